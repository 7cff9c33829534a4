"""Validation rules on small planted runs: every rule, its examples, thresholds, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import workbench.analyze.scan as scan_module
from workbench.analyze.rules import (
    RECORD_RULES,
    SEVERITY,
    RecordChecker,
    Thresholds,
    record_failures,
    record_problems,
)
from workbench.analyze.validate import exit_code, format_report, validate_run
from workbench.errors import ConfigError, DataError
from workbench.profiles import get_profile
from workbench.rundir.reader import parse_lines
from workbench.rundir.records import PromptRecord, Record, Row, encode_line

KIMI = get_profile("kimi-k2.5")
QWEN = get_profile("qwen3")
TS, TE, END = 163606, 163607, 163586
GOOD = [101, 102, TE, 201, 202, END]
PROMPT = [1, 2, 3, 4, 5]  # a planted prompt's ids, shifted per prompt: prompt_tokens=5


# --- planting --------------------------------------------------------------------------------


def record(sid: Any, ids: list[int] | None = None, *, finish: str = "stop",
           completion: int | None = None) -> Record:
    ids = list(GOOD) if ids is None else ids
    return Record(sample_id=sid, output_ids=ids, prompt_tokens=5,
                  completion_tokens=len(ids) if completion is None else completion,
                  cached_tokens=0, finish_reason=finish,
                  matched_stop=END if finish == "stop" else None, e2e_latency=1.0, ts=1.75e9)


def plant(out: Path, name: str, records: list[Any], prompts: list[Any] | None = None,
          *, raw_tail: bytes = b"") -> Path:
    """A dataset folder: records (Record, dict or raw bytes lines) and prompts.jsonl."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    data = b"".join(r if isinstance(r, bytes) else encode_line(r) for r in records)
    (folder / "raw_responses.jsonl").write_bytes(data + raw_tail)
    if prompts is not None:
        (folder / "prompts.jsonl").write_bytes(b"".join(
            p if isinstance(p, bytes) else encode_line(PromptRecord(
                sample_id=p, input_ids=[index * 100 + i for i in PROMPT]))  # distinct prompts
            for index, p in enumerate(prompts)))
    return folder


def write_run_json(out: Path, **body: Any) -> None:
    (out / "run.json").write_text(json.dumps(body))


def row_of(rec: Any) -> Row:
    rows, _ = parse_lines(encode_line(rec), with_output_ids=True)
    assert len(rows) == 1
    return rows[0]


def findings(report: Any, name: str = "ds") -> dict[str, Any]:
    return {f.rule: f for f in report.datasets[name].findings}


# --- per-record rules ------------------------------------------------------------------------


@pytest.mark.parametrize(("ids", "finish", "expected"), [
    (GOOD, "stop", set()),
    ([101, 102, 103, END], "stop", {"reasoning_unclosed"}),
    ([101, 102, 103, 104], "length", {"truncated"}),
    ([101, TE, 201, 202], "length", {"truncated"}),
    ([101, TE, END], "stop", {"empty_answer"}),
    ([101, TE], "stop", {"empty_answer"}),
    ([101, TE], "length", {"truncated"}),
    ([TS, 101, TE, 201, END], "stop", {"stray_think_start"}),
    ([101, TE, 201, TE, 202, END], "stop", {"stray_think_end"}),
    ([101, 163840, TE, 201, END], "stop", {"id_out_of_vocab"}),
    ([-1, 101, TE, 201, END], "stop", {"missing_field"}),  # of the wrong type: no ids
    ([2**64 - 1, 101, TE, 201, END], "stop", {"id_out_of_vocab"}),
    ([], "stop", {"empty_output"}),
    ([END], "stop", {"empty_output"}),
    ([101, 102], "abort", {"aborted"}),
])
def test_record_rules_kimi(ids: list[int], finish: str, expected: set[str]) -> None:
    assert record_failures(row_of(record(0, ids, finish=finish)), KIMI) == expected


def test_qwen_allows_one_opening_think_start() -> None:
    assert record_failures(row_of(record(0, [151667, 1, 151668, 2, 151645])), QWEN) == set()
    twice = record(0, [151667, 1, 151667, 151668, 2, 151645])
    assert record_failures(row_of(twice), QWEN) == {"stray_think_start"}


