"""A monitor frame drawn: a table of the datasets fitted to the terminal's width, the
server line (its load, or why it is not shown, and the run's concurrency), one line per
worker behind a router, then the alerts. :func:`render_frame` gives plain text (pipes,
``--once``), :func:`render_rich` the same frame with colours for the live dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from workbench.analyze.stats import DatasetStats, RunStats
from workbench.server.client import redact_url
from workbench.text import format_count, format_duration, format_table
from workbench.watch.status import MonitorState, ServerState, WorkerState, done_text

__all__ = ["fit_columns", "render_frame", "render_rich", "server_line", "worker_lines"]

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

_KEY_COLUMNS = (0, 1, 2, 8, 9)

_OPTIONAL_COLUMNS = ((3,), (6, 7), (10,), (4, 5))


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
        done_text(ds),
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
    url = stats.manifest.get("server_url")  # written redacted; an edited run.json may not be
    return f"; the run used {redact_url(url)}" if isinstance(url, str) and url else ""


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
