"""Export of conversations regenerated turn by turn: one row per generated turn, its prompt
joined by (sample_id, turn); a single-turn dataset beside it exported as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.errors import DataError
from workbench.export.exporter import export_run
from workbench.export.options import ExportOptions
from workbench.rundir.records import PromptRecord, Record, encode_line

TE, END = 163607, 163586
TURNS = {0: 2, 1: 3, 2: 1}  # conversation -> its generated turns


def reply(sid: int, turn: int) -> list[int]:
    return [400 + 10 * sid + turn, 301, TE, 302, END]


def prompt(sid: int, turn: int) -> list[int]:
    """A turn's prompt: the conversation so far (the earlier replies in it)."""
    ids = [10 * sid + 1, 10 * sid + 2]
    for earlier in range(turn):
        ids += [*reply(sid, earlier), 7]
    return ids


def turn_record(sid: int, turn: int, ended: str | None = None) -> Record:
    ids = reply(sid, turn)
    record = Record(sample_id=sid, output_ids=ids, prompt_tokens=len(prompt(sid, turn)),
                    completion_tokens=len(ids), cached_tokens=0, finish_reason="stop",
                    matched_stop=END, e2e_latency=1.0, ts=1.75e9, turn=turn)
    if ended is not None:
        record.ended = ended
    return record


def single_record(sid: int) -> Record:
    return Record(sample_id=sid, output_ids=[5, TE, 6, END], prompt_tokens=2,
                  completion_tokens=4, cached_tokens=0, finish_reason="stop", matched_stop=END,
                  e2e_latency=1.0, ts=1.75e9)


def write(folder: Path, records: list[Record], prompts: list[PromptRecord]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))
    (folder / "prompts.jsonl").write_bytes(b"".join(map(encode_line, prompts)))


def plant(out: Path, *, turns: bool = True, extra: tuple[Record, ...] = ()) -> Path:
    """The single-turn dataset "single" and (with `turns`) "conv": 3 conversations of 2, 3
    and 1 turns (the last ended by a tool call of another name); prompts in another order
    than the records, so the join is by key."""
    datasets: dict[str, Any] = {"single": {"input": "input_ids"}}
    write(out / "single", [single_record(i) for i in range(2)],
          [PromptRecord(i, [90 + i, 91]) for i in range(2)])
    if turns:
        records = [turn_record(sid, turn, "name_mismatch" if sid == 2 else None)
                   for sid, count in TURNS.items() for turn in range(count)]
        prompts = [PromptRecord(sid, prompt(sid, turn), turn=turn)
                   for turn in range(3) for sid, count in TURNS.items() if turn < count]
        write(out / "conv", [*records, *extra], prompts)
        datasets["conv"] = {"input": "messages", "turns": "each"}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": datasets}))
    return out


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


SINGLE_LINES = (b'{"id":"single/0","dataset":"single","input_ids":[90,91,5,163607,6,163586],'
                b'"loss_mask":[0,0,1,1,1,1]}\n'
                b'{"id":"single/1","dataset":"single","input_ids":[91,91,5,163607,6,163586],'
                b'"loss_mask":[0,0,1,1,1,1]}\n')


def test_one_row_per_turn_its_prompt_then_its_reply(tmp_path: Path) -> None:
    summary = export_run(plant(tmp_path / "run"), tmp_path / "out.jsonl")
    got = [row for row in rows(tmp_path / "out.jsonl") if row["dataset"] == "conv"]
    assert [(row["id"], row["turn"]) for row in got] == [
        ("conv/0", 0), ("conv/0", 1), ("conv/1", 0), ("conv/1", 1), ("conv/1", 2), ("conv/2", 0)]
    for row in got:
        sid, turn = int(row["id"].split("/")[1]), row["turn"]
        assert list(row) == ["id", "turn", "dataset", "input_ids", "loss_mask"]
        assert row["input_ids"] == prompt(sid, turn) + reply(sid, turn)
        assert row["loss_mask"] == [0] * len(prompt(sid, turn)) + [1] * 5
    assert summary.datasets["conv"].written == 6 and summary.datasets["conv"].dropped == {}


