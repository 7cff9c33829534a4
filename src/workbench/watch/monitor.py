"""The live terminal monitor of a run directory (``workbench monitor``).

Each frame refreshes a :class:`~workbench.analyze.stats.StatsCollector` (only appended bytes
are read) and, with a server URL, reads ``/metrics`` (``/server_info`` when metrics are
off). The statuses are :mod:`workbench.watch.status`'s, the alerts
:mod:`workbench.watch.alerts`'s, the drawing :mod:`workbench.watch.render`'s; everything but
the :class:`Monitor`'s polling is pure.

When the server URL is an sglang-router (it has no ``/metrics`` on its own port but lists its
workers at ``/workers``), the frame shows one line per worker: the router's health and load
figures, and the worker's own ``/metrics`` gauges when the monitor can reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live

from workbench.analyze.stats import DEFAULT_WINDOW, StatsCollector
from workbench.errors import (
    ConfigError,
    ConnectionLost,
    RequestTimeout,
    ServerError,
    ServerUnreachable,
)
from workbench.rundir.layout import find_datasets
from workbench.rundir.lock import writer_alive
from workbench.rundir.manifest import manifest_path
from workbench.rundir.run import check_run_dir
from workbench.server.client import SGLangClient, api_key_from_env, redact_url
from workbench.server.metrics import MetricsSnapshot, parse_metrics
from workbench.watch.alerts import build_state
from workbench.watch.fit import Part, fit_line
from workbench.watch.render import render_frame, render_rich
from workbench.watch.status import MonitorState, ServerState, Thresholds, WorkerState

__all__ = ["Monitor", "has_run", "run_monitor", "server_reach", "wait_for_run_dir", "waiting_line"]


def _info_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    """The few /server_info values shown when the server runs without metrics."""
    states = info.get("internal_states")
    rates = (
        [s.get("last_gen_throughput") for s in states if isinstance(s, dict)]
        if isinstance(states, list)
        else []
    )
    numbers = [float(r) for r in rates if isinstance(r, (int, float))]
    return {
        "gen_throughput": sum(numbers) if numbers else None,
        "max_total_num_tokens": info.get("max_total_num_tokens"),
        "max_running_requests": info.get("max_running_requests"),
        "version": info.get("version"),
    }


class Monitor:
    """A run directory's collector and, optionally, a server client, polled with one clock.

    ``clock`` returns wall time (record timestamps are wall time); readings of the server
    older than ``rate_window`` seconds are dropped, the oldest kept one is the baseline of
    the rates shown. The time the server's figures last changed is kept (their age).
    """

    def __init__(
        self,
        out: str | Path,
        *,
        client: SGLangClient | None = None,
        clock: Callable[[], float] = time.time,
        thresholds: Thresholds = Thresholds(),
        window: float = DEFAULT_WINDOW,
        rate_window: float = 60.0,
        worker_client: Callable[[str], SGLangClient] | None = None,
    ) -> None:
        self.collector = StatsCollector(out, window=window, clock=clock)
        self.client = client
        self.worker_client = worker_client
        self._worker_clients: dict[str, SGLangClient] = {}
        self.clock = clock
        self.thresholds = thresholds
        self.rate_window = rate_window
        self._readings: deque[MetricsSnapshot] = deque()
        self._changed_at: float | None = None

    async def poll(self) -> MonitorState:
        """Refresh the figures, poll the server, and return the frame's state."""
        now = self.clock()
        stats = self.collector.refresh(now)
        server = await self.poll_server(now) if self.client is not None else None
        return build_state(stats, server, self.thresholds, writer_alive(stats.out))

    async def poll_server(self, now: float) -> ServerState:
        """Read /metrics (or /server_info when metrics are off); failures become the state."""
        assert self.client is not None
        url = redact_url(self.client.base_url)
        try:
            text = await self.client.metrics()
            if text is None:
                listed = await self.client.workers()
                if listed is not None:
                    return ServerState(url, True, workers=await self._poll_workers(listed, now))
                return ServerState(url, True, info=_info_summary(await self.client.server_info()))
            reading = parse_metrics(text, at=now)
        except (ConnectionLost, RequestTimeout, ServerUnreachable) as exc:
            return ServerState(url, False, error=str(exc))
        except ServerError as exc:
            return ServerState(url, True, error=str(exc))
        except ValueError as exc:
            return ServerState(url, True, error=f"/metrics unreadable: {exc}")
        return self._with_history(url, reading, now)

    async def _poll_workers(
        self, listed: list[dict[str, Any]], now: float
    ) -> tuple[WorkerState, ...]:
        return tuple(await asyncio.gather(*(self._poll_worker(w, now) for w in listed)))

    async def _poll_worker(self, listed: Mapping[str, Any], now: float) -> WorkerState:
        """The router's figures of one worker, with the worker's /metrics when reachable."""
        url = str(listed["url"])
        load = listed.get("load")
        load = load if isinstance(load, int) else None
        state = WorkerState(redact_url(url), listed.get("healthy"), load)
        if self.worker_client is None:
            return state
        if url not in self._worker_clients:
            self._worker_clients[url] = self.worker_client(url)
        client = self._worker_clients[url]
        try:
            text = await client.metrics()
            if text is None:
                return replace(state, error="off (start the worker with --enable-metrics)")
            return replace(state, metrics=parse_metrics(text, at=now))
        except ServerError as exc:
            return replace(state, error=str(exc))
        except ValueError as exc:
            return replace(state, error=f"unreadable: {exc}")

    async def aclose(self) -> None:
        """Close the clients opened for a router's workers."""
        for client in self._worker_clients.values():
            await client.aclose()
        self._worker_clients.clear()

    def _with_history(self, url: str, reading: MetricsSnapshot, now: float) -> ServerState:
        previous = self._readings[-1] if self._readings else None
        while self._readings and now - (self._readings[0].at or now) > self.rate_window:
            self._readings.popleft()
        baseline = self._readings[0] if self._readings else None
        self._readings.append(reading)
        if previous is None or replace(previous, at=None) != replace(reading, at=None):
            self._changed_at = now
        return ServerState(url, True, metrics=reading, previous=previous, baseline=baseline,
                           changed_at=self._changed_at)


