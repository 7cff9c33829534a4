"""validate's turn_prompt_mismatch (each turn's prompt against the rendering of its history)
and turn-aware scores, on a small run of conversations regenerated turn by turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import generate_run, jsonl, tool_turn_rows

from workbench.analyze.findings import ValidationReport
from workbench.analyze.score import load_scores, score_run
from workbench.analyze.turn_prompts import describe_difference
from workbench.analyze.validate import format_report, validate_run
from workbench.server.launch import ServerProcess
from workbench.sim import SimConfig, create_app

pytestmark = pytest.mark.integration

RULE = "turn_prompt_mismatch"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    """24 tool-calling conversations (turns: each), their data file inside the base folder."""
    base = tmp_path_factory.mktemp("turn-prompts")
    data = tool_turn_rows(base, 24)
    return generate_run(base, [{"name": "tools", "path": str(data), "input": "messages",
                                "turns": "each", "chat_template_kwargs": {"thinking": True}}],
                        shared_sim)


@pytest.fixture
def out(generated: Path, tmp_path: Path) -> Path:
    """A fresh copy of the run (tests change it), its data file beside it in run.json."""
    copy = Path(shutil.copytree(generated, tmp_path / "out"))
    data = Path(shutil.copy(generated.parent / "tool_turns.jsonl", tmp_path / "data.jsonl"))
    set_setting(copy, "path", str(data))
    return copy


def set_setting(out: Path, key: str, value: Any) -> None:
    manifest = json.loads((out / "run.json").read_text())
    manifest["datasets"]["tools"][key] = value
    (out / "run.json").write_text(json.dumps(manifest))


def findings(report: ValidationReport, rule: str = RULE) -> list[Any]:
    return [f for f in report.datasets["tools"].findings if f.rule == rule]


def test_every_turn_renders_to_the_prompt_it_was_sent(out: Path) -> None:
    report = validate_run(out, workers=1, cache=False)
    assert findings(report) == [] and report.notes == []
    assert "notes" not in report.to_builtins()
    turns = [r for r in jsonl(out / "tools" / "raw_responses.jsonl") if r["turn"] > 0]
    assert turns  # later turns were checked, not only the first


def test_a_changed_turn_prompt_is_an_error_naming_the_turn(out: Path) -> None:
    path = out / "tools" / "prompts.jsonl"
    prompts = jsonl(path)
    later = next(p for p in prompts if p["turn"] == 1)
    later["input_ids"][30] += 1
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    report = validate_run(out, workers=1, cache=False)
    [found] = findings(report)
    assert found.severity == "error" and found.count == 1 and not report.ok
    detail = found.examples[0].detail
    assert detail.startswith(f"sample_id {later['sample_id']!r} turn 1: ")
    assert "first difference at position 30" in detail
    assert RULE in format_report(report)


def test_a_data_row_that_changed_is_found(out: Path) -> None:
    data = Path(json.loads((out / "run.json").read_text())["datasets"]["tools"]["path"])
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    first = next(m for m in rows[0]["messages"] if m["role"] == "user")
    first["content"] += " Thanks."
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    [found] = findings(validate_run(out, workers=1, cache=False))
    assert found.count >= 1
    assert all(e.detail.startswith(f"sample_id {rows[0]['sample_id']!r} turn ")
               for e in found.examples)


@pytest.mark.parametrize("gone", ["tokenizer", "path"])
def test_without_its_tokenizer_or_data_the_rule_is_skipped_with_a_note(out: Path, gone: str) -> None:
    set_setting(out, gone, str(out / "moved-away"))
    report = validate_run(out, workers=1, cache=False)
    assert findings(report) == []
    [note] = report.notes
    assert note.startswith(f"tools: {RULE} not checked: ") and str(out / "moved-away") in note
    assert f"note: {note}" in format_report(report)
    assert report.to_builtins()["notes"] == [note]


def test_describe_difference_says_lengths_and_where() -> None:
    assert describe_difference([1, 2, 3], [1, 5, 3]) == (
        "sent 3 ids, the history renders to 3; first difference at position 1 (sent 5, "
        "rendered 2)")
    assert "they part at position 2" in describe_difference([1, 2], [1, 2, 9])


def test_scores_are_one_line_per_turn(out: Path) -> None:
    transport = httpx.ASGITransport(app=create_app(SimConfig(model_profile="kimi-k2.5")))
    summary = score_run(out, "http://sim", transport=transport)
    records = [r for r in jsonl(out / "tools" / "raw_responses.jsonl")
               if r["finish_reason"] in ("stop", "length") and r["output_ids"]]
    lines = jsonl(out / "tools" / "scores.jsonl")
    assert sorted((line["sample_id"], line["turn"]) for line in lines) == sorted(
        (r["sample_id"], r["turn"]) for r in records)
    assert summary.scored == len(records) and summary.failed == 0
    frame = load_scores(out / "tools")
    assert list(frame.columns) == ["sample_id", "nll", "entropy", "tokens", "turn"]
    assert len(frame) == len(records)
    again = score_run(out, "http://sim", transport=transport)
    assert again.scored == 0 and again.already == len(records)
