"""The monitor tells the truth at any width: no line longer than the terminal (none wraps),
one rate definition shared with `workbench stats` and generate's progress line, `waiting`
for a dataset not started, a finished dataset's rate fixed at its running time, the runner's
stalled / degraded events as ALERT lines until a `recovered`, and server figures with their
age or the run's end. The last tests run the real `workbench monitor` in tmux at 80x24 and
120x40 and read the screen back."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_until
from rich.console import Console
from test_monitor import flat, metrics_text

from workbench.analyze.stats import StatsCollector, collect_stats
from workbench.analyze.stats_text import render_stats
from workbench.generate.progress import DatasetProgress, format_progress_line
from workbench.generate.views import progress_fields
from workbench.rundir.lock import hold_run_lock, writer_alive
from workbench.rundir.rates import RecordTimes, record_rates
from workbench.server.metrics import MetricsSnapshot
from workbench.text import format_rate
from workbench.watch.alerts import build_state
from workbench.watch.fit import Part, fit_line
from workbench.watch.render import render_frame, render_rich
from workbench.watch.status import MonitorState, ServerState

NOW = time.time()

RUNNING = "B1_glaive_function_calling_v2"  # long: cut at 80 columns
FINISHED = "B2_code"
BUDGET = "B3_budget"
WAITING = "B4_math_waiting"
NAMES = (RUNNING, FINISHED, BUDGET, WAITING)

# the finished dataset: 400 records from 400 s to 200 s before NOW, with growing replies
FINISHED_TS = [NOW - 400 + 0.5 * i for i in range(400)]
FINISHED_TOKENS = [100 + i % 7 for i in range(400)]
# the running one: 1,234 records, one every 0.5 s, the last a second ago
RUNNING_TS = [NOW - 1 - 0.5 * (1233 - i) for i in range(1234)]
RUNNING_TOKENS = [2000 + (i * 37) % 700 for i in range(1234)]

STALL = "no record for 120s with 23 requests in flight"


def plant(out: Path, name: str, ts: list[float], tokens: list[int], written: float) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    records = [flat(i, count, ts=at) for i, (at, count) in enumerate(zip(ts, tokens, strict=True))]
    for file, lines in (("raw_responses.jsonl", records), ("errors.jsonl", [])):
        (folder / file).write_text("".join(json.dumps(r) + "\n" for r in lines))
        os.utime(folder / file, (written, written))


def write_run(out: Path, events: list[dict[str, Any]] | None = None) -> None:
    """A run as a new user sees it mid-way: one dataset running, one done, one its budget
    stopped, one not started (generate created its empty files a minute ago); run.json with
    the concurrency and the runner's events."""
    plant(out, RUNNING, RUNNING_TS, RUNNING_TOKENS, written=NOW - 1)
    plant(out, FINISHED, FINISHED_TS, FINISHED_TOKENS, written=NOW - 200)
    plant(out, BUDGET, [NOW - 900 + i for i in range(50)], [410] * 50, written=NOW - 850)
    plant(out, WAITING, [], [], written=NOW - 64)
    datasets = {
        RUNNING: {"prompts": 100_000, "max_samples": None, "max_tokens": None},
        FINISHED: {"prompts": 400, "max_samples": None, "max_tokens": None},
        BUDGET: {"prompts": 300, "max_samples": None, "max_tokens": 20_000},
        WAITING: {"prompts": 5_000, "max_samples": None, "max_tokens": None},
    }
    if events is None:
        events = [
            {"ts": NOW - 600, "kind": "degraded", "message": "tok/s fell to 40% of its peak"},
            {"ts": NOW - 540, "kind": "recovered", "message": "tok/s back to 95% of its peak"},
            {"ts": NOW - 125, "kind": "stalled", "message": STALL},
        ]
    manifest = {
        "updated": NOW - 3600,
        "server_url": "http://gpu-host-with-a-long-name.example.internal:30000",
        "concurrency": {"setting": "auto", "mode": "metrics", "current": 96},
        "datasets": datasets,
        "events": events,
    }
    (out / "run.json").write_text(json.dumps(manifest))


