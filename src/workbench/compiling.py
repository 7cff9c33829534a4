"""What the compiled loops share (imported only by them, and only where numba is installed).

The ``fast`` extra installs numba; the modules of compiled loops
(:mod:`workbench.rundir._parse_loop`, :mod:`workbench.sketch._loops`) are imported on first
use by those that fall back to numpy without it.

    jit             numba.njit with numba's cache (the next process loads the machine code),
                    or without it where numba has no folder to write it in
    load_u64        the 8 bytes at an index of a uint8 array as one little-endian uint64
                    (one unaligned load, where numba's indexing reads a byte at a time)
    trailing_zeros  the count of an integer's trailing zero bits (one instruction)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numba
from llvmlite import ir
from numba import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

__all__ = ["jit", "load_u64", "trailing_zeros"]

if sys.byteorder != "little":  # load_u64's bytes in the order the loops read them
    raise ImportError("the compiled loops read bytes little-endian")


def jit(function: Callable[..., Any]) -> Any:
    """numba.njit(function) with numba's cache, or without it where it cannot write one."""
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:  # no folder numba may write its cache in: compiled in each process
        return numba.njit(nogil=True)(function)


@intrinsic
def load_u64(typingctx: Any, array: Any, index: Any) -> Any:
    """array[index:index + 8] (a uint8 array, the caller checks the bounds) as a uint64."""
    signature = types.uint64(array, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        pointer = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(pointer, align=1)

    return signature, codegen
