"""Hashing primitives and the flat layout of rows every sketch of the package works on.

A block of rows comes the way the scan holds it (:mod:`workbench.analyze.scan`): one flat
array `ids` and row boundaries `starts`, `ends` (row i holds ids[starts[i]:ends[i]]). Here
the rows are put back to back (:class:`Rows`), their n-value windows hashed with a few numpy
passes over the whole block, never a Python loop over ids, and long blocks cut into parts
that stay in cache.

    mix            splitmix64, elementwise: the mixing under every hash of the package
    as_u64         token ids (int64, possibly negative) or uint64 word hashes as uint64
    sorted_unique  the distinct values, sorted
    bounded        a block's values and row bounds, checked
    Rows, as_rows  rows back to back: values and offsets
    windows        (hash, flat start, row) of every window of n values inside a row
    ngram_hashes   the hash of every n-gram inside a row, and the row of each
    chunks         consecutive row ranges of about CHUNK_IDS ids (a block sketched in parts)
    clipped        row ends cut to MAX_ROW_IDS ids (what a figure looks at)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CHUNK_IDS",
    "MAX_ROW_IDS",
    "Rows",
    "as_rows",
    "as_u64",
    "bounded",
    "chunks",
    "clipped",
    "mix",
    "ngram_hashes",
    "sorted_unique",
    "windows",
]

_U64 = np.uint64
CHUNK_IDS = 1 << 16  # rows are sketched about this many ids (and cells) at a time: in cache

# The ids of a row a figure looks at, at most: a reply of millions of ids (a broken server's,
# a file edited by hand) would otherwise take gigabytes of index arrays; the figures of such a
# row are those of its first MAX_ROW_IDS ids (the digest takes the whole row).
MAX_ROW_IDS = 1 << 18


def clipped(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The row ends cut to at most MAX_ROW_IDS ids after each start."""
    return np.minimum(np.asarray(ends, dtype=np.int64),
                      np.asarray(starts, dtype=np.int64) + MAX_ROW_IDS)


# The seed of the token hash (fixed: equal across processes; every hash of the package has
# its own seed, in the module that owns it).
_SEED_TOKEN = 0x243F6A8885A308D3
_MIX_OFFSET = 0x9E3779B97F4A7C15  # added to every seed before mixing
_MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


# --- hashing primitives -----------------------------------------------------------------------