def test_single_turn_rows_keep_their_bytes(tmp_path: Path) -> None:
    export_run(plant(tmp_path / "alone", turns=False), tmp_path / "alone.jsonl")
    assert (tmp_path / "alone.jsonl").read_bytes() == SINGLE_LINES
    export_run(plant(tmp_path / "mixed"), tmp_path / "mixed.jsonl")
    assert (tmp_path / "mixed.jsonl").read_bytes().startswith(SINGLE_LINES)


def test_the_same_turn_twice_keeps_the_first(tmp_path: Path) -> None:
    again = turn_record(1, 1)
    again.output_ids = [9, END]
    summary = export_run(plant(tmp_path / "run", extra=(again, turn_record(2, 1))),
                         tmp_path / "out.jsonl", ExportOptions(only=("conv",)))
    got = rows(tmp_path / "out.jsonl")
    assert len(got) == 6
    assert got[3]["input_ids"][-5:] == reply(1, 1)
    assert summary.datasets["conv"].dropped == {"duplicate_sample_id": 1, "orphan_response": 1}


def test_parquet_has_a_turn_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run = plant(tmp_path / "run")
    export_run(run, tmp_path / "out.jsonl")
    export_run(run, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "turn", "dataset", "input_ids", "loss_mask"]
    assert table.to_pylist() == [{"turn": None, **row} for row in rows(tmp_path / "out.jsonl")]


def test_single_turn_parquet_has_no_turn_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    export_run(plant(tmp_path / "run", turns=False), tmp_path / "out.parquet")
    assert pq.read_table(tmp_path / "out.parquet").column_names == [
        "id", "dataset", "input_ids", "loss_mask"]


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_a_trainers_rows_and_manifest_name_the_turn(tmp_path: Path, trainer: str) -> None:
    export_run(plant(tmp_path / "run"), tmp_path / "out.jsonl", ExportOptions(trainer=trainer))
    got = rows(tmp_path / "out.jsonl")
    assert all(list(row) == ["input_ids", "loss_mask"] for row in got)
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["row_fields"] == ["id", "dataset", "prompt", "total", "digest", "turn"]
    named = [(row[0], row[5]) for row in manifest["rows"]]
    assert named[:2] == [("single/0", None), ("single/1", None)]
    assert named[2:] == [("conv/0", 0), ("conv/0", 1), ("conv/1", 0), ("conv/1", 1),
                         ("conv/1", 2), ("conv/2", 0)]
    assert got[3]["input_ids"] == prompt(0, 1) + reply(0, 1)


def test_a_single_turn_trainer_manifest_names_no_turn(tmp_path: Path) -> None:
    export_run(plant(tmp_path / "run", turns=False), tmp_path / "out.jsonl",
               ExportOptions(trainer="specforge"))
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["row_fields"] == ["id", "dataset", "prompt", "total", "digest"]
    assert all(len(row) == 5 for row in manifest["rows"])


def test_conversations_of_a_turns_dataset_need_its_data_file(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        export_run(plant(tmp_path / "run"), tmp_path / "out.jsonl",
                   ExportOptions(format="conversations", only=("conv",)))
    assert "run.json names no data file for dataset conv" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_a_trainers_rows_of_turns_only_name_conversation_and_turn(tmp_path: Path,
                                                                  trainer: str) -> None:
    export_run(plant(tmp_path / "run"), tmp_path / "out.jsonl",
               ExportOptions(trainer=trainer, only=("conv",)))
    got = rows(tmp_path / "out.jsonl")
    assert all(list(row) == ["id", "turn", "input_ids", "loss_mask"] for row in got)
    assert [(row["id"], row["turn"]) for row in got][:3] == [("conv/0", 0), ("conv/0", 1),
                                                             ("conv/1", 0)]
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["fields"] == ["id", "turn", "input_ids", "loss_mask"]
