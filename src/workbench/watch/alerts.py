"""The monitor's alerts: one line each, ``ALERT <dataset, run or server>: <cause>``.

    stalled, degraded   the latest such event of the runner's log (run.json ``events``) in
                        its latest session that no later ``recovered`` event cleared: its
                        kind, age and message
    prompt_mismatch     per dataset, the runner's latest such event in any session (the
                        records it tells of stay): replies whose prompt_tokens are not the
                        ids sent, the server cut or changed the prompts
    schema_drift        a count missing in the most recent records read
    no_record           a dataset finished without a record: all its prompts failed (it
                        stands as long as the dataset is so, whatever the window)
    stale_writer        a dataset is stale
    error_rate          failed attempts over the threshold share of the recent window
    truncation          ``length`` finishes over the threshold share of the recent records
    bad_lines           unreadable lines in raw_responses.jsonl
    server_unreachable  no connection to the server (or it answers with errors)
    server_saturated    token usage at the top while the queue grows between two polls
    worker_unhealthy    a worker behind an sglang-router is marked unhealthy by the router

:func:`build_state` turns one frame's figures into statuses and alerts; it reads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.analyze.stats import DatasetStats, RunStats
from workbench.analyze.stats_text import no_record_note
from workbench.text import format_duration
from workbench.watch.status import (
    Alert,
    MonitorState,
    ServerState,
    Thresholds,
    dataset_status,
    done_text,
    last_write,
    run_is_active,
    run_started,
)

__all__ = ["ALERT_EVENTS", "CLEARING_EVENTS", "alerts", "build_state", "open_event"]

ALERT_EVENTS = ("stalled", "degraded")
CLEARING_EVENTS = ("recovered",)


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
    last = last_write(ds)
    if status != "stale" or last is None:
        return None
    return Alert(
        ds.name,
        "stale_writer",
        f"writer stopped: no append for {format_duration(now - last)} "
        f"while the run is active ({done_text(ds)} done)",
    )


def _no_record_alert(ds: DatasetStats) -> Alert | None:
    note = no_record_note(ds)
    return None if note is None else Alert(ds.name, "no_record", note)


def _dataset_alerts(ds: DatasetStats, status: str, stats: RunStats, th: Thresholds) -> list[Alert]:
    failed = _no_record_alert(ds)
    found = ([] if failed is None else [failed]) + _schema_alerts(ds)
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


def _events(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """run.json's events that have a kind and a time, oldest first (others are skipped:
    the log is another program's, the monitor shows what it can read)."""
    events = manifest.get("events")
    if not isinstance(events, list):
        return []
    usable = [e for e in events if isinstance(e, Mapping) and isinstance(e.get("kind"), str)
              and isinstance(e.get("ts"), (int, float)) and not isinstance(e.get("ts"), bool)]
    return sorted(usable, key=lambda e: float(e["ts"]))


def _session_start(manifest: Mapping[str, Any]) -> float | None:
    """When the latest generate session on the run started (run.json ``history``)."""
    history = manifest.get("history")
    last = history[-1] if isinstance(history, list) and history else None
    started = last.get("started") if isinstance(last, Mapping) else None
    return float(started) if isinstance(started, (int, float)) else None


def open_event(manifest: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The latest stalled or degraded event of the latest session that no later recovered
    event cleared (the log is kept across resumed sessions: an earlier one's is over)."""
    found = None
    since = _session_start(manifest)
    for event in _events(manifest):
        if since is not None and float(event["ts"]) < since:
            continue
        if event["kind"] in ALERT_EVENTS:
            found = event
        elif event["kind"] in CLEARING_EVENTS:
            found = None
    return found


def _event_alert(stats: RunStats) -> Alert | None:
    event = open_event(stats.manifest)
    if event is None:
        return None
    subject = event.get("dataset")
    return _told(subject if isinstance(subject, str) and subject else "run", event, stats.now)


def _mismatch_alerts(stats: RunStats) -> list[Alert]:
    """The latest prompt_mismatch event of each dataset, whichever session told it."""
    latest: dict[str, Mapping[str, Any]] = {}
    for event in _events(stats.manifest):
        dataset = event.get("dataset")
        if event["kind"] == "prompt_mismatch" and isinstance(dataset, str):
            latest[dataset] = event
    return [_told(name, event, stats.now) for name, event in latest.items()]


def _told(subject: str, event: Mapping[str, Any], now: float) -> Alert:
    """An alert of a runner's event: its kind, age and message."""
    kind, message = event["kind"], event.get("message")
    age = format_duration(max(0.0, now - float(event["ts"])))
    text = f"{kind} {age} ago" + (f": {message}" if isinstance(message, str) and message else "")
    return Alert(subject, kind, text)


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
    """Every alert of a frame: the runner's open event, per dataset in order, then the server's."""
    event = _event_alert(stats)
    found: list[Alert] = [] if event is None else [event]
    found += _mismatch_alerts(stats)
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
    started = run_started(stats)
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
