"""The compiled loops of :mod:`workbench.sketch.compiled` (imported only with numba)."""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.compiling import jit
from workbench.sketch import hashing, minhash, repeats
from workbench.sketch.hashing import MAX_ROW_IDS

__all__ = ["digest_loop", "figures_loop"]

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_K1, _K2 = (np.uint64(k) for k in hashing._MIX_MULTIPLIERS)
_VALUE_BITS = np.uint64(minhash._VALUE_BITS)
_VALUE_MASK = minhash._VALUE_MASK
_BIN_SHIFT = np.uint64(64 - minhash._VALUE_BITS)
_EMPTY = np.uint64(minhash._EMPTY)
_MAX_ROW = MAX_ROW_IDS
_OFFSET = hashing._MIX_OFFSET
_DIGEST_SEED = np.uint64((repeats._SEED_DIGEST + _OFFSET) % (1 << 64))
_DIGEST_END_SEED = np.uint64((repeats._SEED_DIGEST_END + _OFFSET) % (1 << 64))
_DIGEST_POSITION = repeats._DIGEST_POSITION


@jit
def _mix(z: Any) -> Any:
    """splitmix64's finaliser (:func:`workbench.sketch.hashing.mix` after its offset)."""
    z = (z ^ (z >> _S30)) * _K1
    z = (z ^ (z >> _S27)) * _K2
    return z ^ (z >> _S31)


@jit
def _digest_term(token: Any, position: int) -> Any:
    """An id's part of its row's digest (:func:`workbench.sketch.repeats.digest`)."""
    return _mix((token ^ (np.uint64(position) * _DIGEST_POSITION)) + _DIGEST_SEED)


@jit
def _digest_end(total: Any, length: int) -> Any:
    return _mix((total ^ np.uint64(length)) + _DIGEST_END_SEED)


@jit
def digest_loop(values: Any, starts: Any, ends: Any, token_seed: Any, digests: Any) -> None:
    """Each row's digest into `digests`."""
    for row in range(len(starts)):
        total = np.uint64(0)
        for p in range(starts[row], ends[row]):
            total += _digest_term(_mix(np.uint64(values[p]) + token_seed), p - starts[row])
        digests[row] = _digest_end(total, ends[row] - starts[row])


@jit
def _window_sum(mixed: Any, offset: int, n: int, base: Any) -> Any:
    """sum_j mixed[offset + j] * base**j over j < n (mod 2**64)."""
    total = np.uint64(0)
    for j in range(n - 1, -1, -1):
        total = total * base + mixed[offset + j]
    return total


@jit
def _covered(mixed: Any, offset: int, length: int, n: int, base: Any, inverse: Any, top: Any,
             marks: Any, table: Any, generation: int) -> int:
    """The ids of mixed[offset:offset + length] inside an n-gram whose hash another n-gram
    of it has. `table` is a hash table of (window sum, cell) pairs side by side; a cell holds
    `generation` (the part's: older cells are free) in its high 32 bits and the first window
    of its sum in the low ones."""
    mask = 1
    while mask < 2 * length:
        mask *= 2
    mask -= 1
    umask = np.uint64(mask)
    windows = length - n + 1
    tag = generation << 32
    total = _window_sum(mixed, offset, n, base)
    for p in range(windows):
        if p:
            total = (total - mixed[offset + p - 1]) * inverse + mixed[offset + p + n - 1] * top
        key = total  # its hash is a bijection of it: the same equalities, one mix less
        marks[p] = False
        slot = key & umask
        while True:
            cell = np.int64(table[2 * slot + 1])
            if cell >> 32 != generation:
                table[2 * slot] = key
                table[2 * slot + 1] = np.uint64(tag | p)
                break
            if table[2 * slot] == key:
                marks[p] = True
                marks[cell & 0xFFFFFFFF] = True
                break
            slot = (slot + np.uint64(1)) & umask
    covered = 0
    reach = 0
    for p in range(windows):
        if marks[p]:
            low = max(p, reach)
            reach = p + n
            covered += reach - low
    return covered


