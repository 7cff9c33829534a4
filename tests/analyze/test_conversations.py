"""The frames of a run with a dataset regenerated turn by turn (`turns: each`): the record
frame, the examples, the samples and the opened record carry each record's turn; a
single-turn run's frames stay as they were (its turn and ended NA, no turn column among the
examples); the conversation frames count as `workbench stats` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from workbench.analyze import explore
from workbench.analyze.scan import scan_run
from workbench.analyze.stats import collect_stats
from workbench.rundir.records import PromptRecord, Record, encode_line

TS = 1_750_000_000.0
TE, END = 163607, 163586
TURNS = {0: 2, 1: 3, 2: 1}  # conversation -> its generated turns; conversation 2 ended early


def _record(sid: Any, tokens: int, *, turn: int | None = None, ended: str | None = None) -> Record:
    ids = [300] * (tokens - 3) + [TE, 302, END]
    record = Record(sample_id=sid, output_ids=ids, prompt_tokens=4, completion_tokens=len(ids),
                    cached_tokens=0, finish_reason="stop", matched_stop=END, e2e_latency=1.0,
                    ts=TS)
    if turn is not None:
        record.turn = turn
    if ended is not None:
        record.ended = ended
    return record


def _write(folder: Path, records: list[Record], prompts: list[PromptRecord]) -> None:
    folder.mkdir(parents=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))
    (folder / "prompts.jsonl").write_bytes(b"".join(map(encode_line, prompts)))


def plant(out: Path, *, turns: bool = True) -> Path:
    """"single": 3 prompts, their records and an orphan record (sample 7); with `turns`,
    "conv": the conversations of TURNS, an orphan turn (sample 9, turn 0) and a prompt
    without a record (sample 5, turn 0)."""
    datasets: dict[str, Any] = {"single": {"input": "input_ids", "prompts": 3}}
    _write(out / "single", [*(_record(i, 6) for i in range(3)), _record(7, 6)],
           [PromptRecord(i, [1, 2, 3, 4]) for i in range(3)])
    if turns:
        records = [_record(sid, 4 + turn, turn=turn,
                           ended="name_mismatch" if sid == 2 and turn == count - 1 else None)
                   for sid, count in TURNS.items() for turn in range(count)]
        prompts = [PromptRecord(sid, [sid, turn, 1, 2], turn=turn)
                   for sid, count in TURNS.items() for turn in range(count)]
        _write(out / "conv", [*records, _record(9, 5, turn=0)],
               [*prompts, PromptRecord(5, [5, 0, 1, 2], turn=0)])
        datasets["conv"] = {"input": "messages", "turns": "each", "prompts": 4}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": datasets}))
    return out


def test_the_record_frame_carries_turn_and_ended(tmp_path: Path) -> None:
    frame = explore.record_frame(plant(tmp_path / "out"))
    columns = list(frame.columns)
    assert columns[columns.index("sample_id") + 1: columns.index("sample_id") + 3] == ["turn", "ended"]
    assert str(frame["turn"].dtype) == "Int64" and str(frame["ended"].dtype) == "string"
    conv = frame[frame["dataset"] == "conv"]
    assert conv["turn"].tolist() == [0, 1, 0, 1, 2, 0, 0]
    assert conv["ended"].dropna().tolist() == ["name_mismatch"]
    assert conv.loc[conv["ended"].notna(), "sample_id"].tolist() == [2]
    single = frame[frame["dataset"] == "single"]
    assert single["turn"].isna().all() and single["ended"].isna().all()
    assert list(frame.columns) == [*explore.RECORD_COLUMNS, "time"]


def test_examples_samples_and_details_name_the_turn(tmp_path: Path) -> None:
    scan = scan_run(plant(tmp_path / "out"))
    examples = explore.examples_table(scan)
    columns = list(examples.columns)
    assert columns[columns.index("sample_id") + 1] == "turn" and str(examples["turn"].dtype) == "Int64"
    conv = examples[examples["dataset"] == "conv"].set_index("file")
    assert conv.loc["raw_responses.jsonl", ["sample_id", "turn"]].tolist() == [9, 0]  # orphan turn
    assert conv.loc["prompts.jsonl", ["sample_id", "turn"]].tolist() == [5, 0]  # never answered
    assert examples[examples["dataset"] == "single"]["turn"].isna().all()
    frame = explore.record_frame(scan)
    shown = explore.samples(scan, frame, n=len(frame))
    assert {(s.dataset, s.line): s.turn for s in shown} == {
        (str(d), int(line)): None if pd.isna(t) else int(t)
        for d, line, t in zip(frame["dataset"], frame["line"], frame["turn"], strict=True)}
    assert explore.record_detail(scan, "conv", 5).turn == 2
    assert explore.record_detail(scan, "single", 1).turn is None


def test_a_single_turn_run_has_no_turn_among_its_examples(tmp_path: Path) -> None:
    scan = scan_run(plant(tmp_path / "out", turns=False))
    examples = explore.examples_table(scan)
    assert not examples.empty and "turn" not in examples.columns
    assert list(examples.columns) == ["dataset", "rule", "severity", "file", "line", "detail",
                                      "sample_id", "finish_reason", "completion_tokens", "excerpt"]
    frame = explore.record_frame(scan)
    assert frame["turn"].isna().all() and frame["ended"].isna().all()
    assert explore.conversation_frames(scan).empty


def test_the_conversation_frames_count_as_stats_does(tmp_path: Path) -> None:
    run = plant(tmp_path / "out")
    conversations = explore.conversation_frames(scan_run(run))
    stats = collect_stats(run).datasets["conv"].turns
    assert stats is not None and conversations.turn_datasets == ("conv",)
    summary = conversations.summary.iloc[0]
    assert (summary["conversations"], summary["turns"], summary["max_turns"]) == (
        stats.conversations, stats.turns, stats.max_turns) == (4, 7, 3)
    assert summary["mean_turns"] == pytest.approx(stats.mean_turns)
    by_turn = conversations.turn_tokens
    assert list(zip(by_turn["turn"], by_turn["records"], by_turn["completion_tokens"],
                    strict=True)) == list(stats.by_turn)
    assert dict(zip(conversations.ended["reason"], conversations.ended["conversations"],
                    strict=True)) == dict(stats.ended) == {"name_mismatch": 1}
