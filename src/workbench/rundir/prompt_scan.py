"""One read of a dataset's prompts.jsonl, shared by validation, stats and the subset comparison.

prompts.jsonl (the prompts as sent, written once before the replies) is big on real jobs.
Validation needs each prompt's first line and the file's problems, the stats its line and
id counts, the subset comparison each prompt's length. A prompt is a :data:`Key`,
``(sample_id, turn)``: a conversation regenerated turn by turn (``turns: each``) sends one
prompt per turn under one sample id, each line with its turn. :func:`summary` reads the file once, in
blocks (:func:`workbench.rundir.prompt_reader.iter_prompt_blocks`), into a :class:`PromptScan`
holding all of it, and keeps it beside the file (an appended cache,
:mod:`workbench.rundir.cache`): whichever reader comes first reads the file, the others load the summary, and a file that grew (a resume
adds prompts) is read only after what was kept. A file holding an id past 64 bits (msgpack's
range) cannot be kept and is read each time.

    ids, turns,       each distinct (sample id, turn) (read as a Row's; turn None without
    first_lines       one) and the line it first appears on, in that order
    lengths           per key, the prompt length of that first line: the ids its input_ids
                      array holds, else its text's characters / TEXT_CHARS_PER_TOKEN rounded
                      (at least 1); None when the line has neither
    problems          (line, kind, detail), block by block: the line problems of
                      :mod:`workbench.rundir.records` (malformed, not_object, bad_type, torn), then
                      each row without a sample id ("no_id") or with a (sample id, turn)
                      seen before ("duplicate_id"); all of them, so any number of examples can be shown
    lines             non-blank whole lines (a torn last line is not one); ``tokenized``
                      those with an input_ids array, ``tokens`` the ids in them
    end_offset        the byte offset after the last whole line read
    next_line         the number of the line at end_offset
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from workbench.rundir.cache import AppendedCache, cache_key, file_stamp
from workbench.rundir.line_index import Key, key_text
from workbench.rundir.prompt_reader import iter_prompt_blocks
from workbench.rundir.records import PromptBlock, PromptRow, SampleId

__all__ = ["TEXT_CHARS_PER_TOKEN", "PromptScan", "scan", "summary"]

TEXT_CHARS_PER_TOKEN = 4.0
_VERSION = 2  # 2: keyed by (sample_id, turn), the turns kept
_KEY = cache_key("prompts", _VERSION, TEXT_CHARS_PER_TOKEN, "appended")
_NOT_ROWS = frozenset({"malformed", "not_object"})  # the problems of non-blank lines without a row


class PromptScan(msgspec.Struct):
    """What one read of prompts.jsonl found (fields in the module docstring)."""

    ids: list[SampleId] = msgspec.field(default_factory=list)
    turns: list[int | None] = msgspec.field(default_factory=list)
    first_lines: list[int] = msgspec.field(default_factory=list)
    lengths: list[int | None] = msgspec.field(default_factory=list)
    problems: list[tuple[int, str, str]] = msgspec.field(default_factory=list)
    lines: int = 0
    tokenized: int = 0
    tokens: int = 0
    end_offset: int = 0
    next_line: int = 1

    def keys(self) -> list[Key]:
        """Each distinct (sample id, turn), in the order first seen."""
        return list(zip(self.ids, self.turns, strict=True))

    def first_line_of(self) -> dict[Key, int]:
        """(sample id, turn) -> the line it first appears on."""
        return dict(zip(self.keys(), self.first_lines, strict=True))

    def length_of(self) -> dict[Key, int]:
        """(sample id, turn) -> prompt length, for the keys whose first line has one."""
        return {key: n for key, n in zip(self.keys(), self.lengths, strict=True)
                if n is not None}


_CACHE: AppendedCache[PromptScan] = AppendedCache("prompts", PromptScan)


def summary(path: str | os.PathLike[str], *, cache: bool = True) -> PromptScan:
    """The scan of the whole of path: what was kept beside it (with `cache`) and the lines
    appended since, else all of it read (and kept). Raises OSError when path cannot be read."""
    path = Path(path)
    kept = _CACHE.load(path, _KEY) if cache else None
    stamp = file_stamp(path)  # before the read: what a kept summary was read from
    if kept is not None and stamp is not None and stamp[2] == kept[1]:
        return kept[0]  # unchanged, no torn last line
    reader = _Reader(_without_torn(kept[0]) if kept is not None else PromptScan())
    start = reader.found.end_offset
    for block in iter_prompt_blocks(path, offset=start, first_line=reader.found.next_line):
        reader.add(block)
    if cache and (kept is None or reader.found.end_offset > start):
        _CACHE.save(path, _KEY, reader.found, reader.found.end_offset, stamp)
    return reader.found


def scan(path: str | os.PathLike[str], *, offset: int = 0) -> PromptScan:
    """One read of path from byte offset (a line start, numbered line 1), never cached.
    Raises OSError when path cannot be read."""
    reader = _Reader(PromptScan(end_offset=offset))
    for block in iter_prompt_blocks(path, offset=offset):
        reader.add(block)
    return reader.found


def _without_torn(found: PromptScan) -> PromptScan:
    """A kept scan without its torn last line's problem: that line is read again."""
    found.problems = [p for p in found.problems if p[1] != "torn"]
    return found


