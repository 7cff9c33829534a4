"""A row's digest, loop share and MinHash signature in one compiled pass over its ids.

:func:`row_figures` gives what :func:`workbench.sketch.repeats.digest`,
:func:`workbench.sketch.split_repeat_share` and :func:`workbench.sketch.signatures` give, and
:func:`digest` what the first gives. With numba (the ``fast`` extra) they read each row once,
several times faster: every id is mixed once (the token hash of
:func:`workbench.sketch.hashing.windows`) and the mixed values feed the digest's sum and both
rolling window sums, the loop share's n-grams and the signature's shingles (a rolling sum gives
the sums of the numpy passes' doubling, mod 2**64). The digests and signatures are the numpy
passes' bit for bit. The loop share finds repeated n-grams with a hash table of their whole
64-bit sums, where the numpy passes sort hashes shortened to 32 bits or more: the two differ
only when different n-grams of one part share those bits (about once in 2**32 pairs of them),
numpy's share then counting one n-gram more. Without numba the numpy passes run.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from workbench import loops
from workbench.sketch import hashing, minhash, repeats
from workbench.sketch.hashing import bounded, clipped
from workbench.sketch.minhash import DEFAULT_NUM_PERM, DEFAULT_SHINGLE, signatures
from workbench.sketch.repeats import DEFAULT_REPEAT_NGRAM, split_repeat_share

__all__ = ["RowFigures", "digest", "prepare", "row_figures"]

_M64 = 1 << 64


class RowFigures(NamedTuple):
    """Per row: digest (uint64), loop share (float64), signature ((rows, num_perm) uint64)."""

    digest: np.ndarray
    repeat: np.ndarray
    signature: np.ndarray


def row_figures(
    ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, split: np.ndarray,
    n: int = DEFAULT_REPEAT_NGRAM, shingle: int = DEFAULT_SHINGLE,
    num_perm: int = DEFAULT_NUM_PERM,
) -> RowFigures:
    """Per row ids[starts[i]:ends[i]]: its :func:`digest`, its
    :func:`~workbench.sketch.split_repeat_share` at `split` with `n`-grams, and the
    :func:`~workbench.sketch.signatures` of its first :data:`~workbench.sketch.MAX_ROW_IDS`
    ids (num_perm 0: none, a (rows, 0) array)."""
    split = np.asarray(split, dtype=np.int64)
    if n < 1 or shingle < 1 or not 0 <= num_perm <= minhash._MAX_PERM:
        raise ValueError(f"n and shingle must be >= 1 and num_perm in 0..{minhash._MAX_PERM}: "
                         f"{n}, {shingle}, {num_perm}")
    values, starts, ends = bounded(ids, starts, ends)
    count = len(starts)
    kernel = _kernel()
    if kernel is None:
        sigs = (signatures(values, starts, clipped(starts, ends), shingle=shingle,
                           num_perm=num_perm) if num_perm
                else np.zeros((count, 0), dtype=np.uint64))
        return RowFigures(repeats.digest(values, starts, ends),
                          split_repeat_share(values, starts, ends, split, n), sigs)
    found = RowFigures(np.empty(count, dtype=np.uint64), np.zeros(count, dtype=np.float64),
                       np.empty((count, num_perm), dtype=np.uint64))
    probes = minhash._probes(num_perm) if num_perm else np.zeros((0, 0), dtype=np.int32)
    kernel.figures_loop(values, starts, ends, split, *found, n, shingle, probes,
                        *_constants(n, shingle))
    return found


def digest(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """:func:`workbench.sketch.repeats.digest`, compiled where numba is installed."""
    kernel = _kernel()
    if kernel is None:
        return repeats.digest(ids, starts, ends)
    values, starts, ends = bounded(ids, starts, ends)
    out = np.empty(len(starts), dtype=np.uint64)
    kernel.digest_loop(values, starts, ends, _constants(1, 1)[0], out)
    return out


@functools.cache
def _constants(n: int, shingle: int) -> tuple[np.uint64, ...]:
    """The hashes' constants as uint64: the token hash's offset, the window base, its inverse
    and its powers for n and shingle, and the offsets of the shingles' hash and of a short
    row's (each seeded by its own)."""
    base, offset = hashing._WINDOW_BASE, hashing._MIX_OFFSET
    return tuple(np.uint64(value % _M64) for value in (
        hashing._SEED_TOKEN + offset, base, pow(base, -1, _M64), pow(base, n - 1, _M64),
        pow(base, shingle - 1, _M64), shingle + offset, minhash._SEED_SHORT + offset))


@loops.compiled("workbench.sketch._loops")
def _kernel() -> Any:
    """The compiled loops' module (:mod:`workbench.sketch._loops`), or None."""
    from workbench.sketch import _loops

    return _loops


def prepare() -> None:
    """Compile (or load) the loops now: worker processes forked after it inherit them."""
    if _kernel() is not None:
        row_figures(np.arange(4, dtype=np.int64), np.zeros(1, dtype=np.int64),
                    np.full(1, 4, dtype=np.int64), np.full(1, -1, dtype=np.int64))
        digest(np.arange(4, dtype=np.int64), np.zeros(1, dtype=np.int64),
               np.full(1, 4, dtype=np.int64))
