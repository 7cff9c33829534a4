"""Modes mixed within a dataset: which mode each conversation draws, and a deployment's mix.

Pure logic, no I/O but reading a deployment's request sample. A dataset's ``modes`` (see
:class:`workbench.config.Mode`) are named chat-template arguments and sampling overrides with
weights, e.g. 75% with thinking on and 25% with it off, as the drafter will be served.

- :func:`draw` gives each prompt (each conversation) its mode, walking the send order: every
  prompt goes to the mode furthest behind its share so far (ties broken by a seeded draw), so
  the mix of every prefix of the send order, and so of what any budget lets through, is
  within one prompt of the weights; the whole dataset's is the largest-remainder rounding of
  them. Prompts whose mode an earlier session already chose keep it and count.
- :func:`deployment_mix` reads a sample of a deployment's chat-completion request bodies
  (JSONL) and gives the share of each ``chat_template_kwargs`` combination (with the
  request's ``reasoning_effort`` as the template argument of that name, as SGLang's chat
  serving hands it to the template): the weights of the modes that serve like it.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from workbench.errors import DataError

__all__ = ["DeploymentMode", "deployment_mix", "draw", "mode_name", "shares"]

K = TypeVar("K", bound=Hashable)

_TIE = 1e-9  # deficits this close are a tie


def shares(weights: Sequence[float]) -> list[float]:
    """The weights as shares of their sum."""
    total = float(sum(weights))
    return [w / total for w in weights]


def draw(order: Sequence[K], weights: Sequence[float], seed: str,
         fixed: Mapping[K, int] | None = None) -> dict[K, int]:
    """The mode (an index into `weights`) of each key of `order` (the send order).

    Keys not in `fixed` follow Tijdeman's chairman assignment: of the modes owed at least
    ``1/(2m-2)`` of a prompt by their share so far, the one whose next prompt falls due first
    (ties broken by a draw seeded with `seed`, one per position). Without fixed keys, every prefix's count of a
    mode stays within ``1 - 1/(2m-2)`` (less than one prompt) of its share of the prefix; a
    key in `fixed` keeps its mode and counts."""
    share = shares(weights)
    if len(share) == 1:
        return dict.fromkeys(order, 0)
    sigma = 1 - 1 / (2 * len(share) - 2)
    counts = [0] * len(share)
    rng = random.Random(seed)
    drawn: dict[K, int] = {}
    kept = fixed or {}
    for position, key in enumerate(order, start=1):
        toss = rng.random()  # drawn at every position: a kept key leaves the others' as they were
        mode = kept.get(key)
        if mode is None:
            mode = _due(share, counts, position, sigma, toss)
        counts[mode] += 1
        drawn[key] = mode
    return drawn


def _due(share: list[float], counts: list[int], position: int, sigma: float,
         toss: float) -> int:
    """The mode whose next prompt falls due first among those owed enough (any owed one,
    once fixed keys have put the mix off its bounds)."""
    owed = [i for i, s in enumerate(share) if s * position - counts[i] >= 1 - sigma - _TIE]
    if not owed:
        owed = [max(range(len(share)), key=lambda i: share[i] * position - counts[i])]
    deadline = {i: (counts[i] + sigma) / share[i] for i in owed}
    first = min(deadline.values())
    tied = [i for i in owed if deadline[i] <= first + _TIE]
    return tied[int(toss * len(tied))]


# ------------------------------------------------------------------------ deployment sample


class DeploymentMode(NamedTuple):
    """One combination of chat-template arguments a deployment's requests use, and how many
    of the sampled requests use it."""

    name: str
    chat_template_kwargs: dict[str, Any]
    count: int


def mode_name(kwargs: Mapping[str, Any]) -> str:
    """A mode's name from its arguments: ``thinking=false``, ``a=1,b=x``; ``default`` for
    none. Characters a mode name cannot hold become ``_``; at most 64 characters."""
    if not kwargs:
        return "default"
    parts = [f"{key}={_value_text(value)}" for key, value in sorted(kwargs.items())]
    name = _UNSAFE.sub("_", ",".join(parts)).lstrip("_.,=-") or "mode"
    return name[:64]


_UNSAFE = re.compile(r"[^A-Za-z0-9._=,-]")


def _value_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


def deployment_mix(path: Path, source: str) -> list[DeploymentMode]:
    """The chat-template argument combinations of the request bodies in the JSONL file at
    `path` (named `source` in messages), most used first. A DataError names the file and
    line of a line that is no request body."""
    counts: Counter[str] = Counter()
    kwargs_of: dict[str, dict[str, Any]] = {}
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise DataError(source, f"cannot read the deployment sample: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            kwargs = _request_kwargs(line, source, number)
            key = json.dumps(kwargs, sort_keys=True)
            counts[key] += 1
            kwargs_of.setdefault(key, kwargs)
    if not counts:
        raise DataError(source, "the deployment sample holds no requests")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    names: set[str] = set()
    modes = []
    for key, count in ranked:
        name = _unique(mode_name(kwargs_of[key]), names)
        modes.append(DeploymentMode(name, kwargs_of[key], count))
    return modes


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or with ``-2``, ``-3``, ... when another mode has it (names made safe may meet)."""
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name[:60]}-{number}"
    taken.add(candidate)
    return candidate


def _request_kwargs(line: bytes, source: str, number: int) -> dict[str, Any]:
    """A request body's chat-template arguments (its ``reasoning_effort`` among them)."""
    try:
        body = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(source, f"invalid JSON: {exc}", number) from None
    if not isinstance(body, dict):
        raise DataError(source, "expected a chat-completion request body (a JSON object)", number)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise DataError(source, "chat_template_kwargs: expected an object, got "
                        f"{type(kwargs).__name__}", number)
    effort = body.get("reasoning_effort")
    if effort is not None:
        kwargs = {**kwargs, "reasoning_effort": effort}
    return kwargs
