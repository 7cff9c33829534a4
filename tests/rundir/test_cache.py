"""The read caches beside each dataset never outlive the bytes they were read from.

Each test reads a run with `workbench stats` then `workbench validate` (which keep and use the
caches of :mod:`workbench.rundir.cache`), changes a file the way a user or a tool does, and
checks that both then tell the numbers of the new bytes: those read with no cache at all. The
raw files of the two runs built here have the same size and the same last records, so that
only what the caches record of a change can tell it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import workbench.analyze.scan as scan_module
import workbench.analyze.stats as stats_module
from workbench.analyze.stats import collect_stats
from workbench.analyze.validate import validate_run
from workbench.rundir import cache
from workbench.rundir.columns import SCAN_CACHE
from workbench.rundir.layout import CACHE_DIR, PROMPTS_FILE, RAW_FILE
from workbench.rundir.records import PromptRecord, Record, encode_line

TE, END = 163607, 163586
T0 = 1_750_000_000.0
NOW = T0 + 10_000
SECOND = 10**9
RECORDS = 400
CHANGED = range(100, 140)  # the records whose completion_tokens differ in the other run

Reading = tuple[dict[str, Any], dict[str, Any]]


def lines(first: int, count: int, *, changed: range = range(0)) -> bytes:
    """Records first..first+count-1 of six output ids; those in `changed` claim 7 completion
    tokens instead of 6 (one digit: the file keeps its size)."""
    return b"".join(
        encode_line(Record(sample_id=sid, output_ids=[101, 102, TE, 201, 202, END],
                           prompt_tokens=10, completion_tokens=7 if sid in changed else 6,
                           cached_tokens=0, finish_reason="stop", matched_stop=END,
                           e2e_latency=1.5, ts=T0 + sid))
        for sid in range(first, first + count))


def plant(out: Path, raw: bytes) -> Path:
    """A run of one dataset "ds" holding raw and RECORDS prompts; its raw file."""
    folder = out / "ds"
    folder.mkdir(parents=True)
    (folder / RAW_FILE).write_bytes(raw)
    (folder / PROMPTS_FILE).write_bytes(b"".join(
        encode_line(PromptRecord(sample_id=sid, input_ids=[1, 2])) for sid in range(RECORDS)))
    datasets = {"ds": {"prompts": RECORDS, "chat_template_kwargs": {"thinking": True}}}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": datasets}))
    return folder / RAW_FILE


def read(out: Path) -> Reading:
    """What `workbench stats` and `workbench validate` tell of out, through the caches (stats
    first: it reads the scan validate keeps, and must not lean on a scan made just before)."""
    stats = collect_stats(out, now=NOW).to_dict()
    return stats, validate_run(out, workers=1).to_builtins()


def read_without_caches(out: Path) -> Reading:
    for folder in out.glob(f"*/{CACHE_DIR}"):
        shutil.rmtree(folder)
    return read(out)


def figures(reading: Reading) -> tuple[int, int, int, int]:
    """(records, completion tokens, token count mismatches, duplicate prompt ids) read."""
    stats, report = reading
    counts = {f["rule"]: f["count"] for f in report["datasets"]["ds"]["findings"]}
    return (stats["total"]["records"], stats["total"]["completion_tokens"],
            counts.get("token_count_mismatch", 0), counts.get("duplicate_sample_id", 0))


def assert_reads_the_new_bytes(out: Path, expected: tuple[int, int, int, int]) -> None:
    after = read(out)
    assert figures(after) == expected
    assert after == read_without_caches(out)


ORIGINAL = (RECORDS, 6 * RECORDS, 0, 0)
OTHER = (RECORDS, 6 * RECORDS + len(CHANGED), len(CHANGED), 0)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run read once (so that its scan and prompts summary are kept), and read again from
    those caches."""
    out = tmp_path / "run"
    raw = plant(out, lines(0, RECORDS))
    assert raw.stat().st_size > cache._PROBES * cache._PROBE_BYTES  # the probes are sampled
    read(out)
    assert sorted(p.name.split("-")[0] for p in (out / "ds" / CACHE_DIR).iterdir()) == [
        "prompt", "prompts", "scan"]  # prompt-figures, prompts, scan
    assert figures(read(out)) == ORIGINAL
    return out


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The offsets stats and validate start reading the raw file from."""
    seen: dict[str, list[int]] = {"stats": [], "validate": []}
    iter_blocks, scan_range = stats_module.iter_blocks, scan_module._scan_range

    def stats_reading(path: Path, **kwargs: Any) -> Any:
        if Path(path).name == RAW_FILE:
            seen["stats"].append(kwargs["offset"])
        return iter_blocks(path, **kwargs)

    def validate_reading(job: Any) -> Any:
        seen["validate"].append(job.start)
        return scan_range(job)

    monkeypatch.setattr(stats_module, "iter_blocks", stats_reading)
    monkeypatch.setattr(scan_module, "_scan_range", validate_reading)
    return seen


def test_another_file_of_the_same_size_copied_over_is_read_again(
    run: Path, tmp_path: Path
) -> None:
    raw = run / "ds" / RAW_FILE
    other = plant(tmp_path / "other", lines(0, RECORDS, changed=CHANGED))
    before = raw.stat()
    assert other.stat().st_size == before.st_size
    shutil.copyfile(other, raw)  # cp: the same inode, truncated and written again
    os.utime(raw, ns=(before.st_atime_ns, before.st_mtime_ns + SECOND))  # coarse clocks too
    assert raw.stat().st_ino == before.st_ino
    assert_reads_the_new_bytes(run, OTHER)


@pytest.mark.skipif(shutil.which("sed") is None, reason="no sed")
@pytest.mark.parametrize("edits", [1, 2])
def test_a_file_edited_with_sed_is_read_again(run: Path, edits: int) -> None:
    """sed -i writes a new file over the old one: a new inode, but a second edit may get the
    first file's inode again (ext4 hands out the lowest free one)."""
    raw = run / "ds" / RAW_FILE
    before = raw.stat()
    first, last = CHANGED.start + 1, CHANGED.stop  # sed counts lines from 1
    for old, new in [("6", "7"), ("7", "8")][:edits]:
        subprocess.run(["sed", "-i", f'{first},{last}s/"completion_tokens":{old},/'
                        f'"completion_tokens":{new},/', str(raw)], check=True)
    os.utime(raw, ns=(before.st_atime_ns, before.st_mtime_ns + SECOND))  # coarse clocks too
    extra = len(CHANGED) * edits
    assert_reads_the_new_bytes(run, (RECORDS, 6 * RECORDS + extra, len(CHANGED), 0))


