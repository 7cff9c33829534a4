"""The format_validation report's findings table in a run whose dataset mixes modes: a
finding given per mode (mode_mismatch) says each mode's rate in a "by mode" column, escaped;
a run without modes has no such column (its table is as before)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import make_record, write_records

from workbench.analyze import explore
from workbench.analyze.validate import validate_run
from workbench.report import plots
from workbench.rundir.records import Record

TE, END = 163607, 163586
MODES = [{"name": "think", "weight": 3, "chat_template_kwargs": {"thinking": True}, "sampling": {}},
         {"name": "direct", "weight": 1, "chat_template_kwargs": {"thinking": False}, "sampling": {}}]
REASONED = [101, 102, TE, 201, 202, END]  # a think reply
ANSWERED = [201, 202, 203, END]  # a direct reply


def record(sid: int, ids: list[int], mode: str | None) -> Record:
    return make_record(sid, ids, mode=mode, prompt_tokens=5 + sid, ts=1.75e9 + sid)


def write(folder: Path, records: list[Record]) -> None:
    write_records(folder, records, lambda r: [1, 2, 3, int(r.sample_id)])


def write_mixed_run(out: Path, *, modes: bool = True) -> Path:
    """"mix": 4 think records (one without the think-end id: mode_mismatch) and 2 direct
    records (one with it: mode_mismatch); "plain" (thinking on, no modes) with 3 records.
    Without `modes`, "plain" alone."""
    write(out / "plain", [record(i, REASONED, None) for i in range(3)])
    datasets: dict[str, Any] = {"plain": {"prompts": 3, "chat_template_kwargs": {"thinking": True}}}
    if modes:
        write(out / "mix", [record(0, REASONED, "think"), record(1, REASONED, "think"),
                            record(2, REASONED, "think"), record(3, ANSWERED, "think"),
                            record(4, ANSWERED, "direct"), record(5, [7, TE, 201, END], "direct")])
        datasets["mix"] = {"prompts": 6, "modes": MODES}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "created": 1.75e9,
                                              "datasets": datasets}))
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_mixed_run(tmp_path / "out")


def test_the_findings_table_gives_a_rate_per_mode(run: Path) -> None:
    table = explore.findings_table(validate_run(run, workers=1, cache=False))
    mismatch = table[table["rule"] == "mode_mismatch"].iloc[0]
    assert mismatch["dataset"] == "mix" and mismatch["count"] == 2
    assert mismatch["modes"] == {"direct": {"count": 1, "records": 2, "rate": 0.5},
                                 "think": {"count": 1, "records": 4, "rate": 0.25}}
    others = table[table["rule"] != "mode_mismatch"]
    assert others["modes"].isna().all()  # any other rule, and any dataset without modes
    view = plots.findings_view(table)
    assert "<th>by mode</th>" in view.html
    assert "<td>direct 50.0% (1 of 2), think 25.0% (1 of 4)</td>" in view.html
    row = next(r for r in view.data if r["rule"] == "mode_mismatch")
    assert row["modes"]["think"] == {"count": 1, "records": 4, "rate": 0.25}


def test_a_run_without_modes_has_no_by_mode_column(tmp_path: Path) -> None:
    table = explore.findings_table(validate_run(write_mixed_run(tmp_path / "out", modes=False),
                                                workers=1, cache=False))
    assert table["modes"].isna().all()
    html = plots.findings_view(table).html
    assert "by mode" not in html
    assert "<th>dataset</th><th>rule</th><th>severity</th><th class=num>count</th>" in html
    assert "<th class=num>out of</th></tr></thead>" in html  # the last column, as before
    legacy = table.drop(columns="modes")  # a frame shaped before modes draws the same
    assert plots.findings_view(legacy).html == html


def test_mode_names_are_escaped() -> None:
    table = pd.DataFrame([{"dataset": "d", "rule": "mode_mismatch", "severity": "warning",
                           "count": 1, "rate": 0.5, "records": 2, "default_severity": "warning",
                           "base": 2, "unit": "records",
                           "modes": {"<script>x</script>": {"count": 1, "records": 2, "rate": 0.5}}}])
    html = plots.findings_view(table).html
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt; 50.0% (1 of 2)" in html
