"""Per-row facts about a batch of rows' output ids, the format rules' inputs.

    IdFacts   per row: the first id out of the vocabulary, the special ids, the think-end
              ids (how many, the first, the id after it), the think-start ids
    id_facts  those of rows ids[starts[i]:ends[i]]: one compiled pass over the ids with numba
              (the ``fast`` extra), else a few numpy passes over the whole batch

Both give the same answers (the tests run each against the other); the compiled pass reads
each id once where the numpy passes read them about six times.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from workbench import loops

__all__ = ["IdFacts", "id_facts"]


class IdFacts(NamedTuple):
    """Per row (int64 arrays), positions within the row and -1 when absent: the first id
    outside [0, vocab_size); how many special ids it holds; how many think-end ids, the
    first one, and the id right after it (-1 at the row's end); how many think-start ids."""

    bad_vocab: np.ndarray
    special: np.ndarray
    end_count: np.ndarray
    end_first: np.ndarray
    after_end: np.ndarray
    start_count: np.ndarray


def id_facts(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, *, vocab_size: int,
             think_end: int | None, think_start: int | None, special_start: int | None,
             not_special: np.ndarray) -> IdFacts:
    """The facts of rows ids[starts[i]:ends[i]] (back to back, in order). Think ids are
    looked for only when `think_end` is given (else counted 0, found -1); special ids are
    the ids from `special_start` on inside the vocabulary, but those of `not_special`
    (none without a `special_start`)."""
    ids = np.asarray(ids, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    expected = np.unique(np.asarray(not_special, dtype=np.int64))
    kernel = _kernel()
    if kernel is None:
        return _numpy_facts(ids, starts, ends, vocab_size, think_end, think_start, special_start,
                            expected)
    out = np.empty((6, len(starts)), dtype=np.int64)
    kernel(ids, starts, ends, vocab_size, -1 if think_end is None else think_end,
           -1 if think_start is None else think_start,
           -1 if special_start is None else special_start, think_end is not None,
           think_start is not None, special_start is not None, expected, out)
    return IdFacts(*out)


@loops.compiled("workbench.analyze._facts_loop")
def _kernel() -> Any:
    """The compiled pass (:mod:`workbench.analyze._facts_loop`), or None."""
    from workbench.analyze._facts_loop import facts_loop

    return facts_loop


def _numpy_facts(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, vocab_size: int,
                 think_end: int | None, think_start: int | None, special_start: int | None,
                 expected: np.ndarray) -> IdFacts:
    count = len(starts)
    bad_vocab = _first_at(starts, ends, np.flatnonzero((ids >= vocab_size) | (ids < 0)))
    special = np.zeros(count, dtype=np.int64)
    if special_start is not None:
        found = np.flatnonzero((ids >= special_start) & (ids < vocab_size))
        special = _count_at(ends, found[~np.isin(ids[found], expected)])
    if think_end is None:
        none = np.full(count, -1, dtype=np.int64)
        return IdFacts(bad_vocab, special, np.zeros(count, dtype=np.int64), none, none.copy(),
                       np.zeros(count, dtype=np.int64))
    ends_at = np.flatnonzero(ids == think_end)
    end_first = _first_at(starts, ends, ends_at)
    start_count = (np.zeros(count, dtype=np.int64) if think_start is None
                   else _count_at(ends, np.flatnonzero(ids == think_start)))
    return IdFacts(bad_vocab, special, _count_at(ends, ends_at), end_first,
                   _after(ids, starts, ends, end_first), start_count)


def _first_at(starts: np.ndarray, ends: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per row, the position (within the row) of the first of the flat `positions`
    (ascending) that falls in it, or -1."""
    rows = np.searchsorted(ends, positions, side="right")
    first = np.full(len(ends), -1, dtype=np.int64)
    if len(rows):
        new = np.ones(len(rows), dtype=bool)
        np.not_equal(rows[1:], rows[:-1], out=new[1:])
        first[rows[new]] = positions[new] - starts[rows[new]]
    return first


def _count_at(ends: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per row, how many of the flat `positions` fall in it."""
    rows = np.searchsorted(ends, positions, side="right")
    return np.bincount(rows, minlength=len(ends)).astype(np.int64)[:len(ends)]


def _after(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
           position: np.ndarray) -> np.ndarray:
    """Per row, the id after the row position (-1 for none: no position, or the end)."""
    following = np.full(len(ends), -1, dtype=np.int64)
    rows = np.flatnonzero(position >= 0)
    flat = starts[rows] + position[rows] + 1
    inside = flat < ends[rows]
    following[rows[inside]] = ids[flat[inside]]
    return following