def test_thinking_off_skips_reasoning_rules() -> None:
    row = row_of(record(0, [101, 102, END]))
    assert record_failures(row, KIMI) == {"reasoning_unclosed"}
    assert record_failures(row, KIMI, reasoning=False) == set()
    assert record_failures(row, get_profile("plain")) == {"id_out_of_vocab"}  # 32k vocab


def test_details_say_what_is_wrong() -> None:
    mismatch = dict(record_problems(row_of(record(0, GOOD, completion=3)), KIMI))
    assert mismatch == {"token_count_mismatch":
                        "len(output_ids) 6 vs completion_tokens 3 (+3) (prepended prompt-suffix ids?)"}
    cut = dict(record_problems(row_of(record(0, [1, 2, 3], finish="length")), KIMI))
    assert cut["truncated"] == "finish_reason length after 3 ids, inside the reasoning (no think-end id)"
    vocab = dict(record_problems(row_of(record(0, [1, 200000, TE, 2, END])), KIMI, 1000))
    assert vocab["id_out_of_vocab"] == "output_ids[1] = 200000 outside [0, 1000) of kimi-k2.5"


def test_missing_fields_name_the_fields() -> None:
    flat = msgspec.to_builtins(record(0))
    del flat["ts"], flat["completion_tokens"]
    assert dict(record_problems(row_of(flat), KIMI)) == {
        "missing_field": "cannot read completion_tokens, ts"}


def test_batch_and_single_checks_agree() -> None:
    recs = [record(i, ids, finish=f) for i, (ids, f) in enumerate([
        (GOOD, "stop"), ([1, TE, END], "stop"), ([TS, 1, TE, 2, TE, END], "stop"),
        ([1, 2], "length"), ([], "stop"), ([1, 999999, TE, 2, END], "stop")])]
    rows = [row_of(r) for r in recs]
    checker = RecordChecker(KIMI)
    assert checker.check_rows(rows) == [checker.problems(row) for row in rows]
    assert set(RECORD_RULES) <= set(SEVERITY)


# --- run-level rules -------------------------------------------------------------------------


def test_clean_run_is_ok_and_json_shaped(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(i) for i in range(3)], [0, 1, 2])
    report = validate_run(tmp_path)
    data = json.loads(msgspec.json.encode(report.to_builtins()))
    assert data["ok"] is True and data["model_profile"] == "kimi-k2.5"
    assert data["datasets"]["ds"]["ok"] is True and data["datasets"]["ds"]["findings"] == []
    assert exit_code(report, strict=True) == 0
    assert "ds: 3 records, 3 prompts: ok" in format_report(report)


def test_file_rules_with_lines_and_files(tmp_path: Path) -> None:
    meta = {"sample_id": 7, "output_ids": GOOD, "meta_info": {
        "prompt_tokens": 5, "completion_tokens": 6, "finish_reason": {"type": "stop"}}}
    bad_type = msgspec.to_builtins(record(8))
    bad_type["completion_tokens"] = "six"
    plant(tmp_path, "ds", [record(0), b"{not json\n", record(0), meta, bad_type, record(9)],
          [0, 1, 7, 8, 1], raw_tail=b'{"sample_id": 10, "outp')
    got = findings(validate_run(tmp_path))
    assert got["parse_error"].examples[0].line == 2
    assert got["torn_line"].examples[0].line == 7
    assert [(e.file, e.line) for e in got["duplicate_sample_id"].examples] == [
        ("raw_responses.jsonl", 3), ("prompts.jsonl", 5)]
    assert got["legacy_layout"].examples[0].detail == "meta_info layout"
    assert got["bad_type"].examples[0].line == 5 and "missing_field" not in got
    assert got["missing_response"].examples[0].file == "prompts.jsonl"
    assert got["missing_response"].examples[0].line == 2
    assert got["orphan_response"].examples[0].line == 6
    assert {r: f.severity for r, f in got.items()} == {
        "parse_error": "error", "bad_type": "error", "duplicate_sample_id": "error",
        "torn_line": "warning", "missing_response": "warning", "orphan_response": "warning",
        "legacy_layout": "info"}


def test_without_prompts_file(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(0)])
    got = findings(validate_run(tmp_path))
    assert set(got) == {"no_prompts"} and got["no_prompts"].examples[0].file == "prompts.jsonl"


