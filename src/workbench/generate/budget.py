"""How many completion tokens the requests in flight will still add to a token budget.

A dataset with `max_tokens` admits a new request only when its finished tokens, the
projected tokens of its requests in flight and the new request's fit the budget.

The first replies to finish are the short ones, so the mean of the finished lengths
underrates the requests still running (the demo overshot a 20k budget by 40%). The
projection treats the requests in flight as censored observations of a request's duration:
one that has run for `age` seconds will take longer than that. The duration distribution is
the Kaplan-Meier estimate over the finished requests (each carrying its length), the ages
of those in flight, and `TAIL_PRIOR` pseudo requests that never finish and run to
`max_new_tokens`: a prior for the tail not seen yet. Replies cut at the cap take the
longest, so a budget spent in less time than one of them takes has seen none finish;
three is the rule of three (the 95% upper bound of a rate seen 0 times in n tries is
3/n): 3/103 after 100 replies, 3/1003 after 1000. The mass left past the last finished
request is put at the cap too (the survivors are assumed to run to it: conservative while
the long ones are still running, and gone once they finish). Then

    a request in flight for `age` seconds    adds  E[length | duration > age]
    a new request                            adds  E[length]

and a request is admitted while finished + these expectations + a margin fit the budget.
Lengths are heavy-tailed (a few replies run to the cap, ten times the median), so the
margin is the larger of `MARGIN` standard deviations of the sum (the requests taken as
independent) and the room for more of them to run to the cap than expected: the count at
the cap is about Poisson, and its 1 - `ALPHA` quantile above its mean times (the cap - the
smallest expectation) is kept free. Near its end a budget so keeps room for one or two
long replies: it ends under its cap by about one long reply at most, and rarely over it.
Before anything finished every request counts `max_new_tokens`. Durations are measured
the same way for both (from the send), so queueing time cancels out. The finished requests
kept are the last `WINDOW` (memory stays bounded on long runs).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

__all__ = ["BudgetProjection", "Projection", "poisson_quantile"]

WINDOW = 4096
MARGIN = 2.0
TAIL_PRIOR = 3
ALPHA = 0.02


class BudgetProjection:
    """The finished requests (duration, length) and the requests in flight of one dataset."""

    def __init__(self, max_new_tokens: int) -> None:
        self.max_new_tokens = max_new_tokens
        self._finished: deque[tuple[float, int]] = deque(maxlen=WINDOW)
        self._flight: dict[Hashable, float] = {}

    def start(self, key: Hashable, now: float) -> None:
        self._flight[key] = now

    def finish(self, key: Hashable, now: float, tokens: int | None) -> None:
        """A request ended (`tokens` None: it failed and produced nothing kept)."""
        started = self._flight.pop(key, None)
        if tokens is not None and started is not None:
            self._finished.append((max(now - started, 0.0), tokens))

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    def projected(self, now: float) -> Projection:
        """What the requests in flight and a new one will add to the budget."""
        cap = float(self.max_new_tokens)
        if not self._finished:
            return Projection(cap * (len(self._flight) + 1), 0.0, cap, 0.0)
        ages = np.fromiter((max(now - t, 0.0) for t in self._flight.values()), float,
                           len(self._flight))
        finished = np.array([*self._finished, *[(np.inf, cap)] * TAIL_PRIOR], dtype=float)
        mean, square, at_cap = _length_moments(finished, ages, cap)
        variance = np.maximum(square - mean**2, 0.0)
        return Projection(float(np.sum(mean)), float(np.sqrt(np.sum(variance))),
                          float(np.min(mean)), float(np.sum(at_cap)))

    def fits(self, finished: int, budget: int, now: float) -> bool:
        """One more request fits: finished + in flight + new + margin <= budget."""
        if finished + (self.in_flight + 1) * self.max_new_tokens <= budget:
            return True
        projection = self.projected(now)
        return finished + projection.expected + projection.margin(self.max_new_tokens) <= budget


class Projection(NamedTuple):
    """What the requests in flight and a new one will add: the expected tokens, the standard
    deviation of that sum, the smallest expectation, and how many of them are expected to
    run to the cap."""

    expected: float
    spread: float
    lowest: float
    at_cap: float

    def margin(self, max_new_tokens: int) -> float:
        """Room kept for the sum to run long: `MARGIN` times its spread, or the room for the
        requests that may run to the cap beyond the expected number (the count's
        1 - `ALPHA` quantile, a Poisson approximation), whichever is larger."""
        extra = poisson_quantile(self.at_cap, 1.0 - ALPHA) - self.at_cap
        return max(MARGIN * self.spread, extra * (max_new_tokens - self.lowest))


def poisson_quantile(mean: float, level: float) -> int:
    """The smallest count c with P(Poisson(mean) <= c) >= level (scipy.stats.poisson.ppf's
    value; summed here because importing scipy.stats takes about a second, which would
    stall the runner's event loop when a budget first nears its end). Past a mean of 500,
    where exp(-mean) heads for underflow, the normal approximation (within one count)."""
    if mean > 500:
        return math.ceil(mean + NormalDist().inv_cdf(level) * math.sqrt(mean) - 0.5)
    count, term = 0, math.exp(-mean)
    total = term
    while total < level and term > 0.0:
        count += 1
        term *= mean / count
        total += term
    return count


def _length_moments(finished: np.ndarray, ages: np.ndarray,
                    cap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E[length | duration > a], E[length**2 | duration > a] and P(length = cap | duration >
    a) for a = 0 (a new request), then each age in `ages`.

    `finished` holds (duration, length) rows; Kaplan-Meier over them and the censored ages,
    finished ones first among equal times, the remaining mass at `cap`."""
    times = np.concatenate([finished[:, 0], ages])
    events = np.concatenate([np.ones(len(finished)), np.zeros(len(ages))])
    lengths = np.concatenate([np.minimum(finished[:, 1], cap), np.zeros(len(ages))])
    order = np.lexsort((1 - events, times))
    times, events, lengths = times[order], events[order], lengths[order]
    at_risk = len(times) - np.arange(len(times))
    survival = np.concatenate([[1.0], np.cumprod(1.0 - events / at_risk)])
    mass = survival[:-1] * events / at_risk
    first = np.searchsorted(times, np.concatenate([[0.0], ages]), side="right")
    alive = np.maximum(survival[first], 1e-12)
    moments = []
    for value, top in ((lengths, cap), (lengths**2, cap**2), (lengths >= cap, 1.0)):
        later = np.concatenate([np.cumsum((mass * value)[::-1])[::-1], [0.0]])
        moment = (later[first] + survival[-1] * top) / alive
        moments.append(np.minimum(moment, top))
    return moments[0], moments[1], moments[2]
