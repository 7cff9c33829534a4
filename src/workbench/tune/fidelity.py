"""How far a configuration's replies drift from the baseline's: the fidelity probe's measures.

A probe sends the same prompts at temperature 0 to every configuration and keeps each reply's
ids and the logprobs of the chosen tokens. A pair of replies to one prompt (the baseline's
and a configuration's) is compared position by position:

identical           the two id lists are equal
first divergence    the first position where the ids differ (one reply ending before the
                    other differs there); None for identical replies
agreement           the share of positions, over the longer reply, where both have the same id
                    (1.0 for identical replies, lower the earlier and the more they part)
logprob difference  the mean absolute difference of the chosen tokens' logprobs over the
                    positions before the first divergence (the same tokens, so a change of
                    numbers, not of choice: fp8 KV moves them before it flips a token); None
                    without logprobs or with no common position

A configuration's :class:`Drift` sums its pairs. The baseline probed twice (restarted in
between) gives the noise floor: the drift a configuration shows with no change at all (bf16
kernels are not batch-invariant, so temperature 0 is not always repeatable). :func:`verdict`
excludes a configuration whose share of differing replies is above the floor's by more than
a threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Drift", "PairDrift", "ProbeReply", "compare", "drift", "verdict"]


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """One reply of a probe: its ids and the chosen tokens' logprobs (None when not given)."""

    output_ids: Sequence[int]
    logprobs: Sequence[float] | None = None


@dataclass(frozen=True, slots=True)
class PairDrift:
    """The measures of one pair of replies (module docstring)."""

    identical: bool
    first_divergence: int | None
    agreement: float
    logprob_diff: float | None


@dataclass(frozen=True, slots=True)
class Drift:
    """A configuration's pairs summed: the share of replies identical to the baseline's, the
    mean first divergence of the others, the mean agreement and logprob difference."""

    replies: int
    identical_share: float
    mean_first_divergence: float | None
    agreement: float
    logprob_diff: float | None

    @property
    def differing_share(self) -> float:
        return 1.0 - self.identical_share


def compare(base: ProbeReply, other: ProbeReply) -> PairDrift:
    """The measures of `other` against `base` (module docstring)."""
    a, b = list(base.output_ids), list(other.output_ids)
    common = min(len(a), len(b))
    first = next((i for i in range(common) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = common
    longest = max(len(a), len(b))
    same = sum(1 for i in range(common) if a[i] == b[i])
    agreement = same / longest if longest else 1.0
    return PairDrift(first is None, first, agreement,
                     _logprob_diff(base.logprobs, other.logprobs,
                                   common if first is None else first))


def _logprob_diff(a: Sequence[float] | None, b: Sequence[float] | None,
                  upto: int) -> float | None:
    if a is None or b is None:
        return None
    n = min(upto, len(a), len(b))
    if n == 0:
        return None
    return sum(abs(a[i] - b[i]) for i in range(n)) / n


def drift(base: Mapping[str, ProbeReply], other: Mapping[str, ProbeReply]) -> Drift:
    """A configuration's replies (by prompt key) against the baseline's; prompts either side
    lacks (a failed request) are left out. ValueError when no prompt is on both sides."""
    keys = [key for key in base if key in other]
    if not keys:
        raise ValueError("no probe prompt was answered by both configurations")
    pairs = [compare(base[key], other[key]) for key in keys]
    firsts = [p.first_divergence for p in pairs if p.first_divergence is not None]
    diffs = [p.logprob_diff for p in pairs if p.logprob_diff is not None]
    return Drift(
        replies=len(pairs),
        identical_share=sum(p.identical for p in pairs) / len(pairs),
        mean_first_divergence=sum(firsts) / len(firsts) if firsts else None,
        agreement=sum(p.agreement for p in pairs) / len(pairs),
        logprob_diff=sum(diffs) / len(diffs) if diffs else None,
    )


def verdict(name: str, differing: float, floor: float | None, threshold: float, *,
            baseline: str, speedup: float | None = None,
            max_new_tokens: int | None = None) -> str | None:
    """One line excluding `name` when its share of replies `differing` from the baseline's is
    above the noise floor's (`floor`, the baseline's against itself; 0 without one) by more
    than `threshold`, else None: `fp8_e4m3: 1.31x faster, 38% of replies differ from bf16
    before token 400 (noise floor 2%): excluded`."""
    noise = floor if floor is not None else 0.0
    if differing - noise <= threshold:
        return None
    faster = ("" if speedup is None else
              f"{speedup:.2f}x {'faster' if speedup >= 1 else 'as fast'}, ")
    before = f" before token {max_new_tokens}" if max_new_tokens is not None else ""
    return (f"{name}: {faster}{differing:.0%} of replies differ from {baseline}{before} "
            f"(noise floor {noise:.0%}): excluded")
