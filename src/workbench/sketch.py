"""Sketches of replies for data-quality checks: loops, exact and near duplicates, contamination.

Every function takes a block of rows the way the scan holds them (:mod:`workbench.analyze.scan`):
one flat array `ids` and row boundaries `starts`, `ends` (row i holds ids[starts[i]:ends[i]]),
and works with a few numpy passes over the whole block, never a Python loop over ids.

    ngram_hashes       the hash of every n-gram inside a row, and the row of each
    repeat_share       per row: the share of ids inside an n-gram seen twice in that row (a loop)
    split_repeat_share the same with each row's reasoning and answer looked at apart
    digest             per row: a 64-bit hash of the whole sequence (exact duplicates)
    signatures         per row: a MinHash signature over shingles (near duplicates)
    exact_duplicates   per row: the first earlier row with the same digest, or -1
    near_duplicates    per row: the first earlier row of estimated Jaccard >= threshold, or -1
    normalise_words    text to lowercase NFKC words without punctuation
    word_hashes        a stable 64-bit hash of each normalised word of a text
    PieceDecoder       a tokenizer's ids to the hashes of their normalised words, rows at once
    Benchmarks         benchmark prompts' word n-grams, and which benchmarks each row quotes
    Decontamination    benchmarks with the decoder of a run's ids: which each row of ids quotes

Every hash is a fixed function of the values (splitmix64 mixing with constant seeds, a
polynomial over the UTF-8 bytes of a word), never Python's salted ``hash()``: signatures and
digests made by different processes, or on different days, compare.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import string
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import ConfigError, DataError

__all__ = [
    "DEFAULT_BENCHMARK_NGRAM",
    "DEFAULT_NUM_PERM",
    "DEFAULT_REPEAT_NGRAM",
    "DEFAULT_SHINGLE",
    "DEFAULT_THRESHOLD",
    "MAX_ROW_IDS",
    "PROMPT_FIELDS",
    "Benchmark",
    "Benchmarks",
    "Decontamination",
    "PieceDecoder",
    "clipped",
    "digest",
    "exact_duplicates",
    "lsh_bands",
    "near_duplicates",
    "ngram_hashes",
    "normalise_words",
    "repeat_share",
    "signatures",
    "split_repeat_share",
    "word_hashes",
]

DEFAULT_SHINGLE = 3  # ids per shingle: 5-10% of ids changed still leaves Jaccard 0.55-0.75
DEFAULT_NUM_PERM = 128  # signature entries: the estimate's spread is about 0.045 at 0.5
DEFAULT_THRESHOLD = 0.5  # estimated Jaccard of a near duplicate (bench/dedup.py tunes the three)
DEFAULT_BENCHMARK_NGRAM = 13  # words per benchmark n-gram: the usual decontamination rule
DEFAULT_REPEAT_NGRAM = 10  # ids per n-gram of the repeated-n-gram share (a loop's period or more)

PROMPT_FIELDS = ("prompt", "question", "problem", "instruction", "input", "text", "turns")

_U64 = np.uint64
_EMPTY = np.iinfo(np.uint64).max  # a signature cell no shingle fell in
_VALUE_BITS = 40  # the low bits of a shingle hash are its MinHash value, the high ones its bin
_VALUE_MASK = _U64((1 << _VALUE_BITS) - 1)
_CHUNK_IDS = 1 << 16  # rows are sketched about this many ids (and cells) at a time: in cache
_PAIR_CHUNK = 1 << 18  # candidate pairs verified this many at a time
_MAX_PERM = 4096  # signature entries at most

# The ids of a row a figure looks at, at most: a reply of millions of ids (a broken server's,
# a file edited by hand) would otherwise take gigabytes of index arrays; the figures of such a
# row are those of its first MAX_ROW_IDS ids (the digest takes the whole row).
MAX_ROW_IDS = 1 << 18


def clipped(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The row ends cut to at most MAX_ROW_IDS ids after each start."""
    return np.minimum(np.asarray(ends, dtype=np.int64),
                      np.asarray(starts, dtype=np.int64) + MAX_ROW_IDS)

# Seeds of the independent hash functions (fixed: equal across processes).
_SEED_TOKEN = 0x243F6A8885A308D3
_SEED_SHORT = 0xA4093822299F31D0
_SEED_BAND = 0x082EFA98EC4E6C89
_SEED_PROBE = 0x452821E638D01377
_SEED_BYTES = 0xBE5466CF34E90C6C
_SEED_LENGTH = 0xC0AC29B7C97C50DD


