"""Where each sample id's line is in a records file, and the sample ids a file holds.

Every reader here reads the workbench's own layout only (top-level ``sample_id`` and
``turn``), in the chunks of :mod:`workbench.rundir.reader`; lines without a sample id, bad
lines and a torn last line are left out:

    index_lines      each sample id's first line as a :class:`LineSpan` (number, offset,
                     size), read back by :func:`span_reader`
    index_keys       the same by :data:`Key`: each (sample_id, turn)'s first line
    read_sample_ids  the sample ids of a file, and each repeat as (line, id)
    read_keys        the keys of a file, and each repeat as (line, key)

A :data:`Key` is what is unique in a dataset: ``(sample_id, turn)``, turn None outside a
conversation regenerated turn by turn (``turns: each``), whose turns share their sample id
(:attr:`workbench.rundir.records.Row.key`). :func:`key_text` names one in a finding.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeAlias

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

__all__ = ["Key", "LineSpan", "index_keys", "index_lines", "key_text", "read_keys",
           "read_sample_ids", "span_reader"]

Key: TypeAlias = tuple[SampleId, int | None]


def key_text(sample_id: SampleId | None, turn: int | None = None) -> str:
    """How a finding names a record or prompt: ``sample_id 7``, or ``sample_id 7 turn 2``."""
    return f"sample_id {sample_id!r}" if turn is None else f"sample_id {sample_id!r} turn {turn}"


class _IdLine(msgspec.Struct, gc=False):
    sample_id: SampleId | None = None
    turn: int | None = None


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
    for (sample_id, _), span in _spans(path):
        found.setdefault(sample_id, span)
    return found


def index_keys(path: StrPath) -> dict[Key, LineSpan]:
    """Where the first line of each :data:`Key` of path is (as :func:`index_lines`, by
    ``(sample_id, turn)``). Raises OSError when path cannot be read."""
    found: dict[Key, LineSpan] = {}
    for key, span in _spans(path):
        found.setdefault(key, span)
    return found


def _spans(path: StrPath) -> Iterator[tuple[Key, LineSpan]]:
    """The key and span of each line of path holding a sample id, in file order."""
    line = 1
    for chunk in iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        keys, lines = _chunk_ids(chunk, line)
        at = dict(keys)
        offset = chunk.offset
        for number, text in enumerate(split_lines(chunk), start=line):
            key = at.get(number)
            if key is not None:
                yield key, LineSpan(number, offset, len(text) + 1)
            offset += len(text) + 1
        line += lines


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
    for at, (sample_id, _) in _keys(path):
        if sample_id in seen:
            repeats.append((at, sample_id))
        else:
            seen.add(sample_id)
    return seen, repeats


def read_keys(path: StrPath) -> tuple[set[Key], list[tuple[int, Key]]]:
    """The :data:`Key` values of path, and each repeat as (line, key): two turns of one
    conversation are two keys, the same (sample_id, turn) twice a repeat (lines read as
    :func:`read_sample_ids` reads them). Raises OSError when path cannot be read."""
    seen: set[Key] = set()
    repeats: list[tuple[int, Key]] = []
    for at, key in _keys(path):
        if key in seen:
            repeats.append((at, key))
        else:
            seen.add(key)
    return seen, repeats


def _keys(path: StrPath) -> Iterator[tuple[int, Key]]:
    """(line, key) of each line of path holding a sample id, in file order."""
    line = 1
    for chunk in iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        found, lines = _chunk_ids(chunk, line)
        for at, key in found:
            if key is not None:
                yield at, key
        line += lines


def _chunk_ids(chunk: Chunk, first_line: int) -> tuple[list[tuple[int, Key | None]], int]:
    """(line, key or None) for each non-blank line, and the chunk's line count."""
    items = decode_whole(_IDS, chunk)
    if items is not None:
        return [(first_line + i, _key(item)) for i, item in enumerate(items)], len(items)
    texts = split_lines(chunk)
    return [(at, _key_of(text)) for at, text in numbered(texts, first_line)], len(texts)


def _key(item: _IdLine) -> Key | None:
    return None if item.sample_id is None else (item.sample_id, item.turn)


def _key_of(text: bytes) -> Key | None:
    try:
        return _key(_IDS.decode(text))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
