"""Validation gives the same answers from the reply ids read as arrays as from lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_validate import END, GOOD, TE, TS, plant, record, write_run_json

from workbench import loops
from workbench.analyze import id_facts
from workbench.analyze.scan import scan_run
from workbench.rundir import id_arrays, reader
from workbench.sketch import compiled as sketch_compiled

LOOP = [*range(101, 111)] * 8
FRACTION = (b'{"sample_id": 12, "output_ids": [1, 2.5], "prompt_tokens": 5, "completion_tokens": 2,'
            b' "cached_tokens": 0, "finish_reason": "stop", "e2e_latency": 1.0, "ts": 1.0}\n')


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_every_rule_and_column_reads_the_same_from_arrays_as_from_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool,
) -> None:
    """The rules take each reply as a view of its block's array (details with positions
    included), or as the list a block read line by line keeps."""
    if compiled:  # a run this small would be read without them
        monkeypatch.setattr(loops, "MIN_BYTES", 0)
    else:
        for module in (id_arrays, id_facts, sketch_compiled):
            monkeypatch.setattr(module, "_kernel", lambda: None)
    records = [
        record(1), record(2, [101, TE, 201, TE, 202, END]), record(3, [TS, 101, TE, 201, END]),
        record(4, [101, 999_999, TE, 201, END]), record(5, [END]), record(6, [101, TE, END]),
        record(7, GOOD, completion=9), record(8, [101, 102, 103], finish="length"),
        record(9, [*LOOP, TE, 201, END]), record(10, [101, *range(163800, 163810), TE, 1, END]),
        record(11, []), FRACTION, record(13, [101, TE, 201, END]),
    ]
    write_run_json(tmp_path, model_profile="kimi-k2.5", datasets={"ds": {}})
    plant(tmp_path, "ds", records, prompts=list(range(1, 14)))
    arrays = scan_run(tmp_path, cache=False, workers=1)
    monkeypatch.setattr(reader, "_arrays_at_once", lambda chunk, first_line: None)
    lists = scan_run(tmp_path, cache=False, workers=1)
    assert arrays.report == lists.report
    assert arrays.files["ds"].columns == lists.files["ds"].columns
    found = {f.rule for f in arrays.report.datasets["ds"].findings}
    assert {"stray_think_end", "stray_think_start", "id_out_of_vocab", "empty_output",
            "empty_answer", "token_count_mismatch", "truncated", "repetition", "special_heavy",
            "bad_type"} <= found


def test_the_scan_takes_the_arrays_path_on_clean_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[bool] = []
    at_once = reader._arrays_at_once

    def recording(chunk: reader.Chunk, first_line: int) -> object:
        found = at_once(chunk, first_line)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(reader, "_arrays_at_once", recording)
    write_run_json(tmp_path, model_profile="kimi-k2.5", datasets={"ds": {}})
    plant(tmp_path, "ds", [record(n) for n in range(1, 40)], prompts=list(range(1, 40)))
    assert scan_run(tmp_path, cache=False, workers=1).files["ds"].records == 39
    assert taken == [True]


_SMALL_SCAN = """
import sys
from workbench.analyze.scan import scan_run
scan_run(sys.argv[1], cache=False, workers=1)
print(sorted(name for name in sys.modules if name == "numba" or name.endswith("_loop")
             or name.endswith("_loops")))
"""


@pytest.mark.parametrize("min_bytes", [None, "0"])
def test_a_small_read_leaves_the_compiled_loops_unloaded(tmp_path: Path, min_bytes: str | None,
                                                         ) -> None:
    """Loading numba costs about half a second and 130 MB: a scan of a few megabytes (a
    small run, a run that grew by an append) runs numpy's passes instead."""
    write_run_json(tmp_path, model_profile="kimi-k2.5", datasets={"ds": {}})
    plant(tmp_path, "ds", [record(n) for n in range(1, 40)], prompts=list(range(1, 40)))
    script = _SMALL_SCAN if min_bytes is None else \
        f"from workbench import loops; loops.MIN_BYTES = {min_bytes}\n" + _SMALL_SCAN
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, check=True)
    loaded = done.stdout.strip()
    if min_bytes is None:
        assert loaded == "[]"
    else:
        assert "numba" in loaded and "workbench.rundir._parse_loop" in loaded
        assert "workbench.sketch._loops" in loaded and "workbench.analyze._facts_loop" in loaded