# --- hashing primitives -----------------------------------------------------------------------


def _mix(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """splitmix64 of x + seed, elementwise (a new uint64 array): a bijection of 64-bit values
    whose outputs look random, so small ids and neighbouring values spread over all bits."""
    z = np.asarray(x, dtype=_U64) + _U64((seed + 0x9E3779B97F4A7C15) % (1 << 64))
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


@functools.cache
def _multipliers(count: int, seed: int) -> np.ndarray:
    """`count` odd 64-bit multipliers, a fixed function of seed (one per n-gram position)."""
    values = _mix(np.arange(1, count + 1, dtype=_U64), seed) | _U64(1)
    values.flags.writeable = False
    return values


def _as_u64(tokens: np.ndarray | Sequence[int]) -> np.ndarray:
    """Token ids (int64, possibly negative) or uint64 word hashes as uint64 (ids wrap)."""
    array = np.asarray(tokens)
    if array.dtype == _U64:
        return array
    if array.size == 0:
        return np.zeros(0, dtype=_U64)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"tokens must be integers, not {array.dtype}")
    return array.astype(np.int64, copy=False).view(_U64)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
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
class _Rows:
    """Rows back to back: row i is values[offsets[i]:offsets[i + 1]]."""

    values: np.ndarray  # uint64
    offsets: np.ndarray  # int64, one more than the rows

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def part(self, first: int, last: int) -> _Rows:
        """Rows first..last-1, their offsets from 0."""
        a, b = int(self.offsets[first]), int(self.offsets[last])
        return _Rows(self.values[a:b], self.offsets[first:last + 1] - a)


def _rows(tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
          ends: np.ndarray | Sequence[int]) -> _Rows:
    """The rows tokens[starts[i]:ends[i]] back to back (no copy when they already are)."""
    values = _as_u64(tokens)
    first = np.asarray(starts, dtype=np.int64).ravel()
    last = np.asarray(ends, dtype=np.int64).ravel()
    if first.shape != last.shape:
        raise ValueError(f"{len(first)} starts but {len(last)} ends")
    lengths = last - first
    if (lengths < 0).any() or (len(first) and (first.min() < 0 or last.max() > len(values))):
        raise ValueError("row boundaries outside the token array")
    offsets = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not len(first):
        return _Rows(values[:0], offsets)
    if np.array_equal(first[1:], last[:-1]):  # already back to back
        return _Rows(values[first[0]:last[-1]], offsets)
    positions = np.arange(offsets[-1], dtype=np.int64) + np.repeat(first - offsets[:-1], lengths)
    return _Rows(values[positions], offsets)


