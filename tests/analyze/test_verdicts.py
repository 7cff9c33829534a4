"""Two verdicts a user can act on: the format's (what --strict checks) and the data's (a
data-quality rate past its limit, in words), and the benchmarks said once."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from test_quality import near_copy, prompts_file, reply
from test_validate import plant, record, write_run_json

from workbench.analyze.findings import (
    DATA_LIMITS,
    DatasetReport,
    Finding,
    ValidationReport,
    data_concerns,
)
from workbench.analyze.quality import RunBenchmarks
from workbench.analyze.validate import (
    benchmark_notes,
    contamination_line,
    exit_code,
    format_report,
    validate_run,
)
from workbench.rundir.manifest import BenchmarkChoice
from workbench.rundir.records import PromptRecord


def near_duplicate_run(out: Path) -> Path:
    """a: 10 replies, 4 of them near copies of the first (40% near duplicates); b: 3 of its own."""
    replies = [reply(0), *(near_copy(reply(0), 6, seed=i) for i in range(1, 5)),
               *(reply(i) for i in range(5, 10))]
    plant(out, "a", [record(i, ids) for i, ids in enumerate(replies)])
    prompts_file(out / "a", [PromptRecord(sample_id=i, input_ids=list(range(i * 100, i * 100 + 5)))
                             for i in range(10)])
    plant(out, "b", [record(20 + i, reply(20 + i)) for i in range(3)])
    prompts_file(out / "b", [PromptRecord(sample_id=20 + i, input_ids=list(range(5000 + i * 100, 5005 + i * 100)))
                             for i in range(3)])
    write_run_json(out, model_profile="kimi-k2.5", datasets=[{"name": "a"}, {"name": "b"}])
    return out


def test_near_duplicates_are_a_data_concern_not_a_format_failure(tmp_path: Path) -> None:
    report = validate_run(near_duplicate_run(tmp_path), workers=1, cache=False)
    assert report.ok and exit_code(report, strict=True) == 0  # --strict keeps meaning the format
    [concern] = report.datasets["a"].data
    assert (concern.rule, concern.count, concern.of) == ("near_duplicate_reply", 4, "replies")
    assert concern.rate == 0.4 and concern.limit == DATA_LIMITS["near_duplicate_reply"]
    assert report.datasets["b"].data == []
    text = format_report(report)
    assert "format: passed (no error finding; --strict checks the format only)" in text
    assert "\ndata: 40% of a's replies are near duplicates\n" in text
    assert "a: 10 records, 10 prompts: ok (format), data: 40% of replies are near duplicates" in text
    assert "b: 3 records, 3 prompts: ok (format), data ok" in text


def test_json_gains_a_data_verdict_per_dataset_and_keeps_its_keys(tmp_path: Path) -> None:
    report = validate_run(near_duplicate_run(tmp_path), workers=1, cache=False)
    data = json.loads(msgspec.json.encode(report.to_builtins()))
    assert set(data) == {"ok", "model_profile", "datasets", "benchmarks"}
    assert set(data["datasets"]["a"]) == {"ok", "records", "prompts", "findings", "data"}
    assert data["datasets"]["a"]["data"] == [{
        "rule": "near_duplicate_reply", "count": 4, "rate": 0.4, "limit": 0.1, "of": "replies",
        "says": "are near duplicates"}]
    assert data["datasets"]["b"]["data"] == []


def test_a_clean_run_says_no_concern_and_no_benchmark_line(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(i) for i in range(3)], [0, 1, 2])
    text = format_report(validate_run(tmp_path, workers=1, cache=False))
    assert "\ndata: no concern\n" in text
    assert "contamination" not in text and "benchmark" not in text and "note:" not in text


def _finding(rule: str, count: int, rate: float) -> Finding:
    return Finding(rule, "info", count, [], rate)


def test_each_data_rule_has_a_limit_and_contamination_has_none() -> None:
    found = [_finding("duplicate_reply", 1, 0.01), _finding("duplicate_prompt", 2, 0.02),
             _finding("repetition", 3, 0.05), _finding("contaminated_reply", 1, 0.001),
             _finding("near_duplicate_prompt", 30, 0.3), _finding("truncated", 90, 0.9)]
    concerns = data_concerns(found)
    assert [c.clause("x") for c in concerns] == [
        "2.0% of x's prompts are duplicates",       # past 1%; 1% itself is no concern
        "0.1% of x's replies hold a benchmark n-gram",  # any
        "30% of x's prompts are near duplicates"]    # a format rule (truncated) is none


def _report(benchmarks: list[str]) -> ValidationReport:
    ds = DatasetReport(True, 3, 3, [], [])
    return ValidationReport(True, "kimi-k2.5", {"ds": ds}, benchmarks)


def test_the_run_benchmarks_are_said_once_plainly(tmp_path: Path) -> None:
    bench = tmp_path / "tiny_bench.jsonl"
    gone = str(tmp_path / "old_bench.jsonl")
    choice = BenchmarkChoice((str(bench),), recorded=True, gone=(gone,))
    chosen = RunBenchmarks(None, choice, (*choice.notes(), "ids not read"),
                           (*choice.gone_notes(), "ids not read"))
    text = format_report(_report(["tiny_bench"]), chosen)
    assert text.count("tiny_bench") == 1
    assert "\ncontamination: checked against tiny_bench (from run.json)\n" in text
    assert "looking for the run's benchmarks" not in text and "benchmarks looked for" not in text
    assert benchmark_notes(chosen) == [chosen.notes[1], "ids not read"]  # what asks for action
    assert f"note: {gone}: a benchmark of this run" in text
    given = RunBenchmarks(None, BenchmarkChoice((str(bench),)))
    assert contamination_line(_report(["tiny_bench"]), given) == "contamination: checked against tiny_bench"
    assert contamination_line(_report([]), chosen) is None
