"""The monitor on datasets that mix modes (`modes`): one line per such dataset sets each mode's
share written against the share asked for (of the records; of the conversations in a `turns:
each` dataset), names the deployment sample, stays right while the file grows (a torn last line
included), fits any width from 60 columns; datasets without modes get no line."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_monitor import NOW, flat, plant, state_of
from test_monitor_truth import rich_lines

from workbench.analyze.stats import StatsCollector
from workbench.watch.alerts import build_state
from workbench.watch.modes import mode_lines
from workbench.watch.monitor import run_monitor
from workbench.watch.render import render_frame

MODES = [{"name": "think", "weight": 3, "chat_template_kwargs": {"thinking": True}, "sampling": None},
         {"name": "direct", "weight": 1, "chat_template_kwargs": {"thinking": False},
          "sampling": {"temperature": 0.6}}]
CHAT = ["think", "think", "direct", "think", "think", "direct", "think"]  # 5 think, 2 direct
# "tools" (turns: each): conversation -> (mode, turns)
TOOLS = {0: ("thinking=true", 3), 1: ("thinking=true", 1), 2: ("thinking=false", 2),
         3: ("thinking=true", 2)}
SAMPLE = "/srv/deploy/requests.jsonl"


def chat_records(modes: list[str]) -> list[dict[str, Any]]:
    return [{**flat(i, 100 + i, ts=NOW - 20 + i), "mode": mode} for i, mode in enumerate(modes)]


def tool_records() -> list[dict[str, Any]]:
    records = []
    for sid, (mode, turns) in TOOLS.items():
        records += [{**flat(sid, 50, ts=NOW - 30 + sid), "turn": turn, "mode": mode}
                    for turn in range(turns)]
    return records


def modes_run(out: Path) -> None:
    """"chat" (think 3 : direct 1, 7 records), "tools" (turns: each, modes from a deployment
    sample, 4 conversations) and "single" (no modes)."""
    plant(out, "chat", chat_records(CHAT), written=NOW - 1)
    plant(out, "tools", tool_records(), written=NOW - 1)
    plant(out, "single", [flat(i, 300, ts=NOW - 2 * i) for i in range(6)], written=NOW - 1)
    deployment = [{**MODES[0], "name": "thinking=true"}, {**MODES[1], "name": "thinking=false"}]
    datasets: dict[str, Any] = {
        "chat": {"prompts": 20, "max_samples": None, "max_tokens": None, "modes": MODES,
                 "modes_source": None},
        "tools": {"prompts": 4, "max_samples": None, "max_tokens": None, "turns": "each",
                  "target_turns": 8, "modes": deployment, "modes_source": SAMPLE},
        "single": {"prompts": 20, "max_samples": None, "max_tokens": None, "modes": None,
                   "modes_source": None},
    }
    (out / "run.json").write_text(json.dumps({"updated": NOW - 600, "datasets": datasets}))


def line_of(frame: str, name: str) -> str:
    (line,) = [line for line in frame.splitlines() if line.startswith(f"{name}: modes")]
    return line


def test_a_line_per_mixing_dataset_sets_written_against_wanted(tmp_path: Path) -> None:
    modes_run(tmp_path)
    frame = render_frame(state_of(tmp_path))
    assert line_of(frame, "chat") == "chat: modes  think 71.4% (want 75.0%)  direct 28.6% (want 25.0%)"
    assert line_of(frame, "tools") == ("tools: modes by conversation  thinking=true 75.0% (want 75.0%)"
                                       "  thinking=false 25.0% (want 25.0%)  from requests.jsonl")
    assert not any(line.startswith("single:") for line in frame.splitlines())
    lines = frame.splitlines()
    server = next(i for i, line in enumerate(lines) if line.startswith("server"))
    assert lines.index(line_of(frame, "tools")) == server - 1  # under the conversation line
    assert lines.index(line_of(frame, "chat")) > lines.index(
        next(line for line in lines if line.startswith("tools: 4 conversations")))


def test_the_line_follows_the_file_as_it_is_written(tmp_path: Path) -> None:
    modes_run(tmp_path)
    raw = tmp_path / "chat" / "raw_responses.jsonl"
    raw.write_text("")
    collector = StatsCollector(tmp_path)

    def line() -> str:
        return line_of(render_frame(build_state(collector.refresh(NOW), None, writer=True)), "chat")

    assert line() == "chat: modes  think - (want 75.0%)  direct - (want 25.0%)"
    text = "".join(json.dumps(r) + "\n" for r in chat_records(CHAT))
    ends = [i for i, char in enumerate(text) if char == "\n"]
    cut = ends[2] + 1 + 30  # three records (think, think, direct) and a torn fourth
    with raw.open("a") as handle:
        handle.write(text[:cut])
    assert line() == "chat: modes  think 66.7% (want 75.0%)  direct 33.3% (want 25.0%)"
    with raw.open("a") as handle:
        handle.write(text[cut:])
    assert line() == "chat: modes  think 71.4% (want 75.0%)  direct 28.6% (want 25.0%)"
    with raw.open("a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in chat_records(["think"])))
    assert line() == "chat: modes  think 75.0% (want 75.0%)  direct 25.0% (want 25.0%)"
    fresh = render_frame(build_state(StatsCollector(tmp_path).refresh(NOW), None, writer=True))
    assert line() == line_of(fresh, "chat")


def test_records_of_no_mode_or_an_unasked_one_are_said(tmp_path: Path) -> None:
    modes_run(tmp_path)
    records = chat_records(CHAT) + [{**flat(30, 10, ts=NOW - 1), "mode": "other"}, flat(31, 10, ts=NOW - 1)]
    plant(tmp_path, "chat", records, written=NOW - 1)
    line = line_of(render_frame(state_of(tmp_path)), "chat")
    assert line == ("chat: modes  think 55.6% (want 75.0%)  direct 22.2% (want 25.0%)  "
                    "other 11.1% (not asked)  (no mode) 11.1%")


def test_a_run_without_modes_has_no_modes_line(tmp_path: Path) -> None:
    plant(tmp_path, "single", [flat(i, 300, ts=NOW - 2 * i) for i in range(6)], written=NOW - 1)
    (tmp_path / "run.json").write_text(json.dumps({"updated": NOW - 600, "datasets": {
        "single": {"prompts": 20, "max_samples": None, "max_tokens": None}}}))
    state = state_of(tmp_path)
    assert mode_lines(state.stats) == []
    assert "modes" not in render_frame(state).split("\n", 1)[1]


@pytest.mark.parametrize("width", range(60, 201, 14))
def test_the_modes_line_fits_any_width(tmp_path: Path, width: int) -> None:
    modes_run(tmp_path)
    state = build_state(StatsCollector(tmp_path).refresh(NOW), None, writer=True)
    for kind, lines in (("plain", render_frame(state, width).splitlines()),
                        ("rich", rich_lines(state, width))):
        assert all(len(line) <= width for line in lines), (width, kind, lines)
        (line,) = [line for line in lines if line.startswith("tools: modes")]
        assert re.search(r"thinking=true 75\.0%", line), (width, kind, line)
        (chat,) = [line for line in lines if line.startswith("chat: modes")]
        assert "think 71.4%" in chat and "direct 28.6%" in chat, (width, kind, chat)


def test_monitor_once_prints_the_modes_line(tmp_path: Path) -> None:
    modes_run(tmp_path)
    buffer = io.StringIO()
    run_monitor(tmp_path, once=True, console=Console(file=buffer, width=200), clock=lambda: NOW)
    assert "chat: modes  think 71.4% (want 75.0%)  direct 28.6% (want 25.0%)" in buffer.getvalue()
