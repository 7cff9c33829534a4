"""How far a dataset is, how fast it goes, and when it ends: the progress figures that
``workbench stats``, the monitor and generate's progress line all show.

    target        records: run.json's ``prompts`` capped by ``max_samples`` (else the lines
                  of prompts.jsonl); tokens: run.json's ``max_tokens`` budget
    rates         :func:`workbench.rundir.rates.record_rates`, the one definition of tok/s and
                  records/s: over the last 5 minutes of record ``ts`` values while a dataset
                  runs, over its first to its last record once it is finished
    finished      records plus failed ids reach the target, or the completion tokens reach
                  the budget, or run.json says the budget stopped the dataset
                  (``budget_reached``: the runner stops sending once the next reply would
                  not fit, short of the budget itself)
    remaining     records still to come: by count, or by the budget left over the average
                  reply, whichever is less
    eta           what is left (records, or tokens under a budget, whichever ends first)
                  over the rates (:func:`~workbench.rundir.rates.eta_seconds`); 0 when
                  finished, None without a target or a rate

A run's total: the records left everywhere over the summed request rate (the datasets of a
run share one pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from workbench.rundir.rates import Rates, eta_seconds

__all__ = ["Progress", "Target", "progress", "stopped_by_budget", "total_progress"]


class Target(NamedTuple):
    """What a dataset aims at: records, and a completion-token budget (None: none); whether
    the runner said the budget stopped it."""

    records: int | None
    max_tokens: int | None
    budget_reached: bool = False

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any], prompt_lines: int | None) -> Target:
        """From the dataset's run.json entry (`target_turns` for a turns: each dataset, else
        its prompts capped by max_samples), else the lines of its prompts.jsonl."""
        counts = [entry.get("prompts"), entry.get("max_samples")]
        turns = entry.get("target_turns")  # turns: each: records are turns, not prompts
        if isinstance(turns, int) and not isinstance(turns, bool):
            counts = [turns]
        known = [int(c) for c in counts if isinstance(c, int) and not isinstance(c, bool)]
        records = min(known) if known else prompt_lines
        budget = entry.get("max_tokens")
        return cls(records, budget if isinstance(budget, int) and budget > 0 else None,
                   entry.get("budget_reached") is True)


class Progress(NamedTuple):
    remaining_records: float | None
    finished: bool
    eta_s: float | None


class Counted(Protocol):
    """The figures progress is computed from (a :class:`~workbench.analyze.stats.DatasetStats`)."""

    @property
    def records(self) -> int: ...
    @property
    def failed_missing(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def avg_completion_tokens(self) -> float | None: ...
    @property
    def target_records(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def budget_reached(self) -> bool: ...
    @property
    def tokens_per_s(self) -> float | None: ...
    @property
    def requests_per_s(self) -> float | None: ...


def progress(d: Counted) -> Progress:
    """Remaining records, finished and ETA of one dataset."""
    records, tokens = _left(d)
    finished = records is not None and records <= 0
    if d.budget_reached or d.max_tokens is not None and d.completion_tokens >= d.max_tokens:
        finished = True
    if finished:
        return Progress(0.0, True, 0.0)
    rates = Rates(d.tokens_per_s, d.requests_per_s)
    return Progress(_records_left(records, tokens, d), False, eta_seconds(records, tokens, rates))


def stopped_by_budget(d: Counted) -> bool:
    """Whether the token budget ended the dataset short of its target records."""
    spent = d.budget_reached or d.max_tokens is not None and d.completion_tokens >= d.max_tokens
    short = d.target_records is None or d.records + d.failed_missing < d.target_records
    return spent and short


def total_progress(parts: Sequence[Progress], req_rate: float | None) -> Progress:
    """The run's progress from its datasets' own and the summed request rate."""
    left = [part.remaining_records for part in parts if not part.finished]
    if not left:
        return Progress(0.0, bool(parts), 0.0)
    known = [value for value in left if value is not None]
    remaining = sum(known) if len(known) == len(left) else None
    eta = remaining / req_rate if remaining is not None and req_rate else None
    return Progress(remaining, False, eta)


def _left(d: Counted) -> tuple[int | None, int | None]:
    """(records left, completion tokens left under the budget)."""
    records = None
    if d.target_records is not None:
        records = max(0, d.target_records - d.records - d.failed_missing)
    tokens = None
    if d.max_tokens is not None:
        tokens = max(0, d.max_tokens - d.completion_tokens)
    return records, tokens


def _records_left(records: int | None, tokens: int | None, d: Counted) -> float | None:
    """Records still to come: by count, or by the token budget over the average reply."""
    by_tokens = None
    if tokens is not None and d.avg_completion_tokens:
        by_tokens = tokens / d.avg_completion_tokens
    known = [value for value in (records, by_tokens) if value is not None]
    return float(min(known)) if known else None
