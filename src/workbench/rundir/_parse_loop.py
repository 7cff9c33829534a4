"""The compiled id parser of :mod:`workbench.rundir.id_arrays` (imported only with numba).

An id of up to 7 digits (every id of a vocabulary) is read from one 8-byte load: its digits
found with bit tricks on the whole word, their value with three multiplications (SWAR),
where a byte at a time costs a branch the processor mispredicts at each id's end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.compiling import jit, load_u64, trailing_zeros

__all__ = ["parse_loop"]

_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_HIGH = np.uint64(0x8080808080808080)
_ZEROS = np.uint64(0x3030303030303030)  # b"0" in every byte
_OVER_NINE = np.uint64(0x4646464646464646)  # a byte above b"9" gets its high bit
_PAIRS, _PAIR_FACTOR = np.uint64(0x00FF00FF00FF00FF), np.uint64(1 + (100 << 16))
_QUADS, _QUAD_FACTOR = np.uint64(0x0000FFFF0000FFFF), np.uint64(1 + (10000 << 32))
_TEN, _SHIFT_8, _SHIFT_16, _SHIFT_32 = np.uint64(10), np.uint64(8), np.uint64(16), np.uint64(32)


@jit
def _digits(word: Any) -> int:
    """The digits (ASCII) the little-endian word starts with, 0..8."""
    low = word & _LOW7
    not_digit = ((low + _OVER_NINE) | ~((low | _HIGH) - _ZEROS) | word) & _HIGH
    return 8 if not_digit == 0 else np.int64(trailing_zeros(not_digit)) >> 3


@jit
def _value(word: Any, digits: int) -> int:
    """The number the word's first `digits` (1..7) ASCII digits write."""
    value = (word - _ZEROS) << np.uint64(8 * (8 - digits))  # "0"s before it: the same number
    value = value * _TEN + (value >> _SHIFT_8)
    value = ((value & _PAIRS) * _PAIR_FACTOR) >> _SHIFT_16
    return np.int64(((value & _QUADS) * _QUAD_FACTOR) >> _SHIFT_32)


@jit
def parse_loop(data: Any, bounds: Any, ids: Any, counts: Any) -> int:
    """Parse every span data[bounds[k, 0]:bounds[k, 1]] into ids (the count of each into
    counts): ids written, or -1 for a span :func:`workbench.rundir.id_arrays._parse_numpy`
    refuses. A blank span (spaces, tabs, carriage returns) holds none; any other span is
    ``int (, int)*`` with spaces around the commas, each int without a leading zero and of
    at most 18 digits."""
    written = 0
    size = len(data)
    for k in range(bounds.shape[0]):
        i, end = bounds[k, 0], bounds[k, 1]
        blank = True
        for j in range(i, end):
            byte = data[j]
            if byte != 32 and byte != 9 and byte != 13:
                blank = False
                break
        if blank:
            counts[k] = 0
            continue
        items = 0
        while True:
            while i < end and data[i] == 32:
                i += 1
            if i == end or data[i] < 48 or data[i] > 57:
                return -1
            digits, word = 8, np.uint64(0)
            if i + 8 <= size:
                word = load_u64(data, i)
                digits = _digits(word)
            if digits < 8 and i + digits <= end:
                if digits > 1 and data[i] == 48:
                    return -1  # a leading zero
                value = _value(word, digits)
                i += digits
            else:  # 8 digits or more, or near the end: a byte at a time
                if data[i] == 48 and i + 1 < end and 48 <= data[i + 1] <= 57:
                    return -1
                value = 0
                digits = 0
                while i < end and 48 <= data[i] <= 57:
                    value = value * 10 + (data[i] - 48)
                    digits += 1
                    i += 1
                if digits > 18:
                    return -1
            ids[written] = value
            written += 1
            items += 1
            while i < end and data[i] == 32:
                i += 1
            if i == end:
                break
            if data[i] != 44:
                return -1
            i += 1
        counts[k] = items
    return written
