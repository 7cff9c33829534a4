"""Near duplicates: MinHash signatures of rows' shingle sets, LSH bands, verified pairs.

    signatures       per row: a MinHash signature over shingles (one-permutation hashing,
                     optimal densification)
    lsh_bands        (bands, rows per band) at a threshold: datasketch's choice
    near_duplicates  per row: the first earlier row of estimated Jaccard >= threshold, or -1

Rows come as in :mod:`workbench.sketch.hashing`: a flat array with row starts and ends, of
token ids or uint64 word hashes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from workbench.sketch.hashing import CHUNK_IDS, Rows, as_rows, chunks, mix, sorted_unique, windows
from workbench.sketch.repeats import digest

__all__ = [
    "DEFAULT_NUM_PERM",
    "DEFAULT_SHINGLE",
    "DEFAULT_THRESHOLD",
    "lsh_bands",
    "near_duplicates",
    "signatures",
]

DEFAULT_SHINGLE = 3  # ids per shingle: 5-10% of ids changed still leaves Jaccard 0.55-0.75
DEFAULT_NUM_PERM = 128  # signature entries: the estimate's spread is about 0.045 at 0.5
DEFAULT_THRESHOLD = 0.5  # estimated Jaccard of a near duplicate (bench/dedup.py tunes the three)

_U64 = np.uint64
_EMPTY = np.iinfo(np.uint64).max  # a signature cell no shingle fell in
_VALUE_BITS = 40  # the low bits of a shingle hash are its MinHash value, the high ones its bin
_VALUE_MASK = _U64((1 << _VALUE_BITS) - 1)
_PAIR_CHUNK = 1 << 18  # candidate pairs verified this many at a time
_MAX_PERM = 4096  # signature entries at most

# Seeds of the hash functions of this module (fixed: equal across processes).
_SEED_SHORT = 0xA4093822299F31D0
_SEED_BAND = 0x082EFA98EC4E6C89
_SEED_PROBE = 0x452821E638D01377


# --- MinHash signatures -----------------------------------------------------------------------


def signatures(
    tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
    ends: np.ndarray | Sequence[int], shingle: int = DEFAULT_SHINGLE,
    num_perm: int = DEFAULT_NUM_PERM, exclude: np.ndarray | None = None,
) -> np.ndarray:
    """MinHash signatures of the rows' shingle sets, shape (rows, num_perm), uint64.

    One-permutation hashing: each shingle (`shingle` consecutive tokens) is hashed once to 64
    bits; the high bits pick one of num_perm bins and the low 40 bits are its value, kept as the
    least per (row, bin). Bins no shingle fell in are filled by optimal densification (each
    probes a fixed sequence of other bins and copies the first filled one), so rows with few
    shingles still compare. The share of equal entries of two rows estimates the Jaccard
    similarity of their shingle sets. A row shorter than `shingle` is one shingle of its own
    (two equal short rows match). `tokens` are token ids or uint64 word hashes.

    `exclude` (sorted uint64 shingle hashes, :func:`workbench.sketch.template_shingles`): the
    shingles left out of every row, a dataset's template, so rows compare on what varies; a
    row holding nothing else keeps all of its shingles.
    """
    if shingle < 1 or not 1 <= num_perm <= _MAX_PERM:
        raise ValueError(f"shingle must be >= 1 and num_perm in 1..{_MAX_PERM}: {shingle}, {num_perm}")
    rows = as_rows(tokens, starts, ends)
    out = np.empty((len(rows), num_perm), dtype=_U64)
    for first, last in chunks(rows, CHUNK_IDS, num_perm):
        out[first:last] = _signature_part(rows.part(first, last), shingle, num_perm, exclude)
    return out


def _signature_part(rows: Rows, shingle: int, num_perm: int,
                    exclude: np.ndarray | None) -> np.ndarray:
    hashes, _, row = windows(rows, shingle)
    if exclude is not None and len(exclude) and len(hashes):
        hashes, row = _without(hashes, row, exclude, len(rows))
    short = np.flatnonzero(rows.lengths < shingle)
    if len(short):
        whole = mix(digest(rows.values, rows.offsets[short], rows.offsets[short + 1]),
                     _SEED_SHORT)
        hashes, row = np.concatenate([hashes, whole]), np.concatenate([row, short])
    bins = ((hashes >> _U64(_VALUE_BITS)) * _U64(num_perm)) >> _U64(64 - _VALUE_BITS)
    cells = row * num_perm + bins.astype(np.int64)
    table = np.full(len(rows) * num_perm, _EMPTY, dtype=_U64)
    np.minimum.at(table, cells, hashes & _VALUE_MASK)
    return _densified(table.reshape(len(rows), num_perm))


def _without(hashes: np.ndarray, row: np.ndarray, exclude: np.ndarray,
             count: int) -> tuple[np.ndarray, np.ndarray]:
    """The shingles (hash, row) not in `exclude` (sorted), but all of a row's shingles when
    every one of them is."""
    at = np.minimum(np.searchsorted(exclude, hashes), len(exclude) - 1)
    inside = exclude[at] == hashes
    left = np.bincount(row[~inside], minlength=count)
    drop = inside & (left[row] > 0)
    return hashes[~drop], row[~drop]


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
    probes = ((mix(cells, _SEED_PROBE) >> _U64(32)) * _U64(num_perm)) >> _U64(32)
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


@functools.cache
def _multipliers(count: int, seed: int) -> np.ndarray:
    """`count` odd 64-bit multipliers, a fixed function of seed (one per n-gram position)."""
    values = mix(np.arange(1, count + 1, dtype=_U64), seed) | _U64(1)
    values.flags.writeable = False
    return values


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
        hashed = mix(hashed ^ _U64(band), _SEED_BAND)
        keys = np.sort(((hashed >> row_bits) << row_bits) | rows)
        found.append(_bucket_pairs(keys, row_bits, count))
    pairs = sorted_unique(np.concatenate(found))
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
