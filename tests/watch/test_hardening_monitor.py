"""The monitor on runs that look healthy but are not: a dataset whose prompts all failed (failed,
an ALERT that does not age out, `--once` exit 1), a total row that counted finished datasets
in its rate, and waiting on a mistyped folder with an unreachable server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
from conftest import workbench
from rich.console import Console
from test_monitor import NOW, plant, row, run_json, state_of, steady

from workbench.watch.monitor import run_monitor
from workbench.watch.render import render_frame


def aborted(count: int, ts: float) -> list[dict[str, Any]]:
    return [{"sample_id": i, "attempt": 1, "error_type": "aborted", "message": "abort",
             "ts": ts} for i in range(count)]


def all_failed(out: Path) -> None:
    """X: its 30 prompts aborted an hour ago, no record; the run finished."""
    plant(out, "X", [], written=NOW - 3600, errors=aborted(30, NOW - 3600))
    run_json(out, updated=NOW - 3500, X=30)


def test_a_dataset_whose_prompts_all_failed_is_failed_with_a_standing_alert(tmp_path: Path) -> None:
    all_failed(tmp_path)
    state = state_of(tmp_path)
    assert state.statuses["X"] == "failed"
    assert [str(a) for a in state.alerts] == [
        "ALERT X: no record written: all 30 prompts failed (see X/errors.jsonl)"]
    frame = render_frame(state)
    assert row(frame, "X")[1:3] == ["failed", "0/30"] and row(frame, "X")[9] == "failed"
    assert row(frame, "total")[1] == "failed" and "no alerts" not in frame


def test_monitor_once_exits_1_on_a_run_that_wrote_nothing(tmp_path: Path) -> None:
    all_failed(tmp_path)
    buffer = io.StringIO()
    assert run_monitor(tmp_path, once=True, console=Console(file=buffer), clock=lambda: NOW) == 1
    assert "ALERT X: no record written" in buffer.getvalue()
    done = workbench("monitor", str(tmp_path), "--once")  # the real clock: errors long past
    assert done.returncode == 1 and "ALERT X: no record written" in done.stdout


def test_a_dataset_running_without_a_record_yet_is_not_failed(tmp_path: Path) -> None:
    plant(tmp_path, "X", [], written=NOW - 1, errors=aborted(3, NOW - 1))  # 3 of 30 so far
    run_json(tmp_path, updated=NOW - 60, X=30)
    state = state_of(tmp_path)
    assert state.statuses["X"] == "running"
    assert not [a for a in state.alerts if a.cause == "no_record"]


def test_the_total_row_follows_its_running_datasets(tmp_path: Path) -> None:
    """A finished two minutes ago at 1,000 tok per record; B runs on: the total says B's pace."""
    plant(tmp_path, "A", steady(20, every=3.0, completion=1000, start=0), written=NOW - 120)
    shift(tmp_path / "A" / "raw_responses.jsonl", -120)
    plant(tmp_path, "B", steady(10, every=6.0, completion=100), written=NOW - 1)
    run_json(tmp_path, updated=NOW - 600, A=20, B=40)
    state = state_of(tmp_path)
    a, b = state.stats.datasets["A"], state.stats.datasets["B"]
    assert state.statuses["A"] == "done" and state.statuses["B"] == "running"
    frame = render_frame(state)
    assert row(frame, "total")[8] == row(frame, "B")[8] == f"{b.tokens_per_s:,.0f}"
    assert row(frame, "total")[9] == row(frame, "B")[9]
    assert a.tokens_per_s and a.tokens_per_s > b.tokens_per_s  # it is not summed in


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def shift(path: Path, seconds: float) -> None:
    records = json_lines(path)
    for record in records:
        record["ts"] += seconds
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def test_waiting_for_a_mistyped_folder_says_the_server_is_unreachable(tmp_path: Path) -> None:
    out = tmp_path / "a-rather-long-folder-name-typed-wrong" / "outputs-of-the-run-of-today"
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    code = run_monitor(out, server="http://gpu-box:30000", interval=0.01, console=console,
                       transport=httpx.MockTransport(refused), clock=lambda: NOW, sleep=sleep)
    lines = buffer.getvalue().splitlines()
    assert code == 0 and naps == [0.01] * 3
    assert lines[0].startswith("waiting for ") and lines[0].endswith("to appear (generate creates it) ...")
    assert lines[1:] == ["server http://gpu-box:30000: unreachable (connection refused)"]  # once
    assert all(len(line) <= 80 for line in lines)


def test_waiting_for_a_run_in_an_empty_folder(tmp_path: Path) -> None:
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:  # generate wrote its run meanwhile
            plant(tmp_path, "A", steady(5), written=NOW - 1)
            run_json(tmp_path, updated=NOW - 5, A=10)
        if len(naps) == 3:
            raise KeyboardInterrupt

    buffer = io.StringIO()
    assert run_monitor(tmp_path, interval=1.0, console=Console(file=buffer), clock=lambda: NOW,
                       sleep=sleep) == 0
    text = buffer.getvalue()
    assert text.splitlines()[0] == f"waiting for a run in {tmp_path} (no run.json yet) ..."
    assert text.count("waiting for") == 1 and text.count("workbench monitor") == 1
