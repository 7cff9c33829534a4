"""The throughput of a dataset's records: the one definition of tok/s (and records/s) that
``workbench stats``, the monitor and generate's progress line all show, and the time left
at it.

    window     the rates are taken over the last ``RATE_WINDOW`` seconds (5 minutes) of record
               ``ts`` values while a dataset runs; while its first record is younger, over the
               time since it (that record only marks the start)
    finished   a finished dataset's rates are over its running time instead, its first record
               to its last (the first again only marking the start): they stay what they were
               when it finished, however long ago that was
    eta        what is left (records, or tokens under a budget, whichever ends first) at the
               rates: :func:`eta_seconds`

:class:`RecordTimes` keeps what the rates need (the first and last record, the totals, the
records of the window); :func:`record_rates` is the definition.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

__all__ = ["RATE_WINDOW", "Rates", "RecordTimes", "eta_seconds", "merged_times", "record_rates"]

RATE_WINDOW = 300.0
"""Seconds of record timestamps the rates are taken over (while a dataset runs)."""


class Rates(NamedTuple):
    """Completion tokens and records per second; None when not measurable (no record with
    a ``ts``; a finished dataset of one record)."""

    tokens_per_s: float | None
    records_per_s: float | None


@dataclass(slots=True)
class RecordTimes:
    """What the rates are taken from: the records' ``ts`` and completion tokens, kept as
    the first record, the latest ``ts``, the totals, and the records of the last ``window``
    seconds (a record without a ``ts`` is not counted; a missing token count counts 0)."""

    window: float = RATE_WINDOW
    first: tuple[float, int] | None = None  # (ts, completion tokens) of the earliest record
    last_ts: float | None = None
    tokens: int = 0
    records: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, ts: float, tokens: int) -> None:
        """One record."""
        self.extend([ts], [tokens])

    def extend(self, times: Sequence[float | None], tokens: Sequence[int | None],
               cutoff: float | None = None) -> None:
        """Records given as their ``ts`` and completion tokens, in file order; those at or
        before `cutoff` (the start of the window at the time of reading) are only counted."""
        if None in times or None in tokens:  # else all below runs at C speed
            kept = [(ts, count or 0) for ts, count in zip(times, tokens, strict=True)
                    if ts is not None]
            stamps, counts = [ts for ts, _ in kept], [count for _, count in kept]
        else:
            stamps, counts = cast(Sequence[float], times), cast(Sequence[int], tokens)
        if not stamps:
            return
        self.records += len(stamps)
        self.tokens += sum(counts)
        earliest = min(stamps)
        first = min((ts, count) for ts, count in zip(stamps, counts, strict=True) if ts == earliest)
        if self.first is None or first < self.first:
            self.first = first
        latest = max(stamps)
        self.last_ts = latest if self.last_ts is None else max(self.last_ts, latest)
        start = self.last_ts - self.window
        start = start if cutoff is None else max(start, cutoff)
        self.recent.extend((ts, count) for ts, count in zip(stamps, counts, strict=True) if ts > start)
        while self.recent and self.recent[0][0] <= start:
            self.recent.popleft()

    def rates(self, now: float, finished: bool = False) -> Rates:
        """:func:`record_rates` of these records at wall time `now`."""
        return record_rates(self, now, finished)


def record_rates(times: RecordTimes, now: float, finished: bool = False) -> Rates:
    """The rates of a dataset (see the module docstring): over the last ``times.window``
    seconds before `now` (wall time) while it runs, over its first to its last record once
    `finished`."""
    if times.first is None or times.last_ts is None:
        return Rates(None, None)
    first_ts, first_tokens = times.first
    if finished:
        start, end = first_ts, times.last_ts
        tokens, records = times.tokens - first_tokens, times.records - 1
    else:
        start, end = now - times.window, now
        recent = [(ts, count) for ts, count in times.recent if ts > start]
        tokens, records = sum(count for _, count in recent), len(recent)
        if first_ts > start:  # early on: since the first record, which only marks the start
            start, tokens, records = first_ts, tokens - first_tokens, records - 1
    span = end - start
    if span <= 0:  # finished with one record: no running time; running: nothing after the start yet
        return Rates(None, None) if finished else Rates(0.0, 0.0)
    return Rates(max(0, tokens) / span, max(0, records) / span)


def merged_times(parts: Iterable[RecordTimes]) -> RecordTimes:
    """The record times of several datasets as one (the first and last of them all)."""
    merged = RecordTimes()
    for part in parts:
        if part.first is None or part.last_ts is None:
            continue
        merged.window = part.window
        merged.records += part.records
        merged.tokens += part.tokens
        merged.first = part.first if merged.first is None else min(merged.first, part.first)
        merged.last_ts = part.last_ts if merged.last_ts is None else max(merged.last_ts, part.last_ts)
        merged.recent.extend(part.recent)
    merged.recent = deque(sorted(merged.recent))
    return merged


def eta_seconds(records_left: float | None, tokens_left: float | None, rates: Rates) -> float | None:
    """Seconds until the records left are written, or the tokens left under a budget are
    spent, whichever comes first, at `rates`; None without a rate for either."""
    candidates = []
    if records_left is not None and rates.records_per_s:
        candidates.append(records_left / rates.records_per_s)
    if tokens_left is not None and rates.tokens_per_s:
        candidates.append(tokens_left / rates.tokens_per_s)
    return min(candidates) if candidates else None
