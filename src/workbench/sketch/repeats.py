"""Repeats: n-grams a row says twice (a loop) and whole rows seen before (exact duplicates).

    repeat_share        per row: the share of ids inside an n-gram seen twice in that row
    split_repeat_share  the same with each row's reasoning and answer looked at apart
    digest              per row: a 64-bit hash of the whole sequence (exact duplicates)
    exact_duplicates    per row: the first earlier row with the same digest, or -1

Rows come as in :mod:`workbench.sketch.hashing`: a flat array with row starts and ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workbench.sketch.hashing import (
    _SEED_TOKEN,
    CHUNK_IDS,
    Rows,
    as_rows,
    bounded,
    chunks,
    clipped,
    mix,
    windows,
)

__all__ = [
    "DEFAULT_REPEAT_NGRAM",
    "digest",
    "exact_duplicates",
    "repeat_share",
    "split_repeat_share",
]

# The digest's constants (fixed: digests compare across processes and days).
_SEED_DIGEST = 0x13198A2E03707344
_SEED_DIGEST_END = 0x3F84D5B5B5470917
_DIGEST_POSITION = np.uint64(0xC2B2AE3D27D4EB4F)  # odd: each position its own multiple

DEFAULT_REPEAT_NGRAM = 10  # ids per n-gram of the repeated-n-gram share (a loop's period or more)

_U64 = np.uint64


def repeat_share(
    ids: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
    ends: np.ndarray | Sequence[int], n: int = DEFAULT_REPEAT_NGRAM,
) -> np.ndarray:
    """Per row, the share of its ids that lie inside an n-gram occurring at least twice in it.

    Gopher's duplicate n-gram fraction over ids: a reply stuck in a loop of any period scores
    about the share of the reply the loop covers, a normal reply scores near 0. Rows shorter
    than 2n score 0. One sort of (row, n-gram hash, position) keys per call, then the covered
    positions by a +1/-1 difference array and a cumulative sum (float32).
    """
    rows = as_rows(ids, starts, ends)
    share = np.zeros(len(rows), dtype=np.float32)
    for first, last in chunks(rows, CHUNK_IDS, 1):
        share[first:last] = _repeat_share_part(rows.part(first, last), n)
    return share


def split_repeat_share(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                       split: np.ndarray, n: int = DEFAULT_REPEAT_NGRAM) -> np.ndarray:
    """Per row, the share of its ids inside an n-gram repeated within its own part (float64):
    the part before position `split[i]` of the row (the reasoning, up to the first think-end
    id) and the part after it (the answer) are looked at apart, as an answer that restates
    the reasoning is no loop; a row whose split is -1 is one part. Each part's first
    :data:`MAX_ROW_IDS` ids are looked at.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    split = np.asarray(split, dtype=np.int64)
    cut = starts + np.where(split >= 0, split, ends - starts)
    begins = np.concatenate([starts, np.where(split >= 0, cut + 1, ends)])
    finishes = clipped(begins, np.concatenate([cut, ends]))
    lengths = finishes - begins
    covered = repeat_share(ids, begins, finishes, n) * lengths
    rows = len(starts)
    looked = np.maximum(lengths[:rows] + lengths[rows:], 1)
    result: np.ndarray = (covered[:rows] + covered[rows:]) / looked
    return result


def _repeat_share_part(rows: Rows, n: int) -> np.ndarray:
    lengths = rows.lengths
    hashes, first, row = windows(rows, n)
    long_enough = lengths[row] >= 2 * n
    hashes, first, row = hashes[long_enough], first[long_enough], row[long_enough]
    share = np.zeros(len(rows), dtype=np.float32)
    if len(hashes) < 2:
        return share
    begins = _repeated(hashes, first, row, len(rows), len(rows.values))
    delta = np.zeros(len(rows.values) + 1, dtype=np.int32)
    delta[begins] += 1
    delta[begins + n] -= 1
    covered = np.zeros(len(rows.values) + 1, dtype=np.int64)
    np.cumsum(np.cumsum(delta[:-1]) > 0, out=covered[1:])
    inside = covered[rows.offsets[1:]] - covered[rows.offsets[:-1]]
    np.divide(inside, lengths, out=share, where=lengths >= 2 * n, casting="unsafe")
    return share


