"""Whole-file writes and backups: what replaces a file never leaves half of it behind.

:func:`write_atomic` and :func:`write_lines_atomic` write a temp file beside the target
(``.<name>.<pid>.tmp``) and rename it over the target, so a reader sees the old file or the
new one; a failed write removes the temp file. :func:`set_aside` moves a file out of the way
for a run that starts over, under a name no other backup has, and never deletes anything.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from workbench.rundir.layout import BACKUP_SUFFIX

__all__ = ["set_aside", "write_atomic", "write_lines_atomic"]


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """data as the whole of path (its folder created when missing)."""
    write_lines_atomic(path, (data,))


def write_lines_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """The chunks, in order, as the whole of path (its folder created when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_path(path)
    try:
        with tmp.open("wb") as file:
            for chunk in chunks:
                file.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def set_aside(path: Path, now: float | None = None) -> Path | None:
    """Move a non-empty path to ``<name>.<YYYYmmdd-HHMMSS>[-N].bak`` beside it (N counting
    up from 2 while that name is taken) and return the new path; None for a missing or
    empty file, which is left alone."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = path.with_name(f"{path.name}.{stamp}{BACKUP_SUFFIX}")
    number = 2
    while target.exists():
        target = path.with_name(f"{path.name}.{stamp}-{number}{BACKUP_SUFFIX}")
        number += 1
    os.replace(path, target)
    return target