def _windows(rows: _Rows, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    sums = _window_sums(_mix(rows.values, _SEED_TOKEN), n)
    return _mix(sums[starts], n), starts, row


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
    hashes, _, row = _windows(_rows(tokens, starts, ends), n)
    return hashes, row


# --- loops and exact duplicates ---------------------------------------------------------------


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
    rows = _rows(ids, starts, ends)
    share = np.zeros(len(rows), dtype=np.float32)
    for first, last in _chunks(rows, _CHUNK_IDS, 1):
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


def _repeat_share_part(rows: _Rows, n: int) -> np.ndarray:
    lengths = rows.lengths
    hashes, first, row = _windows(rows, n)
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

    The BLAKE2b digest of the row's ids as 32-bit values (their low bits: every id of a
    vocabulary fits; ids past it are flagged apart, and word hashes keep 32 random bits): one
    C call a row, about ten times faster on long rows than numpy passes over every id, and
    half the bytes of 64-bit values. Equal sequences give equal digests in any block or
    process; different ones differ but with a chance of about 2**-64.
    """
    values = _as_u64(ids).astype(np.uint32)  # (a copy: contiguous)
    data = values.view(np.uint8).data
    first = np.asarray(starts, dtype=np.int64).tolist()
    last = np.asarray(ends, dtype=np.int64).tolist()
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(data[s * 4:e * 4], digest_size=8).digest(), "little")
         for s, e in zip(first, last, strict=True)),
        dtype=_U64, count=len(first))


def exact_duplicates(digests: np.ndarray | Sequence[int]) -> np.ndarray:
    """Per row, the index of the first earlier row with the same digest, else -1 (int64)."""
    values = np.asarray(digests)
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    earliest = first[inverse.ravel()].astype(np.int64)
    return np.where(earliest < np.arange(len(values)), earliest, -1)


# --- MinHash signatures -----------------------------------------------------------------------


def signatures(
    tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
    ends: np.ndarray | Sequence[int], shingle: int = DEFAULT_SHINGLE,
    num_perm: int = DEFAULT_NUM_PERM,
) -> np.ndarray:
    """MinHash signatures of the rows' shingle sets, shape (rows, num_perm), uint64.

    One-permutation hashing: each shingle (`shingle` consecutive tokens) is hashed once to 64
    bits; the high bits pick one of num_perm bins and the low 40 bits are its value, kept as the
    least per (row, bin). Bins no shingle fell in are filled by optimal densification (each
    probes a fixed sequence of other bins and copies the first filled one), so rows with few
    shingles still compare. The share of equal entries of two rows estimates the Jaccard
    similarity of their shingle sets. A row shorter than `shingle` is one shingle of its own
    (two equal short rows match). `tokens` are token ids or uint64 word hashes.
    """
    if shingle < 1 or not 1 <= num_perm <= _MAX_PERM:
        raise ValueError(f"shingle must be >= 1 and num_perm in 1..{_MAX_PERM}: {shingle}, {num_perm}")
    rows = _rows(tokens, starts, ends)
    out = np.empty((len(rows), num_perm), dtype=_U64)
    for first, last in _chunks(rows, _CHUNK_IDS, num_perm):
        out[first:last] = _signature_part(rows.part(first, last), shingle, num_perm)
    return out


def _chunks(rows: _Rows, size: int, per_row: int) -> list[tuple[int, int]]:
    """Consecutive (first, last) row ranges of about `size` ids plus `per_row` per row each
    (a longer row alone)."""
    weight = rows.offsets + np.arange(len(rows) + 1, dtype=np.int64) * per_row
    cuts = np.searchsorted(weight, np.arange(size, int(weight[-1]), size, dtype=np.int64))
    bounds = sorted({0, len(rows), *cuts.tolist()})
    return list(itertools.pairwise(bounds))


def _signature_part(rows: _Rows, shingle: int, num_perm: int) -> np.ndarray:
    hashes, _, row = _windows(rows, shingle)
    short = np.flatnonzero(rows.lengths < shingle)
    if len(short):
        whole = _mix(digest(rows.values, rows.offsets[short], rows.offsets[short + 1]),
                     _SEED_SHORT)
        hashes, row = np.concatenate([hashes, whole]), np.concatenate([row, short])
    bins = ((hashes >> _U64(_VALUE_BITS)) * _U64(num_perm)) >> _U64(64 - _VALUE_BITS)
    cells = row * num_perm + bins.astype(np.int64)
    table = np.full(len(rows) * num_perm, _EMPTY, dtype=_U64)
    np.minimum.at(table, cells, hashes & _VALUE_MASK)
    return _densified(table.reshape(len(rows), num_perm))


def _densified(table: np.ndarray) -> np.ndarray:
    """The table with each empty cell holding the value of a filled cell of its row.

    Optimal densification (Shrivastava 2017): empty bin i of a row probes bins p(i, 1),
    p(i, 2), ... (a fixed sequence, the same for every row) and copies the first filled one;
    after min(8 * num_perm, 1024) probes, the next filled bin to the right (circularly). A row
    with one filled bin is filled with it at once.
    """
    filled = table != _EMPTY
    out = table.copy()
    per_row = filled.sum(axis=1)
    single = np.flatnonzero(per_row == 1)
    out[single] = table[single, filled[single].argmax(axis=1)][:, None]
    empty_rows, empty_bins = np.nonzero(~filled & (per_row >= 2)[:, None])
    num_perm = table.shape[1]
    probes = _probes(num_perm)
    for attempt in range(probes.shape[1] + num_perm):
        if not len(empty_rows):
            break
        if attempt < probes.shape[1]:
            donor = probes[empty_bins, attempt]
        else:
            donor = (empty_bins + attempt - probes.shape[1] + 1) % num_perm
        found = filled[empty_rows, donor]
        out[empty_rows[found], empty_bins[found]] = table[empty_rows[found], donor[found]]
        empty_rows, empty_bins = empty_rows[~found], empty_bins[~found]
    return out


@functools.cache
def _probes(num_perm: int) -> np.ndarray:
    """The fixed probe sequence of each bin: (num_perm, min(8 * num_perm, 1024)) bin numbers."""
    attempts = min(8 * num_perm, 1024)
    cells = np.arange(num_perm * attempts, dtype=_U64)
    probes = ((_mix(cells, _SEED_PROBE) >> _U64(32)) * _U64(num_perm)) >> _U64(32)
    table = probes.astype(np.int32).reshape(num_perm, attempts)
    table.flags.writeable = False
    return table


# --- near duplicates --------------------------------------------------------------------------


@functools.cache
def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) for LSH at `threshold` over num_perm entries: the choice of
    datasketch's MinHashLSH (``_optimal_param``, false positives and negatives weighed
    equally), with its integrals taken on a grid in numpy: importing datasketch (and scipy)
    took half a second of every validation. A test checks both choose the same."""
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)],
                     dtype=np.float64)
    bands, rows = pairs[:, :1], pairs[:, 1:]
    below = np.linspace(0.0, threshold, 1001)
    above = np.linspace(threshold, 1.0, 1001)
    false_positive = _integral(1 - (1 - below ** rows) ** bands, below)
    false_negative = _integral((1 - above ** rows) ** bands, above)
    best = int(np.argmin(false_positive + false_negative))
    return int(pairs[best, 0]), int(pairs[best, 1])


