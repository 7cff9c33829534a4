"""What one scan of a raw file keeps per record, and its cache beside each dataset.

A scan of ``raw_responses.jsonl`` (see :func:`workbench.analyze.scan.scan_run`) keeps, per
file, a :class:`FileScan`: the validation tallies (counts and first examples of each rule),
one :class:`Columns` entry per record (the token counts, finish reason, times, the reasoning
split and the per-record rules failed: what every report figure needs), and a sparse index
of block offsets to read chosen lines back without reading the file from its start.

The scan is kept in ``<dataset>/.workbench-cache/scan-v<N>-<key>.msgpack`` as an
appended-file cache (:mod:`workbench.rundir.cache`): the next scan of a file that grew reads
only the appended bytes. The key covers everything a figure depends on (model profile,
vocabulary size, reasoning, examples kept); ``N`` is :data:`COLUMNS_VERSION`, bumped when a
column is added or changes meaning, so a scan kept by an older workbench is never read.
"""

from __future__ import annotations

import bisect

import msgspec

from workbench.rundir.cache import AppendedCache

__all__ = ["COLUMNS_VERSION", "SCAN_CACHE", "Columns", "FileScan", "Tally"]

COLUMNS_VERSION = 3  # 2: the turn and ended columns (turns: each); 3: the mode column

SampleId = int | str


class Tally(msgspec.Struct):
    """Counts and the first examples of each rule: (line, detail)."""

    max_examples: int
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    examples: dict[str, list[tuple[int, str]]] = msgspec.field(default_factory=dict)

    def add(self, rule: str, line: int, detail: str) -> None:
        self.counts[rule] = self.counts.get(rule, 0) + 1
        kept = self.examples.setdefault(rule, [])
        if len(kept) < self.max_examples:
            kept.append((line, detail))

    def merge(self, other: Tally, shift: int) -> None:
        """Add other's counts, and its examples (lines shifted) while there is room."""
        for rule, count in other.counts.items():
            self.counts[rule] = self.counts.get(rule, 0) + count
            kept = self.examples.setdefault(rule, [])
            room = self.max_examples - len(kept)
            kept.extend((shift + line, detail) for line, detail in other.examples[rule][:room])


class Columns(msgspec.Struct):
    """One entry per record, in file order; None where a value cannot be read.

    ``output_len``, ``reasoning_tokens``, ``answer_tokens`` and ``closed`` come from the
    output ids (None without them; ``closed`` None without reasoning); ``failed`` is a
    bit mask over :data:`workbench.analyze.rules.RECORD_RULES`. The data-quality columns
    (:mod:`workbench.sketch`; 0 or empty without output ids): ``repeat_share``
    (share of the reply inside a repeated n-gram), ``special_ids`` (special ids counted by
    the special_heavy rule), ``digest`` (a hash of the ids: exact duplicates),
    ``signature`` (a MinHash signature: near duplicates) and ``overlap`` (a bit mask of the
    benchmarks whose n-grams the reply holds; 0 when none were given). ``turn`` and
    ``ended`` are a record's turn of its conversation and why the conversation ended after
    it (None for a single-turn record; see :class:`workbench.rundir.records.Record`);
    ``mode`` the mode its conversation drew (None outside a dataset that mixes modes).
    """

    line: list[int] = msgspec.field(default_factory=list)
    sample_id: list[SampleId | None] = msgspec.field(default_factory=list)
    layout: list[str] = msgspec.field(default_factory=list)
    prompt_tokens: list[int | None] = msgspec.field(default_factory=list)
    completion_tokens: list[int | None] = msgspec.field(default_factory=list)
    cached_tokens: list[int | None] = msgspec.field(default_factory=list)
    finish_reason: list[str | None] = msgspec.field(default_factory=list)
    ts: list[float | None] = msgspec.field(default_factory=list)
    e2e_latency: list[float | None] = msgspec.field(default_factory=list)
    output_len: list[int | None] = msgspec.field(default_factory=list)
    reasoning_tokens: list[int | None] = msgspec.field(default_factory=list)
    answer_tokens: list[int | None] = msgspec.field(default_factory=list)
    closed: list[bool | None] = msgspec.field(default_factory=list)
    failed: list[int] = msgspec.field(default_factory=list)
    repeat_share: list[float] = msgspec.field(default_factory=list)
    special_ids: list[int] = msgspec.field(default_factory=list)
    digest: list[int] = msgspec.field(default_factory=list)
    signature: list[bytes] = msgspec.field(default_factory=list)
    overlap: list[int] = msgspec.field(default_factory=list)
    turn: list[int | None] = msgspec.field(default_factory=list)
    ended: list[str | None] = msgspec.field(default_factory=list)
    mode: list[str | None] = msgspec.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.line)

    def extend(self, other: Columns, shift: int) -> None:
        """Append other's entries, their line numbers shifted by shift."""
        self.line.extend(shift + line for line in other.line)
        for name in self.__struct_fields__[1:]:
            getattr(self, name).extend(getattr(other, name))


class FileScan(msgspec.Struct):
    """A scanned part of a raw file: ``lines`` lines (blank and bad ones included) read.

    Line numbers count from 1 at the part's start until parts are merged. ``blocks`` holds
    (first line, byte offset) of each block read; ``end_offset`` is the byte offset after the
    last whole line read; ``torn`` the (line, detail) of a last line without newline, which
    is never cached (it is read again until it is complete).
    """

    tally: Tally
    lines: int = 0
    records: int = 0
    columns: Columns = msgspec.field(default_factory=Columns)
    blocks: list[tuple[int, int]] = msgspec.field(default_factory=list)
    end_offset: int = 0
    torn: tuple[int, str] | None = None

    def merge(self, part: FileScan) -> None:
        """Append part (the scan of the bytes after this one's), shifting its line numbers."""
        base = self.lines
        self.lines += part.lines
        self.records += part.records
        self.tally.merge(part.tally, base)
        self.columns.extend(part.columns, base)
        self.blocks.extend((base + line, offset) for line, offset in part.blocks)
        self.end_offset = part.end_offset
        self.torn = None if part.torn is None else (base + part.torn[0], part.torn[1])

    def kept(self) -> FileScan:
        """What a cache keeps of this scan: all of it but a torn last line, read again until
        it is complete."""
        return msgspec.structs.replace(self, torn=None)

    def block_at(self, line: int) -> tuple[int, int]:
        """(byte offset, first line) of the block holding line ((0, 1) before any block)."""
        index = bisect.bisect_right(self.blocks, (line, 1 << 62)) - 1
        if index < 0:
            return 0, 1
        first, offset = self.blocks[index]
        return offset, first


SCAN_CACHE: AppendedCache[FileScan] = AppendedCache(f"scan-v{COLUMNS_VERSION}", FileScan)
"""The scan of each raw file, kept beside it (what :meth:`FileScan.kept` says)."""
