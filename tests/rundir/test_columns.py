"""The scan cache beside each dataset: what a cached scan reads, and that it changes no number."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import workbench.analyze.scan as scan_module
from workbench.analyze import explore
from workbench.analyze.scan import RunScan, scan_run
from workbench.analyze.stats import collect_stats
from workbench.analyze.subset import compare_subsets
from workbench.report import plots
from workbench.rundir import prompt_scan, reader
from workbench.rundir.layout import CACHE_DIR
from workbench.rundir.records import PromptRecord, Record, encode_line

THINK_END, IM_END = 163607, 163586
T0 = 1_750_000_000.0
NOW = T0 + 10_000


def record(sid: Any, *, finish: str = "stop", ts: float = T0, n: int = 6) -> Record:
    ids = [1 + sid % 5] * n + ([THINK_END, 7, IM_END] if sid % 4 else [IM_END])
    return Record(sample_id=sid, output_ids=ids, prompt_tokens=10 + sid,
                  completion_tokens=len(ids) + (sid % 11 == 0), cached_tokens=sid % 3,
                  finish_reason=finish, matched_stop=IM_END, e2e_latency=1.5, ts=ts)


def lines(first: int, count: int) -> bytes:
    """Records first..first+count-1: some cut, a repeated id, a legacy line, a bad line."""
    out = []
    for sid in range(first, first + count):
        out.append(encode_line(record(sid, finish="length" if sid % 7 == 0 else "stop",
                                      ts=T0 + 10 * sid)))
        if sid % 13 == 0:
            out.append(encode_line(record(sid - 1, ts=T0 + 10 * sid)))  # a duplicate
        if sid % 17 == 0:
            out.append(b'{"sample_id": "x", "usage": {"completion_tokens": 3}}\n')
        if sid % 19 == 0:
            out.append(b"{not json\n")
    return b"".join(out)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    for name, thinking in (("a", True), ("b", False)):
        folder = out / name
        folder.mkdir(parents=True)
        (folder / "raw_responses.jsonl").write_bytes(lines(0, 60))
        (folder / "prompts.jsonl").write_bytes(
            b"".join(encode_line(PromptRecord(sample_id=i, input_ids=[1, 2])) for i in range(200)))
        (folder / "errors.jsonl").write_bytes(b'{"sample_id": 150, "ts": %f}\n' % (T0 + 5))
    datasets = {"a": {"prompts": 200, "chat_template_kwargs": {"thinking": True}},
                "b": {"prompts": 200, "chat_template_kwargs": {"thinking": False}}}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": datasets}))
    return out


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(dataset, start offset) of every byte range scanned."""
    seen: list[tuple[str, int]] = []
    scan_range = scan_module._scan_range

    def recording(job: Any) -> Any:
        seen.append((Path(job.path).parent.name, job.start))
        return scan_range(job)

    monkeypatch.setattr(scan_module, "_scan_range", recording)
    return seen


def append(run: Path, data: bytes, name: str = "a") -> None:
    with open(run / name / "raw_responses.jsonl", "ab") as file:
        file.write(data)


def figures(scan: RunScan | Path) -> list[str]:
    """Every table and figure the reports draw from a scan, as JSON."""
    source = scan if isinstance(scan, RunScan) else scan_run(scan, cache=False)
    frame = explore.record_frame(source)
    stats = collect_stats(source.run.out, now=NOW, scan=source)
    drawn = [
        plots.histogram_figure(explore.histogram(frame)),
        plots.cdf_figure(explore.cdf(frame)),
        plots.reasoning_figure(explore.reasoning_summary(frame), frame),
        plots.findings_over_time_figure(explore.findings_over_time(source, buckets=5)),
        plots.findings_figure(explore.findings_table(source.report)),
    ]
    tables = [frame.drop(columns=["time"]), explore.examples_table(source),
              explore.budget_table(stats, frame)]
    return ([figure.to_json() for figure in drawn] + [t.to_json() for t in tables]
            + [json.dumps(stats.to_dict(), sort_keys=True)])