def _client(server: str, transport: httpx.AsyncBaseTransport | None) -> SGLangClient:
    return SGLangClient(
        server, api_key=api_key_from_env(), transport=transport, timeout=httpx.Timeout(5.0)
    )


Sleep = Callable[[float], Awaitable[None]]


def _frame_width(console: Console) -> int | None:
    """The width to fit frames to: the terminal's; none when writing to a file or pipe."""
    return console.width if console.is_terminal else None


async def _watch(
    monitor: Monitor, console: Console, interval: float | None, live: bool, sleep: Sleep
) -> MonitorState:
    """One frame (interval None; returns its state), frames as text, or a live dashboard,
    until interrupted."""
    if interval is None:
        state = await monitor.poll()
        console.out(render_frame(state, _frame_width(console)), highlight=False)
        return state
    if not live:
        while True:
            frame = render_frame(await monitor.poll(), _frame_width(console))
            console.out(frame + "\n", highlight=False)
            await sleep(interval)
    with Live(console=console, auto_refresh=False, transient=False) as view:
        while True:
            view.update(render_rich(await monitor.poll(), console.width), refresh=True)
            await sleep(interval)


def has_run(out: Path) -> bool:
    """Whether `out` holds a run yet: a folder with run.json or a dataset's files."""
    return out.is_dir() and (manifest_path(out).is_file() or bool(find_datasets(out, {})))


def waiting_line(out: Path, width: int | None = None) -> str:
    """What the monitor waits for: the run folder to appear, or a run in it; fitted to
    `width` (the run folder's name only, then that name cut, on a narrow terminal)."""
    where = Part(str(out), out.name or str(out), sep=" ", shrink=True)
    if out.is_dir():
        return fit_line([Part("waiting for a run in", sep=""), where,
                         Part("(no run.json yet)", rank=1, sep=" "), Part("...", sep=" ")], width)
    return fit_line([Part("waiting for", sep=""), where, Part("to appear", sep=" "),
                     Part("(generate creates it once the server answered)",
                          "(generate creates it)", rank=1, sep=" "),
                     Part("...", sep=" ")], width)


