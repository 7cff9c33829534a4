"""The live counters of a generation run, and its one-line progress text.

:class:`DatasetProgress` is what the dispatcher updates as replies arrive (done, errors,
in flight, tokens, the budget) and what every view shows; :class:`RunSummary` is what a run
returns. Counts of earlier runs of a resumed run are in ``done`` and ``completion_tokens``;
the rates and the ETA use this run's records alone, with the definition ``workbench stats``
and the monitor use (:func:`workbench.rundir.rates.record_rates`: tok/s over the last 5
minutes of records; a finished dataset's over its running time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workbench.rundir.rates import Rates, RecordTimes, eta_seconds
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
    times: RecordTimes = field(default_factory=RecordTimes)  # this run's records: the rates
    prompt_mismatches: int = 0  # replies whose prompt_tokens are not the ids sent (this run)
    turns: bool = False  # a turns: each dataset: done and target count turns, not prompts

    def count_done(self, tokens: int, ts: float | None = None) -> None:
        """A reply's record is on disk, with `tokens` completion tokens (written at wall
        time `ts`, by default now)."""
        self.times.add(time.time() if ts is None else ts, tokens)
        self.done += 1
        self.done_this_run += 1
        self.completion_tokens += tokens
        self.tokens_this_run += tokens
        if self.done >= self.target and self.finished is None:
            self.finished = time.perf_counter()

    @property
    def counts(self) -> str:
        """`428/10000`, or `428/10000 turns` for a turns: each dataset."""
        return f"{self.done}/{self.target}" + (" turns" if self.turns else "")

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

    @property
    def ended(self) -> bool:
        return self.finished is not None or self.budget_reached

    def rates(self, now: float | None = None) -> Rates:
        """This run's tok/s and records/s at wall time `now` (by default now)."""
        return self.times.rates(time.time() if now is None else now, finished=self.ended)

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left at :meth:`rates` (wall time `now`), by samples or by the token budget
        (whichever ends first)."""
        left = max(self.target - self.done - self.failed_ids, 0)
        budget = max(self.max_tokens - self.completion_tokens, 0) if self.max_tokens else None
        return eta_seconds(left, budget, self.rates(now))


@dataclass(slots=True)
class RunSummary:
    datasets: dict[str, DatasetProgress]
    interrupted: bool
    wall_seconds: float
    retries: int
    dropped: int = 0  # requests in flight when the run stopped, whose prompts a resume sends again
    unwritten: int = 0  # lines (replies and errors) that could not be written: sent again on resume
    storage_error: str | None = None  # the failed write that stopped the run
    gpus: int | None = None  # the GPUs serving the run (None: unknown)

    @property
    def failed(self) -> int:
        return sum(p.failed_ids for p in self.datasets.values())

    def time_left(self, now: float | None = None) -> tuple[float | None, float | None]:
        """The job's completion tokens left and the seconds they take at this run's output
        rate (wall time `now`, by default now): each unfinished dataset's samples left at its
        mean reply length (the run's where it has none), or its budget left where that is
        less, over the summed tok/s of the datasets still running; seconds 0 when every
        dataset ended; None for what is unknown (no reply yet, no rate)."""
        open_ = [p for p in self.datasets.values() if not p.ended]
        if not open_:
            return 0.0, 0.0
        done = sum(p.done for p in self.datasets.values())
        run_mean = sum(p.completion_tokens for p in self.datasets.values()) / done if done else None
        tokens = 0.0
        for p in open_:
            mean = p.completion_tokens / p.done if p.done else run_mean
            left = max(p.target - p.done - p.failed_ids, 0) * mean if mean is not None else None
            budget = max(p.max_tokens - p.completion_tokens, 0) if p.max_tokens else None
            known = [x for x in (left, budget) if x is not None]
            if not known:
                return None, None
            tokens += min(known)
        if tokens == 0:  # the prompts left failed after all their attempts
            return 0.0, 0.0
        rate = sum(p.rates(now).tokens_per_s or 0.0 for p in open_)
        return tokens, tokens / rate if rate > 0 else None


def format_progress_line(p: DatasetProgress, now: float | None = None) -> str:
    """`[B1_glaive] 428/10000 (0 err) 1.1 req/s avg_comp=217tok 238 tok/s ETA=2.4h` at wall
    time `now` (`428/10000 turns` for a turns: each dataset) (the rates: :meth:`DatasetProgress.rates`; `-` while there are none)."""
    rates = p.rates(now)
    avg = p.completion_tokens / p.done if p.done else 0.0
    req = "-" if rates.records_per_s is None else f"{rates.records_per_s:.1f}"
    tok = "-" if rates.tokens_per_s is None else f"{rates.tokens_per_s:.0f}"
    line = f"[{p.name}] {p.counts} ({p.errors} err) {req} req/s avg_comp={avg:.0f}tok {tok} tok/s"
    if p.finished is not None or p.budget_reached:
        return line + (" budget reached" if p.budget_reached else " done")
    return line + f" ETA={format_duration(p.eta_seconds(now))}"