def server_state(changed_at: float = NOW) -> ServerState:
    reading = MetricsSnapshot(running=23, queued=4, token_usage=0.91, gen_throughput=91.0,
                              prompt_tokens=1e6, generation_tokens=4e6, cached_tokens=2e5,
                              requests=1e4, at=NOW)
    return ServerState("http://gpu-host-with-a-long-name.example.internal:30000", True,
                       metrics=reading, changed_at=changed_at)


def state_at(out: Path, now: float = NOW, writer: bool | None = None,
             server: ServerState | None = None) -> MonitorState:
    return build_state(StatsCollector(out).refresh(now), server or server_state(), writer=writer)


def rich_lines(state: MonitorState, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_rich(state, width))
    return console.export_text().splitlines()


def frames(state: MonitorState, width: int) -> dict[str, list[str]]:
    return {"rich": rich_lines(state, width), "plain": render_frame(state, width).splitlines()}


def row_of(lines: list[str], name: str) -> str:
    """The line of a dataset's row (its name may end in an ellipsis)."""
    found = [line for line in lines if line.startswith(name[:12])]
    assert len(found) == 1, (name, lines)
    return found[0]


# --- widths ----------------------------------------------------------------------------------


@pytest.fixture
def run_folder() -> Iterator[Path]:
    """A run folder whose path is 52 characters wherever the tests run, as the header's
    fitting below expects (pytest's own folders are longer under a parallel worker)."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-monitor-test-every-line-fits-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("width", [80, 120])
def test_every_line_fits_and_each_stays_whole(run_folder: Path, width: int) -> None:
    write_run(run_folder)
    state = state_at(run_folder, server=server_state(changed_at=NOW - 64))
    for kind, lines in frames(state, width).items():
        assert all(len(line) <= width for line in lines), (kind, lines)
        # header, column names (and a rule), 4 rows (and a blank), total, server, alert
        assert len(lines) == (11 if kind == "rich" else 9), (kind, lines)
        header = lines[0]
        assert header.startswith("workbench monitor ") and re.search(r"\d\d:\d\d:\d\d", header)
        note = "(rates over the last 5.0m" if width == 120 else "(rates: last 5.0m)"
        assert note in header and header.endswith(")"), (kind, header)
        # each logical line on one line: the rows, the server line, the alert
        for name in NAMES:
            assert re.search(r"\s(running|done|budget|waiting)\s", row_of(lines, name))
        server = [line for line in lines if "server gen" in line]
        assert len(server) == 1 and re.search(r"23 running, .*server gen 91 tok/s, .*unchanged for "
                                              r"64s", server[0]), server
        alert = [line for line in lines if line.startswith("ALERT")]
        assert len(alert) == 1 and alert[0].startswith("ALERT run: stalled 2.1m ago: no record"), alert
        assert not any(line.startswith(("ago", "5.0m", "tok/s", "running")) for line in lines)


@pytest.mark.parametrize("width", [80, 120])
def test_the_key_values_stay_whole(tmp_path: Path, width: int) -> None:
    write_run(tmp_path)
    state = state_at(tmp_path)
    running = state.stats.datasets[RUNNING]
    for kind, lines in frames(state, width).items():
        row = row_of(lines, RUNNING)
        if kind == "rich" and width == 80:  # its wider gaps leave no room for the whole name
            assert RUNNING not in row and row.startswith(f"{RUNNING[:20]}") and "…" in row
        else:
            assert row.startswith(RUNNING)
        assert re.search(rf"running +1,234/100,000 .*{running.tokens_per_s:,.0f} +\d+(\.\d)?h", row)
        assert "20,500/20,000 tok" in row_of(lines, BUDGET)


def test_a_line_is_shortened_in_order_never_wrapped() -> None:
    parts = [Part("workbench monitor", sep=""), Part("/very/long/path/to/the/run", "run", sep=" ",
                                                        shrink=True),
             Part("2026-05-01 12:00:00", "12:00:00", rank=3), Part("(note)", rank=1)]
    assert fit_line(parts, None) == "workbench monitor /very/long/path/to/the/run  2026-05-01 12:00:00  (note)"
    # the short forms first, the least important first
    assert fit_line(parts, 62) == "workbench monitor /very/long/path/to/the/run  12:00:00  (note)"
    assert fit_line(parts, 61) == "workbench monitor run  12:00:00  (note)"
    assert fit_line(parts, 33) == "workbench monitor run  (note)"  # then the parts given up
    assert fit_line(parts, 20) == "workbench monitor r…"  # and last the cut
    shrinking = [Part("workbench monitor", sep=""), Part("/a/much/longer/path/to/the/run", sep=" ",
                                                         shrink=True)]
    assert fit_line(shrinking, 40) == "workbench monitor …onger/path/to/the/run"  # cut on the left


def test_no_width_from_60_columns_wraps(tmp_path: Path) -> None:
    write_run(tmp_path)
    state = state_at(tmp_path, writer=False, server=server_state(changed_at=NOW - 300))
    for width in range(60, 201, 7):
        for kind, lines in frames(state, width).items():
            assert all(len(line) <= width for line in lines), (width, kind, lines)
            assert len(lines) == (11 if kind == "rich" else 9), (width, kind, lines)
            assert lines[-1].startswith("ALERT run: stalled") and lines[-2].startswith("run ended")


# --- statuses and rates ----------------------------------------------------------------------


def test_a_dataset_not_started_is_waiting_without_a_write_time(tmp_path: Path) -> None:
    write_run(tmp_path)
    state = state_at(tmp_path)
    assert state.statuses[WAITING] == "waiting"
    for width in (80, 120, None):
        row = row_of(render_frame(state, width).splitlines(), WAITING)
        assert "waiting" in row and "0/5,000" in row and "ago" not in row
    assert row_of(render_frame(state).splitlines(), WAITING).split()[-1] == "-"  # last write


def test_a_finished_datasets_rate_is_over_its_running_time_and_stays(tmp_path: Path) -> None:
    write_run(tmp_path)
    # the first record only marks the start: the others' tokens over the records' ts span
    expected = sum(FINISHED_TOKENS[1:]) / (FINISHED_TS[-1] - FINISHED_TS[0])
    for now in (NOW, NOW + 600):
        state = state_at(tmp_path, now=now)
        ds = state.stats.datasets[FINISHED]
        assert state.statuses[FINISHED] == "done" and ds.finished
        assert ds.tokens_per_s == pytest.approx(expected)
        assert ds.requests_per_s == pytest.approx(399 / (FINISHED_TS[-1] - FINISHED_TS[0]))
        cells = re.split(r"\s{2,}", row_of(render_frame(state).splitlines(), FINISHED).strip())
        assert cells[:3] == [FINISHED, "done", "400/400"]
        assert cells[8:10] == [f"{expected:,.0f}", "done"]  # tok/s, no ETA
    budget = state_at(tmp_path, now=NOW + 600).stats.datasets[BUDGET]
    assert budget.tokens_per_s == pytest.approx(410.0)  # a record a second: fixed as well


def test_one_rate_definition_for_stats_the_monitor_and_generate(tmp_path: Path) -> None:
    write_run(tmp_path)
    stats = collect_stats(tmp_path, now=NOW)
    text = render_stats(tmp_path, now=NOW)
    frame = render_frame(state_at(tmp_path))
    for name, ts, tokens, target in ((RUNNING, RUNNING_TS, RUNNING_TOKENS, 100_000),
                                     (FINISHED, FINISHED_TS, FINISHED_TOKENS, 400)):
        times = RecordTimes()
        times.extend(ts, tokens)
        ds = stats.datasets[name]
        shared = record_rates(times, NOW, finished=ds.finished)
        progress = DatasetProgress(name=name, target=target)
        for at, count in zip(ts, tokens, strict=True):
            progress.count_done(count, ts=at)
        assert progress.rates(NOW) == shared
        assert (ds.tokens_per_s, ds.requests_per_s) == shared
        rate = shared.tokens_per_s
        assert rate is not None
        assert f" {rate:.0f} tok/s" in format_progress_line(progress, NOW)
        assert f" {rate:,.0f} tok/s" in progress_fields(progress, NOW)
        assert format_rate(rate) in next(line for line in text.splitlines()
                                         if line.startswith(name) and "/" in line)
        assert f"  {rate:,.0f}  " in row_of(frame.splitlines(), name)
        if not ds.finished:  # the ETA from that rate, in both
            assert progress.eta_seconds(NOW) == pytest.approx(ds.eta_s)
    running = stats.datasets[RUNNING]
    window = [(t, n) for t, n in zip(RUNNING_TS, RUNNING_TOKENS, strict=True) if t > NOW - 300]
    assert running.tokens_per_s == pytest.approx(sum(n for _, n in window) / 300)
    assert "rates over the last 5.0m" in text and "(rates over the last 5.0m" in frame


def test_generate_starts_measuring_at_its_first_record() -> None:
    progress = DatasetProgress(name="a", target=10)
    assert progress.rates(NOW) == (None, None) and progress.eta_seconds(NOW) is None
    assert " - tok/s" in format_progress_line(progress, NOW)
    progress.count_done(50, ts=NOW - 10)
    progress.count_done(70, ts=NOW - 5)
    assert progress.rates(NOW) == (7.0, 0.1)  # 70 tokens and 1 record in the 10 s since the first
    assert progress.eta_seconds(NOW) == pytest.approx(8 / 0.1)


# --- alerts from the runner's events ---------------------------------------------------------


def test_an_unresolved_stall_is_an_alert_until_it_recovers(tmp_path: Path) -> None:
    write_run(tmp_path)
    state = state_at(tmp_path)
    assert [(a.subject, a.cause) for a in state.alerts] == [("run", "stalled")]
    assert str(state.alerts[0]) == f"ALERT run: stalled 2.1m ago: {STALL}"
    assert f"ALERT run: stalled 2.1m ago: {STALL}" in render_frame(state).splitlines()

    events = json.loads((tmp_path / "run.json").read_text())["events"]
    recovered = {"ts": NOW - 30, "kind": "recovered", "message": "records again"}
    write_run(tmp_path, events + [recovered])
    state = state_at(tmp_path)
    assert state.alerts == () and "no alerts" in render_frame(state).splitlines()

    degraded = {"ts": NOW - 10, "kind": "degraded", "message": "tok/s at 30% of its peak",
                "dataset": RUNNING}
    write_run(tmp_path, events + [recovered, degraded, {"kind": "started"}, "junk"])
    assert [str(a) for a in state_at(tmp_path).alerts] == [
        f"ALERT {RUNNING}: degraded 10s ago: tok/s at 30% of its peak"]

    # the log is kept across sessions: a stall of a session before the latest is over
    write_run(tmp_path)
    manifest = json.loads((tmp_path / "run.json").read_text())
    manifest["history"] = [{"started": NOW - 7200}, {"started": NOW - 60}]
    (tmp_path / "run.json").write_text(json.dumps(manifest))
    assert state_at(tmp_path).alerts == ()


def test_prompts_cut_by_the_server_are_an_alert_per_dataset_in_any_session(
        tmp_path: Path) -> None:
    cut = [{"ts": NOW - 3000 + i, "kind": "prompt_mismatch", "dataset": RUNNING, "count": 2 ** i,
            "message": f"{RUNNING}: prompt_tokens differ in {2 ** i} replies"}
           for i in range(3)]
    write_run(tmp_path, cut)
    manifest = json.loads((tmp_path / "run.json").read_text())
    manifest["history"] = [{"started": NOW - 7200}, {"started": NOW - 60}]  # told a session ago
    (tmp_path / "run.json").write_text(json.dumps(manifest))
    state = state_at(tmp_path)
    assert [str(a) for a in state.alerts] == [
        (f"ALERT {RUNNING}: prompt_mismatch 50.0m ago: {RUNNING}: prompt_tokens differ in 4 "
         "replies")]
    assert any(line.startswith(f"ALERT {RUNNING}: prompt_mismatch")
               for line in render_frame(state, 80).splitlines())


# --- the server's figures --------------------------------------------------------------------


def test_server_figures_say_their_age_and_that_the_run_ended(tmp_path: Path) -> None:
    write_run(tmp_path)
    fresh = render_frame(state_at(tmp_path, server=server_state(changed_at=NOW - 2)), 120)
    line = next(line for line in fresh.splitlines() if "server gen" in line)
    assert line.startswith("server") and "unchanged" not in line and "run ended" not in line

    with hold_run_lock(tmp_path):
        assert writer_alive(tmp_path) is True
    assert writer_alive(tmp_path) is False  # generate exited: its lock is free
    ended = state_at(tmp_path, writer=False, server=server_state(changed_at=NOW - 64))
    for width in (80, 120, None):
        line = next(line for line in render_frame(ended, width).splitlines() if "server gen" in line)
        # the run last wrote a record a second ago; the server's figures are a minute old
        assert line.startswith("run ended 1s ago; server"), line
        assert re.search(r"23 running, .*unchanged for 64s", line), line


# --- the real command in a real terminal -----------------------------------------------------


def tmux_path() -> str:
    found = shutil.which("tmux")
    if found is None:
        raise AssertionError("tmux is missing: run scripts/ci_install_system.sh (Debian package tmux)")
    return found


class MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = metrics_text(23, 4, 0.91, 1_000_000, 200_000, 4_000_000).encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """A server answering /metrics (and nothing else) on a free port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Tmux:
    """A tmux server of its own (its own socket), killed at the end."""

    def __init__(self, socket: Path) -> None:
        self.base = [tmux_path(), "-S", str(socket)]

    def __call__(self, *args: str) -> str:
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self, joined: bool = False) -> list[str]:
        """The pane's lines; `joined`: lines the terminal wrapped joined back (tmux -J)."""
        text = self("capture-pane", "-p", *(["-J"] if joined else []), "-t", "monitor")
        return [line.rstrip() for line in text.splitlines()]


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    folder = Path(tempfile.mkdtemp(prefix="wb-tmux-"))  # short: a socket path has a length limit
    terminal = Tmux(folder / "socket")
    yield terminal
    subprocess.run([*terminal.base, "kill-server"], capture_output=True, timeout=30, check=False)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(("width", "height", "once"), [(80, 24, False), (120, 40, False),
                                                       (80, 24, True)])