@jit
def _densify(out: Any, probes: Any) -> None:
    """Fill each empty cell of one signature as :func:`workbench.sketch.minhash._densified`."""
    num_perm = len(out)
    filled = out != _EMPTY
    count = filled.sum()
    if count == num_perm:
        return
    table = out.copy()
    if count == 1:
        out[:] = table[np.argmax(filled)]
        return
    attempts = probes.shape[1]
    for cell in range(num_perm):
        if filled[cell]:
            continue
        done = False
        for attempt in range(attempts):
            donor = probes[cell, attempt]
            if filled[donor]:
                out[cell] = table[donor]
                done = True
                break
        if not done:
            for step in range(num_perm):
                donor = (cell + step + 1) % num_perm
                if filled[donor]:
                    out[cell] = table[donor]
                    break


@jit
def figures_loop(values: Any, starts: Any, ends: Any, split: Any, digests: Any, repeat: Any,
                 table: Any, n: int, shingle: int, probes: Any, token_seed: Any, base: Any,
                 inverse: Any, top_n: Any, top_shingle: Any, seed_shingle: Any,
                 seed_short: Any) -> None:
    """Each row's digest into `digests`, its split loop share into `repeat` and its signature
    into `table` (none when `table` has no column)."""
    num_perm = table.shape[1]
    perm = np.uint64(num_perm)
    longest = 1
    for row in range(len(starts)):
        longest = max(longest, min(ends[row] - starts[row], _MAX_ROW))
    mixed = np.empty(2 * longest, dtype=np.uint64)  # a row's first ids, then its answer's
    marks = np.zeros(longest + 1, dtype=np.bool_)
    size = 1
    while size < 2 * longest:
        size *= 2
    hashes = np.zeros(2 * size, dtype=np.uint64)  # (key, generation and first window) pairs
    generation = 0
    for row in range(len(starts)):
        start, end = starts[row], ends[row]
        cut = end if split[row] < 0 else start + split[row]
        after = end if split[row] < 0 else cut + 1
        last = min(end, start + _MAX_ROW)  # the signature's ids and the reasoning's
        first_end = min(cut, last)
        second_end = min(end, after + _MAX_ROW)
        total = np.uint64(0)
        for p in range(start, last):  # the token hash, once per id
            token = _mix(np.uint64(values[p]) + token_seed)
            mixed[p - start] = token
            total += _digest_term(token, p - start)
        for p in range(last, end):  # the digest takes the whole row
            total += _digest_term(_mix(np.uint64(values[p]) + token_seed), p - start)
        digests[row] = _digest_end(total, end - start)
        second = after - start  # the answer past the first ids: hashed after them
        if second_end > last:
            second = longest
            for p in range(after, second_end):
                mixed[longest + p - after] = _mix(np.uint64(values[p]) + token_seed)
        covered = 0.0
        looked = 0
        for offset, length in ((0, first_end - start), (second, second_end - after)):
            looked += length
            if length >= 2 * n:
                generation += 1
                found = _covered(mixed, offset, length, n, base, inverse, top_n, marks, hashes,
                                 generation)
                covered += np.float64(np.float32(found / length)) * length
        repeat[row] = covered / max(looked, 1)
        if not num_perm:
            continue
        out = table[row]
        out[:] = _EMPTY
        if last - start < shingle:  # a short row is one shingle: its digest
            hashed = _mix(digests[row] + seed_short)
            out[np.int64(((hashed >> _VALUE_BITS) * perm) >> _BIN_SHIFT)] = hashed & _VALUE_MASK
        else:
            total = _window_sum(mixed, 0, shingle, base)
            for p in range(last - start - shingle + 1):
                if p:
                    total = (total - mixed[p - 1]) * inverse + mixed[p + shingle - 1] * top_shingle
                hashed = _mix(total + seed_shingle)
                cell = np.int64(((hashed >> _VALUE_BITS) * perm) >> _BIN_SHIFT)
                out[cell] = min(out[cell], hashed & _VALUE_MASK)
        _densify(out, probes)
