"""What a generation run shows while it runs and when it ends.

Two views, one interface (``start``, ``update``, ``event``, ``stop``), chosen by the CLI:

    LineView    plain lines for logs, CI and pipes: one per active dataset every interval,
                `[B1_glaive] 428/10000 (0 err) 1.1 req/s avg_comp=217tok 238 tok/s ETA=2.4h`
    RichView    on a terminal, one rich progress bar per dataset,
                `B1_glaive ━━━━━━  428/10000 0 err 238 tok/s ETA 2.4h`, the bar taking the
                width the other columns leave (readable at 80 columns)

Both say when the concurrency cap moves, and a resumed run's `resuming OUT: ...` line
first; then what the rates are (:data:`RATES_NOTE`: the definition the monitor and ``workbench
stats`` use). :func:`summary_lines` is the closing summary. The views write through the
callables they are given: the library itself prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from workbench.generate.dispatch import Runner
from workbench.generate.progress import DatasetProgress, RunSummary, format_progress_line
from workbench.rundir.layout import ERRORS_FILE
from workbench.rundir.rates import RATE_WINDOW
from workbench.text import format_count, format_duration, format_gpu_hours, format_gpus

__all__ = [
    "RATES_NOTE",
    "LineView",
    "RichView",
    "View",
    "cost_line",
    "progress_fields",
    "resume_line",
    "summary_lines",
]

Say = Callable[[str], None]

RATES_NOTE = (f"tok/s: this run's records of the last {format_duration(RATE_WINDOW)} "
              "(once finished: its whole run)")  # fits 80 columns


class View(Protocol):
    def start(self, runner: Runner) -> None: ...
    def update(self, runner: Runner) -> None: ...
    def event(self, message: str) -> None: ...
    def stop(self) -> None: ...


def resume_line(out: Path, progress: Sequence[DatasetProgress]) -> str | None:
    """`resuming OUT: 208/800 done, 592 to send` when earlier runs wrote records, else None."""
    done = sum(p.done for p in progress)
    if done == 0:
        return None
    target = sum(p.target for p in progress)
    return f"resuming {out}: {done:,}/{target:,} done, {max(0, target - done):,} to send"


def progress_fields(p: DatasetProgress, now: float | None = None) -> str:
    """The short figures next to a dataset's bar: errors, tok/s and ETA (or how it ended), at
    wall time `now` (by default now)."""
    rate = p.rates(now).tokens_per_s
    if p.budget_reached:
        end = "budget reached"
    elif p.finished is not None:
        end = "done"
    else:
        end = f"ETA {format_duration(p.eta_seconds(now))}"
    return f"{p.errors} err {'-' if rate is None else f'{rate:,.0f}'} tok/s {end}"


class LineView:
    """Progress as plain lines, each through `say`."""

    def __init__(self, out: Path, say: Say) -> None:
        self.out = out
        self.say = say
        self.reported_done: set[str] = set()
        self.concurrency_said: str | None = None

    def concurrency_changed(self, runner: Runner) -> str | None:
        """`concurrency 96 (auto, metrics)` when the cap moved since it was last said."""
        text = runner.concurrency_text()
        if text == self.concurrency_said:
            return None
        self.concurrency_said = text
        return text

    def start(self, runner: Runner) -> None:
        self.say_resume(runner)
        names = ", ".join(f"{p.name} ({p.counts} done)" for p in runner.progress())
        self.say(f"generating {names}")
        self.say(RATES_NOTE)

    def say_resume(self, runner: Runner) -> None:
        line = resume_line(self.out, runner.progress())
        if line is not None:
            self.event(line)

    def update(self, runner: Runner) -> None:
        for p in runner.progress():
            if p.name in self.reported_done or (p.done_this_run == 0 and p.in_flight == 0):
                continue
            if p.finished is not None:
                self.reported_done.add(p.name)
            self.say(format_progress_line(p))
        changed = self.concurrency_changed(runner)
        if changed is not None:
            self.say(changed)

    def event(self, message: str) -> None:
        self.say(message)

    def stop(self) -> None:
        pass


class RichView(LineView):
    """Progress bars on `console`, one per dataset: name, bar, done/target and the short
    figures; the bar takes the width the others leave (10 to 40 columns)."""

    def __init__(self, out: Path, console: Console) -> None:
        super().__init__(out, self._print)
        self.bar = BarColumn(bar_width=10)
        self.progress = Progress(TextColumn("{task.description}"), self.bar, MofNCompleteColumn(),
                                 TextColumn("{task.fields[figures]}"), console=console)
        self.tasks: dict[str, Any] = {}

    def _print(self, message: str) -> None:
        self.progress.console.print(message, highlight=False, markup=False)

    def start(self, runner: Runner) -> None:
        self.say_resume(runner)
        self._print(RATES_NOTE)
        progress = runner.progress()
        for p in progress:
            self.tasks[p.name] = self.progress.add_task(p.name, total=p.target, completed=p.done,
                                                        figures=progress_fields(p))
        self.bar.bar_width = self._bar_width(progress)
        self.progress.start()

    def _bar_width(self, progress: Sequence[DatasetProgress]) -> int:
        """What the console's width leaves after the name, count and figures (10 to 40)."""
        name = max((len(p.name) for p in progress), default=0)
        count = max((2 * len(str(p.target)) + 1 for p in progress), default=3)
        figures = len("999 err 99,999 tok/s ETA 99.9h")
        spare = self.progress.console.width - name - count - figures - 3
        return max(10, min(40, spare))

    def update(self, runner: Runner) -> None:
        for p in runner.progress():
            self.progress.update(self.tasks[p.name], completed=p.done, figures=progress_fields(p))
        changed = self.concurrency_changed(runner)
        if changed is not None:
            self.event(changed)

    def stop(self) -> None:
        self.progress.stop()


