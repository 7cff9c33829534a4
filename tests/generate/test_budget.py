"""The token budget's projection of the requests in flight, against a model of a server whose
replies are heavy-tailed: most short, a few cut at max_new_tokens, durations in proportion."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from workbench.generate.budget import BudgetProjection, poisson_quantile

CAP = 2048
BUDGET = 20_000


def spend(seed: int, *, p_cap: float = 0.02, concurrency: int = 24) -> int:
    """Run one budget to its end; the tokens it kept. Replies as the simulator's fast
    profile writes them (a lognormal reasoning and answer, p_cap of them unclosed to the cap),
    each taking its length / 190 tokens per second, give or take a quarter."""
    rng = random.Random(seed)
    projection = BudgetProjection(CAP)
    now, finished, started = 0.0, 0, 0
    running: list[tuple[float, int, int]] = []
    while True:
        while len(running) < concurrency and projection.fits(finished, BUDGET, now):
            length = CAP if rng.random() < p_cap else min(CAP, 2 + int(
                rng.lognormvariate(math.log(100), 0.5)) + int(rng.lognormvariate(math.log(40), 0.5)))
            started += 1
            projection.start(started, now)
            heapq.heappush(running, (now + length / 190 * rng.uniform(0.8, 1.25) + 0.05, started, length))
        if not running:
            return finished
        now, key, length = heapq.heappop(running)
        projection.finish(key, now, length)
        finished += length


@pytest.mark.parametrize("concurrency", [8, 64])
def test_a_tail_not_seen_yet_rarely_overshoots(concurrency: int) -> None:
    """The budget is spent before any reply cut at the cap can finish (each takes 11 s), so
    only the prior and the ages of those in flight speak for them."""
    kept = [spend(seed, concurrency=concurrency) for seed in range(150)]
    over = [k / BUDGET - 1 for k in kept]
    assert sum(o > 0.02 for o in over) <= 3  # at most 2% of runs past 2% of the budget
    assert max(over) < CAP / BUDGET  # never a whole long reply past it
    # it ends under the budget by about one long reply at most
    assert sum(kept) / len(kept) / BUDGET > 0.88
    assert min(kept) > BUDGET - 1.25 * CAP


def test_a_tail_seen_finishing_keeps_the_budget() -> None:
    """Replies cut at the cap that finish (a budget many times longer than one) are counted."""
    kept = [spend(seed, p_cap=0.1, concurrency=16) for seed in range(60)]
    assert all(k <= BUDGET * 1.02 for k in kept)
    assert sum(kept) / len(kept) / BUDGET > 0.85


def test_requests_in_flight_before_any_finished_count_the_cap() -> None:
    projection = BudgetProjection(CAP)
    for key in range(9):
        projection.start(key, 0.0)
    assert projection.fits(0, 10 * CAP, 1.0)
    projection.start(9, 0.0)
    assert not projection.fits(0, 10 * CAP, 1.0)
    assert projection.projected(1.0).expected == 11 * CAP


def test_an_old_request_in_flight_is_projected_at_the_cap() -> None:
    """Older than every finished reply: the short ones say nothing about it."""
    projection = BudgetProjection(CAP)
    for key in range(100):
        projection.start(key, 0.0)
        projection.finish(key, 1.0, 190)
    projection.start("old", 0.0)
    young = projection.projected(1.5)
    projection.start("young", 1.4)
    both = projection.projected(1.5)
    assert young.expected > CAP  # the old one at the cap, plus a new one
    assert both.expected - young.expected < 300
    assert 0.9 < young.at_cap < 1.2


@pytest.mark.parametrize("mean", [0.0, 1e-6, 0.03, 0.5, 1.0, 3.3, 17.0, 150.0, 499.0])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.98, 0.999])
def test_the_poisson_quantile_is_scipys(mean: float, level: float) -> None:
    from scipy.stats import poisson

    assert poisson_quantile(mean, level) == int(poisson.ppf(level, mean))


@pytest.mark.parametrize("mean", [501.0, 900.0, 5000.0, 1e5])
def test_a_large_poisson_quantile_is_within_one_count(mean: float) -> None:
    from scipy.stats import poisson

    assert abs(poisson_quantile(mean, 0.98) - int(poisson.ppf(0.98, mean))) <= 1