def _repeated(hashes: np.ndarray, first: np.ndarray, row: np.ndarray, rows: int,
              size: int) -> np.ndarray:
    """The flat starts of the windows whose hash another window of the same row has too.

    Keys are (row, hash) in the high bits; when the flat position fits in the low bits with
    at least 32 bits of hash left (any block of the scan), one plain sort of the keys does,
    else an argsort of keys without it.
    """
    row_bits = max(1, (rows - 1).bit_length())
    position_bits = max(1, (size - 1).bit_length())
    hash_bits = 64 - row_bits - position_bits
    if hash_bits >= 32:
        keys = (row.astype(_U64) << _U64(64 - row_bits)) | \
            ((hashes >> _U64(64 - hash_bits)) << _U64(position_bits)) | first.astype(_U64)
        ordered = np.sort(keys)
        groups: np.ndarray = ordered >> _U64(position_bits)
        positions = (ordered & _U64((1 << position_bits) - 1)).astype(np.int64)
    else:
        keys = (row.astype(_U64) << _U64(64 - row_bits)) | (hashes >> _U64(row_bits))
        order = np.argsort(keys)
        groups, positions = keys[order], first[order]
    same = groups[1:] == groups[:-1]
    repeated = np.zeros(len(groups), dtype=bool)
    repeated[1:] |= same
    repeated[:-1] |= same
    return positions[repeated]


def digest(
    ids: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
    ends: np.ndarray | Sequence[int],
) -> np.ndarray:
    """Per row, a 64-bit hash of its whole id sequence (uint64), for exact duplicates.

    Each id's token hash (the one the windows of :func:`workbench.sketch.hashing.windows`
    take) is mixed with its position in the row, the results summed (mod 2**64), and the sum
    mixed with the row's length: a few numpy passes over the whole block (a row of more than
    CHUNK_IDS ids a slice at a time, memory bounded), or one compiled pass with its other
    figures where numba is installed
    (:mod:`workbench.sketch.compiled`: the same digests). Equal sequences give equal digests in
    any block or process; different ones differ but with a chance of about 2**-64 (every bit
    of every id counts: token ids and word hashes alike).
    """
    values, starts, ends = bounded(ids, starts, ends)
    lengths = ends - starts
    out = np.empty(len(starts), dtype=_U64)
    long = lengths > CHUNK_IDS  # summed a slice at a time: memory bounded by the slice
    for row in np.flatnonzero(long).tolist():
        total = 0
        for at in range(int(starts[row]), int(ends[row]), CHUNK_IDS):
            piece = values[at:min(at + CHUNK_IDS, int(ends[row]))]
            position = np.arange(at - starts[row], at - starts[row] + len(piece), dtype=_U64)
            total = (total + int(_digest_terms(piece, position).sum(dtype=_U64))) % (1 << 64)
        out[row] = total
    rest = np.flatnonzero(~long)
    rows = as_rows(values, starts[rest], ends[rest])
    for first, last in chunks(rows, CHUNK_IDS, 0):
        part = rows.part(first, last)
        position = np.arange(len(part.values), dtype=_U64) - \
            np.repeat(part.offsets[:-1], part.lengths).astype(_U64)
        running = np.zeros(len(part.values) + 1, dtype=_U64)
        np.cumsum(_digest_terms(part.values, position), out=running[1:])
        out[rest[first:last]] = running[part.offsets[1:]] - running[part.offsets[:-1]]
    return mix(out ^ lengths.astype(_U64), _SEED_DIGEST_END)


def _digest_terms(values: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Each id's part of its row's digest: its token hash mixed with its position."""
    return mix(mix(values, _SEED_TOKEN) ^ (position * _DIGEST_POSITION), _SEED_DIGEST)


def exact_duplicates(digests: np.ndarray | Sequence[int]) -> np.ndarray:
    """Per row, the index of the first earlier row with the same digest, else -1 (int64)."""
    values = np.asarray(digests)
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    earliest = first[inverse.ravel()].astype(np.int64)
    return np.where(earliest < np.arange(len(values)), earliest, -1)