def test_a_file_truncated_then_written_again_longer_is_read_again(run: Path) -> None:
    raw = run / "ds" / RAW_FILE
    ino = raw.stat().st_ino
    os.truncate(raw, 0)
    with open(raw, "ab") as file:  # other records where the cached ones were, then more
        file.write(lines(0, RECORDS, changed=CHANGED) + lines(RECORDS, 20))
    assert raw.stat().st_ino == ino
    assert_reads_the_new_bytes(run, (RECORDS + 20, 6 * (RECORDS + 20) + len(CHANGED),
                                     len(CHANGED), 0))


def rewrite_in_place(path: Path, old: bytes, new: bytes, *, keep_mtime: bool) -> None:
    """Replace the first old with new (as long) through the same open file: a tool writing
    in place; then give the file back its modification time, or move it a second on."""
    before = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    with open(path, "r+b") as file:
        file.seek(data.index(old))
        file.write(new)
    mtime = before.st_mtime_ns + (0 if keep_mtime else SECOND)
    os.utime(path, ns=(before.st_atime_ns, mtime))
    if path.stat().st_ctime_ns == before.st_ctime_ns:
        pytest.skip("the change time did not move (timestamps coarser than this test)")


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["mtime moved", "mtime kept"])
def test_a_few_bytes_changed_in_place_are_read_again(run: Path, keep_mtime: bool) -> None:
    record = lines(200, 1)
    rewrite_in_place(run / "ds" / RAW_FILE, record, record.replace(
        b'"completion_tokens":6,', b'"completion_tokens":9,'), keep_mtime=keep_mtime)
    assert_reads_the_new_bytes(run, (RECORDS, 6 * RECORDS + 3, 1, 0))


