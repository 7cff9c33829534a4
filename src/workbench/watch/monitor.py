"""The live terminal monitor of a run directory, and the alerts it raises.

Each frame refreshes a :class:`~workbench.analyze.stats.StatsCollector` (only appended bytes are
read) and, with a server URL, reads ``/metrics`` (``/server_info`` when metrics are off).
Everything below the :class:`Monitor` is pure: :func:`build_state` turns figures into
statuses and :func:`alerts`, :func:`render_frame` and :func:`render_rich` draw them.

Dataset status:

    done      records plus failed ids reach the target
    budget    the dataset's token budget stopped it before its target
    stopped   not done, and the generate that wrote the run is gone (its lock on
              ``OUT/.writer.lock`` is free: see :mod:`workbench.rundir.lock`)
    running   its raw or errors file holds lines and was written within ``stale_after`` s
    stale     it holds lines, was written since the run started (run.json "updated") but not
              within ``stale_after`` s, and the run is active
    idle      anything else: nothing written yet, or written only by an earlier run, or
              the run is not active

The run is active while a generate holds the run's lock; without a lock file (older runs,
or no ``fcntl``) when any file of the run was written within ``stale_after`` seconds,
when run.json was written that recently (a run that just started), or when the polled
server's token or request counters advanced since its baseline reading (up to a minute
earlier; its gauges keep their last value when it idles, so they are not used).

Alerts (one line each, ``ALERT <dataset or server>: <cause>``):

    schema_drift        a count missing in the most recent records read
    stale_writer        a dataset is stale
    error_rate          failed attempts over the threshold share of the recent window
    truncation          ``length`` finishes over the threshold share of the recent records
    bad_lines           unreadable lines in raw_responses.jsonl
    server_unreachable  no connection to the server (or it answers with errors)
    server_saturated    token usage at the top while the queue grows between two polls
    worker_unhealthy    a worker behind an sglang-router is marked unhealthy by the router

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.analyze.stats import (
    DEFAULT_WINDOW,
    DatasetStats,
    RunStats,
    StatsCollector,
    check_run_dir,
    format_count,
    format_duration,
    format_table,
)
from workbench.rundir.lock import writer_alive
from workbench.server.metrics import MetricsSnapshot, cache_hit_rate, generation_rate, parse_metrics

if TYPE_CHECKING:
    import httpx
    from rich.console import Console, RenderableType

    from workbench.server.client import SGLangClient

__all__ = [
    "STATUSES",
    "Alert",
    "Monitor",
    "MonitorState",
    "ServerState",
    "Thresholds",
    "WorkerState",
    "alerts",
    "build_state",
    "dataset_status",
    "fit_columns",
    "render_frame",
    "render_rich",
    "run_is_active",
    "run_monitor",
    "server_line",
    "stopped_by_budget",
    "wait_for_run_dir",
]

STATUSES = ("running", "done", "budget", "stopped", "idle", "stale")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a status turns stale and when an alert fires."""

    stale_after: float = 120.0
    error_rate: float = 0.10
    min_errors: int = 5
    truncation_rate: float = 0.25
    min_finished: int = 20
    token_usage: float = 0.95


