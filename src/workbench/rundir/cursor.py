"""Files read from a remembered offset: what changed since the last read, and reading on.

A :class:`Cursor` remembers, for one file, the byte offset a reader reached (always a line
start) and how to tell that the file changed: a file that shrank, was replaced (another
inode) or whose last bytes before the offset changed is read again from the start (an
in-place rewrite that keeps those bytes goes unnoticed, and so does a replacement that keeps
them and lands on an inode the file had before; writers only append). The stats
collector keeps one per file of a run, so a refresh reads only what was appended.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TypeVar

from workbench.errors import DataError

__all__ = ["Change", "Cursor", "guarded", "line_chunks", "text_lines"]

Change = Literal["same", "grown", "reset", "gone"]
T = TypeVar("T")
_TAIL_BYTES = 256
_LINE_BLOCK = 8 << 20


class Cursor:
    """Where the last read of one file stopped, and how to tell that the file changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ident: tuple[int, int] | None = None
        self.stamp: tuple[int, int] | None = None
        self.offset = 0
        self.line = 1
        self.tail = b""
        self.mtime: float | None = None

    def poll(self) -> Change:
        """What changed: same, grown (read from offset), reset (read from 0), gone (forget)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            known = self.ident is not None
            self._forget()
            return "gone" if known else "same"
        ident, stamp = (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns)
        self.mtime = st.st_mtime
        if ident == self.ident and stamp == self.stamp:
            return "same"
        replaced = self.ident is not None and (
            ident != self.ident or st.st_size < self.offset or not self._tail_matches()
        )
        if replaced:
            self._forget()
            self.mtime = st.st_mtime
        self.ident, self.stamp = ident, stamp
        return "reset" if replaced else "grown"

    def advance(self, offset: int, line: int) -> None:
        """Remember that whole lines up to offset were read (line numbers the next one)."""
        if offset != self.offset:
            self.offset, self.line = offset, line
            self.tail = self._read_tail()

    def _forget(self) -> None:
        self.ident = self.stamp = self.mtime = None
        self.offset, self.line, self.tail = 0, 1, b""

    def _read_tail(self) -> bytes:
        start = max(0, self.offset - _TAIL_BYTES)
        try:
            with open(self.path, "rb") as file:
                file.seek(start)
                return file.read(self.offset - start)
        except OSError:
            return b""

    def _tail_matches(self) -> bool:
        return self.offset == 0 or self._read_tail() == self.tail


def line_chunks(path: Path, offset: int) -> Iterator[tuple[bytes, int]]:
    """(whole lines, offset after them) from offset up to the file's last newline."""
    with open(path, "rb") as file:
        file.seek(offset)
        carry = b""
        while data := file.read(_LINE_BLOCK):
            data = carry + data
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                offset += cut
                yield data[:cut], offset


def text_lines(data: bytes) -> Iterator[bytes]:
    """The non-blank lines of whole-line bytes."""
    return (line for line in data.split(b"\n") if line.strip())


def guarded(path: Path, items: Iterator[T]) -> Iterator[T]:
    """items, or nothing more once the file vanished; other read failures name the file."""
    try:
        yield from items
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
