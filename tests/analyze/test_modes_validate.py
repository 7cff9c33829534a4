"""Validation of a dataset that mixes modes: the reasoning rules and the reasoning split follow
each record's mode, mode_mismatch counts the records whose ids contradict their mode (per
mode), and turn_prompt_mismatch renders each conversation with its mode's arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import generate_run, jsonl, make_record, tool_turn_rows

from workbench.analyze.readback import record_detail
from workbench.analyze.rules import RECORD_RULES, SEVERITY, RecordChecker, Thresholds, rule_bit
from workbench.analyze.scan import scan_run
from workbench.analyze.validate import format_report, validate_run
from workbench.profiles import get_profile
from workbench.rundir.reader import parse_lines
from workbench.rundir.records import PromptRecord, Record, Row, encode_line
from workbench.server.launch import ServerProcess

KIMI = get_profile("kimi-k2.5")
TS, TE, END = 163606, 163607, 163586
MODES = [{"name": "think", "weight": 3, "chat_template_kwargs": {"thinking": True},
          "sampling": {}},
         {"name": "direct", "weight": 1, "chat_template_kwargs": {"thinking": False},
          "sampling": {}}]

REASONED = [101, 102, TE, 201, 202, END]  # a think reply
ANSWERED = [201, 202, 203, END]  # a direct reply


def record(sid: Any, ids: list[int], mode: str | None, *, finish: str = "stop",
           turn: int | None = None) -> Record:
    return make_record(sid, ids, mode=mode, turn=turn, finish=finish)


def plant(out: Path, records: list[Record], *, modes: list[dict[str, Any]] | None = None,
          kwargs: dict[str, Any] | None = None) -> Path:
    """Dataset "ds" of `records`, a prompt for each, and run.json with its modes."""
    folder = out / "ds"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))
    (folder / "prompts.jsonl").write_bytes(b"".join(
        encode_line(PromptRecord(sample_id=r.sample_id, input_ids=[1, 2, 3, 4, 5 + i]))
        for i, r in enumerate(records)))
    settings: dict[str, Any] = {"input": "input_ids", "modes": MODES if modes is None else modes}
    if kwargs is not None:
        settings["chat_template_kwargs"] = kwargs
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": {"ds": settings}}))
    return out


def mixed(out: Path, **extra: Any) -> Path:
    """6 think records (one finished without reasoning's end, one cut inside it), 5 direct
    records (one that reasoned anyway: a think-end id; one that opened the reasoning) and a
    record without a mode."""
    records = [record(i, REASONED, "think") for i in range(4)]
    records += [record(4, [101, 102, 103, END], "think"),  # mode_mismatch, reasoning_unclosed
                record(5, [101, 102, 103], "think", finish="length")]  # truncated only
    records += [record(10 + i, ANSWERED, "direct") for i in range(3)]
    records += [record(13, [7, TE, 201, END], "direct"),  # mode_mismatch
                record(14, [TS, 7, 8, END], "direct")]  # mode_mismatch
    records += [record(20, [101, 102, 103, END], None)]  # reasoning_unclosed, never mismatch
    return plant(out, records, **extra)


def findings(report: Any) -> dict[str, Any]:
    return {f.rule: f for f in report.datasets["ds"].findings}


def row_of(rec: Record) -> Row:
    rows, _ = parse_lines(encode_line(rec), with_output_ids=True)
    return rows[0]


# --- the rule ----------------------------------------------------------------------------------


def test_mode_mismatch_is_the_last_rule_a_warning_with_a_rate() -> None:
    assert RECORD_RULES[-1] == "mode_mismatch" and RECORD_RULES[-2] == "special_heavy"
    assert rule_bit("special_heavy") == 1 << 12 and rule_bit("mode_mismatch") == 1 << 13
    assert SEVERITY["mode_mismatch"] == "warning"
    assert Thresholds().error_rate("mode_mismatch") == 0.02


def test_mode_mismatch_counts_and_rates_per_mode(tmp_path: Path) -> None:
    report = validate_run(mixed(tmp_path), workers=1)
    found = findings(report)
    mismatch = found["mode_mismatch"]
    assert mismatch.count == 3 and mismatch.rate == pytest.approx(3 / 12)
    assert {name: (m.count, m.records) for name, m in mismatch.modes.items()} == {
        "direct": (2, 5), "think": (1, 6)}
    assert mismatch.modes["direct"].rate == pytest.approx(0.4)
    assert mismatch.severity == "error"  # 40% of direct's records
    off = "switched thinking off, but the reply holds"
    on = "reasons, but the reply finished (stop) after 4 ids with no"
    assert [e.detail for e in mismatch.examples] == [
        f"sample_id 4: mode 'think' {on} think-end id {TE}",
        f"sample_id 13: mode 'direct' {off} think-end id {TE} (at 1 of 4 ids)",
        f"sample_id 14: mode 'direct' {off} think-start id {TS} (at 0 of 4 ids)"]
    text = format_report(report)
    assert "mode_mismatch" in text and "(25.0%) (direct: 2/5, think: 1/6)" in text


def test_the_json_report_gives_the_rate_per_mode(tmp_path: Path) -> None:
    data = json.loads(msgspec.json.encode(validate_run(mixed(tmp_path)).to_builtins()))
    by_rule = {f["rule"]: f for f in data["datasets"]["ds"]["findings"]}
    assert by_rule["mode_mismatch"]["modes"] == {
        "direct": {"count": 2, "records": 5, "rate": 0.4},
        "think": {"count": 1, "records": 6, "rate": pytest.approx(1 / 6)}}
    assert all("modes" not in f for rule, f in by_rule.items() if rule != "mode_mismatch")


def test_thinking_off_records_are_not_reasoning_unclosed(tmp_path: Path) -> None:
    found = findings(validate_run(mixed(tmp_path)))
    assert found["reasoning_unclosed"].count == 2  # think's sample 4 and the record without
    assert [e.line for e in found["reasoning_unclosed"].examples] == [5, 12]
    assert found["truncated"].examples[0].detail.endswith("inside the reasoning (no think-end id)")
    assert "empty_answer" not in found and "stray_think_start" not in found


def test_a_thinking_off_dataset_with_a_thinking_mode(tmp_path: Path) -> None:
    """The dataset's arguments switch thinking off; its think mode switches it on again."""
    records = [record(0, REASONED, "think"), record(1, ANSWERED, "think"),
               record(2, ANSWERED, "direct"), record(3, ANSWERED, None)]
    modes = [{"name": "think", "chat_template_kwargs": {"thinking": True}},
             {"name": "direct"}]  # the dataset's arguments
    found = findings(validate_run(plant(tmp_path, records, modes=modes,
                                        kwargs={"thinking": False})))
    assert [e.line for e in found["reasoning_unclosed"].examples] == [2]
    assert {n: (m.count, m.records) for n, m in found["mode_mismatch"].modes.items()} == {
        "direct": (0, 1), "think": (1, 2)}


def test_a_lenient_threshold_keeps_it_a_warning(tmp_path: Path) -> None:
    lenient = Thresholds(mode_mismatch_error_rate=0.5)
    assert findings(validate_run(mixed(tmp_path), thresholds=lenient))[
        "mode_mismatch"].severity == "warning"


def test_one_mode_over_its_rate_is_an_error_though_the_dataset_is_under(tmp_path: Path) -> None:
    records = [record(i, REASONED, "think") for i in range(60)]
    records += [record(100, ANSWERED, "direct"), record(101, [7, TE, 8, END], "direct")]
    found = findings(validate_run(plant(tmp_path, records)))["mode_mismatch"]
    assert found.rate == pytest.approx(1 / 62) and found.rate < 0.02
    assert found.severity == "error" and found.modes["direct"].rate == 0.5


def test_records_without_a_mode_are_never_mode_mismatch() -> None:
    checker = RecordChecker(KIMI, modes={"think": True, "direct": False})
    assert checker.failures(row_of(record(0, [7, TE, 8, END], None))) == set()
    assert checker.failures(row_of(record(0, [7, 8, END], None))) == {"reasoning_unclosed"}
    assert checker.failures(row_of(record(0, [7, TE, 8, END], "direct"))) == {"mode_mismatch"}
    assert checker.failures(row_of(record(0, [END], "think"))) == {"empty_output"}
    assert checker.failures(row_of(record(0, [7, 8], "think", finish="abort"))) == {"aborted"}


def test_a_turn_is_named_in_the_detail() -> None:
    checker = RecordChecker(KIMI, modes={"think": True, "direct": False})
    problems = dict(checker.problems(row_of(record(3, [7, TE, 8, END], "direct", turn=1))))
    assert problems["mode_mismatch"].startswith("sample_id 3 turn 1: mode 'direct' switched")


def test_a_dataset_without_modes_is_checked_as_before() -> None:
    plain, with_none = RecordChecker(KIMI), RecordChecker(KIMI, modes={})
    assert (plain.think_facts, plain.splits) == (True, True)
    off = RecordChecker(KIMI, reasoning=False)
    assert (off.think_facts, off.splits) == (False, False)
    rows = [row_of(record(i, ids, None)) for i, ids in enumerate(
        [REASONED, ANSWERED, [TS, 1, TE, 2, END], [1, TE, 2, TE, END]])]
    assert plain.check_rows(rows) == with_none.check_rows(rows)
    assert off.check_rows(rows) == [[], [], [], []]


# --- the split and the cache -------------------------------------------------------------------


def test_the_scan_splits_each_record_by_its_mode(tmp_path: Path) -> None:
    columns = scan_run(mixed(tmp_path), workers=1).files["ds"].columns
    split = list(zip(columns.mode, columns.reasoning_tokens, columns.answer_tokens, columns.closed,
                     strict=True))
    assert split[0] == ("think", 2, 2, True)
    assert split[4] == ("think", 3, 0, False)
    assert split[6] == ("direct", 0, 3, None)
    assert split[9] == ("direct", 0, 3, None)  # the think-end id it held is answer
    assert split[11] == (None, 3, 0, False)  # the dataset's arguments: thinking on
    assert [bool(f & rule_bit("mode_mismatch")) for f in columns.failed] == [
        False] * 4 + [True, False] + [False] * 3 + [True, True, False]


def test_a_changed_mode_is_not_read_from_the_cache(tmp_path: Path) -> None:
    out = mixed(tmp_path)
    assert findings(validate_run(out))["mode_mismatch"].count == 3
    flipped = [{**MODES[0]}, {**MODES[1], "chat_template_kwargs": {"thinking": True}}]
    manifest = json.loads((out / "run.json").read_text())
    manifest["datasets"]["ds"]["modes"] = flipped
    (out / "run.json").write_text(json.dumps(manifest))
    found = findings(validate_run(out))
    assert {n: m.count for n, m in found["mode_mismatch"].modes.items()} == {
        "direct": 4, "think": 1}  # direct's replies but the one with a think-end id


def test_a_record_shown_in_full_follows_its_mode(tmp_path: Path) -> None:
    out = mixed(tmp_path)
    direct = record_detail(out, "ds", 10)
    assert (direct.mode, direct.reasoning) == ("direct", None)
    assert direct.answer == "7 </think> 201 <end>"
    assert [rule for rule, _ in direct.findings] == ["mode_mismatch"]
    think = record_detail(out, "ds", 1)
    assert think.mode == "think" and think.reasoning == "101 102 </think>"


# --- turn prompts rendered with each conversation's mode ---------------------------------------


@pytest.mark.integration
def test_turn_prompts_render_with_each_conversations_mode(tmp_path: Path,
                                                          shared_sim: ServerProcess) -> None:
    rows = tool_turn_rows(tmp_path, 16)
    modes = [{"name": "on", "chat_template_kwargs": {"thinking": True}},
             {"name": "off", "chat_template_kwargs": {"thinking": False}}]
    out = generate_run(tmp_path, [{"name": "t", "path": str(rows), "input": "messages",
                                   "turns": "each", "modes": modes}], shared_sim)
    records = jsonl(out / "t" / "raw_responses.jsonl")
    assert {r["mode"] for r in records if r["turn"] > 0} == {"on", "off"}
    report = validate_run(out, workers=1, cache=False)
    assert report.notes == []
    found = {f.rule: f for f in report.datasets["t"].findings}
    assert "turn_prompt_mismatch" not in found
    assert "mode_mismatch" not in found and "reasoning_unclosed" not in found
    columns = scan_run(out, workers=1).files["t"].columns
    off = [closed for mode, closed in zip(columns.mode, columns.closed, strict=True)
           if mode == "off"]
    assert off and all(closed is None for closed in off)