def test_a_grown_file_is_read_from_where_the_last_scan_stopped(
    run: Path, starts: list[tuple[str, int]]
) -> None:
    first = scan_run(run)
    assert sorted(starts) == [("a", 0), ("b", 0)]
    assert (run / "a" / CACHE_DIR).is_dir()
    size = (run / "a" / "raw_responses.jsonl").stat().st_size
    starts.clear()
    assert scan_run(run) == first  # nothing new: nothing read
    assert starts == []
    append(run, lines(60, 30))
    starts.clear()
    grown = scan_run(run)
    assert starts == [("a", size)]
    assert grown.report == scan_run(run, cache=False).report
    assert figures(grown) == figures(run)


def test_a_torn_tail_is_read_again_until_complete(run: Path, starts: list[tuple[str, int]]) -> None:
    scan_run(run)
    size = (run / "a" / "raw_responses.jsonl").stat().st_size
    tail = lines(60, 3)
    append(run, tail[:25])
    torn = scan_run(run)
    assert torn.report == scan_run(run, cache=False).report
    assert any(f.rule == "torn_line" for f in torn.report.datasets["a"].findings)
    append(run, tail[25:])
    starts.clear()
    whole = scan_run(run)
    assert starts == [("a", size)]
    assert not any(f.rule == "torn_line" for f in whole.report.datasets["a"].findings)
    assert figures(whole) == figures(run)


@pytest.mark.parametrize("change", ["shrunk", "replaced", "rewritten tail", "cache corrupt",
                                    "cache deleted"])
