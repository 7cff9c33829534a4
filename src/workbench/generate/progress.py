"""The live counters of a generation run, and its one-line progress text.

:class:`DatasetProgress` is what the dispatcher updates as replies arrive (done, errors,
in flight, tokens, the budget) and what every view shows; :class:`RunSummary` is what a run
returns. Counts of earlier runs of a resumed run are in ``done`` and ``completion_tokens``;
the rates and the ETA use this run's alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workbench.text import format_duration

__all__ = ["DatasetProgress", "RunSummary", "format_progress_line"]


@dataclass(slots=True)
class DatasetProgress:
    """Live counters of one dataset (previous runs included in `done` and `completion_tokens`)."""

    name: str
    target: int
    done: int = 0
    done_this_run: int = 0
    errors: int = 0
    failed_ids: int = 0
    failed_samples: list[int | str] = field(default_factory=list)  # their ids, in failing order
    in_flight: int = 0
    completion_tokens: int = 0
    tokens_this_run: int = 0
    max_tokens: int | None = None
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    budget_closed: bool = False  # nothing in flight and not even one more request fits

    def count_done(self, tokens: int) -> None:
        """A reply's record is on disk, with `tokens` completion tokens."""
        self.done += 1
        self.done_this_run += 1
        self.completion_tokens += tokens
        self.tokens_this_run += tokens
        if self.done >= self.target and self.finished is None:
            self.finished = time.perf_counter()

    def count_error(self) -> None:
        """A failed attempt's line is on disk."""
        self.errors += 1

    @property
    def budget_reached(self) -> bool:
        if self.max_tokens is None:
            return False
        return self.budget_closed or self.completion_tokens >= self.max_tokens

    @property
    def overshoot(self) -> int:
        return max(0, self.completion_tokens - self.max_tokens) if self.max_tokens else 0

    @property
    def active(self) -> bool:
        return self.finished is None and self.in_flight + self.done_this_run > 0

    def elapsed(self, now: float | None = None) -> float:
        end = self.finished if self.finished is not None else (now or time.perf_counter())
        return max(end - self.started, 1e-9)

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left at this run's rate, by samples or by the token budget (whichever ends first)."""
        elapsed = self.elapsed(now)
        if self.done_this_run == 0:
            return None
        by_samples = max(self.target - self.done, 0) / (self.done_this_run / elapsed)
        if not self.max_tokens or self.tokens_this_run == 0:
            return by_samples
        by_tokens = max(self.max_tokens - self.completion_tokens, 0) / (self.tokens_this_run / elapsed)
        return min(by_samples, by_tokens)


@dataclass(slots=True)
class RunSummary:
    datasets: dict[str, DatasetProgress]
    interrupted: bool
    wall_seconds: float
    retries: int
    dropped: int = 0  # requests in flight when the run stopped, whose prompts a resume sends again
    unwritten: int = 0  # lines (replies and errors) that could not be written: sent again on resume
    storage_error: str | None = None  # the failed write that stopped the run

    @property
    def failed(self) -> int:
        return sum(p.failed_ids for p in self.datasets.values())


def format_progress_line(p: DatasetProgress, now: float | None = None) -> str:
    """`[B1_glaive] 428/10000 (0 err) 1.1 req/s avg_comp=217tok 238 tok/s ETA=2.4h`."""
    elapsed = p.elapsed(now)
    avg = p.completion_tokens / p.done if p.done else 0.0
    line = (
        f"[{p.name}] {p.done}/{p.target} ({p.errors} err) {p.done_this_run / elapsed:.1f} req/s "
        f"avg_comp={avg:.0f}tok {p.tokens_this_run / elapsed:.0f} tok/s"
    )
    if p.finished is not None or p.budget_reached:
        return line + (" budget reached" if p.budget_reached else " done")
    return line + f" ETA={format_duration(p.eta_seconds(now))}"