@dataclass(frozen=True, slots=True)
class Alert:
    """One problem: the dataset (or "server") it concerns, a cause key and a message."""

    subject: str
    cause: str
    message: str

    def __str__(self) -> str:
        return f"ALERT {self.subject}: {self.message}"


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker behind a router: the router's view, and its own /metrics when readable."""

    url: str
    healthy: bool | None = None
    load: int | None = None
    metrics: MetricsSnapshot | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ServerState:
    """The result of one server poll.

    ``previous`` is the reading of the poll before, ``baseline`` the oldest kept reading
    (rates and the cache hit rate are taken over the interval since it); ``info`` holds a
    few ``/server_info`` values when the server runs without metrics; ``workers`` is set when
    the server is an sglang-router.
    """

    url: str
    reachable: bool
    error: str | None = None
    metrics: MetricsSnapshot | None = None
    previous: MetricsSnapshot | None = None
    baseline: MetricsSnapshot | None = None
    info: Mapping[str, Any] | None = None
    workers: tuple[WorkerState, ...] | None = None

    @property
    def busy(self) -> bool:
        """Whether the server's counters advanced since the baseline reading.

        Not the gauges: SGLang sets them when it logs, so an idle server keeps showing its
        last load. One reading alone says nothing.
        """
        current, baseline = self.metrics, self.baseline
        if current is None or baseline is None:
            return False
        pairs = ((current.generation_tokens, baseline.generation_tokens),
                 (current.requests, baseline.requests))
        return any(now is not None and then is not None and now > then for now, then in pairs)

    @property
    def gen_rate(self) -> float | None:
        """Generated tok/s from the counters, else the server's own gauge."""
        if self.metrics is None:
            return None
        rate = generation_rate(self.metrics, self.baseline)
        return rate if rate is not None else self.metrics.gen_throughput

    @property
    def cache_hit(self) -> float | None:
        return None if self.metrics is None else cache_hit_rate(self.metrics, self.baseline)


@dataclass(frozen=True, slots=True)
class MonitorState:
    """Everything one frame shows."""

    stats: RunStats
    statuses: Mapping[str, str]
    run_active: bool
    server: ServerState | None
    alerts: tuple[Alert, ...]
    thresholds: Thresholds
    writer: bool | None = None

    @property
    def now(self) -> float:
        return self.stats.now


# --- statuses --------------------------------------------------------------------------------


def _last_write(ds: DatasetStats) -> float | None:
    times = [t for t in (ds.last_write, ds.last_error_write) if t is not None]
    return max(times) if times else None


def _run_started(stats: RunStats) -> float | None:
    """When the current run wrote run.json ("updated"), if known."""
    updated = stats.manifest.get("updated")
    return float(updated) if isinstance(updated, (int, float)) else None


def run_is_active(
    stats: RunStats, server: ServerState | None, stale_after: float, writer: bool | None = None
) -> bool:
    """Whether a run seems to be going on (see the module docstring)."""
    if writer is not None:
        return writer
    recent = [_last_write(d) for d in stats.datasets.values()] + [_run_started(stats)]
    if any(t is not None and stats.now - t <= stale_after for t in recent):
        return True
    return server is not None and server.busy


def stopped_by_budget(ds: DatasetStats) -> bool:
    """The token budget ended the dataset before its target."""
    budget_spent = ds.max_tokens is not None and ds.completion_tokens >= ds.max_tokens
    short = ds.target_records is None or ds.records + ds.failed_missing < ds.target_records
    return ds.finished and budget_spent and short


def dataset_status(
    ds: DatasetStats,
    *,
    now: float,
    run_active: bool,
    stale_after: float,
    run_started: float | None = None,
    writer: bool | None = None,
) -> str:
    """running, done, budget, stopped, idle or stale (see the module docstring)."""
    if ds.finished:
        return "budget" if stopped_by_budget(ds) else "done"
    if writer is False:
        return "stopped"
    last = _last_write(ds)
    if last is None or not (ds.records or ds.errors or ds.bad_lines or ds.torn_tail):
        return "idle"
    if now - last <= stale_after:
        return "running"
    written_this_run = run_started is None or last >= run_started
    return "stale" if run_active and written_this_run else "idle"


# --- alerts ----------------------------------------------------------------------------------


def _percent(part: float, whole: float) -> str:
    return f"{part / whole:.0%}"


def _schema_alerts(ds: DatasetStats) -> list[Alert]:
    recent = ds.recent
    found = []
    for name, missing in (
        ("completion_tokens", recent.missing_completion),
        ("prompt_tokens", recent.missing_prompt),
    ):
        if missing:
            found.append(
                Alert(
                    ds.name,
                    "schema_drift",
                    f"{name} missing in {missing}/{recent.rows} records "
                    f"(most recent; layout {ds.layout})",
                )
            )
    return found


