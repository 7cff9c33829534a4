"""The monitor in real terminals: layouts at 80x24 and 160x48 that never cut a key value,
the stopped / budget / done states from the writer's lock and the budget, waiting for a
run folder that does not exist yet, and `--once` exit codes."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_monitor import NOW, flat, plant, run_json, state_of, steady

from workbench.analyze.stats import StatsCollector
from workbench.rundir.layout import LOCK_FILE
from workbench.rundir.lock import hold_run_lock, writer_alive
from workbench.watch.alerts import build_state
from workbench.watch.monitor import run_monitor
from workbench.watch.render import render_frame, render_rich
from workbench.watch.status import MonitorState

KEY = ("dataset", "status", "done/target", "tok/s", "ETA")
LONG = "B1_glaive_function_calling"


def busy_run(out: Path) -> None:
    """Two datasets with wide figures: one running (thousands done), one idle."""
    plant(out, LONG, steady(1234, every=0.5, completion=2345), written=NOW - 1)
    plant(out, "B2_code", steady(40, every=3.0, completion=150), written=NOW - 2)
    run_json(out, updated=NOW - 3600, **{LONG: 100000, "B2_code": 3000})


def rich_text(state: MonitorState, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, height=width * 3 // 10, force_terminal=True,
                      color_system=None)  # 80x24, 160x48
    console.print(render_rich(state, width))
    return console.file.getvalue()  # type: ignore[attr-defined]


def header_and_row(text: str, name: str) -> tuple[str, str]:
    lines = text.splitlines()
    header = next(line for line in lines if "done/target" in line)
    return header, next(line for line in lines if line.lstrip().startswith(name))


@pytest.mark.parametrize("width", [80, 160])
def test_rich_layout_keeps_key_columns_whole(tmp_path: Path, width: int) -> None:
    busy_run(tmp_path)
    state = state_of(tmp_path)
    text = rich_text(state, width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines() if "done/target" in line or LONG in line)
    header, row = header_and_row(text, LONG)
    assert ("(rates over the last" in text) == (width == 160)  # the short header when narrow
    for name in KEY:
        assert name in header
    ds = state.stats.datasets[LONG]
    for value in ("running", "1,234/100,000", f"{ds.tokens_per_s:,.0f}"):
        assert value in row
    assert re.search(r"\d+(\.\d)?[smhd]\b", row.split("1,234/100,000")[1])  # an ETA, whole
    if width == 160:  # everything fits
        assert "completion tok" in header and "last write" in header and "prompt tok" in header
    else:
        assert "prompt tok" not in header


@pytest.mark.parametrize("width", [80, 160])
def test_plain_frame_fits_the_width(tmp_path: Path, width: int) -> None:
    busy_run(tmp_path)
    frame = render_frame(state_of(tmp_path), width)
    table = [line for line in frame.splitlines()[1:] if "done/target" in line or LONG in line]
    assert all(len(line) <= width for line in table) and "…" not in frame
    cells = re.split(r"\s{2,}", table[0].strip())
    assert cells[:3] == list(KEY[:3]) and {"tok/s", "ETA"} <= set(cells)


def test_without_a_width_every_column_is_shown(tmp_path: Path) -> None:
    busy_run(tmp_path)
    header = render_frame(state_of(tmp_path)).splitlines()[1]
    assert "prompt tok" in header and "last write" in header


def writer_state(out: Path, writer: bool | None) -> MonitorState:
    return build_state(StatsCollector(out).refresh(NOW), None, writer=writer)


def test_stopped_once_the_writer_is_gone(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(50), written=NOW - 1)  # written a second ago: would be "running"
    run_json(tmp_path, updated=NOW - 60, A=300)
    assert writer_alive(tmp_path) is None  # no lock file: an older run, decided by file times
    with hold_run_lock(tmp_path):
        assert writer_alive(tmp_path) is True
        held = writer_state(tmp_path, writer_alive(tmp_path))
    assert held.statuses == {"A": "running"}
    assert writer_alive(tmp_path) is False
    state = writer_state(tmp_path, writer_alive(tmp_path))
    assert state.statuses == {"A": "stopped"} and not state.run_active
    cells = re.split(r"\s{2,}", next(line for line in render_frame(state).splitlines()
                                     if line.startswith("A ")).strip())
    assert cells[:3] == ["A", "stopped", "50/300"] and cells[9] == "-"  # no ETA once stopped
    total = next(line for line in render_frame(state).splitlines() if line.startswith("total "))
    assert re.split(r"\s{2,}", total)[1] == "stopped"


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    second = rf"{tmp_path}: another workbench generate \(pid {os.getpid()}\)"
    with hold_run_lock(tmp_path), pytest.raises(Exception, match=second), hold_run_lock(tmp_path):
        pass
    assert (tmp_path / LOCK_FILE).is_file()


def budget_run(out: Path) -> None:
    plant(out, "A", steady(50, completion=410), written=NOW - 1)  # 20,500 tokens
    plant(out, "B", steady(30, completion=100), written=NOW - 1)
    datasets: dict[str, Any] = {
        "A": {"prompts": 300, "max_samples": None, "max_tokens": 20000},
        "B": {"prompts": 30, "max_samples": None, "max_tokens": None},
    }
    (out / "run.json").write_text(json.dumps({"updated": NOW - 60, "datasets": datasets}))


def test_budget_and_done_states_and_a_total_that_ends_done(tmp_path: Path) -> None:
    budget_run(tmp_path)
    state = writer_state(tmp_path, False)
    assert state.statuses == {"A": "budget", "B": "done"}
    frame = render_frame(state)
    rows = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in frame.splitlines()
            if line.split() and line.split()[0] in ("A", "B", "total")}
    assert rows["A"][1:3] == ["budget", "50/300"] and rows["A"][9] == "20,500/20,000 tok"
    assert rows["B"][1:3] == ["done", "30/30"] and rows["B"][9] == "done"
    assert rows["total"][1] == "done"
    assert "20,500/20,000 tok" in rich_text(state, 80)


def test_monitor_waits_for_the_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:  # generate passed its preflight meanwhile
            out.mkdir()
            plant(out, "A", steady(5), written=NOW - 1)
            run_json(out, updated=NOW - 5, A=10)
        if len(naps) == 4:
            raise KeyboardInterrupt

    buffer = io.StringIO()
    assert run_monitor(out, interval=1.5, console=Console(file=buffer), clock=lambda: NOW, sleep=sleep) == 0
    text = buffer.getvalue()
    assert text.splitlines()[0] == f"waiting for {out} to appear (generate creates it once the server answered) ..."
    assert text.count("workbench monitor") == 2 and naps == [1.5] * 4
    with pytest.raises(Exception, match="not a run directory"):  # --once does not wait
        run_monitor(tmp_path / "missing", once=True, console=Console(file=io.StringIO()))


def test_once_exit_code_says_whether_it_alerted(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10), written=NOW - 1)
    run_json(tmp_path, A=20)
    assert run_monitor(tmp_path, once=True, console=Console(file=io.StringIO()), clock=lambda: NOW) == 0
    plant(tmp_path, "A", [flat(i, None, ts=NOW - 1) for i in range(5)], written=NOW - 1)
    assert run_monitor(tmp_path, once=True, console=Console(file=io.StringIO()), clock=lambda: NOW) == 1
