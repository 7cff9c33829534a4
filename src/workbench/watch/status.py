"""What one monitor frame knows: the thresholds, the server's state and each dataset's status.

Dataset status:

    done      records plus failed ids reach the target
    failed    finished without a record: every prompt it was to send failed (a dataset that
              has written nothing yet and still has prompts to send is not failed)
    budget    the dataset's token budget stopped it before its target
    waiting   nothing written yet: no record, no failed attempt, no unreadable line (its
              files may exist: generate creates them before it sends anything)
    stopped   started, not done, and the generate that wrote the run is gone (its lock on
              ``OUT/.writer.lock`` is free: see :mod:`workbench.rundir.lock`)
    running   its raw or errors file holds lines and was written within ``stale_after`` s
    stale     it holds lines, was written since the run started (run.json "updated") but not
              within ``stale_after`` s, and the run is active
    idle      anything else: written only by an earlier run, or the run is not active

The run is active while a generate holds the run's lock; without a lock file (older runs,
or no ``fcntl``) when any file of the run was written within ``stale_after`` seconds,
when run.json was written that recently (a run that just started), or when the polled
server's token or request counters advanced since its baseline reading (up to a minute
earlier; its gauges keep their last value when it idles, so they are not used).

The run has ended (:func:`run_ended`) once the generate that wrote it is gone (its lock is
free); it ended when it last wrote run.json (it does when it closes) or a record, whichever
is later. The server's figures are then those of a server the run no longer uses, and the
monitor says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.analyze import eta
from workbench.analyze.stats import DatasetStats, RunStats
from workbench.server.metrics import MetricsSnapshot, cache_hit_rate, generation_rate

__all__ = [
    "STATUSES",
    "Alert",
    "MonitorState",
    "ServerState",
    "Thresholds",
    "WorkerState",
    "dataset_status",
    "done_text",
    "last_write",
    "run_ended",
    "run_is_active",
    "run_started",
    "started",
    "stopped_by_budget",
]

STATUSES = ("running", "done", "failed", "budget", "waiting", "stopped", "idle", "stale")


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
    the server is an sglang-router; ``changed_at`` is when the metrics last differed from the
    reading before (the first reading's time when they never did): SGLang's gauges keep their
    last value while the server idles, so unchanged figures are old ones.
    """

    url: str
    reachable: bool
    error: str | None = None
    metrics: MetricsSnapshot | None = None
    previous: MetricsSnapshot | None = None
    baseline: MetricsSnapshot | None = None
    info: Mapping[str, Any] | None = None
    workers: tuple[WorkerState, ...] | None = None
    changed_at: float | None = None

    def unchanged_for(self, now: float) -> float | None:
        """Seconds the metrics have read the same (None without metrics or history)."""
        if self.metrics is None or self.changed_at is None:
            return None
        return max(0.0, now - self.changed_at)

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


def last_write(ds: DatasetStats) -> float | None:
    times = [t for t in (ds.last_write, ds.last_error_write) if t is not None]
    return max(times) if times else None


def started(ds: DatasetStats) -> bool:
    """Whether anything was written for the dataset: a record, a failed attempt, a line."""
    return bool(ds.records or ds.errors or ds.bad_lines or ds.torn_tail)


def run_ended(stats: RunStats, writer: bool | None) -> float | None:
    """When the run ended, once its generate is gone (`writer` False); else None."""
    if writer is not False:
        return None
    times = [last_write(d) for d in stats.datasets.values()] + [run_started(stats)]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def run_started(stats: RunStats) -> float | None:
    """When the current run wrote run.json ("updated"), if known."""
    updated = stats.manifest.get("updated")
    return float(updated) if isinstance(updated, (int, float)) else None


def run_is_active(
    stats: RunStats, server: ServerState | None, stale_after: float, writer: bool | None = None
) -> bool:
    """Whether a run seems to be going on (see the module docstring)."""
    if writer is not None:
        return writer
    recent = [last_write(d) for d in stats.datasets.values()] + [run_started(stats)]
    if any(t is not None and stats.now - t <= stale_after for t in recent):
        return True
    return server is not None and server.busy


def stopped_by_budget(ds: DatasetStats) -> bool:
    """The token budget ended the dataset before its target."""
    return ds.finished and eta.stopped_by_budget(ds)


def dataset_status(
    ds: DatasetStats,
    *,
    now: float,
    run_active: bool,
    stale_after: float,
    run_started: float | None = None,
    writer: bool | None = None,
) -> str:
    """running, done, failed, budget, waiting, stopped, idle or stale (the module docstring)."""
    if ds.finished:
        return "failed" if ds.all_failed else "budget" if stopped_by_budget(ds) else "done"
    last = last_write(ds)
    if last is None or not started(ds):
        return "waiting"
    if writer is False:
        return "stopped"
    if now - last <= stale_after:
        return "running"
    written_this_run = run_started is None or last >= run_started
    return "stale" if run_active and written_this_run else "idle"


def done_text(ds: DatasetStats) -> str:
    """`1,234/10,000`: records against the target (`?` when unknown)."""
    target = "?" if ds.target_records is None else f"{ds.target_records:,}"
    return f"{ds.records:,}/{target}"