def _error_alert(ds: DatasetStats, th: Thresholds, window: float) -> Alert | None:
    errors, records = ds.recent.window_errors, ds.recent.window_records
    if errors < th.min_errors or errors / (errors + records) <= th.error_rate:
        return None
    share = _percent(errors, errors + records)
    return Alert(
        ds.name,
        "error_rate",
        f"error rate {share} in the last {format_duration(window)} "
        f"({errors} errors, {records} records)",
    )


def _truncation_alert(ds: DatasetStats, th: Thresholds) -> Alert | None:
    cut, finished = ds.recent.truncated, ds.recent.with_reason
    if finished < th.min_finished or cut / finished <= th.truncation_rate:
        return None
    return Alert(
        ds.name,
        "truncation",
        f"truncation rate {_percent(cut, finished)} "
        f"(finish_reason length in {cut}/{finished} recent records)",
    )


def _stale_alert(ds: DatasetStats, status: str, now: float) -> Alert | None:
    last = _last_write(ds)
    if status != "stale" or last is None:
        return None
    return Alert(
        ds.name,
        "stale_writer",
        f"writer stopped: no append for {format_duration(now - last)} "
        f"while the run is active ({_done(ds)} done)",
    )


def _dataset_alerts(ds: DatasetStats, status: str, stats: RunStats, th: Thresholds) -> list[Alert]:
    found = _schema_alerts(ds)
    if ds.bad_lines:
        found.append(
            Alert(ds.name, "bad_lines", f"{ds.bad_lines} unreadable lines in raw_responses.jsonl")
        )
    optional = (
        _stale_alert(ds, status, stats.now),
        _error_alert(ds, th, stats.window),
        _truncation_alert(ds, th),
    )
    return found + [alert for alert in optional if alert is not None]


def _worker_alerts(server: ServerState) -> list[Alert]:
    return [
        Alert("server", "worker_unhealthy",
              f"worker {w.url} marked unhealthy by the router {server.url}")
        for w in server.workers or ()
        if w.healthy is False
    ]


def _server_alerts(server: ServerState, th: Thresholds) -> list[Alert]:
    if server.workers is not None:
        return _worker_alerts(server)
    if not server.reachable:
        return [
            Alert("server", "server_unreachable", f"unreachable at {server.url}: {server.error}")
        ]
    if server.error:
        return [
            Alert(
                "server",
                "server_unreachable",
                f"{server.url} answers with an error: {server.error}",
            )
        ]
    current, previous = server.metrics, server.previous
    if current is None or previous is None or current.token_usage is None:
        return []
    if current.queued is None or previous.queued is None:
        return []
    if current.token_usage >= th.token_usage and current.queued > previous.queued:
        return [
            Alert(
                "server",
                "server_saturated",
                f"token usage {current.token_usage:.0%} pinned at the top while the queue grows "
                f"({previous.queued:.0f} -> {current.queued:.0f} queued)",
            )
        ]
    return []


def alerts(
    stats: RunStats, statuses: Mapping[str, str], server: ServerState | None, thresholds: Thresholds
) -> list[Alert]:
    """Every alert of a frame: per dataset in order, then the server's."""
    found: list[Alert] = []
    for name, ds in stats.datasets.items():
        found += _dataset_alerts(ds, statuses.get(name, "idle"), stats, thresholds)
    if server is not None:
        found += _server_alerts(server, thresholds)
    return found