def _integral(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per row of values (taken at the points `at`), the trapezoid rule's integral."""
    return ((values[:, 1:] + values[:, :-1]) / 2 * np.diff(at)).sum(axis=1)


def near_duplicates(sigs: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Per row, the index of the first earlier row it near-duplicates, else -1 (int64).

    LSH banding with datasketch's (bands, rows per band) for the threshold: rows whose entries
    agree on a whole band share a bucket. Each row is paired with the earliest row of each of
    its buckets and with the row just before it there, and a pair counts when its estimated
    Jaccard (the share of equal entries) is at least `threshold`; the earliest such partner is
    returned. (A row could miss an earlier partner that is neither first nor just before it in
    any shared bucket; with few collisions that does not happen in practice.)
    """
    sigs = np.asarray(sigs)
    if sigs.ndim != 2:
        raise ValueError(f"signatures must be a (rows, num_perm) array, not shape {sigs.shape}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], not {threshold}")
    count, num_perm = sigs.shape
    result = np.full(count, -1, dtype=np.int64)
    if count < 2:
        return result
    later, earlier = _candidates(sigs, *lsh_bands(float(threshold), num_perm))
    need = int(np.ceil(threshold * num_perm - 1e-9))
    for start in range(0, len(later), _PAIR_CHUNK):
        rows, partners = later[start:start + _PAIR_CHUNK], earlier[start:start + _PAIR_CHUNK]
        keep = np.count_nonzero(sigs[rows] == sigs[partners], axis=1) >= need
        rows, partners = rows[keep], partners[keep]
        first = np.ones(len(rows), dtype=bool)  # pairs come sorted by (row, partner)
        first[1:] = rows[1:] != rows[:-1]
        rows, partners = rows[first], partners[first]
        unset = result[rows] < 0
        result[rows[unset]] = partners[unset]
    return result


def _candidates(sigs: np.ndarray, bands: int, per_band: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (row, earlier row) candidate pairs sorted by row then partner: each row with
    the first row and the previous row of every band bucket it shares.

    Band by band (arrays of one entry a row: small, reused, in cache): a bucket key is the
    band's hash with its low bits replaced by the row number, so one plain sort puts each
    bucket together with its rows in order (buckets whose shortened hashes collide merge:
    their false pairs fail the verification).
    """
    count = len(sigs)
    row_bits = _U64(max(1, (count - 1).bit_length()))
    rows = np.arange(count, dtype=_U64)
    factors = _multipliers(per_band, _SEED_BAND)
    found: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    for band in range(bands):
        hashed = np.zeros(count, dtype=_U64)
        for j, factor in enumerate(factors):  # min hashes: random already, mixed once a band
            hashed += sigs[:, band * per_band + j].astype(_U64) * factor
        hashed = _mix(hashed ^ _U64(band), _SEED_BAND)
        keys = np.sort(((hashed >> row_bits) << row_bits) | rows)
        found.append(_bucket_pairs(keys, row_bits, count))
    pairs = _sorted_unique(np.concatenate(found))
    return pairs // count, pairs % count


def _bucket_pairs(keys: np.ndarray, row_bits: np.uint64, count: int) -> np.ndarray:
    """later * count + earlier for each row of a sorted band's keys after the first of its
    bucket: paired with the bucket's first row and with the row just before it."""
    bucket = keys >> row_bits
    same = np.flatnonzero(bucket[1:] == bucket[:-1]) + 1  # positions after a bucket's first
    if not len(same):
        return np.zeros(0, dtype=np.int64)
    row = (keys & ((_U64(1) << row_bits) - _U64(1))).astype(np.int64)
    new = np.ones(len(keys), dtype=bool)
    new[same] = False
    head = row[np.maximum.accumulate(np.where(new, np.arange(len(keys)), 0))]
    later = row[same]
    return np.concatenate([later * count + head[same], later * count + row[same - 1]])


# --- words ------------------------------------------------------------------------------------


@functools.cache
def _punctuation() -> dict[int, str]:
    """str.translate table: every Unicode punctuation character and ASCII symbol to a space."""
    marks = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)).startswith("P")]
    return dict.fromkeys([*marks, *map(ord, string.punctuation)], " ")


