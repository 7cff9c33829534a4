"""The monitor on a dataset regenerated turn by turn (`turns: each`): its row counts turns
against run.json's target_turns, one line says its conversations, turns per conversation and
early ends by reason, at any width from 60 columns (and in a real terminal); single-turn
datasets are drawn as before."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_until
from test_monitor import NOW, flat, plant, row, state_of
from test_monitor_truth import Tmux, rich_lines, tmux  # noqa: F401  (tmux: the fixture)

from workbench.analyze.stats import StatsCollector
from workbench.watch.alerts import build_state
from workbench.watch.render import render_frame
from workbench.watch.turns import conversation_lines

TOOLS = "tools_multi_turn_function_calls"  # long: cut on a narrow terminal
# conversation -> turns, why it ended after its last turn
CONVERSATIONS = {0: (3, None), 1: (1, "no_call"), 2: (2, "more_calls"), 3: (1, "no_call"),
                 4: (1, "truncated"), 5: (2, None)}
TURNS = sum(n for n, _ in CONVERSATIONS.values())  # 10


def turn_records() -> list[dict[str, Any]]:
    records, at = [], NOW - 2 * TURNS
    for sid, (count, ended) in CONVERSATIONS.items():
        for turn in range(count):
            record = {**flat(sid, 100 + 10 * turn, ts=at), "turn": turn}
            if ended is not None and turn == count - 1:
                record["ended"] = ended
            records.append(record)
            at += 2
    return records


def turns_run(out: Path, waiting: bool = False) -> None:
    """TOOLS (turns: each, 10 turns written of 14 targeted), "single" (one reply a prompt),
    and with `waiting` a turns dataset with nothing written yet."""
    plant(out, TOOLS, turn_records(), written=NOW - 1)
    plant(out, "single", [flat(i, 300, ts=NOW - 2 * i) for i in range(6)], written=NOW - 1)
    datasets: dict[str, Any] = {
        TOOLS: {"prompts": 6, "max_samples": None, "max_tokens": None, "turns": "each",
                "target_turns": 14},
        "single": {"prompts": 20, "max_samples": None, "max_tokens": None, "turns": "last",
                   "target_turns": None},
    }
    if waiting:
        plant(out, "later", [], written=NOW - 60)
        datasets["later"] = {"prompts": 5, "max_samples": None, "max_tokens": None, "turns": "each",
                             "target_turns": 5}
    (out / "run.json").write_text(json.dumps({"updated": NOW - 600, "datasets": datasets}))


def test_a_turns_dataset_counts_turns_and_says_its_conversations(tmp_path: Path) -> None:
    turns_run(tmp_path)
    frame = render_frame(state_of(tmp_path))
    assert row(frame, TOOLS)[1:3] == ["running", "10/14 turns"]
    assert row(frame, "single")[1:3] == ["running", "6/20"]  # unchanged
    assert row(frame, "total")[2] == "16/34"
    (line,) = [line for line in frame.splitlines() if line.startswith(f"{TOOLS}:")]
    assert line == (f"{TOOLS}: 6 conversations, 1.67 turns each (max 3); ended early 4 "
                    "(no_call 2, more_calls 1, truncated 1)")
    lines = frame.splitlines()
    assert lines.index(line) == lines.index(next(x for x in lines if x.startswith("total "))) + 1
    assert not any(x.startswith("single:") for x in lines)


def test_a_run_without_turns_has_no_conversation_line(tmp_path: Path) -> None:
    plant(tmp_path, "single", [flat(i, 300, ts=NOW - 2 * i) for i in range(6)], written=NOW - 1)
    (tmp_path / "run.json").write_text(json.dumps({"updated": NOW - 600, "datasets": {
        "single": {"prompts": 20, "max_samples": None, "max_tokens": None}}}))
    state = state_of(tmp_path)
    assert conversation_lines(state.stats) == []
    frame = render_frame(state).split("\n", 1)[1]  # the header names the test's folder
    assert "turns" not in frame and "conversations" not in frame


def test_a_turns_dataset_not_started_says_so(tmp_path: Path) -> None:
    turns_run(tmp_path, waiting=True)
    frame = render_frame(state_of(tmp_path))
    assert row(frame, "later")[1:3] == ["waiting", "0/5 turns"]
    assert "later: no turn written yet" in frame.splitlines()


@pytest.mark.parametrize("width", range(60, 201, 7))
def test_the_conversation_line_fits_any_width(tmp_path: Path, width: int) -> None:
    turns_run(tmp_path)
    state = build_state(StatsCollector(tmp_path).refresh(NOW), None, writer=True)
    for kind, lines in (("plain", render_frame(state, width).splitlines()),
                        ("rich", rich_lines(state, width))):
        assert all(len(line) <= width for line in lines), (width, kind, lines)
        (line,) = [line for line in lines if re.match(r"tools_multi\S*: ", line)]
        assert "6 conversations" in line and "ended early 4" in line, (width, kind, line)
        if width >= 120:
            assert "1.67 turns each (max 3)" in line
        table = [line for line in lines if line.startswith("tools_multi")]
        assert any(re.search(r"\b10/14 turns\b", line) for line in table), (width, kind, lines)


def test_the_real_monitor_in_tmux_on_a_turns_run(tmp_path: Path, tmux: Tmux) -> None:  # noqa: F811
    out = tmp_path / "out"
    turns_run(out)
    # without COLUMNS: rich takes an exported COLUMNS over the terminal's size, and the tmux
    # server may hand its environment's one to the pane
    argv = [sys.executable, "-m", "workbench", "monitor", str(out), "--interval", "1"]
    tmux("new-session", "-d", "-s", "monitor", "-x", "64", "-y", "20", "-c", str(ROOT),
         f"env -u COLUMNS -u LINES {shlex.join(argv)}; echo monitor-exited-$?; sleep 600")

    def drawn() -> bool:  # a frame at the pane's width (tmux may size it after the first)
        screen = tmux.screen()
        return (any(re.match(r"tools_multi\S*: 6 conversations", line) for line in screen)
                and tmux.screen(joined=True) == screen)

    wait_until(drawn, 60, lambda: "an unwrapped frame with the conversation line:\n"
               + "\n".join(tmux.screen()))
    screen = tmux.screen()
    assert all(len(line) <= 64 for line in screen) and "Traceback" not in "\n".join(screen)
    assert any(re.search(r"tools_multi\S* +\w+ +10/14 turns", line) for line in screen), (
        "\n".join(screen))
