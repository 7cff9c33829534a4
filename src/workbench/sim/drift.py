"""Where a greedy reply departs from the one its prompt always gets: fp8 KV, batch noise and a
corrupted host-tier prefix (the formulas: `workbench.sim.profiles`, "Output fidelity").

:func:`flip_at` says at which output position a reply flips, if at all; :func:`diverge`
rewrites a reply's ids from there (content ids only: the reply keeps its shape, its
think-end and end ids where they were, so it stops where it stopped, and a tool call whole); :func:`perturbed` moves the chosen tokens' logprobs
the way fp8 KV does before any flip.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import NamedTuple

from workbench.profiles import ModelProfile
from workbench.sim.outputs import corpus
from workbench.sim.profiles import Fidelity, flip_position

__all__ = ["DriftSettings", "diverge", "flip_at", "perturbed"]


class DriftSettings(NamedTuple):
    """A server's side of it: its KV dtype is fp8, its kernels batch-invariant, its host-tier
    corruption rate and the seed faults are drawn from."""

    fp8: bool
    deterministic: bool
    corrupt_rate: float = 0.0
    fault_seed: int = 0


def _key(seed: int, *parts: object) -> bytes:
    return repr((seed, *parts)).encode()


def flip_at(fidelity: Fidelity, settings: DriftSettings, seed: int, *, batch: int,
            host_hit: bool) -> int | None:
    """The output position where a greedy reply with output seed `seed` flips (module
    docstring), None when it does not: `batch` is the number of requests on its rank when
    it arrived, `host_hit` whether its prefix is read back from the host tier."""
    candidates = []
    if settings.fp8:
        candidates.append(flip_position(_key(seed, "fp8"), fidelity.fp8_flip_rate))
    if not settings.deterministic:
        candidates.append(flip_position(_key(seed, "batch", batch), fidelity.batch_flip_rate))
    if host_hit and settings.corrupt_rate > 0:
        draw = int.from_bytes(hashlib.blake2b(_key(seed, "hicache", settings.fault_seed),
                                              digest_size=8).digest(), "little") / 2**64
        if draw < settings.corrupt_rate:
            candidates.append(0.0)
    first = min(candidates, default=math.inf)
    return None if math.isinf(first) else int(first)


def diverge(output_ids: list[int], at: int, model: ModelProfile, seed: int) -> list[int]:
    """The ids with every content id from position `at` on taken from another run of the
    text (a seeded sentence start), each differing from the id it replaces; special ids
    stay, and so does a tool call from its first marker on (it still parses)."""
    ids = list(output_ids)
    markers = set(model.reply_special_ids)
    end = next((position for position, token in enumerate(ids) if token in markers), len(ids))
    if at >= end:
        return ids
    specials = set(model.end_ids) | {model.think_start, model.think_end}
    text = corpus()
    rng = random.Random(int.from_bytes(hashlib.blake2b(_key(seed, "diverge", at),
                                                      digest_size=8).digest(), "little"))
    start = text.starts[rng.randrange(len(text.starts))]
    for offset, position in enumerate(range(at, end)):
        if ids[position] in specials:
            continue
        other = text.ids[(start + offset) % len(text.ids)]
        ids[position] = other if other != ids[position] else text.ids[(start + offset + 1)
                                                                      % len(text.ids)]
    return ids


def perturbed(logprob: float, position: int, token: int, noise: float) -> float:
    """A chosen token's logprob moved by up to +-`noise` (seeded by position and token), kept
    below 0."""
    if noise <= 0:
        return logprob
    digest = hashlib.blake2b(f"{position}:{token}:fp8".encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "little") / 2**64
    return min(-1e-6, round(logprob + noise * (2 * unit - 1), 6))
