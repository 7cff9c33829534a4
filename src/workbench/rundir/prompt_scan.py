"""One read of a dataset's prompts.jsonl, shared by validation, stats and the subset comparison.

prompts.jsonl (the prompts as sent, written once before the replies) is big on real jobs.
Validation needs each sample id's first line and the file's problems, the stats its line and
id counts, the subset comparison each prompt's length. :func:`summary` reads the file once, in
blocks (:func:`workbench.rundir.records.iter_prompt_blocks`), into a :class:`PromptScan` holding all
of it, and keeps it beside the file (:func:`workbench.rundir.cache.save_summary`) while the file's
stamp is unchanged: whichever reader comes first reads the file, the others load the summary.
A file holding an id past 64 bits (msgpack's range) cannot be kept and is read each time.

    ids, first_lines  each distinct sample id (read as a Row's) and the line it first
                      appears on, in that order
    lengths           per id, the prompt length of that first line: the ids its input_ids
                      array holds, else its text's characters / TEXT_CHARS_PER_TOKEN rounded
                      (at least 1); None when the line has neither
    problems          (line, kind, detail), block by block: the line problems of
                      :mod:`workbench.rundir.records` (malformed, not_object, bad_type, torn), then
                      each row without a sample id ("no_id") or with one seen before
                      ("duplicate_id"); all of them, so any number of examples can be shown
    lines             non-blank whole lines (a torn last line is not one); ``tokenized``
                      those with an input_ids array, ``tokens`` the ids in them
    end_offset        the byte offset after the last whole line read
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from workbench.rundir.cache import cache_key, file_stamp, load_summary, save_summary
from workbench.rundir.records import PromptBlock, PromptRow, SampleId, iter_prompt_blocks

__all__ = ["TEXT_CHARS_PER_TOKEN", "PromptScan", "scan", "summary"]

TEXT_CHARS_PER_TOKEN = 4.0
_KIND = "prompts"
_KEY = cache_key(_KIND, TEXT_CHARS_PER_TOKEN)
_NOT_ROWS = frozenset({"malformed", "not_object"})  # the problems of non-blank lines without a row


class PromptScan(msgspec.Struct):
    """What one read of prompts.jsonl found (fields in the module docstring)."""

    ids: list[SampleId] = msgspec.field(default_factory=list)
    first_lines: list[int] = msgspec.field(default_factory=list)
    lengths: list[int | None] = msgspec.field(default_factory=list)
    problems: list[tuple[int, str, str]] = msgspec.field(default_factory=list)
    lines: int = 0
    tokenized: int = 0
    tokens: int = 0
    end_offset: int = 0

    def first_line_of(self) -> dict[SampleId, int]:
        """sample id -> the line it first appears on."""
        return dict(zip(self.ids, self.first_lines, strict=True))

    def length_of(self) -> dict[SampleId, int]:
        """sample id -> prompt length, for the ids whose first line has one."""
        return {sid: n for sid, n in zip(self.ids, self.lengths, strict=True) if n is not None}


def summary(path: str | os.PathLike[str], *, cache: bool = True) -> PromptScan:
    """The scan of the whole of path: kept beside it while it is unchanged (with `cache`),
    else read (and kept). Raises OSError when path cannot be read."""
    path = Path(path)
    if cache and (kept := load_summary(path, _KIND, _KEY, PromptScan)) is not None:
        return kept
    stamp = file_stamp(path)
    found = scan(path)
    if cache:
        save_summary(path, _KIND, _KEY, stamp, found)
    return found


def scan(path: str | os.PathLike[str], *, offset: int = 0) -> PromptScan:
    """One read of path from byte offset (a line start, numbered line 1), never cached.
    Raises OSError when path cannot be read."""
    reader = _Reader(offset)
    for block in iter_prompt_blocks(path, offset=offset):
        reader.add(block)
    return reader.found


class _Reader:
    """The blocks of one read, gathered into a PromptScan."""

    def __init__(self, offset: int) -> None:
        self.found = PromptScan(end_offset=offset)
        self.first: dict[SampleId, int] = {}

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

    def _add_new_ids(self, rows: list[PromptRow]) -> bool:
        """Add the rows at once when each has a sample id not seen before (the usual case);
        False (nothing added) otherwise."""
        ids = [row.sample_id for row in rows if row.sample_id is not None]
        if len(set(ids)) != len(rows) or not self.first.keys().isdisjoint(ids):
            return False
        lines = [row.line for row in rows]
        self.first.update(zip(ids, lines))
        self.found.ids.extend(ids)
        self.found.first_lines.extend(lines)
        self.found.lengths.extend(map(_length, rows))
        return True

    def _add_id(self, row: PromptRow) -> None:
        """The row's sample id: a first one, a repeat, or none."""
        found, sample_id = self.found, row.sample_id
        seen = self.first.setdefault(sample_id, row.line) if sample_id is not None else None
        if sample_id is None:
            found.problems.append((row.line, "no_id", "cannot read sample_id"))
        elif seen != row.line:
            found.problems.append(
                (row.line, "duplicate_id", f"sample_id {sample_id!r} also at line {seen}"))
        else:
            found.ids.append(sample_id)
            found.first_lines.append(row.line)
            found.lengths.append(_length(row))


def _length(row: PromptRow) -> int | None:
    """The prompt's ids, else its text's estimated tokens, else None."""
    if row.input_ids is not None:
        return row.input_ids
    if row.text_chars is None:
        return None
    return max(1, round(row.text_chars / TEXT_CHARS_PER_TOKEN))