def build_state(
    stats: RunStats,
    server: ServerState | None,
    thresholds: Thresholds = Thresholds(),
    writer: bool | None = None,
) -> MonitorState:
    """Statuses and alerts of one frame, from figures only (`writer`: whether a generate
    holds the run's lock; None when unknown)."""
    active = run_is_active(stats, server, thresholds.stale_after, writer)
    started = _run_started(stats)
    statuses = {
        name: dataset_status(
            ds,
            now=stats.now,
            run_active=active,
            stale_after=thresholds.stale_after,
            run_started=started,
            writer=writer,
        )
        for name, ds in stats.datasets.items()
    }
    found = alerts(stats, statuses, server, thresholds)
    return MonitorState(stats, statuses, active, server, tuple(found), thresholds, writer)


# --- drawing ---------------------------------------------------------------------------------

_HEADERS = (
    "dataset",
    "status",
    "done/target",
    "errors",
    "prompt tok",
    "avg",
    "completion tok",
    "avg",
    "tok/s",
    "ETA",
    "last write",
)
# The key columns, always shown whole, then the others by priority while they fit (an
# average only with its total).
_KEY_COLUMNS = (0, 1, 2, 8, 9)
_OPTIONAL_COLUMNS = ((3,), (6, 7), (10,), (4, 5))


def _done(ds: DatasetStats) -> str:
    target = "?" if ds.target_records is None else f"{ds.target_records:,}"
    return f"{ds.records:,}/{target}"


def _ago(now: float, when: float | None) -> str:
    return "-" if when is None else f"{format_duration(max(0.0, now - when))} ago"


def _tok_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _eta(ds: DatasetStats, status: str) -> str:
    """Time left; for a dataset its budget stopped, the tokens against the budget."""
    if status == "budget":
        return f"{format_count(ds.completion_tokens)}/{format_count(ds.max_tokens)} tok"
    if ds.finished:
        return "done"
    return "-" if status == "stopped" else format_duration(ds.eta_s)


def _row(ds: DatasetStats, status: str, now: float) -> list[str]:
    return [
        ds.name,
        status,
        _done(ds),
        format_count(ds.errors),
        format_count(ds.prompt_tokens),
        format_count(ds.avg_prompt_tokens),
        format_count(ds.completion_tokens),
        format_count(ds.avg_completion_tokens),
        _tok_rate(ds.tokens_per_s),
        _eta(ds, status),
        _ago(now, ds.last_write),
    ]


def _total_status(state: MonitorState) -> str:
    if state.stats.total.finished:
        return "done"
    if state.writer is False:
        return "stopped"
    return "active" if state.run_active else "inactive"


def _rows(state: MonitorState) -> list[list[str]]:
    stats = state.stats
    rows = [_row(ds, state.statuses[name], stats.now) for name, ds in stats.datasets.items()]
    rows.append(_row(stats.total, _total_status(state), stats.now))
    return rows


def fit_columns(widths: list[int], width: int | None, gap: int) -> list[int]:
    """The columns to show, in table order: the key columns always, then the others by
    priority while the table (each column's widest cell plus `gap`) fits in `width`."""
    if width is None:
        return list(range(len(widths)))
    chosen = list(_KEY_COLUMNS)
    used = sum(widths[i] + gap for i in chosen)
    for group in _OPTIONAL_COLUMNS:
        needed = sum(widths[i] + gap for i in group)
        if used + needed <= width:
            chosen += group
            used += needed
    return sorted(chosen)


def _column_widths(rows: list[list[str]]) -> list[int]:
    return [max(len(cell) for cell in column) for column in zip(_HEADERS, *rows, strict=False)]


def _header(state: MonitorState, width: int | None = None) -> str:
    """The frame's first line; on a narrow terminal without the date and the rate window."""
    now = time.localtime(state.now)
    window = format_duration(state.stats.window)
    full = (f"workbench monitor {state.stats.out}  {time.strftime('%Y-%m-%d %H:%M:%S', now)}  "
            f"(rates over the last {window})")
    if width is None or len(full) <= width:
        return full
    return f"workbench monitor {state.stats.out}  {time.strftime('%H:%M:%S', now)}"


def _server_url_hint(stats: RunStats) -> str:
    url = stats.manifest.get("server_url")
    return f"; the run used {url}" if isinstance(url, str) and url else ""


