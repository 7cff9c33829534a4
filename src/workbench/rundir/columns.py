"""What one scan of a raw file keeps, and the incremental cache of it beside each dataset.

A scan of ``raw_responses.jsonl`` (see :func:`workbench.analyze.validate.scan_run`) keeps, per file, a
:class:`FileScan`: the validation tallies (counts and first examples of each rule), one
:class:`Columns` entry per record (the token counts, finish reason, times, the reasoning
split and the per-record rules failed: what every report figure needs), and a sparse index
of block offsets to read chosen lines back without reading the file from its start.

The cache stores that scan in ``<dataset>/.workbench-cache/scan-<key>.msgpack`` with the
raw file's identity (device, inode) and the byte offset read so far (always a line start),
like the monitor's collector. The next scan of a file that grew reads only the appended
bytes; a file that shrank, was replaced, or whose last bytes before that offset changed is
read again from the start. The key covers everything a figure depends on (cache format,
workbench version, model profile, vocabulary size, reasoning, examples kept), so the
cache never changes a number. A cache that cannot be read is ignored, one that cannot be
written is skipped; deleting the cache folder is always safe.

The same append-aware cache keeps other values read of an append-only file
(:func:`save_appended`; the block digests of :func:`workbench.report.provenance.content_hash`).
Smaller files read whole (prompts.jsonl, written once before the requests) keep a summary
instead (:func:`save_summary`), used while the file's identity, size and modification time
are those it was read with.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import msgspec

import workbench

__all__ = [
    "CACHE_DIR",
    "Columns",
    "FileScan",
    "Stamp",
    "Tally",
    "cache_key",
    "file_stamp",
    "load_appended",
    "load_cached",
    "load_summary",
    "save_appended",
    "save_cached",
    "save_summary",
]

CACHE_DIR = ".workbench-cache"
_FORMAT = 2
_TAIL_BYTES = 256

SampleId = int | str
T = TypeVar("T")


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
    bit mask over :data:`workbench.analyze.validate.RECORD_RULES`.
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

    def block_at(self, line: int) -> tuple[int, int]:
        """(byte offset, first line) of the block holding line ((0, 1) before any block)."""
        index = bisect.bisect_right(self.blocks, (line, 1 << 62)) - 1
        if index < 0:
            return 0, 1
        first, offset = self.blocks[index]
        return offset, first


class _Appended(msgspec.Struct):
    """One cache file of an append-only file: its identity, the offset read (and the bytes
    just before it) and what was read up to it."""

    format: int
    version: str
    key: str
    ident: tuple[int, int]
    offset: int
    tail: bytes
    value: msgspec.Raw


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Appended)


def cache_key(*parts: Any) -> str:
    """A short digest of the settings a scan depends on (with the format and version)."""
    text = repr((_FORMAT, workbench.__version__, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tail(raw: Path, offset: int) -> bytes:
    start = max(0, offset - _TAIL_BYTES)
    with open(raw, "rb") as file:
        file.seek(start)
        return file.read(offset - start)


def load_appended(path: Path, kind: str, key: str | None, value_type: type[T]) -> tuple[T, int] | None:
    """(what was kept of kind for path, the offset it was read to), or None when there is no
    usable cache: none, unreadable, other settings, or path shrank, was replaced or its
    last bytes before that offset changed. Key None takes the newest usable one of any key."""
    if key is not None:
        return _usable(path, _cache_file(path, kind, key), key, value_type)
    try:
        paths = sorted((path.parent / CACHE_DIR).glob(f"{kind}-*.msgpack"),
                       key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    return next(filter(None, (_usable(path, cache, None, value_type) for cache in paths)), None)


def _usable(path: Path, cache: Path, key: str | None, value_type: type[T]) -> tuple[T, int] | None:
    try:
        cached = _DECODER.decode(cache.read_bytes())
        st = os.stat(path)
        same = (
            cached.format == _FORMAT and cached.version == workbench.__version__
            and (key is None or cached.key == key)
            and cached.ident == (st.st_dev, st.st_ino) and st.st_size >= cached.offset
            and _tail(path, cached.offset) == cached.tail
        )  # fmt: skip
        return (msgspec.msgpack.decode(cached.value, type=value_type), cached.offset) if same else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def save_appended(path: Path, kind: str, key: str, value: Any, offset: int) -> None:
    """Keep value (what was read of path up to offset) for the next reader; best effort."""
    with contextlib.suppress(OSError, OverflowError):  # ids past 64 bits: not cached
        st = os.stat(path)
        raw = msgspec.Raw(_ENCODER.encode(value))
        _write(_cache_file(path, kind, key), _ENCODER.encode(
            _Appended(_FORMAT, workbench.__version__, key, (st.st_dev, st.st_ino), offset,
                      _tail(path, offset), raw)))


def load_cached(raw: Path, key: str | None) -> tuple[FileScan, int] | None:
    """(the cached scan of raw, the offset it reached), or None (see :func:`load_appended`).
    Key None takes the newest usable scan of any settings (for counts that depend on none)."""
    return load_appended(raw, "scan", key, FileScan)


def save_cached(raw: Path, key: str, scan: FileScan, offset: int) -> None:
    """Store scan (of raw up to the line start offset) for the next scan; best effort."""
    save_appended(raw, "scan", key, msgspec.structs.replace(scan, torn=None), offset)


Stamp = tuple[int, int, int, int]


class _Summary(msgspec.Struct):
    """One summary file: what was read of a file with this stamp."""

    format: int
    version: str
    key: str
    stamp: Stamp
    value: msgspec.Raw


def file_stamp(path: Path) -> Stamp | None:
    """(device, inode, size, modification time) of path; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _cache_file(path: Path, kind: str, key: str) -> Path:
    return path.parent / CACHE_DIR / f"{kind}-{key}.msgpack"


def load_summary(path: Path, kind: str, key: str, value_type: type[T]) -> T | None:
    """The summary of kind saved for path as it is now, or None."""
    try:
        cached = msgspec.msgpack.decode(_cache_file(path, kind, key).read_bytes(),
                                        type=_Summary)
        if (cached.format, cached.version, cached.key) != (_FORMAT, workbench.__version__, key):
            return None
        if cached.stamp != file_stamp(path):
            return None
        return msgspec.msgpack.decode(cached.value, type=value_type)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def save_summary(path: Path, kind: str, key: str, stamp: Stamp | None, value: Any) -> None:
    """Keep value, read from path when it had stamp (taken before reading); best effort."""
    if stamp is None or file_stamp(path) != stamp:
        return  # changed while read: not worth keeping
    try:
        raw = msgspec.Raw(_ENCODER.encode(value))
    except OverflowError:
        return  # an id past 64 bits (msgpack's range): read again next time
    _write(_cache_file(path, kind, key),
           _ENCODER.encode(_Summary(_FORMAT, workbench.__version__, key, stamp, raw)))


def _write(path: Path, data: bytes) -> None:
    """data into path atomically; nothing when the folder cannot be written."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as file:
            file.write(data)
        try:
            os.chmod(file.name, 0o644)  # like the run's other files, not the temp file's 0600
            os.replace(file.name, path)
        except OSError:
            os.unlink(file.name)
            raise