class _Reader:
    """The blocks of one read, gathered into a PromptScan (one kept before, or a new one)."""

    def __init__(self, found: PromptScan) -> None:
        self.found = found
        self.first: dict[Key, int] = found.first_line_of()

    def add(self, block: PromptBlock) -> None:
        found = self.found
        found.problems.extend((p.line, p.kind, p.detail) for p in block.problems)
        found.lines += len(block.rows) + sum(p.kind in _NOT_ROWS for p in block.problems)
        counts = [row.input_ids for row in block.rows if row.input_ids is not None]
        found.tokenized += len(counts)
        found.tokens += sum(counts)
        if not self._add_new_ids(block.rows):
            for row in block.rows:
                self._add_id(row)
        found.end_offset = block.end_offset
        found.next_line = block.first_line + block.lines

    def _add_new_ids(self, rows: list[PromptRow]) -> bool:
        """Add the rows at once when each has a sample id not seen before (the usual case);
        False (nothing added) otherwise."""
        keys = [(row.sample_id, row.turn) for row in rows if row.sample_id is not None]
        if len(set(keys)) != len(rows) or not self.first.keys().isdisjoint(keys):
            return False
        lines = [row.line for row in rows]
        self.first.update(zip(keys, lines))
        self.found.ids.extend(row.sample_id for row in rows if row.sample_id is not None)
        self.found.turns.extend(row.turn for row in rows)
        self.found.first_lines.extend(lines)
        self.found.lengths.extend(map(_length, rows))
        return True

    def _add_id(self, row: PromptRow) -> None:
        """The row's (sample id, turn): a first one, a repeat, or none."""
        found, sample_id = self.found, row.sample_id
        key = (sample_id, row.turn)
        seen = self.first.setdefault(key, row.line) if sample_id is not None else None
        if sample_id is None:
            found.problems.append((row.line, "no_id", "cannot read sample_id"))
        elif seen != row.line:
            found.problems.append((row.line, "duplicate_id",
                                   f"{key_text(sample_id, row.turn)} also at line {seen}"))
        else:
            found.ids.append(sample_id)
            found.turns.append(row.turn)
            found.first_lines.append(row.line)
            found.lengths.append(_length(row))


def _length(row: PromptRow) -> int | None:
    """The prompt's ids, else its text's estimated tokens, else None."""
    if row.input_ids is not None:
        return row.input_ids
    if row.text_chars is None:
        return None
    return max(1, round(row.text_chars / TEXT_CHARS_PER_TOKEN))