def normalise_words(text: str) -> list[str]:
    """The words of text: Unicode NFKC, lowercase, punctuation (and ASCII symbols) replaced by
    spaces, split on whitespace. "Hello,World!" and "hello world" give the same words."""
    return unicodedata.normalize("NFKC", text).lower().translate(_punctuation()).split()


@functools.cache
def _byte_values() -> np.ndarray:
    values = _mix(np.arange(256, dtype=_U64), _SEED_BYTES)
    values.flags.writeable = False
    return values


_BASE = 0x100000001B3 * 2 + 1  # odd


@functools.cache
def _powers(count: int) -> np.ndarray:
    """_BASE ** j modulo 2**64 for j < count."""
    powers = np.full(count, _BASE, dtype=_U64)
    powers[0] = 1
    np.cumprod(powers, out=powers)
    powers.flags.writeable = False
    return powers


def _hash_spaced(data: bytes) -> np.ndarray:
    """The hash of each space-separated word of data (single spaces, no leading or trailing
    one): sum_j v(byte_j) * B**j over the word's bytes (j from the word's start), with one
    prefix sum over all of data, then mixed with the length."""
    if not data:
        return np.zeros(0, dtype=_U64)
    raw = np.frombuffer(data, dtype=np.uint8)
    spaces = np.flatnonzero(raw == 32)
    begin = np.concatenate([[0], spaces + 1])
    end = np.concatenate([spaces, [len(raw)]])
    marks = np.zeros(len(raw), dtype=np.int64)
    marks[begin[1:]] = begin[1:]
    local = np.arange(len(raw), dtype=np.int64) - np.maximum.accumulate(marks)
    longest = int(local.max()) + 1
    powers = _powers(1 << max(4, (longest - 1).bit_length()))
    prefix = np.zeros(len(raw) + 1, dtype=_U64)
    np.cumsum(_byte_values()[raw] * powers[local], out=prefix[1:])
    words = prefix[end] - prefix[begin]
    return _mix(words ^ _mix((end - begin).view(_U64), _SEED_LENGTH), _SEED_BYTES)