def cost_line(summary: RunSummary, now: float | None = None) -> str:
    """The session's wall time and what is left of the job (at wall time `now`), each in
    GPU-hours when the GPU count is known: `cost: 2.0h x 8 GPUs = 16.0 GPU-hours this session;
    left: 3.4h for 14,800,000 tokens at 1,210 tok/s = 27.2 GPU-hours`. A CPU server (0 GPUs:
    `--gpus 0`) has hours, no GPU-hours."""
    gpus = summary.gpus

    def gpu_hours(seconds: float) -> str:
        return "" if not gpus else f" = {format_gpu_hours(seconds / 3600 * gpus)} GPU-hours"

    wall = summary.wall_seconds
    spent = (f"{format_duration(wall)} x {format_gpus(gpus)}" if gpus
             else f"{format_duration(wall)} on CPU" if gpus == 0 else format_duration(wall))
    text = f"cost: {spent}{gpu_hours(wall)} this session"
    tokens, seconds = summary.time_left(now)
    if seconds == 0:
        text += "; nothing left"
    elif tokens is None or seconds is None:
        text += "; time left unknown (no output rate yet)"
    else:
        text += (f"; left: {format_duration(seconds)} for {format_count(tokens)} tokens at "
                 f"{format_count(tokens / seconds)} tok/s{gpu_hours(seconds)}")
    if gpus is None:
        text += " (GPU count unknown: /server_info has no tp_size; give --gpus N)"
    return text


def summary_lines(summary: RunSummary, out: Path, resume_command: str) -> list[str]:
    """The closing summary: per dataset, the failed ones named, and after a stop the dropped
    requests and `resume_command`, the command that resumes."""
    state = "interrupted" if summary.interrupted else "finished"
    lines = [(f"run {state} in {format_duration(summary.wall_seconds)}; {summary.retries} "
              f"retries; output in {out}")]
    for p in summary.datasets.values():
        extra = f", budget {p.max_tokens} tokens (overshoot {p.overshoot})" if p.max_tokens else ""
        lines.append(f"  {p.name}: {p.counts} done ({p.done_this_run} this run), "
                     f"{p.failed_ids} failed, {p.errors} errors, {p.completion_tokens} completion "
                     f"tokens{extra}")
    lines.append(cost_line(summary))
    for p in summary.datasets.values():
        if p.failed_samples:
            ids = ", ".join(map(str, p.failed_samples[:5])) + (", ..." if len(p.failed_samples) > 5 else "")
            lines.append(f"failed after all attempts: {p.name}: {len(p.failed_samples)} prompts "
                         f"(sample_id {ids}; see {out / p.name / ERRORS_FILE})")
    if summary.failed and not summary.interrupted:
        lines.append("rerun the same command to retry the failed prompts")
    if summary.storage_error is not None:
        lines.append(f"stopped: {summary.storage_error}; {summary.unwritten} lines could not "
                     f"be written (not counted above)")
    elif summary.unwritten:
        lines.append(f"{summary.unwritten} lines could not be written (not counted above)")
    if summary.interrupted and summary.dropped:
        lines.append(f"stopped: {summary.dropped} prompts unfinished, in flight or waiting for "
                     f"a retry (sent again on resume); to resume, run: {resume_command}")
    elif summary.interrupted or summary.unwritten:
        lines.append(f"to resume, run: {resume_command}")
    return lines
