"""Stats and validate on a run whose conversations were regenerated turn by turn (one record
per generated assistant turn), next to a single-turn dataset whose figures stay as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.analyze.stats import collect_stats
from workbench.analyze.stats_text import format_stats_table, render_stats
from workbench.analyze.validate import format_report, validate_run
from workbench.rundir.records import PromptRecord, Record, encode_line

NOW = 1_750_000_000.0
TE, END = 163607, 163586
TURNS = {0: 2, 1: 3, 2: 1}  # conversation -> its generated turns


def reply(turn: int, tokens: int) -> list[int]:
    return [300 + turn] * (tokens - 3) + [TE, 302, END]


def prompt(sid: int, turn: int) -> list[int]:
    return [10 * sid + 1, 10 * sid + 2, 10 * sid + 3, 10 * sid + 4] + [5] * (3 * turn)


def turn_record(sid: int, turn: int, *, ended: str | None = None) -> Record:
    ids = reply(turn, 4 + turn)
    record = Record(sample_id=sid, output_ids=ids, prompt_tokens=len(prompt(sid, turn)),
                    completion_tokens=len(ids), cached_tokens=0, finish_reason="stop",
                    matched_stop=END, e2e_latency=1.0, ts=NOW - 10, turn=turn)
    if ended is not None:
        record.ended = ended
    return record


def single_record(sid: int) -> Record:
    ids = reply(0, 6)
    return Record(sample_id=sid, output_ids=ids, prompt_tokens=4, completion_tokens=len(ids),
                  cached_tokens=0, finish_reason="stop", matched_stop=END, e2e_latency=1.0,
                  ts=NOW - 10)


def write(folder: Path, records: list[Record], prompts: list[PromptRecord]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))
    (folder / "prompts.jsonl").write_bytes(b"".join(map(encode_line, prompts)))


def plant(out: Path, *, turns: bool = True, extra: tuple[Record, ...] = ()) -> Path:
    """The single-turn dataset "single" and (with `turns`) the conversations "conv": 3
    conversations of 2, 3 and 1 turns, the last one ended by a tool call of another name."""
    datasets: dict[str, Any] = {"single": {"input": "input_ids", "prompts": 3}}
    write(out / "single", [single_record(i) for i in range(3)],
          [PromptRecord(i, [1, 2, 3, 4]) for i in range(3)])
    if turns:
        records = [turn_record(sid, turn, ended="name_mismatch" if sid == 2 else None)
                   for sid, count in TURNS.items() for turn in range(count)]
        prompts = [PromptRecord(sid, prompt(sid, turn), turn=turn)
                   for sid, count in TURNS.items() for turn in range(count)]
        write(out / "conv", [*records, *extra], prompts)
        datasets["conv"] = {"input": "messages", "turns": "each", "prompts": 3}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": datasets}))
    return out


# --- stats -----------------------------------------------------------------------------------


def test_stats_count_conversations_turns_and_early_ends(tmp_path: Path) -> None:
    conv = collect_stats(plant(tmp_path / "run"), now=NOW).datasets["conv"]
    assert conv.records == 6
    turns = conv.turns
    assert turns is not None
    assert (turns.conversations, turns.turns, turns.max_turns) == (3, 6, 3)
    assert turns.mean_turns == 2.0
    assert turns.by_turn == ((0, 3, 12), (1, 2, 10), (2, 1, 6))
    assert dict(turns.ended) == {"name_mismatch": 1}
    assert conv.to_dict()["turns"] == {
        "conversations": 3, "turns": 6, "turns_per_conversation": {"mean": 2.0, "max": 3},
        "by_turn": [{"turn": 0, "records": 3, "completion_tokens": 12},
                    {"turn": 1, "records": 2, "completion_tokens": 10},
                    {"turn": 2, "records": 1, "completion_tokens": 6}],
        "ended": {"name_mismatch": 1}}


def test_stats_text_shows_turns_only_for_the_turns_dataset(tmp_path: Path) -> None:
    text = format_stats_table(collect_stats(plant(tmp_path / "run"), now=NOW))
    assert "conv: 3 conversations, 6 turns (2.00 per conversation, max 3)" in text
    assert "conv: conversations ended early: name_mismatch 1" in text
    table = text.split("conversations, 6 turns")[1].splitlines()[1:5]
    assert [line.split() for line in table] == [
        ["turn", "records", "completion", "tok"], ["0", "3", "12"], ["1", "2", "10"],
        ["2", "1", "6"]]
    assert "single: " not in text.split("rates over the last")[1]


def test_a_single_turn_dataset_reads_as_before(tmp_path: Path) -> None:
    alone = collect_stats(plant(tmp_path / "alone", turns=False), now=NOW)
    mixed = collect_stats(plant(tmp_path / "mixed"), now=NOW)
    assert "turns" not in alone.datasets["single"].to_dict()
    def figures(stats: Any) -> dict[str, Any]:
        return {k: v for k, v in stats.datasets["single"].to_dict().items() if k != "last_write"}

    assert figures(alone) == figures(mixed)
    assert "turns" not in alone.total.to_dict()
    assert "conversations" not in render_stats(tmp_path / "alone", now=NOW)
    assert "turns" not in json.loads(render_stats(tmp_path / "alone", as_json=True, now=NOW))[
        "datasets"]["single"]


def test_stats_from_a_scan_count_the_same_turns(tmp_path: Path) -> None:
    from workbench.analyze.scan import scan_run

    run = plant(tmp_path / "run")
    scanned = collect_stats(run, now=NOW, scan=scan_run(run, workers=1))
    assert scanned.datasets["conv"].turns == collect_stats(run, now=NOW).datasets["conv"].turns


# --- validate --------------------------------------------------------------------------------


def rules(report: Any, name: str) -> dict[str, Any]:
    return {f.rule: f for f in report.datasets[name].findings}


def test_turns_of_one_conversation_are_no_duplicates(tmp_path: Path) -> None:
    report = validate_run(plant(tmp_path / "run"), workers=1)
    assert report.ok
    assert not {"duplicate_sample_id", "orphan_response", "missing_response",
                "missing_turn"} & set(rules(report, "conv"))
    assert report.datasets["conv"].records == 6 and report.datasets["conv"].prompts == 6


def test_the_same_turn_twice_is_a_duplicate_named_by_its_turn(tmp_path: Path) -> None:
    report = validate_run(plant(tmp_path / "run", extra=(turn_record(1, 1),)), workers=1)
    duplicate = rules(report, "conv")["duplicate_sample_id"]
    assert duplicate.count == 1
    assert duplicate.examples[0].line == 7
    assert duplicate.examples[0].detail == "sample_id 1 turn 1 also at line 4"


def test_a_gap_in_a_conversations_turns_is_named(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    raw = run / "conv" / "raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    raw.write_bytes(b"".join(lines[:3] + lines[4:]))  # conversation 1 without its turn 1
    report = validate_run(run, workers=1)
    gap = rules(report, "conv")["missing_turn"]
    assert (gap.count, gap.severity) == (1, "warning")
    assert gap.examples[0].line == 4
    assert gap.examples[0].detail == "sample_id 1: turn 2 present, turn 1 missing"
    missing = rules(report, "conv")["missing_response"]
    assert missing.examples[0].detail == "sample_id 1 turn 1: prepared prompt without a record"
    assert "missing_turn" in format_report(report)


def test_examples_of_turn_records_name_sample_id_and_turn(tmp_path: Path) -> None:
    cut = turn_record(1, 2)
    cut.finish_reason, cut.matched_stop = "length", None
    run = plant(tmp_path / "run")
    raw = run / "conv" / "raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    lines[4] = encode_line(cut)
    raw.write_bytes(b"".join(lines))
    truncated = rules(validate_run(run, workers=1), "conv")["truncated"]
    assert truncated.examples[0].line == 5
    assert truncated.examples[0].detail.startswith("sample_id 1 turn 2: ")


def test_an_orphan_turn_is_named_by_its_turn(tmp_path: Path) -> None:
    report = validate_run(plant(tmp_path / "run", extra=(turn_record(2, 1),)), workers=1)
    orphan = rules(report, "conv")["orphan_response"]
    assert orphan.examples[0].detail == "sample_id 2 turn 1 is not a prepared prompt"


def test_single_turn_findings_keep_their_details(tmp_path: Path) -> None:
    run = plant(tmp_path / "run", turns=False)
    raw = run / "single" / "raw_responses.jsonl"
    raw.write_bytes(raw.read_bytes() + encode_line(single_record(1)) + encode_line(
        single_record(7)))
    found = rules(validate_run(run, workers=1), "single")
    assert found["duplicate_sample_id"].examples[0].detail == "sample_id 1 also at line 2"
    assert found["orphan_response"].examples[0].detail == "sample_id 7 is not a prepared prompt"
    assert "missing_turn" not in found
