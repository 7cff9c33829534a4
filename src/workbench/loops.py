"""When the compiled loops run: where numba is installed (the ``fast`` extra), for work big
enough to pay for loading them.

Importing numba and loading the compiled loops from its cache takes about half a second and
130 MB (LLVM's code and state) in a process; on two cores they save about 4 ms a megabyte a
first read scans. A command that reads less than :data:`MIN_BYTES` of new bytes (a validate
after an append, a small run) runs numpy's passes, which give the same answers, unless the
loops are loaded already (a notebook that read a large run before).

    sized      a context: within it, the loops are loaded only for work of MIN_BYTES or more
    wanted     whether a module of compiled loops may be used now (loaded, or may be loaded)
    compiled   a decorator of a module's loader of its compiled loops: loaded once, None
               without numba or where they are not wanted
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MIN_BYTES", "compiled", "sized", "wanted"]

MIN_BYTES = 128 << 20  # about where loading the loops pays for itself on a first read

_state = threading.local()  # per thread: `small`, the depth of its small work's contexts


@contextlib.contextmanager
def sized(work_bytes: int) -> Iterator[None]:
    """Within (in this thread, and the processes it forks): the compiled loops not yet
    loaded are not loaded, unless `work_bytes` (the bytes the work will read) is MIN_BYTES or
    more."""
    small = int(work_bytes < MIN_BYTES)
    _state.small = getattr(_state, "small", 0) + small
    try:
        yield
    finally:
        _state.small -= small


def wanted(module: str) -> bool:
    """Whether the compiled loops of `module` (its name) may be used: loaded already, or
    outside any small work's `sized` context."""
    return not getattr(_state, "small", 0) or module in sys.modules


def compiled(module: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Decorate a loader that imports the compiled loops of `module` (its name) and returns
    what its caller runs: the decorated function returns that, imported once (numba compiles
    them on first use and keeps them in its cache, so the next process loads them), or None
    where numba is not installed or the loops are not :func:`wanted`."""
    def decorate(load: Callable[[], Any]) -> Callable[[], Any]:
        @functools.cache
        def loaded() -> Any:
            try:
                return load()
            except ImportError:
                return None

        @functools.wraps(load)
        def kernel() -> Any:
            return loaded() if wanted(module) else None

        return kernel

    return decorate