def _hash_word_rows(rows: Sequence[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word hashes, starts, ends) of rows of normalised words, the rows back to back."""
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(counts)
    hashes = _hash_spaced(" ".join(" ".join(words) for words in rows if words).encode())
    return hashes, ends - counts, ends


def word_hashes(text: str) -> np.ndarray:
    """A stable 64-bit hash of each normalised word of text (uint64, in order; see
    :func:`normalise_words`): equal words hash equal in any process."""
    return _hash_word_rows([normalise_words(text)])[0]


# --- ids to words -----------------------------------------------------------------------------


class PieceDecoder:
    """A tokenizer's ids to words, a block of rows at once.

    Built once per tokenizer (`digest` names the table: a cache key): `pieces` holds each
    id's text as UTF-8 bytes (index `size`, for
    ids outside the vocabulary, is empty). A piece is the text the id adds after a plain word
    (``decode([anchor, id])`` less ``decode([anchor])``), so it carries its leading space
    whatever the tokenizer's decoder (byte-level BPE, SentencePiece, word level). For byte-level
    tokenizers the raw bytes of each token are used, so a character split over two ids joins
    back whole. Special tokens are a space: they separate words and add none.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.pieces = _piece_table(tokenizer)
        self.size = len(self.pieces) - 1
        self.digest = hashlib.sha256(b"\0".join(self.pieces.tolist())).hexdigest()
        # the pieces back to back: a row's bytes are gathered by numpy, not joined by Python
        self._lengths = np.fromiter(map(len, self.pieces), dtype=np.int64, count=len(self.pieces))
        self._starts = np.cumsum(self._lengths) - self._lengths
        self._bytes = np.frombuffer(b"".join(self.pieces.tolist()), dtype=np.uint8)

    def text(self, ids: np.ndarray | Sequence[int]) -> str:
        """The text of a sequence of ids (invalid UTF-8 replaced)."""
        array = np.asarray(ids, dtype=np.int64)
        return b"".join(self.pieces[self._index(array)]).decode("utf-8", "replace")

    def words(
        self, ids: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
        ends: np.ndarray | Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word hashes, word starts, word ends): each row's text, normalised and hashed as
        :func:`word_hashes` does, the rows back to back (row i's words are
        hashes[word_starts[i]:word_ends[i]])."""
        index = self._index(np.asarray(ids, dtype=np.int64))
        data, offsets = self._gathered(index)
        bounds = zip(offsets[np.asarray(starts, dtype=np.int64)].tolist(),
                     offsets[np.asarray(ends, dtype=np.int64)].tolist(), strict=True)
        return _hash_word_rows([normalise_words(data[a:b].decode("utf-8", "replace"))
                                for a, b in bounds])

    def _gathered(self, index: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The pieces of `index` back to back, and the byte offset of each (one more)."""
        lengths = self._lengths[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        source = np.repeat(self._starts[index] - offsets[:-1], lengths)
        source += np.arange(int(offsets[-1]), dtype=np.int64)
        return self._bytes[source].tobytes(), offsets

    def _index(self, ids: np.ndarray) -> np.ndarray:
        return np.where((ids >= 0) & (ids < self.size), ids, self.size)


def _piece_table(tokenizer: Any) -> np.ndarray:
    """Each id's text as bytes (see :class:`PieceDecoder`), an empty one at the end."""
    known = sorted(set(tokenizer.get_vocab().values()))
    size = max([len(tokenizer), *(i + 1 for i in known)])
    texts = _contextual_texts(tokenizer, known)
    raw = _byte_level_pieces(tokenizer, known, texts)
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    pieces = np.full(size + 1, b"", dtype=object)
    for i, text in zip(known, texts, strict=True):
        pieces[i] = b" " if i in special else raw.get(i, text.encode("utf-8"))
    return pieces


def _contextual_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """What each id adds to the text after a plain word (its own decode without one)."""
    anchor = _anchor(tokenizer)
    if anchor is None:
        return [tokenizer.decode([i]) for i in ids]
    prefix = tokenizer.decode([anchor])
    decoded = tokenizer.batch_decode([[anchor, i] for i in ids])
    return [text[len(prefix):] if text.startswith(prefix) else tokenizer.decode([i])
            for text, i in zip(decoded, ids, strict=True)]


def _anchor(tokenizer: Any) -> int | None:
    """The id of a plain word that decodes to itself and prefixes what follows it."""
    for word in ("the", "a", "is", "1", "x"):
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            continue
        alone = tokenizer.decode(ids)
        if alone.strip() and tokenizer.decode([ids[0], ids[0]]).startswith(alone):
            return int(ids[0])
    return None


@functools.cache
def _unicode_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _byte_level_pieces(tokenizer: Any, ids: list[int], texts: list[str]) -> dict[int, bytes]:
    """Each id's raw bytes when the tokenizer is byte-level BPE (its tokens spell bytes in
    GPT-2's alphabet, "Ġ" a space), else nothing. Byte level is taken when almost every token
    that spells valid UTF-8 spells its decoded text, and a "Ġ" token decodes to a space."""
    alphabet = _unicode_bytes()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    raw: dict[int, bytes] = {}
    agree = disagree = spaces = 0
    for i, token, text in zip(ids, tokens, texts, strict=True):
        if not isinstance(token, str) or not token or any(c not in alphabet for c in token):
            continue
        data = bytes(alphabet[c] for c in token)
        raw[i] = data
        try:
            spelled = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a character: what byte level is for
        agree, disagree = agree + (spelled == text), disagree + (spelled != text)
        spaces += token.startswith("Ġ") and text.startswith(" ")
    return raw if spaces and agree >= 0.99 * (agree + disagree) else {}


# --- benchmarks -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark file: its word n-grams (sorted uint64 hashes), the items read, the items
    skipped for having fewer than n words, the prompt field used, and a digest of the file's
    content with n and the field (a cache key)."""

    name: str
    path: Path
    field: str
    ngrams: np.ndarray
    items: int
    skipped: int
    digest: str


_PARQUET_SUFFIXES = (".parquet", ".pq")
_MAX_BENCHMARKS = 63  # one bit each in an int64 mask


class Benchmarks:
    """Benchmark prompts as sets of word n-gram hashes, and which of them each row quotes.

    :meth:`load` reads JSONL or Parquet files (one benchmark per file, named by its stem);
    :meth:`overlaps` gives per row a bit mask of the benchmarks (bit k: the k-th loaded) one of
    whose n-grams of normalised words the row contains.
    """

    def __init__(self, benchmarks: Sequence[Benchmark], n: int) -> None:
        if len(benchmarks) > _MAX_BENCHMARKS:
            raise ConfigError("benchmarks", f"at most {_MAX_BENCHMARKS} files, not {len(benchmarks)}")
        self.benchmarks = list(benchmarks)
        self.n = n
        hashes = np.concatenate([b.ngrams for b in benchmarks] or [np.zeros(0, _U64)])
        bits = np.repeat(np.int64(1) << np.arange(len(benchmarks), dtype=np.int64),
                         [len(b.ngrams) for b in benchmarks])
        order = np.argsort(hashes, kind="stable")
        hashes, bits = hashes[order], bits[order]
        new = np.ones(len(hashes), dtype=bool)
        new[1:] = hashes[1:] != hashes[:-1]
        self._keys = hashes[new]
        self._bits = np.bitwise_or.reduceat(bits, np.flatnonzero(new)) if len(bits) else bits

    @classmethod
    def load(cls, paths: Sequence[Path | str], field: str | None = None,
             n: int = DEFAULT_BENCHMARK_NGRAM) -> Benchmarks:
        """Read benchmark files: JSONL (one object per line) or Parquet (.parquet, .pq).

        The prompt is `field` if given, else the first of :data:`PROMPT_FIELDS` the file has
        (a list of strings is joined by newlines). DataError naming the file and line (JSONL)
        or column (Parquet) for bad JSON or a missing or non-text field. Items of fewer than
        `n` words are skipped and counted.
        """
        if n < 1:
            raise ConfigError("n", f"must be at least 1, not {n}")
        loaded: list[Benchmark] = []
        for path in map(Path, paths):
            taken = path.stem in {b.name for b in loaded}  # e.g. two test.parquet files
            name = f"{path.parent.name}/{path.stem}" if taken else path.stem
            loaded.append(_load_benchmark(path, name, field, n))
        return cls(loaded, n)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.benchmarks]

    @property
    def digest(self) -> str:
        """A digest of every file's content, in order, with n and the fields (a cache key)."""
        joined = "\n".join(b.digest for b in self.benchmarks)
        return hashlib.sha256(f"{joined}\n{self.n}".encode()).hexdigest()

    def overlaps(
        self, tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
        ends: np.ndarray | Sequence[int],
    ) -> np.ndarray:
        """Per row of word hashes (:meth:`PieceDecoder.words`, :func:`word_hashes`), the bit
        mask of the benchmarks one of whose n-grams it contains (int64, 0 for none)."""
        hashes, row = ngram_hashes(tokens, starts, ends, self.n)
        result = np.zeros(len(np.asarray(starts)), dtype=np.int64)
        if not len(self._keys) or not len(hashes):
            return result
        at = np.minimum(np.searchsorted(self._keys, hashes), len(self._keys) - 1)
        hit = self._keys[at] == hashes
        np.bitwise_or.at(result, row[hit], self._bits[at[hit]])
        return result


def _load_benchmark(path: Path, name: str, field: str | None, n: int) -> Benchmark:
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    if path.suffix.lower() in _PARQUET_SUFFIXES:
        used, prompts = _parquet_prompts(path, content, field)
    else:
        used, prompts = _jsonl_prompts(path, content, field)
    hashes, starts, ends = _hash_word_rows([normalise_words(p) for p in prompts])
    ngrams = _sorted_unique(ngram_hashes(hashes, starts, ends, n)[0])
    ngrams.flags.writeable = False
    key = hashlib.sha256(content)
    key.update(f"\n{n}\n{used}".encode())
    return Benchmark(name, path, used, ngrams, len(prompts), int(np.sum(ends - starts < n)),
                     key.hexdigest())


def _jsonl_prompts(path: Path, content: bytes, field: str | None) -> tuple[str, list[str]]:
    """(the field used, each line's prompt) of a JSONL file."""
    prompts: list[str] = []
    used = field
    for number, line in enumerate(content.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(path, f"not JSON: {exc}", line=number) from None
        if not isinstance(record, dict):
            raise DataError(path, f"not a JSON object but {type(record).__name__}", line=number)
        used = used or _detect_field(record)
        if used is None:
            raise DataError(path, f"no prompt field (none of {', '.join(PROMPT_FIELDS)}): "
                                  "name the field", line=number)
        if used not in record:
            raise DataError(path, f"no field {used!r}", line=number)
        text = _prompt_text(record[used])
        if text is None:
            raise DataError(path, f"field {used!r} is not text or a list of text", line=number)
        prompts.append(text)
    return used or field or PROMPT_FIELDS[0], prompts


def _parquet_prompts(path: Path, content: bytes, field: str | None) -> tuple[str, list[str]]:
    """(the column used, each row's prompt) of a Parquet file."""
    import pyarrow as pa  # here: the sketches load with every command, Parquet seldom
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(pa.BufferReader(content))
        columns = table.schema_arrow.names
        used = field or _detect_field(columns)
        if used is None:
            raise DataError(path, f"no prompt column (none of {', '.join(PROMPT_FIELDS)}; "
                                  f"columns: {', '.join(columns)}): name the field")
        if used not in columns:
            raise DataError(path, f"no column {used!r} (columns: {', '.join(columns)})")
        values = table.read(columns=[used]).column(0).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(path, f"not a readable Parquet file: {exc}") from None
    prompts: list[str] = []
    for row, value in enumerate(values):
        text = _prompt_text(value)
        if text is None:
            raise DataError(path, f"column {used!r}, row {row}: not text or a list of text")
        prompts.append(text)
    return used, prompts


def _detect_field(names: Iterable[str]) -> str | None:
    present = set(names)
    return next((name for name in PROMPT_FIELDS if name in present), None)


def _prompt_text(value: object) -> str | None:
    """A prompt value as text: a string, or a list of strings joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


@dataclass(frozen=True)
class Decontamination:
    """Benchmarks to look for in a run, and the decoder of its ids into words."""

    benchmarks: Benchmarks
    decoder: PieceDecoder | None

    @property
    def key(self) -> str:
        """The benchmarks' digest and the decoder's (another tokenizer reads other words)."""
        return f"{self.benchmarks.digest}:{self.decoder.digest if self.decoder else 'no-ids'}"

    @property
    def names(self) -> list[str]:
        return list(self.benchmarks.names)

    @classmethod
    def load(cls, paths: Sequence[str | os.PathLike[str]], *, field: str | None = None,
             ngram: int = DEFAULT_BENCHMARK_NGRAM, tokenizer: Any = None) -> Decontamination:
        """The benchmark files (JSONL or Parquet; DataError naming a bad file and line) and
        the tokenizer that decodes the run's ids (None: ids are not looked at)."""
        benchmarks = Benchmarks.load([Path(p) for p in paths], field, n=ngram)
        return cls(benchmarks, None if tokenizer is None else PieceDecoder(tokenizer))

    def id_overlaps(self, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per row of ids, the bit mask of the benchmarks it overlaps (0 without a decoder)."""
        if self.decoder is None or not len(starts):
            return np.zeros(len(starts), dtype=np.int64)
        words, word_starts, word_ends = self.decoder.words(ids, starts, ends)
        return self.benchmarks.overlaps(words, word_starts, word_ends)

    def text_overlaps(self, texts: Sequence[str]) -> np.ndarray:
        """Per text, the bit mask of the benchmarks it overlaps."""
        words, starts, ends = _hash_word_rows([normalise_words(text) for text in texts])
        return self.benchmarks.overlaps(words, starts, ends)

    def describe(self, mask: int) -> str:
        return ", ".join(name for bit, name in enumerate(self.names) if mask >> bit & 1)
