"""Conversations regenerated turn by turn exported as conversations: one row per
conversation, the history the model lived then its last turn, on a run made on the
simulator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, generate_run, jsonl, tool_turn_rows

from workbench.chat import parse_messages
from workbench.chat.render import render_turn
from workbench.errors import DataError
from workbench.export.exporter import export_run
from workbench.export.options import ExportOptions
from workbench.server.launch import ServerProcess
from workbench.tokenizer import load_tokenizer

pytestmark = pytest.mark.integration

KWARGS = {"thinking": True}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    base = tmp_path_factory.mktemp("threads")
    data = tool_turn_rows(base, 30)
    return generate_run(base, [{"name": "tools", "path": str(data), "input": "messages",
                                "turns": "each", "chat_template_kwargs": KWARGS}], shared_sim)


@pytest.fixture
def out(generated: Path, tmp_path: Path) -> Path:
    """A fresh copy of the run, its own data file named in run.json (tests change both)."""
    copy = Path(shutil.copytree(generated, tmp_path / "out"))
    data = Path(shutil.copy(generated.parent / "tool_turns.jsonl", tmp_path / "data.jsonl"))
    manifest = json.loads((copy / "run.json").read_text())
    manifest["datasets"]["tools"]["path"] = str(data)
    (copy / "run.json").write_text(json.dumps(manifest))
    return copy


def export(out: Path, target: Path, **options: Any) -> Any:
    return export_run(out, target, ExportOptions(format="conversations", **options))


def records(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["sample_id"], r["turn"]): r for r in jsonl(out / "tools" / "raw_responses.jsonl")}


def prompts(out: Path) -> dict[tuple[str, int], list[int]]:
    return {(p["sample_id"], p["turn"]): p["input_ids"]
            for p in jsonl(out / "tools" / "prompts.jsonl")}


def data_rows(out: Path) -> dict[str, dict[str, Any]]:
    path = json.loads((out / "run.json").read_text())["datasets"]["tools"]["path"]
    return {row["sample_id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_one_row_per_conversation_the_history_it_lived_then_its_last_turn(out: Path,
                                                                          tmp_path: Path) -> None:
    summary = export(out, tmp_path / "conv.jsonl", reasoning="field")
    rows = jsonl(tmp_path / "conv.jsonl")
    found, sent, data = records(out), prompts(out), data_rows(out)
    truncated = {sid for (sid, _), r in found.items() if r["finish_reason"] == "length"}
    turns = {sid: sum(1 for key in found if key[0] == sid) for sid, _ in found}
    assert {row["id"] for row in rows} == {f"tools/{sid}" for sid in turns
                                           if not (sid in truncated and turns[sid] == 1)}
    tokenizer = load_tokenizer(EXAMPLES / "tokenizer")
    for row in rows:
        sid = row["id"].split("/", 1)[1]
        assert list(row)[:3] == ["id", "turns", "dataset"]
        assert row["turns"] == turns[sid] - (sid in truncated)
        assert row["tools"] == data[sid]["tools"]
        *history, last = row["conversations"]
        assert last["role"] == "assistant" and "reasoning_content" in last
        assert sum(m["role"] == "assistant" for m in row["conversations"]) == row["turns"]
        chat = parse_messages(data[sid]["messages"], data[sid].get("tools"))
        assert render_turn(tokenizer, chat, history, KWARGS) == sent[sid, row["turns"] - 1]
    assert summary.rows == len(rows) and summary.datasets["tools"].written == len(rows)
    assert summary.datasets["tools"].dropped.get("truncated", 0) == len(truncated)
    assert 0 < (summary.datasets["tools"].exact or 0) <= len(rows)


def test_truncated_last_turns_are_kept_on_request(out: Path, tmp_path: Path) -> None:
    kept = export(out, tmp_path / "kept.jsonl", keep_truncated=True)
    total = len({sid for sid, _ in records(out)})
    assert kept.rows == total and "truncated" not in kept.datasets["tools"].dropped


def test_inline_reasoning_goes_into_every_assistant_turn(out: Path, tmp_path: Path) -> None:
    export(out, tmp_path / "inline.jsonl", reasoning="inline")
    assistants = [m for row in jsonl(tmp_path / "inline.jsonl") for m in row["conversations"]
                  if m["role"] == "assistant"]
    assert assistants and all("reasoning_content" not in m for m in assistants)
    assert all(m["content"].startswith("<think>") for m in assistants)


def test_limit_and_shuffle_count_conversations(out: Path, tmp_path: Path) -> None:
    first = export(out, tmp_path / "first.jsonl", limit=3)
    drawn = export(out, tmp_path / "drawn.jsonl", limit=3, shuffle=True, seed=1)
    assert first.rows == drawn.rows == 3
    full = export(out, tmp_path / "all.jsonl")
    every = sum(row["turns"] for row in jsonl(tmp_path / "all.jsonl"))
    for summary, name in ((first, "first"), (drawn, "drawn")):
        written = sum(row["turns"] for row in jsonl(tmp_path / f"{name}.jsonl"))
        assert summary.datasets["tools"].dropped["limit"] == every - written
    assert [row["id"] for row in jsonl(tmp_path / "first.jsonl")] == [
        row["id"] for row in jsonl(tmp_path / "all.jsonl")][:3]
    assert full.rows > 3


def test_a_turn_dropped_cuts_its_conversation_there(out: Path, tmp_path: Path) -> None:
    found = records(out)
    sid = next(sid for sid, turn in found if turn == 1 and (sid, 2) in found)
    raw = out / "tools" / "raw_responses.jsonl"
    lines = [r for r in jsonl(raw) if (r["sample_id"], r["turn"]) != (sid, 1)]
    raw.write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = export(out, tmp_path / "cut.jsonl", keep_truncated=True)
    [row] = [row for row in jsonl(tmp_path / "cut.jsonl") if row["id"] == f"tools/{sid}"]
    assert row["turns"] == 1
    later = sum(1 for s, turn in found if s == sid and turn > 1)
    assert summary.datasets["tools"].dropped["earlier_turn_dropped"] == later


def test_a_data_file_gone_or_changed_is_one_line_naming_it(out: Path, tmp_path: Path) -> None:
    path = Path(json.loads((out / "run.json").read_text())["datasets"]["tools"]["path"])
    text = path.read_text()
    path.unlink()
    with pytest.raises(DataError) as gone:
        export(out, tmp_path / "gone.jsonl")
    assert str(path) in str(gone.value) and "not found" in str(gone.value)
    rows = [json.loads(line) for line in text.splitlines()]
    for row in rows:
        next(m for m in row["messages"] if m["role"] == "user")["content"] += " Thanks."
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as changed:
        export(out, tmp_path / "changed.jsonl")
    message = str(changed.value)
    assert message.startswith(str(path)) and "changed since the run" in message
    assert "\n" not in message and "\n" not in str(gone.value)
    assert not (tmp_path / "gone.jsonl").exists() and not (tmp_path / "changed.jsonl").exists()