def server_line(state: MonitorState) -> str:
    """One line about the server: its load, its fallback info, or why it is not shown; then
    the run's concurrency (run.json) beside it."""
    return _server_text(state) + _concurrency_note(state.stats)


def _concurrency_note(stats: RunStats) -> str:
    """` | concurrency 96 (auto, metrics)` from run.json; empty for runs that do not say."""
    record = stats.manifest.get("concurrency")
    if not isinstance(record, Mapping) or not isinstance(record.get("current"), int):
        return ""
    mode = record.get("mode")
    how = "fixed" if mode == "fixed" else f"auto, {mode}"
    return f" | concurrency {record['current']} ({how})"


def _server_text(state: MonitorState) -> str:
    server = state.server
    if server is None:
        return f"server: not polled (pass --server URL{_server_url_hint(state.stats)})"
    if not server.reachable:
        return f"server {server.url}: UNREACHABLE ({server.error})"
    if server.error:
        return f"server {server.url}: error ({server.error})"
    if server.workers is not None:
        healthy = sum(1 for w in server.workers if w.healthy is not False)
        return f"router {server.url}: {len(server.workers)} workers ({healthy} healthy)"
    if server.metrics is None:
        info = _info_text(server.info or {})
        return f"server {server.url}: metrics off (start it with --enable-metrics); {info}"
    return f"server {server.url}: {_metrics_text(server)}"


def worker_lines(state: MonitorState) -> list[str]:
    """One line per worker behind a router (none for a plain server)."""
    workers = state.server.workers if state.server is not None else None
    return [f"  worker {w.url}: {_worker_text(w)}" for w in workers or ()]


def _worker_text(worker: WorkerState) -> str:
    health = {True: "healthy", False: "UNHEALTHY", None: "health unknown"}[worker.healthy]
    parts = [health] + ([] if worker.load is None else [f"load {worker.load}"])
    m = worker.metrics
    if m is not None:
        parts += [f"{format_count(m.running)} running", f"{format_count(m.queued)} queued"]
        usage = "-" if m.token_usage is None else f"{m.token_usage:.0%}"
        parts += [f"token usage {usage}", f"gen {_tok_rate(m.gen_throughput)} tok/s (last logged)"]
    elif worker.error:
        parts.append(f"metrics: {worker.error}")
    return ", ".join(parts)


def _metrics_text(server: ServerState) -> str:
    m = server.metrics
    assert m is not None
    parts = [f"{format_count(m.running)} running", f"{format_count(m.queued)} queued"]
    parts.append("token usage -" if m.token_usage is None else f"token usage {m.token_usage:.0%}")
    parts.append(f"gen {_tok_rate(server.gen_rate)} tok/s")
    hit = server.cache_hit
    parts.append("cache hit -" if hit is None else f"cache hit {hit:.0%}")
    return ", ".join(parts)


def _info_text(info: Mapping[str, Any]) -> str:
    parts = []
    if info.get("gen_throughput") is not None:
        parts.append(f"gen {_tok_rate(info['gen_throughput'])} tok/s (last logged)")
    if info.get("max_total_num_tokens") is not None:
        parts.append(f"KV pool {format_count(info['max_total_num_tokens'])} tokens")
    if info.get("max_running_requests") is not None:
        parts.append(f"max running {info['max_running_requests']}")
    if info.get("version"):
        parts.append(f"version {info['version']}")
    return "/server_info: " + (", ".join(parts) if parts else "no load figures")


def render_frame(state: MonitorState, width: int | None = None) -> str:
    """One frame as plain text: header, table, server line, then the alerts. With `width`,
    the table keeps the columns that fit (never cutting a value)."""
    rows = _rows(state)
    keep = fit_columns(_column_widths(rows), width, gap=2)
    table = format_table([_HEADERS[i] for i in keep], [[r[i] for i in keep] for r in rows], left=2)
    lines = [_header(state, width), table, server_line(state)]
    lines += worker_lines(state)
    lines += [str(alert) for alert in state.alerts] or ["no alerts"]
    return "\n".join(lines)


