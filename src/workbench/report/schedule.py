"""``workbench report NAME --every 30m [--until done] [--keep N]``: a report kept up to date.

Every interval the loop checks the report's inputs against its newest finished rendering of
the same run in the reports folder (:func:`workbench.report.render.changes_since_latest`:
the provenance digests of the run's files, which read only what was appended, and the
notebook's digest). It renders when something changed, or when there is no rendering yet;
otherwise it says ``inputs unchanged, next check at HH:MM:SS``. A rendering that fails
(a cell raised) is said and listed in the index; the loop goes on, and the next check tries
again, since the newest finished rendering is still the older one. So does a check that
fails after the first one (the parameter file edited wrong, the run moved away).

``until="done"`` stops the loop once the run is finished, after a last check (so the last
rendering shows the finished run): finished as ``workbench stats`` says it, every dataset's
records plus failed ids at its target, or its completion tokens at its budget
(:mod:`workbench.analyze.eta`). Only a report that reads a run (``run_dir``) can wait for
one. ``keep`` prunes the report's older renderings after each new one
(:func:`workbench.report.index.prune`; never the ``-latest`` one).

Time is injected: `clock` (wall time, for the times said) and `sleep`; Ctrl-C
(KeyboardInterrupt) is the caller's to catch, between or during checks.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.analyze.stats import collect_stats
from workbench.errors import ConfigError, InputError, ReportError
from workbench.report import index
from workbench.report.render import (
    DEFAULT_OUT,
    Planned,
    ReportResult,
    changes_since_latest,
    plan_report,
    run_report,
)

__all__ = ["UNTIL", "Schedule", "Watch", "parse_interval", "run_finished", "watch_report"]

UNTIL = ("done",)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")

Say = Callable[[str], None]


def parse_interval(text: str) -> float:
    """Seconds of ``30m``, ``2s``, ``1h30m``, ``1.5h`` or a plain number of seconds;
    ConfigError naming ``--every`` otherwise."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _PART.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ConfigError("--every", f"expected an interval like 30s, 10m, 1h or 1h30m, "
                                         f"got {text!r}") from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not 0 < seconds < float("inf"):
        raise ConfigError("--every", f"expected an interval above 0, got {text!r}")
    return seconds


def run_finished(run_dir: str | os.PathLike[str]) -> bool:
    """Whether every dataset of the run reached its target or its token budget (what
    ``workbench stats`` calls finished); False while a target is unknown."""
    return collect_stats(run_dir).total.finished


@dataclass(frozen=True, slots=True)
class Schedule:
    """What to render and how often."""

    name: str
    params_file: str | os.PathLike[str] | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    out_dir: str | os.PathLike[str] = DEFAULT_OUT
    every: float = 1800.0
    until: str | None = None  # "done": stop when the run is finished
    keep: int | None = None
    notebooks: str | os.PathLike[str] | None = None


@dataclass(slots=True)
class Watch:
    """What a schedule did so far."""

    checks: int = 0
    rendered: list[ReportResult] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    finished: bool = False  # stopped because the run was finished


Render = Callable[[Schedule], ReportResult]


def _render(schedule: Schedule) -> ReportResult:
    return run_report(schedule.name, schedule.params_file, schedule.overrides, schedule.out_dir,
                      notebooks=schedule.notebooks)


def _plan(schedule: Schedule) -> Planned:
    planned = plan_report(schedule.name, schedule.params_file, schedule.overrides,
                          notebooks=schedule.notebooks)
    if schedule.until == "done" and not planned.parameters.get("run_dir"):
        raise ConfigError("--until", f"{schedule.name} reads no run (no run_dir parameter): "
                                     "nothing to wait for")
    return planned


def _clock_text(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(seconds))


def _reason(changes: list[Any] | None) -> str:
    if changes is None:
        return "no rendering yet"
    shown = "; ".join(change.line() for change in changes[:3])
    return shown + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")


def _check(schedule: Schedule, planned: Planned, watch: Watch, render: Render, say: Say) -> str:
    """One check: render when the inputs changed; "unchanged", "rendered" or "failed"
    (the failure said and kept, never raised)."""
    changes = changes_since_latest(schedule.out_dir, planned)
    watch.checks += 1
    if changes == []:
        return "unchanged"
    say(f"rendering {schedule.name} ({_reason(changes)})")
    try:
        result = render(schedule)
    except ReportError as exc:
        watch.failed.append(str(exc))
        say(f"rendering failed: {exc}")
        return "failed"
    watch.rendered.append(result)
    say(f"rendered {result.html_path}")
    if schedule.keep is not None:
        for folder in index.prune(schedule.out_dir, schedule.name, schedule.keep):
            say(f"removed {folder}")
        index.write_index(schedule.out_dir)
    return "rendered"


def watch_report(
    schedule: Schedule,
    *,
    say: Say,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    render: Render = _render,
    finished: Callable[[str], bool] = run_finished,
) -> Watch:
    """Check, render when needed, wait `schedule.every` seconds; again, until the run is
    finished (``until="done"``) or forever. ConfigError or InputError (before the first
    check) for bad parameters or a missing run; afterwards a failed rendering or check (a bad
    edit of the parameter file, a run moved away) is said and the next interval tried."""
    _plan(schedule)  # bad parameters end it before anything runs
    watch = Watch()
    while True:
        started = clock()
        try:
            planned = _plan(schedule)  # the parameter file read again: an edit applies now
            run = planned.parameters.get("run_dir")
            done = schedule.until == "done" and bool(run) and finished(str(run))
            outcome = _check(schedule, planned, watch, render, say)
        except InputError as exc:  # the parameter file edited wrong, the run moved away
            watch.failed.append(str(exc))
            say(f"check failed: {exc}")
            done, outcome = False, "failed"
        if done:
            watch.finished = True
            say(f"run finished: {run}")
            return watch
        wake = started + schedule.every
        said = "inputs unchanged, next check" if outcome == "unchanged" else "next check"
        say(f"{said} at {_clock_text(wake)}")
        sleep(max(0.0, wake - clock()))