def mix(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """splitmix64 of x + seed, elementwise (a new uint64 array): a bijection of 64-bit values
    whose outputs look random, so small ids and neighbouring values spread over all bits."""
    z = np.asarray(x, dtype=_U64) + _U64((seed + _MIX_OFFSET) % (1 << 64))
    z ^= z >> _U64(30)
    z *= _U64(_MIX_MULTIPLIERS[0])
    z ^= z >> _U64(27)
    z *= _U64(_MIX_MULTIPLIERS[1])
    z ^= z >> _U64(31)
    return z


def as_u64(tokens: np.ndarray | Sequence[int]) -> np.ndarray:
    """Token ids (int64, possibly negative) or uint64 word hashes as uint64 (ids wrap)."""
    array = np.asarray(tokens)
    if array.dtype == _U64:
        return array
    if array.size == 0:
        return np.zeros(0, dtype=_U64)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"tokens must be integers, not {array.dtype}")
    return array.astype(np.int64, copy=False).view(_U64)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (np.unique's hash path is slow on large integer arrays)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


# --- the flat layout --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rows:
    """Rows back to back: row i is values[offsets[i]:offsets[i + 1]]."""

    values: np.ndarray  # uint64
    offsets: np.ndarray  # int64, one more than the rows

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def part(self, first: int, last: int) -> Rows:
        """Rows first..last-1, their offsets from 0."""
        a, b = int(self.offsets[first]), int(self.offsets[last])
        return Rows(self.values[a:b], self.offsets[first:last + 1] - a)


def bounded(tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
            ends: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values as uint64, starts, ends as int64); ValueError unless every row lies inside."""
    values = as_u64(tokens)
    first = np.asarray(starts, dtype=np.int64).ravel()
    last = np.asarray(ends, dtype=np.int64).ravel()
    if first.shape != last.shape:
        raise ValueError(f"{len(first)} starts but {len(last)} ends")
    if len(first) and (int((last - first).min()) < 0 or int(first.min()) < 0
                       or int(last.max()) > len(values)):
        raise ValueError("row boundaries outside the token array")
    return values, first, last


def as_rows(tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
            ends: np.ndarray | Sequence[int]) -> Rows:
    """The rows tokens[starts[i]:ends[i]] back to back (no copy when they already are)."""
    values, first, last = bounded(tokens, starts, ends)
    lengths = last - first
    offsets = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not len(first):
        return Rows(values[:0], offsets)
    if np.array_equal(first[1:], last[:-1]):  # already back to back
        return Rows(values[first[0]:last[-1]], offsets)
    positions = np.arange(offsets[-1], dtype=np.int64) + np.repeat(first - offsets[:-1], lengths)
    return Rows(values[positions], offsets)


def windows(rows: Rows, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash, flat start, row) of every window of n values inside one row.

    The hash is sum_j mix(value[p + j]) * B**j over the window (:func:`_window_sums`),
    finalised by another mix: the sums are taken over the whole flat array, and the windows
    that cross a row end are then left out.
    """
    lengths = rows.lengths
    counts = np.maximum(lengths - n + 1, 0)
    total = int(counts.sum())
    row = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
    if total == 0:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int64), row
    before = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(counts[:-1], out=before[1:])
    starts = np.arange(total, dtype=np.int64) + np.repeat(rows.offsets[:-1] - before, counts)
    sums = _window_sums(mix(rows.values, _SEED_TOKEN), n)
    return mix(sums[starts], n), starts, row


_WINDOW_BASE = 0x9FB21C651E98DF25  # odd


def _window_sums(mixed: np.ndarray, n: int) -> np.ndarray:
    """sum_j mixed[p + j] * B**j (mod 2**64) for every window of n values, p in order.

    By doubling, as n's bits say: the sums over w values give those over 2w with one pass
    (S_2w[p] = S_w[p] + B**w * S_w[p + w]), and the windows of the set bits are joined the
    same way: about 2 log2(n) passes over the array instead of n.
    """
    if len(mixed) < n:
        return np.zeros(0, dtype=_U64)
    result: np.ndarray | None = None
    covered = 0  # values the result's windows hold
    part, width = mixed, 1  # sums over `width` values
    while True:
        if n & 1:
            if result is None:
                result, covered = part, width
            else:
                span = len(result) - width
                result = result[:span] + _U64(pow(_WINDOW_BASE, covered, 1 << 64)) * \
                    part[covered:covered + span]
                covered += width
        n >>= 1
        if not n:
            break
        span = len(part) - width
        part = part[:span] + _U64(pow(_WINDOW_BASE, width, 1 << 64)) * part[width:width + span]
        width *= 2
    assert result is not None
    return result


def ngram_hashes(
    tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
    ends: np.ndarray | Sequence[int], n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(hash, row) of every n-gram lying inside one row, rows in order (uint64, int64).

    `tokens` are token ids or uint64 word hashes; equal n-grams hash equal in any row, block or
    process. A row shorter than n has none.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    hashes, _, row = windows(as_rows(tokens, starts, ends), n)
    return hashes, row


def chunks(rows: Rows, size: int, per_row: int) -> list[tuple[int, int]]:
    """Consecutive (first, last) row ranges of about `size` ids plus `per_row` per row each
    (a longer row alone)."""
    weight = rows.offsets + np.arange(len(rows) + 1, dtype=np.int64) * per_row
    cuts = np.searchsorted(weight, np.arange(size, int(weight[-1]), size, dtype=np.int64))
    bounds = sorted({0, len(rows), *cuts.tolist()})
    return list(itertools.pairwise(bounds))
