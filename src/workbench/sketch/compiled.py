"""The loop share and the MinHash signature of each row in one compiled pass over its ids.

:func:`repeats_and_signatures` gives what :func:`workbench.sketch.split_repeat_share` and
:func:`workbench.sketch.signatures` give. With numba (the ``fast`` extra) it reads each row
once, about four times faster: every id is mixed once (the token hash of
:func:`workbench.sketch.hashing.windows`) and the mixed values feed both rolling window sums,
the loop share's n-grams and the signature's shingles (a rolling sum gives the sums of the
numpy passes' doubling, mod 2**64). The signatures are the numpy passes' bit for bit. The
loop share finds repeated n-grams with a hash table of their whole 64-bit sums, where the
numpy passes sort hashes shortened to 32 bits or more: the two differ only when different
n-grams of one part share those bits (about once in 2**32 pairs of them), numpy's share then
counting one n-gram more. Without numba the numpy passes run.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from workbench.sketch import hashing, minhash
from workbench.sketch.hashing import as_u64, clipped, mix
from workbench.sketch.minhash import DEFAULT_NUM_PERM, DEFAULT_SHINGLE, signatures
from workbench.sketch.repeats import DEFAULT_REPEAT_NGRAM, digest, split_repeat_share

__all__ = ["prepare", "repeats_and_signatures"]

_M64 = 1 << 64


def repeats_and_signatures(
    ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, split: np.ndarray,
    n: int = DEFAULT_REPEAT_NGRAM, shingle: int = DEFAULT_SHINGLE,
    num_perm: int = DEFAULT_NUM_PERM,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row ids[starts[i]:ends[i]]: its :func:`~workbench.sketch.split_repeat_share` at
    `split` with `n`-grams (float64), and the :func:`~workbench.sketch.signatures` of its first
    :data:`~workbench.sketch.MAX_ROW_IDS` ids ((rows, num_perm) uint64; num_perm 0: none)."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    split = np.asarray(split, dtype=np.int64)
    if n < 1 or shingle < 1 or not 0 <= num_perm <= minhash._MAX_PERM:
        raise ValueError(f"n and shingle must be >= 1 and num_perm in 0..{minhash._MAX_PERM}: "
                         f"{n}, {shingle}, {num_perm}")
    values = as_u64(ids)
    count = len(starts)
    if count and (int((ends - starts).min()) < 0 or int(starts.min()) < 0
                  or int(ends.max()) > len(values)):
        raise ValueError("row boundaries outside the token array")
    kernel = _kernel()
    if kernel is None:
        sigs = (signatures(values, starts, clipped(starts, ends), shingle=shingle,
                           num_perm=num_perm) if num_perm
                else np.zeros((count, 0), dtype=np.uint64))
        return split_repeat_share(values, starts, ends, split, n), sigs
    short = np.flatnonzero(ends - starts < shingle) if num_perm else np.zeros(0, np.int64)
    short_hash = np.zeros(count, dtype=np.uint64)
    if len(short):
        short_hash[short] = mix(digest(values, starts[short], ends[short]), minhash._SEED_SHORT)
    repeat = np.zeros(count, dtype=np.float64)
    table = np.empty((count, num_perm), dtype=np.uint64)
    probes = minhash._probes(num_perm) if num_perm else np.zeros((0, 0), dtype=np.int32)
    kernel(values, starts, ends, split, short_hash, repeat, table, n, shingle, probes,
           *_constants(n, shingle))
    return repeat, table


@functools.cache
def _constants(n: int, shingle: int) -> tuple[np.uint64, ...]:
    """The hashes' constants as uint64: the token hash's offset, the window base, its inverse
    and its powers for n and shingle, and the offset of the shingles' hash (seeded by it)."""
    base, offset = hashing._WINDOW_BASE, hashing._MIX_OFFSET
    return tuple(np.uint64(value % _M64) for value in (
        hashing._SEED_TOKEN + offset, base, pow(base, -1, _M64), pow(base, n - 1, _M64),
        pow(base, shingle - 1, _M64), shingle + offset))


@functools.cache
def _kernel() -> Any:
    """The compiled pass, or None without numba (compiled on first use and kept in numba's
    cache, so the next process loads it)."""
    try:
        from workbench.sketch._loops import figures_loop
    except ImportError:
        return None
    return figures_loop


def prepare() -> None:
    """Compile (or load) the pass now: worker processes forked after it inherit it."""
    if _kernel() is not None:
        repeats_and_signatures(np.arange(4, dtype=np.int64), np.zeros(1, dtype=np.int64),
                               np.full(1, 4, dtype=np.int64), np.full(1, -1, dtype=np.int64))
