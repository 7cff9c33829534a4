"""A monitor frame drawn: the header, a table of the datasets, one line per dataset
regenerated turn by turn (its conversations: :mod:`workbench.watch.turns`), one line per
dataset that mixes modes (each mode's share written against wanted:
:mod:`workbench.watch.modes`), the server line
(its load, or why it is not shown, and the run's concurrency), one line per worker behind a
router, then the alerts. :func:`render_frame` gives plain text (pipes, ``--once``), :func:`render_rich` the
same frame with colours for the live dashboard.

Given a width (a terminal's), no line is longer, so nothing wraps: the table keeps its key
columns (dataset, status, done/target, tok/s, ETA) and adds the others by priority while they
fit (errors, completion tokens, last write, prompt tokens); when the key columns alone do not
fit, long dataset names end in an ellipsis, and below ``NAME_MIN`` characters large counts are
written short (``123.4k``) instead. The header and the server and worker lines take their
short phrases and give up the least important ones (:mod:`workbench.watch.fit`); an alert too
long ends in an ellipsis. Without a width, everything in full.

tok/s is :func:`workbench.rundir.rates.record_rates`, as in ``workbench stats`` and generate's
progress line; the header says its window, and a finished dataset's rate is over its running
time (it stays what it was when it finished). The total row's rate is the sum of the running
datasets' rates (a finished dataset's is left out), its ETA what is left at that rate; its
status is ``failed`` when no dataset wrote a record and their prompts failed. A dataset that
has not started is ``waiting``, without a last write. The server line's ``server gen`` is the server's own rate (its token
counter over the last minute of polls); once the run has ended the line starts with it, and
figures that have not changed for ``STALE_FIGURES`` seconds say since when.
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
from workbench.watch.fit import Part, cut, fit_line
from workbench.watch.modes import mode_lines
from workbench.watch.status import (
    MonitorState,
    ServerState,
    WorkerState,
    last_write,
    run_ended,
    started,
)
from workbench.watch.turns import TURNS_UNIT, conversation_lines, turns_datasets

__all__ = [
    "NAME_MIN",
    "STALE_FIGURES",
    "fit_columns",
    "header_line",
    "render_frame",
    "render_rich",
    "server_line",
    "worker_lines",
]

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

NAME_MIN = 10  # dataset names are cut to no less; below it, counts are written short first
STALE_FIGURES = 10.0  # seconds the server's figures may stay the same before the line says so


# --- the table -------------------------------------------------------------------------------


def _short_count(value: float | None) -> str:
    """``9,999``, ``12.3k``, ``456k``, ``7.8M``; ``-`` for unknown."""
    if value is None or abs(value) < 10_000:
        return format_count(value)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.1f}{unit}" if abs(scaled) < 100 else f"{scaled:.0f}{unit}"
    return format_count(value)  # pragma: no cover - the loop always returns


def _ago(now: float, when: float | None) -> str:
    return "-" if when is None else f"{format_duration(max(0.0, now - when))} ago"


def _tok_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _eta(ds: DatasetStats, status: str, short: bool) -> str:
    """Time left; for a dataset its budget stopped, the tokens against the budget."""
    count = _short_count if short else format_count
    if status == "budget":
        return f"{count(ds.completion_tokens)}/{count(ds.max_tokens)} tok"
    if ds.finished:
        return "failed" if ds.all_failed else "done"
    return "-" if status in ("stopped", "waiting") else format_duration(ds.eta_s)


def _done(ds: DatasetStats, short: bool, turns: bool = False) -> str:
    """`1,234/10,000` (`1,234/?` without a target), or `12.3k/100k` when short; a dataset
    regenerated turn by turn counts turns: `195/195 turns`."""
    count = _short_count if short else format_count
    target = "?" if ds.target_records is None else count(ds.target_records)
    return f"{count(ds.records)}/{target}" + (f" {TURNS_UNIT}" if turns else "")


def _row(ds: DatasetStats, status: str, now: float, short: bool, turns: bool = False) -> list[str]:
    count = _short_count if short else format_count
    return [
        ds.name,
        status,
        _done(ds, short, turns),
        count(ds.errors),
        count(ds.prompt_tokens),
        format_count(ds.avg_prompt_tokens),
        count(ds.completion_tokens),
        format_count(ds.avg_completion_tokens),
        _tok_rate(ds.tokens_per_s),
        _eta(ds, status, short),
        _ago(now, last_write(ds)) if started(ds) else "-",  # files made by generate: no write
    ]


def _total_status(state: MonitorState) -> str:
    if state.stats.total.finished:
        return "failed" if state.stats.total.all_failed else "done"
    if state.writer is False:
        return "stopped"
    return "active" if state.run_active else "inactive"


def _rows(state: MonitorState, short: bool = False) -> list[list[str]]:
    stats = state.stats
    turns = turns_datasets(stats)
    rows = [_row(ds, state.statuses[name], stats.now, short, name in turns)
            for name, ds in stats.datasets.items()]
    rows.append(_row(stats.total, _total_status(state), stats.now, short))
    return rows


def fit_columns(widths: list[int], width: int | None, gap: int) -> list[int]:
    """The columns to show, in table order: the key columns always, then the others by
    priority while the table (each column's widest cell, `gap` between two) fits in `width`."""
    if width is None:
        return list(range(len(widths)))
    chosen = list(_KEY_COLUMNS)
    used = sum(widths[i] for i in chosen) + gap * (len(chosen) - 1)
    for group in _OPTIONAL_COLUMNS:
        needed = sum(widths[i] + gap for i in group)
        if used + needed <= width:
            chosen += group
            used += needed
    return sorted(chosen)


def _column_widths(rows: list[list[str]]) -> list[int]:
    return [max(len(cell) for cell in column) for column in zip(_HEADERS, *rows, strict=False)]


def _layout(state: MonitorState, width: int | None, gap: int) -> tuple[list[int], list[list[str]]]:
    """(the columns shown, the rows with the names cut to fit): full counts while the names
    keep NAME_MIN characters, else short ones."""
    rows = _rows(state)
    if width is None:
        return list(range(len(_HEADERS))), rows
    for short in (False, True):
        rows = _rows(state, short) if short else rows
        widths = _column_widths(rows)
        keep = fit_columns(widths, width, gap)
        others = sum(widths[i] + gap for i in keep if i != 0)
        name_width = max(1, width - others)
        if name_width >= min(widths[0], NAME_MIN):
            break
    return keep, [[cut(row[0], name_width), *row[1:]] for row in rows]


# --- the lines -------------------------------------------------------------------------------


def header_line(state: MonitorState, width: int | None = None) -> str:
    """`workbench monitor OUT  2026-05-01 12:00:00  (rates over the last 5.0m; ...)`,
    shorter on a narrow terminal: without the note on finished datasets, the time only, the
    short rate note, the run folder's name only, then that name cut."""
    now = time.localtime(state.now)
    window = format_duration(state.stats.window)
    out = state.stats.out
    return fit_line([
        Part("workbench monitor", sep=""),
        Part(str(out), out.name or str(out), sep=" ", shrink=True),
        Part(time.strftime("%Y-%m-%d %H:%M:%S", now), time.strftime("%H:%M:%S", now), rank=3),
        Part(f"(rates over the last {window}", f"(rates: last {window}", rank=1),
        Part("; finished: over their running time", "", rank=4, sep=""),
        Part(")", sep=""),
    ], width)


def _server_url_hint(stats: RunStats) -> str:
    url = stats.manifest.get("server_url")  # written redacted; an edited run.json may not be
    return f"; the run used {redact_url(url)}" if isinstance(url, str) and url else ""


def server_line(state: MonitorState, width: int | None = None) -> str:
    """One line about the server: its load, its fallback info, or why it is not shown; then
    the run's concurrency (run.json) beside it; fitted to `width`."""
    concurrency = _concurrency_part(state.stats)
    return fit_line(_server_parts(state) + ([] if concurrency is None else [concurrency]), width)


def _concurrency_part(stats: RunStats) -> Part | None:
    """`| concurrency 96 (auto, metrics)` from run.json; None for runs that do not say."""
    record = stats.manifest.get("concurrency")
    if not isinstance(record, Mapping) or not isinstance(record.get("current"), int):
        return None
    mode = record.get("mode")
    how = "fixed" if mode == "fixed" else f"auto, {mode}"
    current = record["current"]
    return Part(f"concurrency {current} ({how})", f"concurrency {current}", rank=9, sep=" | ")


def _server_parts(state: MonitorState) -> list[Part]:
    server = state.server
    if server is None:
        return [Part(f"server: not polled (pass --server URL{_server_url_hint(state.stats)})",
                     "server: not polled (pass --server URL)")]
    head = Part(f"server {server.url}:", "server:", sep=" ")
    if not server.reachable:
        return [head, Part("UNREACHABLE", sep=" "), Part(f"({server.error})", rank=1, sep=" ")]
    if server.error:
        return [head, Part("error", sep=" "), Part(f"({server.error})", rank=1, sep=" ")]
    if server.workers is not None:
        healthy = sum(1 for w in server.workers if w.healthy is not False)
        return [Part(f"router {server.url}:", "router:", sep=""),
                Part(f"{len(server.workers)} workers ({healthy} healthy)", sep=" ")]
    if server.metrics is None:
        return [head, Part("metrics off (start it with --enable-metrics);", "metrics off;",
                           rank=1, sep=" "), *_info_parts(server.info or {})]
    return _ended_parts(state) + [head, *_metrics_parts(server, state.now)]


def _ended_parts(state: MonitorState) -> list[Part]:
    """`run ended 2.0m ago;` once the run's generate is gone: the figures after it are not
    the run's."""
    ended = run_ended(state.stats, state.writer)
    if ended is None:
        return []
    return [Part(f"run ended {format_duration(max(0.0, state.now - ended))} ago;", sep="")]


def _metrics_parts(server: ServerState, now: float) -> list[Part]:
    m = server.metrics
    assert m is not None
    usage = "-" if m.token_usage is None else f"{m.token_usage:.0%}"
    hit = "-" if server.cache_hit is None else f"{server.cache_hit:.0%}"
    parts = [
        Part(f"{format_count(m.running)} running", rank=1, sep=" "),
        Part(f"{format_count(m.queued)} queued", rank=3, sep=", "),
        Part(f"token usage {usage}", f"KV {usage}", rank=4, sep=", "),
        Part(f"server gen {_tok_rate(server.gen_rate)} tok/s", rank=2, sep=", "),
        Part(f"cache hit {hit}", rank=5, sep=", "),
    ]
    unchanged = server.unchanged_for(now)
    if unchanged is not None and unchanged >= STALE_FIGURES:
        parts.append(Part(f"unchanged for {format_duration(unchanged)}", sep=", "))
    return parts


def _info_parts(info: Mapping[str, Any]) -> list[Part]:
    """`/server_info: gen 620 tok/s (last logged), KV pool 40,000 tokens, ...`."""
    figures = []
    if info.get("gen_throughput") is not None:
        rate = _tok_rate(info["gen_throughput"])
        figures.append(Part(f"gen {rate} tok/s (last logged)", f"gen {rate} tok/s", rank=3))
    if info.get("max_total_num_tokens") is not None:
        figures.append(Part(f"KV pool {format_count(info['max_total_num_tokens'])} tokens", rank=5))
    if info.get("max_running_requests") is not None:
        figures.append(Part(f"max running {info['max_running_requests']}", rank=6))
    if info.get("version"):
        figures.append(Part(f"version {info['version']}", rank=7))
    first = [Part("/server_info:", rank=2, sep=" ")]
    if not figures:
        return [*first, Part("no load figures", rank=2, sep=" ")]
    return first + [Part(p.full, p.short, p.rank, sep=", ") for p in figures]


def worker_lines(state: MonitorState, width: int | None = None) -> list[str]:
    """One line per worker behind a router (none for a plain server)."""
    workers = state.server.workers if state.server is not None else None
    return [fit_line(_worker_parts(w), width) for w in workers or ()]


def _worker_parts(worker: WorkerState) -> list[Part]:
    health = {True: "healthy", False: "UNHEALTHY", None: "health unknown"}[worker.healthy]
    parts = [Part(f"  worker {worker.url}:", sep="", shrink=True), Part(health, sep=" ")]
    if worker.load is not None:
        parts.append(Part(f"load {worker.load}", rank=4, sep=", "))
    m = worker.metrics
    if m is not None:
        usage = "-" if m.token_usage is None else f"{m.token_usage:.0%}"
        rate = _tok_rate(m.gen_throughput)
        parts += [Part(f"{format_count(m.running)} running", rank=1, sep=", "),
                  Part(f"{format_count(m.queued)} queued", rank=3, sep=", "),
                  Part(f"token usage {usage}", f"KV {usage}", rank=5, sep=", "),
                  Part(f"gen {rate} tok/s (last logged)", f"gen {rate} tok/s", rank=2, sep=", ")]
    elif worker.error:
        parts.append(Part(f"metrics: {worker.error}", rank=1, sep=", "))
    return parts


# --- the frame -------------------------------------------------------------------------------


def render_frame(state: MonitorState, width: int | None = None) -> str:
    """One frame as plain text: header, table, server line, then the alerts; with `width`,
    no line longer (see the module docstring)."""
    keep, rows = _layout(state, width, gap=2)
    table = format_table([_HEADERS[i] for i in keep], [[r[i] for i in keep] for r in rows], left=2)
    lines = [header_line(state, width), table, *conversation_lines(state.stats, width),
             *mode_lines(state.stats, width), server_line(state, width)]
    lines += worker_lines(state, width)
    lines += [cut(str(alert), width) for alert in state.alerts] or ["no alerts"]
    return "\n".join(lines)


_STATUS_STYLES = {"running": "green", "done": "cyan", "failed": "bold red", "budget": "cyan",
                  "stopped": "yellow", "waiting": "dim", "idle": "dim", "stale": "bold red"}


def _line(text: str, style: str = "") -> Text:
    """A frame line that rich never wraps (cut with an ellipsis should it not fit)."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def render_rich(state: MonitorState, width: int | None = None) -> RenderableType:
    """The same frame as a rich renderable (a table with colours), fitted to `width`."""
    keep, rows = _layout(state, width, gap=3)
    table = Table(expand=False, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for index in keep:
        table.add_column(_HEADERS[index], justify="left" if index < 2 else "right", no_wrap=True,
                         overflow="ellipsis")
    for number, row in enumerate(rows):
        last = number == len(rows) - 1
        cells = [Text(row[i], style=_STATUS_STYLES.get(row[i], "") if i == 1 else "") for i in keep]
        table.add_row(*cells, end_section=number == len(rows) - 2, style="bold" if last else None)
    lines: list[RenderableType] = [_line(header_line(state, width)), table]
    lines += [_line(line) for line in conversation_lines(state.stats, width)]
    lines += [_line(line) for line in mode_lines(state.stats, width)]
    lines.append(_line(server_line(state, width)))
    lines += [_line(line) for line in worker_lines(state, width)]
    lines += [_line(str(alert), "bold red") for alert in state.alerts] or [
        _line("no alerts", "dim")
    ]
    return Group(*lines)
