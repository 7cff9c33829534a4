"""Where each sample id's line is in a records file, and the sample ids a file holds.

Both read the workbench's own layout only (top-level ``sample_id``), in the chunks of
:mod:`workbench.rundir.reader`; lines without one, bad lines and a torn last line are left
out:

    index_lines      each sample id's first line as a :class:`LineSpan` (number, offset,
                     size), read back by :func:`span_reader`
    read_sample_ids  the sample ids of a file, and each repeat as (line, id)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple

import msgspec

from workbench.rundir.reader import (
    DEFAULT_BLOCK_BYTES,
    Chunk,
    decode_whole,
    iter_chunks,
    numbered,
    split_lines,
)
from workbench.rundir.records import SampleId, StrPath

__all__ = ["LineSpan", "index_lines", "read_sample_ids", "span_reader"]


class _IdLine(msgspec.Struct, gc=False):
    sample_id: SampleId | None = None


_IDS = msgspec.json.Decoder(_IdLine)


class LineSpan(NamedTuple):
    """Where one line is in its file: 1-based number, byte offset and length (newline
    included)."""

    line: int
    offset: int
    size: int


def index_lines(path: StrPath) -> dict[SampleId, LineSpan]:
    """Where the first line of each ``sample_id`` of path is (the workbench's own layout:
    top-level ``sample_id``); lines without one, bad lines and a torn last line are left
    out. Raises OSError when path cannot be read."""
    found: dict[SampleId, LineSpan] = {}
    line = 1
    for chunk in iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        ids, lines = _chunk_ids(chunk, line)
        at = dict(ids)
        offset = chunk.offset
        for number, text in enumerate(split_lines(chunk), start=line):
            sample_id = at.get(number)
            if sample_id is not None and sample_id not in found:
                found[sample_id] = LineSpan(number, offset, len(text) + 1)
            offset += len(text) + 1
        line += lines
    return found


@contextlib.contextmanager
def span_reader(path: StrPath) -> Iterator[Callable[[LineSpan], bytes]]:
    """A function giving the bytes of a line of path (see :func:`index_lines`), the file
    held open meanwhile."""
    with open(path, "rb") as file:
        fd = file.fileno()
        yield lambda span: os.pread(fd, span.size, span.offset)


def read_sample_ids(path: StrPath) -> tuple[set[SampleId], list[tuple[int, SampleId]]]:
    """The ``sample_id`` values of path, and each repeat as (line, id).

    Only top-level ``sample_id`` is read (the workbench's own layout); lines without one, bad
    lines and a torn last line are skipped. Raises OSError when path cannot be read.
    """
    seen: set[SampleId] = set()
    repeats: list[tuple[int, SampleId]] = []
    line = 1
    for chunk in iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        found, lines = _chunk_ids(chunk, line)
        for at, sample_id in found:
            if sample_id is None:
                continue
            if sample_id in seen:
                repeats.append((at, sample_id))
            else:
                seen.add(sample_id)
        line += lines
    return seen, repeats


def _chunk_ids(chunk: Chunk, first_line: int) -> tuple[list[tuple[int, SampleId | None]], int]:
    """(line, sample_id or None) for each non-blank line, and the chunk's line count."""
    items = decode_whole(_IDS, chunk)
    if items is not None:
        return [(first_line + i, item.sample_id) for i, item in enumerate(items)], len(items)
    texts = split_lines(chunk)
    return [(at, _sample_id_of(text)) for at, text in numbered(texts, first_line)], len(texts)


def _sample_id_of(text: bytes) -> SampleId | None:
    try:
        return _IDS.decode(text).sample_id
    except (msgspec.DecodeError, RecursionError):
        return None