def _short_reason(exc: ServerError) -> str:
    """`connection refused`, `host not found`, `timed out`, else the error's own words."""
    text = str(exc)
    if isinstance(exc, RequestTimeout):
        return "timed out"
    if "refused" in text.lower() or "connect call failed" in text.lower():
        return "connection refused"
    if "name or service not known" in text.lower() or "nodename nor servname" in text.lower():
        return "host not found"
    return text.removeprefix("connection failed: ")


async def server_reach(client: SGLangClient, width: int | None = None) -> str:
    """One line on whether the server answers (its /metrics):
    `server http://gpu:30000: unreachable (connection refused)`, fitted to `width`."""
    url = redact_url(client.base_url)
    try:
        await client.metrics()
        verdict = "reachable"
    except (ConnectionLost, RequestTimeout, ServerUnreachable) as exc:
        verdict = f"unreachable ({_short_reason(exc)})"
    except ServerError as exc:
        verdict = f"answers with an error ({exc})"
    return fit_line([Part("server", sep=""), Part(f"{url}:", sep=" ", shrink=True),
                     Part(verdict, sep=" ")], width)


async def wait_for_run_dir(
    out: Path,
    interval: float,
    sleep: Sleep,
    say: Callable[[str], None],
    client: SGLangClient | None = None,
    width: int | None = None,
) -> None:
    """Return once `out` holds a run (generate creates the folder after its preflight, then
    run.json), saying what it waits for, and with a `client` whether its server answers
    (again each time that changes); lines fitted to `width`."""
    if has_run(out):
        return
    said: list[str] = []
    while not has_run(out):
        lines = [waiting_line(out, width)]
        if client is not None:
            lines.append(await server_reach(client, width))
        for line in lines:
            if line not in said:
                say(line)
        said = lines
        await sleep(interval)


async def _monitor(
    out: Path,
    server: str | None,
    interval: float | None,
    live: bool,
    console: Console,
    transport: httpx.AsyncBaseTransport | None,
    clock: Callable[[], float],
    thresholds: Thresholds,
    sleep: Sleep,
) -> MonitorState | None:
    client = _client(server, transport) if server else None
    try:
        if interval is not None:
            await wait_for_run_dir(out, interval, sleep, lambda m: console.out(m, highlight=False),
                                   client, _frame_width(console))
        check_run_dir(out, need_datasets=False)
        monitor = Monitor(out, client=client, clock=clock, thresholds=thresholds,
                          worker_client=lambda url: _client(url, transport))
        try:
            return await _watch(monitor, console, interval, live, sleep)
        finally:
            await monitor.aclose()
    finally:
        if client is not None:
            await client.aclose()


def run_monitor(
    out: str | Path,
    server: str | None = None,
    interval: float | None = None,
    once: bool = False,
    console: Console | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.time,
    thresholds: Thresholds = Thresholds(),
    sleep: Sleep = asyncio.sleep,
) -> int:
    """``workbench monitor``: a live dashboard on a terminal, else plain-text frames.

    ``once`` prints one frame and returns 1 when it raised an alert (a dataset that wrote no
    record because all its prompts failed is one, however old its errors), else 0. Without a
    terminal, no ``interval`` means once; with one, a frame every ``interval`` seconds (2 by
    default on a terminal), fitted to the terminal's width, until Ctrl-C (then 0); a run
    directory that does not exist yet, or holds no run yet, is waited for, saying so and
    whether the ``server`` answers (:func:`wait_for_run_dir`). A bad directory raises
    InputError (the CLI's exit code 2).
    """
    if interval is not None and interval <= 0:
        raise ConfigError("--interval", f"must be positive, got {interval:g}")
    console = console if console is not None else Console()
    live = console.is_terminal and not once
    if once or (not live and interval is None):
        every = None
    else:
        every = interval if interval is not None else 2.0
    if every is None:
        check_run_dir(out, need_datasets=False)
    state = None
    with contextlib.suppress(KeyboardInterrupt):
        state = asyncio.run(
            _monitor(Path(out), server, every, live, console, transport, clock, thresholds, sleep))
    return 1 if every is None and state is not None and state.alerts else 0