def test_truncation_rate_makes_an_error(tmp_path: Path) -> None:
    recs = [record(i) for i in range(9)] + [record(9, [1, 2, 3], finish="length")]
    plant(tmp_path, "ds", recs, list(range(10)))
    lenient = validate_run(tmp_path, thresholds=Thresholds(truncated_error_rate=0.2))
    assert findings(lenient)["truncated"].severity == "warning" and lenient.ok
    strict = validate_run(tmp_path)
    assert findings(strict)["truncated"].severity == "error"
    assert findings(strict)["truncated"].rate == pytest.approx(0.1)
    finding = strict.to_builtins()["datasets"]["ds"]["findings"][0]
    assert finding == {"rule": "truncated", "severity": "error", "count": 1, "rate": 0.1,
                       "examples": [{"line": 10, "file": "raw_responses.jsonl", "detail":
                                     "finish_reason length after 3 ids, inside the reasoning "
                                     "(no think-end id)"}]}
    assert (exit_code(strict), exit_code(strict, strict=True)) == (0, 1)


def test_examples_are_capped(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(i, completion=1) for i in range(12)], list(range(12)))
    finding = findings(validate_run(tmp_path))["token_count_mismatch"]
    assert finding.count == 12 and [e.line for e in finding.examples] == [1, 2, 3, 4, 5]


def test_profile_from_run_json_or_override(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(0, [151667, 1, 151668, 2, 151645])], [0])
    write_run_json(tmp_path, model_profile="qwen3", datasets={"ds": {"input": "input_ids"}})
    assert validate_run(tmp_path).model_profile == "qwen3"
    assert findings(validate_run(tmp_path)) == {}
    kimi = validate_run(tmp_path, model_profile="kimi-k2.5")
    assert "reasoning_unclosed" in findings(kimi)
    with pytest.raises(ConfigError, match="unknown model profile 'nope'"):
        validate_run(tmp_path, model_profile="nope")


def test_thinking_switched_off_in_run_json(tmp_path: Path) -> None:
    plant(tmp_path, "ds", [record(0, [1, 2, END])], [0])
    write_run_json(tmp_path, model_profile="kimi-k2.5",
                   datasets={"ds": {"chat_template_kwargs": {"thinking": False}}})
    assert findings(validate_run(tmp_path)) == {}


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"absent: not a run directory \(no such directory\)"):
        validate_run(tmp_path / "absent")
    with pytest.raises(DataError, match=r"not a run directory \(no run.json and no "
                                        r"<dataset>/raw_responses.jsonl\)"):
        validate_run(tmp_path)
    (tmp_path / "run.json").write_text("{oops")
    with pytest.raises(DataError, match="run.json: invalid JSON"):
        validate_run(tmp_path)


def test_only_selects_datasets(tmp_path: Path) -> None:
    plant(tmp_path, "a", [record(0)], [0])
    plant(tmp_path, "b", [record(0)], [0])
    assert list(validate_run(tmp_path, only=["b"]).datasets) == ["b"]
    with pytest.raises(ConfigError, match="--only: unknown dataset 'c'"):
        validate_run(tmp_path, only=["c"])


def test_ranges_in_workers_match_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs: list[Any] = []
    for i in range(400):
        ids = [100 + i % 50] * (i % 37) + [TE, 5, END] if i % 9 else [1, 2]
        recs.append(record(i, ids, finish="length" if i % 9 == 0 else "stop",
                           completion=len(ids) + (i % 23 == 0)))
        if i % 97 == 0:
            recs.append(b"garbage\n")
    recs.append(record(3))
    plant(tmp_path, "ds", recs, list(range(0, 420, 2)), raw_tail=b'{"sample_id": 1')
    single = validate_run(tmp_path, workers=1, cache=False)
    monkeypatch.setattr(scan_module, "MIN_RANGE_BYTES", 2000)
    monkeypatch.setattr(scan_module, "SCAN_BLOCK_BYTES", 700)
    assert len(scan_module._plan_ranges(tmp_path / "ds" / "raw_responses.jsonl", 5)) == 5
    assert validate_run(tmp_path, workers=5, cache=False) == single
    assert validate_run(tmp_path, workers=1, cache=False) == single
    assert single.datasets["ds"].records == 401
