"""Reports of a simulator run with a dataset regenerated turn by turn (`turns: each`): the
token-distribution report's Conversations section says what `workbench stats --json` says and
draws it in Chromium; the format-validation examples name each turn record's turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from browser import open_page
from conftest import EXAMPLES, generate_run, workbench

from workbench.report.render import ReportResult, cell_data, run_report
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.integration

FIGURES = 10  # token_distribution's: 7, and the Conversations section's 3


@pytest.fixture(scope="module")
def turns_run(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    base = tmp_path_factory.mktemp("turns-report-run")
    return generate_run(base, [
        {"name": "tools", "path": str(EXAMPLES / "data/tool_turns.jsonl"), "input": "messages",
         "turns": "each", "max_samples": 40, "chat_template_kwargs": {"thinking": True}},
        {"name": "code", "path": str(EXAMPLES / "data/code_instruct.jsonl"), "input": "messages",
         "max_samples": 20},
    ], shared_sim)


@pytest.fixture(scope="module")
def reports(turns_run: Path) -> dict[str, ReportResult]:
    folder = turns_run.parent / "reports"
    return {name: run_report(name, None, {"run_dir": str(turns_run), **extra}, folder)
            for name, extra in (("token_distribution", {"sample_size": 200}),
                                ("format_validation", {"tokenizer": str(EXAMPLES / "tokenizer")}))}


def _stats_turns(out: Path) -> dict[str, Any]:
    done = workbench("stats", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["datasets"]["tools"]["turns"]  # type: ignore[no-any-return]


def test_conversations_section_says_what_stats_says(turns_run: Path, reports: dict[str, ReportResult]) -> None:
    expected = _stats_turns(turns_run)
    shown = cell_data(reports["token_distribution"].notebook_path, "conversations")
    assert shown["turn_datasets"] == ["tools"]
    (row,) = shown["summary"]
    assert (row["conversations"], row["turns"], row["max_turns"]) == (
        expected["conversations"], expected["turns"], expected["turns_per_conversation"]["max"])
    assert row["mean_turns"] == pytest.approx(expected["turns_per_conversation"]["mean"], abs=1e-3)
    assert row["ended_early"] == sum(expected["ended"].values())
    assert expected["turns_per_conversation"]["max"] > 1  # the run has conversations of several turns


def test_conversations_are_drawn_in_chromium(reports: dict[str, ReportResult], tmp_path: Path) -> None:
    page = open_page(reports["token_distribution"].html_path, screenshot=tmp_path / "page.png", evaluate={
        "graphs": "document.querySelectorAll('.plotly-graph-div').length",
        "drawn": "[...document.querySelectorAll('.plotly-graph-div')]"
                 ".filter(d => d.querySelector('svg.main-svg') && d.querySelector('g.trace')).length",
        "titles": "[...document.querySelectorAll('.gtitle')].map(t => t.textContent)",
        "text": "document.body.innerText",
    })
    assert page.errors == []
    assert page.values["graphs"] == page.values["drawn"] == FIGURES  # every figure has data
    for title in ("Turns per conversation", "Completion tokens by turn index",
                  "Conversations ended early, by reason"):
        assert title in page.values["titles"]
    assert "Conversations" in page.values["text"] and "turns per conversation" in page.values["text"]


def test_examples_name_the_turn_of_turn_records(reports: dict[str, ReportResult]) -> None:
    examples = cell_data(reports["format_validation"].notebook_path, "examples")
    tools = [row for row in examples if row["dataset"] == "tools"]
    assert tools, "the tools dataset has examples (near-duplicate replies at least)"
    assert all(isinstance(row["turn"], int) for row in tools if row["file"] == "raw_responses.jsonl")
    assert all(row["turn"] is None for row in examples if row["dataset"] == "code")
    html = Path(reports["format_validation"].html_path).read_text()
    assert "<th>sample_id</th><th>turn</th>" in html
