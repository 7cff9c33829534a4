"""Whole-file writes and backups: what replaces a file never leaves half of it behind.

:func:`write_atomic` and :func:`write_lines_atomic` write a temp file beside the target
(``.<name>.<pid>.tmp``) and rename it over the target, so a reader sees the old file or the
new one; a failed write removes the temp file. A writer killed outright cannot, so each write
first removes the temp files of its target that a process no longer running left
(:func:`remove_stale_temps`; a live process's are never touched). :func:`temp_path` is the
name, for other writers of whole files (the export's sinks). :func:`set_aside` moves a file
out of the way for a run that starts over, under a name no other backup has, and never
deletes anything.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from workbench.rundir.layout import BACKUP_SUFFIX

__all__ = ["backup_path", "copy_aside", "remove_stale_temps", "same_content", "set_aside",
           "temp_path", "write_atomic", "write_lines_atomic"]

_TEMP_PID = re.compile(r"\.(\d+)\.tmp$")


def temp_path(path: Path) -> Path:
    """This process's temp file for path: ``.<name>.<pid>.tmp`` beside it."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temp files of path (``.<name>.<pid>.tmp``) whose process is gone; the ones
    removed. A live process's temp file is kept, and so is one whose pid cannot be checked
    (on Windows none is: there `os.kill` would end the process)."""
    if os.name == "nt":
        return []
    removed = []
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = _TEMP_PID.search(candidate.name)
        if match and candidate.name == f".{path.name}.{match[1]}.tmp" and _is_gone(int(match[1])):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def _is_gone(pid: int) -> bool:
    """Whether no process has this pid (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: alive, another user's
        return False
    return False


def write_atomic(path: Path, data: bytes) -> None:
    """data as the whole of path (its folder created when missing)."""
    write_lines_atomic(path, (data,))


def write_lines_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """The chunks, in order, as the whole of path (its folder created when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = temp_path(path)
    try:
        with tmp.open("wb") as file:
            for chunk in chunks:
                file.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def same_content(path: Path, chunks: Iterable[bytes]) -> bool:
    """Whether path holds exactly the chunks, in order (False when it is missing)."""
    try:
        with open(path, "rb") as file:
            for chunk in chunks:
                if file.read(len(chunk)) != chunk:
                    return False
            return file.read(1) == b""
    except FileNotFoundError:
        return False


def backup_path(path: Path, now: float | None = None) -> Path:
    """``<name>.<YYYYmmdd-HHMMSS>[-N].bak`` beside path: a name no file has (N counts up from
    2 while the name is taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = path.with_name(f"{path.name}.{stamp}{BACKUP_SUFFIX}")
    number = 2
    while target.exists():
        target = path.with_name(f"{path.name}.{stamp}-{number}{BACKUP_SUFFIX}")
        number += 1
    return target


def set_aside(path: Path, now: float | None = None) -> Path | None:
    """Move a non-empty path to its :func:`backup_path` and return that; None for a missing
    or empty file, which is left alone."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    target = backup_path(path, now)
    os.replace(path, target)
    return target


def copy_aside(path: Path, now: float | None = None) -> Path | None:
    """Copy a non-empty path to its :func:`backup_path` (made durable) and return that; None
    for a missing or empty file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    target = backup_path(path, now)
    shutil.copyfile(path, target)
    with open(target, "rb") as file:
        os.fsync(file.fileno())
    return target