def test_the_real_monitor_in_tmux(tmp_path: Path, tmux: Tmux, metrics_server: str, width: int,
                                  height: int, once: bool) -> None:
    out = tmp_path / "out"
    write_run(out)
    for path in (out / RUNNING).iterdir():  # written a second ago, however long the suite ran
        os.utime(path, (time.time() - 1, time.time() - 1))
    argv = [sys.executable, "-m", "workbench", "monitor", str(out), "--server", metrics_server]
    argv += ["--once"] if once else ["--interval", "1"]
    command = f"{shlex.join(argv)}; echo monitor-exited-$?; sleep 600"
    tmux("new-session", "-d", "-s", "monitor", "-x", str(width), "-y", str(height), "-c", str(ROOT),
         command)

    def drawn() -> bool:  # and, with --once, exited: else it may print its exit between captures
        lines = tmux.screen()
        return (any(line.startswith("ALERT run: stalled") for line in lines)
                and (not once or "monitor-exited-1" in lines))  # the alert makes --once exit 1

    wait_until(drawn, 120, "the monitor's frame on the tmux screen" + (" and its exit" if once else ""))
    screen, joined = tmux.screen(), tmux.screen(joined=True)
    assert joined == screen, "\n".join(screen)  # no line was wrapped by the terminal
    assert all(len(line) <= width for line in screen)
    assert "Traceback" not in "\n".join(screen)
    # nor by rich: one line each for the header, the column names (a rule on a live one),
    # the 4 datasets, the total, the server and the alert
    frame = [line for line in screen[:next(i for i, line in enumerate(screen)
                                          if line.startswith("ALERT")) + 1] if line]
    assert len(frame) == (9 if once else 10), "\n".join(screen)
    header = r"workbench monitor .+  (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d  \(rates[^()]*\)"
    assert re.fullmatch(header, frame[0]), frame[0]
    for name, status in ((RUNNING, "running"), (FINISHED, "done"), (BUDGET, "budget"),
                         (WAITING, "waiting")):
        assert re.search(rf"\s{status}\s", row_of(screen, name)), screen
    assert "ago" not in row_of(screen, WAITING)
    assert any(re.search(r"server\S*.*23 running, .*server gen", line) for line in screen), screen
