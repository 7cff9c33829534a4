"""The write path of a records file: whole lines appended, and the repairs made before a
writer opens it.

:class:`JsonlAppender` puts whole lines (:func:`~workbench.rundir.records.encode_line`) on
disk or none. A write that fails (a full disk, an I/O error, a read-only file system) is cut
back to where it started before the error is raised as
:class:`~workbench.errors.StorageError`, so a file never holds part of a line of this
writer's, and the caller may write the same lines again.

Before any writer opens a file, a resume repairs it:

    repair_torn_tail   puts aside (``<path>.torn``) the partial last line a killed writer
                       may leave
    move_lines_aside   takes chosen lines out of the file into others, the file replaced whole
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, Self, TypeAlias

from workbench.errors import StorageError
from workbench.rundir.files import temp_path
from workbench.rundir.layout import TORN_SUFFIX
from workbench.rundir.records import StrPath, encode_line
from workbench.rundir.storage import storage_error

__all__ = ["JsonlAppender", "move_lines_aside", "repair_torn_tail"]


Writer: TypeAlias = "Callable[[int, memoryview], int]"


class JsonlAppender:
    """Appends whole JSON lines to a file; the one writer of it (the run's lock says so).

    Each ``append``/``append_many`` is one ``os.write`` of complete lines on an ``O_APPEND``
    descriptor (finished by further writes when the system writes less), so a reader never
    sees part of a line once the call returned. A write that fails raises StorageError
    after the bytes it put down are cut off again; when even that fails, the next append
    cuts them first (and raises again if it cannot). ``fsync=True`` also makes each append
    durable before returning; ``flush()`` does so on demand. ``write`` is the system call
    (``os.write``; tests pass one that fails at the Nth call).
    """

    def __init__(self, path: StrPath, *, fsync: bool = False, write: Writer = os.write) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._write_call = write
        self._cut_at: int | None = None  # where a failed write began, while not yet cut back
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise storage_error(self.path, exc) from None

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, obj: Any) -> None:
        """Append obj as one line."""
        self._write(encode_line(obj))

    def append_many(self, objs: Iterable[Any]) -> None:
        """Append every obj, one line each, in one write."""
        data = b"".join(encode_line(obj) for obj in objs)
        if data:
            self._write(data)

    def flush(self) -> None:
        """Make the appended lines durable (lines reach the OS on every append already)."""
        os.fsync(self._open_fd())

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: appender is closed")
        return self._fd

    def _write(self, data: bytes) -> None:
        """One write of whole lines; a short write (disk full, file size limit) is finished,
        or cut back and raised as StorageError."""
        fd = self._open_fd()
        if self._cut_at is not None:
            self._cut_back(fd, self._cut_at)
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += self._write_call(fd, view[written:])
            if self._fsync:
                os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError, StorageError):  # else cut by the next append
                self._cut_back(fd, os.fstat(fd).st_size - written)
            raise storage_error(self.path, exc) from None

    def _cut_back(self, fd: int, size: int) -> None:
        """Truncate the file to `size` (where a failed write began); StorageError if it cannot."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            self._cut_at = size
            raise storage_error(self.path, exc) from None
        self._cut_at = None


def repair_torn_tail(path: StrPath) -> int:
    """Move a last line without newline to ``<path>.torn``; return how many bytes moved.

    The fragment is appended to the .torn file, followed by a newline, and made durable before
    it is cut from path, so no byte is lost. Returns 0 when path is missing, empty or already
    ends with a newline. Run it before any writer opens path.
    """
    if not os.path.exists(path):
        return 0
    with open(path, "r+b") as file:
        size = file.seek(0, os.SEEK_END)
        start = _tail_start(file, size)
        if start == size:
            return 0
        file.seek(start)
        fragment = file.read()
        with open(f"{os.fspath(path)}{TORN_SUFFIX}", "ab") as torn:
            torn.write(fragment + b"\n")
            torn.flush()
            os.fsync(torn.fileno())
        file.truncate(start)
        file.flush()
        os.fsync(file.fileno())
    return len(fragment)


def _tail_start(file: BinaryIO, size: int, step: int = 1 << 16) -> int:
    """Offset just after the last newline of a file of the given size (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - step)
        file.seek(start)
        found = file.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def move_lines_aside(path: StrPath, moves: dict[int, Path]) -> int:
    """Take lines out of path (1-based number -> the file it is appended to); return how many
    moved. The files they go to are made durable first, then path is replaced whole (a temp
    file beside it, renamed over it), so every line is in one file whatever happens. Run it
    before any writer opens path."""
    if not moves:
        return 0
    source = Path(path)
    temp = temp_path(source)
    try:
        with contextlib.ExitStack() as stack:
            reader = stack.enter_context(open(source, "rb"))
            kept = stack.enter_context(open(temp, "wb"))
            aside = {to: stack.enter_context(open(to, "ab")) for to in set(moves.values())}
            for number, text in enumerate(reader, start=1):
                to = moves.get(number)
                (kept if to is None else aside[to]).write(text)
            for file in (*aside.values(), kept):
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, source)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return len(moves)