def test_a_file_rewritten_while_read_is_not_kept_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    raw = plant(out, lines(0, RECORDS))
    scan_range = scan_module._scan_range

    def rewritten_meanwhile(job: Any) -> Any:
        scanned = scan_range(job)
        rewrite_in_place(raw, lines(0, RECORDS), lines(0, RECORDS, changed=CHANGED),
                         keep_mtime=False)
        return scanned

    monkeypatch.setattr(scan_module, "_scan_range", rewritten_meanwhile)
    validate_run(out, workers=1)
    monkeypatch.undo()
    assert_reads_the_new_bytes(out, OTHER)


def test_an_appended_file_is_read_from_the_cached_offset(
    run: Path, starts: dict[str, list[int]]
) -> None:
    raw = run / "ds" / RAW_FILE
    size = raw.stat().st_size
    with open(raw, "ab") as file:
        file.write(lines(RECORDS, 30))
    found = SCAN_CACHE.load(raw, None)
    assert found is not None and found[1] == size
    after = read(run)
    assert starts == {"stats": [size], "validate": [size]}  # the old bytes are not read again
    assert figures(after) == (RECORDS + 30, 6 * (RECORDS + 30), 0, 0)
    assert after == read_without_caches(run)


def test_a_file_appended_to_while_read_keeps_its_cache(
    tmp_path: Path, starts: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run being written: the scan reads what was appended after it began, and keeps it."""
    out = tmp_path / "run"
    raw = plant(out, lines(0, RECORDS))
    scan_range = scan_module._scan_range

    def appended_meanwhile(job: Any) -> Any:
        with open(raw, "ab") as file:
            file.write(lines(RECORDS, 30))
        return scan_range(job)

    monkeypatch.setattr(scan_module, "_scan_range", appended_meanwhile)
    validate_run(out, workers=1)
    monkeypatch.setattr(scan_module, "_scan_range", scan_range)
    starts["validate"].clear()
    assert figures(read(out)) == (RECORDS + 30, 6 * (RECORDS + 30), 0, 0)
    assert starts == {"stats": [raw.stat().st_size], "validate": []}  # nothing read again


def test_prompts_rewritten_at_the_same_size_are_read_again(run: Path) -> None:
    prompts = run / "ds" / PROMPTS_FILE
    rewrite_in_place(prompts, b'{"sample_id":150,', b'{"sample_id":151,', keep_mtime=True)
    assert_reads_the_new_bytes(run, (*ORIGINAL[:3], 1))


def test_a_torn_tail_cut_by_a_resume_keeps_the_cache(
    tmp_path: Path, starts: dict[str, list[int]]
) -> None:
    """A resume cuts a torn last line off (appender.repair_torn_tail): the file shrinks to the
    offset the scan stopped at, and what was read before it still holds."""
    out = tmp_path / "run"
    raw = plant(out, lines(0, RECORDS) + lines(RECORDS, 1)[:40])
    read(out)
    offset = len(lines(0, RECORDS))
    os.truncate(raw, offset)
    starts["stats"].clear()
    starts["validate"].clear()
    after = read(out)
    assert starts == {"stats": [offset], "validate": []}  # nothing read before the offset
    assert figures(after) == ORIGINAL
    assert after == read_without_caches(out)