def test_a_changed_file_or_cache_is_read_again_from_the_start(
    run: Path, starts: list[tuple[str, int]], change: str
) -> None:
    scan_run(run)
    raw = run / "a" / "raw_responses.jsonl"
    data = raw.read_bytes()
    if change == "shrunk":
        raw.write_bytes(data[: len(data) // 2].rsplit(b"\n", 2)[0] + b"\n")
    elif change == "replaced":
        other = raw.with_name("new.jsonl")
        other.write_bytes(data + lines(60, 5))  # the same bytes first: only the inode tells
        os.replace(other, raw)
    elif change == "rewritten tail":
        raw.write_bytes(data[:-30] + b"9" * 29 + b"\n" + lines(60, 5))  # same inode, grown
    elif change == "cache corrupt":
        for cached in (run / "a" / CACHE_DIR).iterdir():
            cached.write_bytes(b"\x93garbage")
    else:
        for cached in (run / "a" / CACHE_DIR).iterdir():
            cached.unlink()
    starts.clear()
    again = scan_run(run)
    assert ("a", 0) in starts
    assert figures(again) == figures(run)
    assert scan_run(run) == again


def test_another_profile_or_threshold_does_not_reuse_the_scan(run: Path) -> None:
    kimi = scan_run(run)
    qwen = scan_run(run, model_profile="qwen3")
    assert qwen.report == scan_run(run, model_profile="qwen3", cache=False).report
    assert qwen.report != kimi.report
    assert len(list((run / "a" / CACHE_DIR).glob("scan-*"))) == 2
    assert scan_run(run) == kimi


def test_ranges_in_workers_grow_the_cache_like_one_pass(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_module, "MIN_RANGE_BYTES", 1500)
    monkeypatch.setattr(scan_module, "SCAN_BLOCK_BYTES", 600)
    scan_run(run, workers=3)
    append(run, lines(60, 40))
    append(run, lines(60, 10), name="b")
    grown = scan_run(run, workers=3)
    assert figures(grown) == figures(run)
    assert explore.samples(grown, explore.record_frame(grown), n=50) == explore.samples(
        scan_run(run, cache=False), explore.record_frame(grown), n=50)


def test_stats_of_a_scan_equal_stats_read_from_the_files(run: Path) -> None:
    append(run, lines(60, 2)[:-5])  # a torn tail too
    scan = scan_run(run)
    assert collect_stats(run, now=NOW, scan=scan).to_dict() == collect_stats(run, now=NOW).to_dict()


def test_an_unwritable_cache_folder_is_skipped(run: Path) -> None:
    (run / "a" / CACHE_DIR).write_text("not a folder")
    assert figures(scan_run(run)) == figures(run)


def test_stats_read_only_what_follows_a_cached_scan(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workbench.analyze.stats as stats_module

    scan_run(run, model_profile="qwen3")  # any profile: the counts depend on none
    cached = (run / "a" / "raw_responses.jsonl").stat().st_size
    append(run, lines(60, 20))
    append(run, lines(80, 2)[:-9])  # and a torn tail
    offsets: list[tuple[str, int]] = []
    iter_blocks = stats_module.iter_blocks

    def recording(path: Path, **kwargs: Any) -> Any:
        offsets.append((Path(path).parent.name, kwargs["offset"]))
        return iter_blocks(path, **kwargs)

    monkeypatch.setattr(stats_module, "iter_blocks", recording)
    from_cache = collect_stats(run, now=NOW).to_dict()
    assert ("a", cached) in offsets and ("a", 0) not in offsets
    for folder in run.glob(f"*/{CACHE_DIR}"):
        for path in folder.iterdir():
            path.write_bytes(path.read_bytes()[:-100])  # unreadable: read from the start
    offsets.clear()
    assert collect_stats(run, now=NOW).to_dict() == from_cache
    assert ("a", 0) in offsets


def test_rows_are_read_back_from_their_own_blocks(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_module, "SCAN_BLOCK_BYTES", 600)
    scan = scan_run(run, cache=False)
    index = scan.files["a"]
    lines = {index.columns.line[1], index.columns.line[-1]}
    blocks_read: list[int] = []
    iter_blocks = reader.iter_blocks

    def recording(path: Path, **kwargs: Any) -> Any:
        for block in iter_blocks(path, **kwargs):
            blocks_read.append(block.start_offset)
            yield block

    monkeypatch.setattr(reader, "iter_blocks", recording)
    rows = reader.rows_at(run / "a" / "raw_responses.jsonl", lines, index, block_bytes=600)
    assert sorted(rows) == sorted(lines)
    assert all(rows[line].output_ids is not None for line in lines)
    assert len(index.blocks) > 20 and len(blocks_read) <= 4


def test_unchanged_prompts_are_not_read_again(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    blocks = prompt_scan.iter_prompt_blocks

    def reading(path: Path, **kwargs: Any) -> Any:
        read.append(Path(path).parent.name)
        return blocks(path, **kwargs)

    monkeypatch.setattr(prompt_scan, "iter_prompt_blocks", reading)

    def report() -> tuple[list[str], list[str]]:
        """What a report draws: the scan, the stats, the subset comparison."""
        subset = compare_subsets(run)
        return figures(scan_run(run)), [subset.lengths.to_json(), subset.length_curves.to_json()]

    first = report()
    assert sorted(read) == ["a", "b"]  # one read of each prompts.jsonl, shared
    read.clear()
    assert report() == first and read == []
    with open(run / "a" / "prompts.jsonl", "ab") as file:
        file.write(encode_line(PromptRecord(sample_id=500, input_ids=[1, 2, 3])))
        file.write(b"{bad\n")
    changed = report()
    assert read == ["a"]
    assert changed != first and changed[0] == figures(run)


def test_ids_past_64_bits_are_read_without_a_cache(tmp_path: Path) -> None:
    folder = tmp_path / "out" / "d"
    folder.mkdir(parents=True)
    huge = [-(2**63) - 1, 2**64]
    (folder / "raw_responses.jsonl").write_bytes(b"".join(encode_line(record(0)).replace(
        b'"sample_id":0', b'"sample_id":%d' % sid) for sid in huge))
    (folder / "prompts.jsonl").write_bytes(b'{"sample_id": %d, "input_ids": [1]}\n' % huge[0])
    first, again = scan_run(tmp_path / "out", workers=1), scan_run(tmp_path / "out", workers=1)
    assert first.report.to_builtins() == again.report.to_builtins()
    assert first.report.to_builtins()["datasets"]["d"]["records"] == 2
    assert collect_stats(tmp_path / "out").datasets["d"].records == 2