_STATUS_STYLES = {"running": "green", "done": "cyan", "budget": "cyan", "stopped": "yellow",
                  "idle": "dim", "stale": "bold red"}


def render_rich(state: MonitorState, width: int | None = None) -> RenderableType:
    """The same frame as a rich renderable (a table with colours), fitted to `width`."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rows = _rows(state)
    keep = fit_columns(_column_widths(rows), width, gap=3)
    table = Table(title=_header(state, width), title_justify="left", expand=False, box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
    for index in keep:
        table.add_column(_HEADERS[index], justify="left" if index < 2 else "right", no_wrap=index > 0,
                         overflow="fold", min_width=len(_HEADERS[index]) if index == 0 else None)
    for number, row in enumerate(rows):
        last = number == len(rows) - 1
        cells = [Text(row[i], style=_STATUS_STYLES.get(row[i], "") if i == 1 else "") for i in keep]
        table.add_row(*cells, end_section=number == len(rows) - 2, style="bold" if last else None)
    lines: list[RenderableType] = [table, Text(server_line(state))]
    lines += [Text(line) for line in worker_lines(state)]
    lines += [Text(str(alert), style="bold red") for alert in state.alerts] or [
        Text("no alerts", style="dim")
    ]
    return Group(*lines)


# --- polling ---------------------------------------------------------------------------------


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
    the rates shown.
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

    async def poll(self) -> MonitorState:
        """Refresh the figures, poll the server, and return the frame's state."""
        now = self.clock()
        stats = self.collector.refresh(now)
        server = await self.poll_server(now) if self.client is not None else None
        return build_state(stats, server, self.thresholds, writer_alive(stats.out))

    async def poll_server(self, now: float) -> ServerState:
        """Read /metrics (or /server_info when metrics are off); failures become the state."""
        from workbench.errors import ConnectionLost, RequestTimeout, ServerError, ServerUnreachable
        from workbench.server.client import redact_url

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
        from workbench.errors import ServerError
        from workbench.server.client import redact_url

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
        return ServerState(url, True, metrics=reading, previous=previous, baseline=baseline)


# --- the command -----------------------------------------------------------------------------


def _client(server: str, transport: httpx.AsyncBaseTransport | None) -> SGLangClient:
    import httpx

    from workbench.server.client import SGLangClient, api_key_from_env

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
    from rich.live import Live

    with Live(console=console, auto_refresh=False, transient=False) as view:
        while True:
            view.update(render_rich(await monitor.poll(), console.width), refresh=True)
            await sleep(interval)


async def wait_for_run_dir(out: Path, interval: float, sleep: Sleep, say: Callable[[str], None]) -> None:
    """Return once out exists (generate creates it after its preflight), saying so once."""
    if out.exists():
        return
    say(f"waiting for {out} to appear (generate creates it once the server answered) ...")
    while not out.exists():
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
    if interval is not None:
        await wait_for_run_dir(out, interval, sleep, lambda m: console.out(m, highlight=False))
    check_run_dir(out, need_datasets=False)
    client = _client(server, transport) if server else None
    monitor = Monitor(out, client=client, clock=clock, thresholds=thresholds,
                      worker_client=lambda url: _client(url, transport))
    try:
        return await _watch(monitor, console, interval, live, sleep)
    finally:
        await monitor.aclose()
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

    ``once`` prints one frame and returns 1 when it raised an alert, else 0. Without a
    terminal, no ``interval`` means once; with one, a frame every ``interval`` seconds (2 by
    default on a terminal), fitted to the terminal's width, until Ctrl-C (then 0); a run
    directory that does not exist yet is waited for. A bad directory raises InputError.
    """
    from rich.console import Console

    from workbench.errors import ConfigError

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
