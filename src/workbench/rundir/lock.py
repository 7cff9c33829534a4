"""The writer's lock on a run directory: who is generating into it right now.

`workbench generate` holds an exclusive advisory lock (``flock``) on ``OUT/.writer.lock``
for as long as it writes; the kernel drops it when the process ends, however it ends
(Ctrl-C, SIGKILL, a crash). So a second generate into the same folder is refused, and the
monitor tells a run in progress from one whose writer is gone without guessing from file
times. Where ``fcntl`` is missing (Windows) nothing is locked and the writer is unknown.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from workbench.errors import InputError
from workbench.rundir.layout import LOCK_FILE, SCORE_LOCK_FILE
from workbench.rundir.storage import storage_error

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["hold_run_lock", "hold_score_lock", "writer_alive"]


def _try_lock(handle: IO[str], mode: int) -> bool:
    assert fcntl is not None
    try:
        fcntl.flock(handle.fileno(), mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def hold_run_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the writer's lock on out (which must exist) for the block; InputError naming the
    other writer's pid when it is held already."""
    with _holding(Path(out), LOCK_FILE, "generate", "is writing this run"):
        yield


@contextlib.contextmanager
def hold_score_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the scorer's lock on out for the block (a second `workbench score` of the run
    would append the same scores twice); InputError naming the other one's pid."""
    with _holding(Path(out), SCORE_LOCK_FILE, "score", "is scoring this run"):
        yield


@contextlib.contextmanager
def _holding(out: Path, name: str, verb: str, doing: str) -> Iterator[None]:
    path = out / name
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with _open_lock(path) as handle:
        if not _try_lock(handle, fcntl.LOCK_EX):
            handle.seek(0)
            pid = handle.read().strip() or "?"
            raise InputError(f"{out}: another workbench {verb} (pid {pid}) {doing}")
        _write_pid(handle, path)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _open_lock(path: Path) -> IO[str]:
    try:
        return open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise storage_error(path, exc) from None


def _write_pid(handle: IO[str], path: Path) -> None:
    """This process's pid in the lock file, for the message of a refused second writer."""
    try:  # unbuffered: nothing is left for close() to fail on
        os.ftruncate(handle.fileno(), 0)
        os.write(handle.fileno(), f"{os.getpid()}\n".encode())
    except OSError as exc:
        raise storage_error(path, exc) from None


def writer_alive(out: str | os.PathLike[str]) -> bool | None:
    """True while a generate holds out's lock, False once it is gone, None when unknown (no
    lock file: a run written before the lock existed, or no fcntl)."""
    path = Path(out) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            if not _try_lock(handle, fcntl.LOCK_SH):
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return False
    except OSError:
        return None
