"""Per-dataset statistics of a run directory, collected incrementally.

:class:`StatsCollector` remembers, for every file it reads, the byte offset it reached and
parses only what was appended since the previous :meth:`~StatsCollector.refresh`. A file
that shrank, was replaced (another inode) or whose last 256 bytes before the remembered
offset changed is read again from the start (an in-place rewrite that keeps those bytes goes
unnoticed; writers only append). The result equals a fresh full scan at the same ``now``,
as long as ``now`` does not go backwards between refreshes. A first read starts from what a
report or ``validate`` cached beside the file (:mod:`workbench.rundir.columns`), so ``workbench
stats`` reads only the bytes written since; an unchanged prompts.jsonl is not read again.

What is counted, per dataset (``OUT/<name>/``):

    records                     lines of raw_responses.jsonl that gave a row (any layout);
                                duplicated sample ids are counted twice (validate names them)
    errors                      non-blank lines of errors.jsonl, one per failed attempt
    failed_missing              sample ids in errors.jsonl that have no record
    token totals                over the records that carry the count; a record without one
                                is counted in ``missing_*_tokens``, never as 0
    percentiles                 nearest rank over the exact completion counts
    truncation_rate             ``length`` among the records with a finish reason
    layout                      ``flat``, ``legacy``, ``meta_info``, ``mixed`` or ``none``
    prepared_prompt_tokens      ids in prompts.jsonl (None when it holds text prompts only)
    tokens_per_s, requests_per_s
                                completion tokens and records per second over the last
                                ``window`` seconds, from record ``ts`` values; while the
                                first record is inside the window, over the time since it
                                (that record only marks the start); None without any ``ts``
    target_records, max_tokens  from run.json: ``prompts`` (capped by ``max_samples``) and
                                ``max_tokens``; else the line count of prompts.jsonl
    finished                    records plus failed ids reach the target, or the completion
                                tokens reach ``max_tokens``
    eta_s                       what is left (records, or tokens under a budget, whichever
                                ends first) over the recent rate; 0 when finished, None
                                without a target or a rate

The total row sums the datasets; its ETA is the records left everywhere over the summed
request rate (datasets of a run share one pipeline). Lines that are not rows are counted in
``bad_lines``; a last line without newline only sets ``torn_tail`` until it is complete.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard, TypeVar

import msgspec

from workbench.errors import DataError, InputError
from workbench.rundir import prompt_scan
from workbench.rundir.columns import load_cached
from workbench.rundir.records import (
    ERRORS_FILE,
    MANIFEST_FILE,
    PROMPTS_FILE,
    RAW_FILE,
    Block,
    iter_blocks,
)

if TYPE_CHECKING:
    from workbench.analyze.validate import RunScan
    from workbench.rundir.columns import FileScan

__all__ = [
    "DEFAULT_WINDOW",
    "RECENT_ROWS",
    "DatasetStats",
    "RecentStats",
    "RunStats",
    "StatsCollector",
    "check_run_dir",
    "collect_stats",
    "format_count",
    "format_duration",
    "format_stats_table",
    "format_table",
    "render_stats",
]

DEFAULT_WINDOW = 300.0
RECENT_ROWS = 1000
PERCENTILES = (50, 90, 99)
_TAIL_BYTES = 256
_LINE_BLOCK = 8 << 20
_INT64 = (-(1 << 63), (1 << 63) - 1)

T = TypeVar("T")
_SERIALS = itertools.count()


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecentStats:
    """The last ``rows`` records read, and the records and errors of the time window."""

    rows: int = 0
    missing_completion: int = 0
    missing_prompt: int = 0
    truncated: int = 0
    with_reason: int = 0
    window_records: int = 0
    window_errors: int = 0


@dataclass(frozen=True, slots=True)
class DatasetStats:
    """One dataset's figures (see the module docstring for their definitions)."""

    name: str
    records: int = 0
    errors: int = 0
    failed_missing: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    avg_completion_tokens: float | None = None
    percentiles: tuple[int | None, ...] = (None, None, None)
    max_completion_tokens: int | None = None
    finish_reasons: Mapping[str, int] = field(default_factory=dict)
    truncation_rate: float | None = None
    layouts: Mapping[str, int] = field(default_factory=dict)
    missing_completion_tokens: int = 0
    missing_prompt_tokens: int = 0
    prepared_prompts: int | None = None
    prepared_prompt_tokens: int | None = None
    tokens_per_s: float | None = None
    requests_per_s: float | None = None
    target_records: int | None = None
    max_tokens: int | None = None
    remaining_records: float | None = None
    finished: bool = False
    eta_s: float | None = None
    bad_lines: int = 0
    torn_tail: bool = False
    last_write: float | None = None
    last_error_write: float | None = None
    recent: RecentStats = field(default_factory=RecentStats)

    @property
    def layout(self) -> str:
        return _layout_name(self.layouts)

    @property
    def avg_prompt_tokens(self) -> float | None:
        counted = self.records - self.missing_prompt_tokens
        return self.prompt_tokens / counted if counted > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``workbench stats --json`` for this dataset."""
        p50, p90, p99 = self.percentiles
        return {
            "records": self.records,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "avg_completion_tokens": _round(self.avg_completion_tokens, 3),
            "p50_completion_tokens": p50,
            "p90_completion_tokens": p90,
            "p99_completion_tokens": p99,
            "max_completion_tokens": self.max_completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "truncation_rate": _round(self.truncation_rate, 4),
            "layout": self.layout,
            "missing_completion_tokens": self.missing_completion_tokens,
            "tokens_per_s": _round(self.tokens_per_s, 3),
            "eta_s": _round(self.eta_s, 1),
            **self._extra_dict(),
        }

    def _extra_dict(self) -> dict[str, Any]:
        return {
            "failed_missing": self.failed_missing,
            "missing_prompt_tokens": self.missing_prompt_tokens,
            "layouts": dict(sorted(self.layouts.items())),
            "prepared_prompts": self.prepared_prompts,
            "prepared_prompt_tokens": self.prepared_prompt_tokens,
            "requests_per_s": _round(self.requests_per_s, 4),
            "target_records": self.target_records,
            "max_tokens": self.max_tokens,
            "remaining_records": _round(self.remaining_records, 1),
            "finished": self.finished,
            "bad_lines": self.bad_lines,
            "torn_tail": self.torn_tail,
            "last_write": self.last_write,
            "recent": {
                "rows": self.recent.rows,
                "missing_completion_tokens": self.recent.missing_completion,
                "missing_prompt_tokens": self.recent.missing_prompt,
                "truncated": self.recent.truncated,
                "window_records": self.recent.window_records,
                "window_errors": self.recent.window_errors,
            },
        }


@dataclass(frozen=True, slots=True)
class RunStats:
    """Every dataset of a run directory and their total, as seen at ``now``."""

    out: Path
    now: float
    window: float
    datasets: dict[str, DatasetStats]
    total: DatasetStats
    manifest: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``workbench stats --json``."""
        return {
            "datasets": {name: ds.to_dict() for name, ds in self.datasets.items()},
            "total": self.total.to_dict(),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _layout_name(layouts: Mapping[str, int]) -> str:
    present = [name for name, count in layouts.items() if count]
    if not present:
        return "none"
    return present[0] if len(present) == 1 else "mixed"


# --- files read from a remembered offset -----------------------------------------------------


class _Cursor:
    """Where the last read of one file stopped, and how to tell that the file changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ident: tuple[int, int] | None = None
        self.stamp: tuple[int, int] | None = None
        self.offset = 0
        self.line = 1
        self.tail = b""
        self.mtime: float | None = None

    def poll(self) -> str:
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


def _line_chunks(path: Path, offset: int) -> Iterator[tuple[bytes, int]]:
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


def _text_lines(data: bytes) -> Iterator[bytes]:
    """The non-blank lines of whole-line bytes."""
    return (line for line in data.split(b"\n") if line.strip())


# --- record ids, 8 bytes each ----------------------------------------------------------------


class _IdIndex:
    """Sample ids of the records read: ints as themselves, other ids by their hash.

    Only asked which error ids have a record, so a (rare) hash collision can at worst hide
    one failed id; memory stays at 8 bytes a record.
    """

    def __init__(self) -> None:
        self.ints = array("q")
        self.keys = array("q")

    def extend(self, sample_ids: Iterable[object]) -> None:
        ints = self.ints
        for sample_id in sample_ids:
            if _is_int64(sample_id):
                ints.append(sample_id)
            elif sample_id is not None:
                self.keys.append(hash(sample_id))

    def without_records(self, ids: Iterable[object]) -> set[object]:
        """The ids of ``ids`` that no record has."""
        candidates = set(ids)
        ints = [i for i in candidates if _is_int64(i)]
        hashed: dict[int, set[object]] = {}
        for other in candidates.difference(ints):
            hashed.setdefault(hash(other), set()).add(other)
        found: set[object] = set(_present(self.ints, ints))
        for key in _present(self.keys, list(hashed)):
            found |= hashed[key]
        return candidates - found


def _present(pool: array[int], values: list[int]) -> list[int]:
    """The values that occur in pool (a vectorised scan; few values are the usual case)."""
    if not values or not pool:
        return []
    import numpy as np

    data = np.frombuffer(pool, dtype=np.int64)
    hits: list[int] = np.unique(data[np.isin(data, np.array(values, dtype=np.int64))]).tolist()
    return hits


def _is_int64(value: object) -> TypeGuard[int]:
    return type(value) is int and _INT64[0] <= value <= _INT64[1]


# --- per-file accumulators -------------------------------------------------------------------


class _Raw:
    """Everything counted from raw_responses.jsonl."""

    def __init__(self, recent_rows: int) -> None:
        self.serial = next(_SERIALS)
        self.records = 0
        self.prompt_tokens = 0
        self.prompt_counted = 0
        self.completion_tokens = 0
        self.completions = array("q")
        self.cached_tokens = 0
        self.reasons: dict[str, int] = {}
        self.layouts: dict[str, int] = {}
        self.bad_lines = 0
        self.torn = False
        self.ids = _IdIndex()
        self.first_ts: float | None = None
        self.window: deque[tuple[float, int]] = deque()
        self.last: deque[tuple[bool, bool, str | None]] = deque(maxlen=recent_rows)
        self._percentiles: tuple[int, tuple[int | None, ...], int | None] | None = None
        self._recent: tuple[int, tuple[int, ...]] | None = None

    def add_block(self, block: Block, cutoff: float, unresolved: set[object]) -> None:
        bad_lines = sum(1 for p in block.problems if p.kind != "torn")
        torn = any(p.kind == "torn" for p in block.problems)
        rows = block.rows
        fields = _Fields(*([getattr(row, name) for row in rows] for name in _Fields._fields))
        self.add_fields(fields, bad_lines, torn, cutoff, unresolved)

    def add_scan(self, scan: FileScan, cutoff: float, unresolved: set[object]) -> None:
        """Count the records of a scan (see :func:`workbench.analyze.validate.scan_run`)."""
        c = scan.columns
        counts = scan.tally.counts
        bad_lines = counts.get("parse_error", 0) + counts.get("bad_type", 0)
        fields = _Fields(c.sample_id, c.layout, c.prompt_tokens, c.completion_tokens,
                         c.cached_tokens, c.finish_reason, c.ts)
        self.add_fields(fields, bad_lines, scan.torn is not None, cutoff, unresolved)

    def add_fields(self, fields: _Fields, bad_lines: int, torn: bool, cutoff: float,
                   unresolved: set[object]) -> None:
        """Count records given as one list per field, in file order."""
        self.records += len(fields.layout)
        self.bad_lines += bad_lines
        self.torn = torn
        self._add_counts(fields)
        self._add_labels(fields, unresolved)
        self._add_times(fields, cutoff)
        size = self.last.maxlen or 1
        self.last.extend(zip((c is None for c in fields.completion_tokens[-size:]),
                             (p is None for p in fields.prompt_tokens[-size:]),
                             fields.finish_reason[-size:]))

    def _add_counts(self, fields: _Fields) -> None:
        completions = [c for c in fields.completion_tokens if c is not None]
        self.completions.extend([min(c, _INT64[1]) for c in completions])  # JSON allows uint64
        self.completion_tokens += sum(completions)
        prompts = [p for p in fields.prompt_tokens if p is not None]
        self.prompt_tokens += sum(prompts)
        self.prompt_counted += len(prompts)
        self.cached_tokens += sum(c for c in fields.cached_tokens if c is not None)

    def _add_labels(self, fields: _Fields, unresolved: set[object]) -> None:
        for counts, values in ((self.reasons, fields.finish_reason), (self.layouts, fields.layout)):
            for value, count in Counter(values).items():
                key = "missing" if value is None else value
                counts[key] = counts.get(key, 0) + count
        self.ids.extend(fields.sample_id)
        if unresolved:
            unresolved.difference_update(fields.sample_id)

    def _add_times(self, fields: _Fields, cutoff: float) -> None:
        times = [ts for ts in fields.ts if ts is not None]
        if not times:
            return
        first = min(times)
        if self.first_ts is None or first < self.first_ts:
            self.first_ts = first
        self.window.extend((ts, tokens or 0) for ts, tokens
                           in zip(fields.ts, fields.completion_tokens, strict=True)
                           if ts is not None and ts > cutoff)

    def recent_counts(self) -> tuple[int, ...]:
        """(rows, missing completion, missing prompt, truncated, with a reason) of the last rows."""
        if self._recent is None or self._recent[0] != self.records:
            last = self.last
            counts = (
                len(last),
                sum(1 for missing, _, _ in last if missing),
                sum(1 for _, missing, _ in last if missing),
                sum(1 for _, _, reason in last if reason == "length"),
                sum(1 for _, _, reason in last if reason is not None),
            )
            self._recent = (self.records, counts)
        return self._recent[1]

    def percentiles(self) -> tuple[tuple[int | None, ...], int | None]:
        """(p50, p90, p99) and max of the completion counts, cached until new ones arrive."""
        if self._percentiles is None or self._percentiles[0] != len(self.completions):
            values, top = _nearest_ranks([self.completions])
            self._percentiles = (len(self.completions), values, top)
        return self._percentiles[1], self._percentiles[2]


def _nearest_ranks(arrays: Sequence[array[int]]) -> tuple[tuple[int | None, ...], int | None]:
    """Nearest-rank percentiles and the max over the values of several arrays."""
    size = sum(len(a) for a in arrays)
    if size == 0:
        return (None,) * len(PERCENTILES), None
    import numpy as np

    values = np.concatenate([np.frombuffer(a, dtype=np.int64) for a in arrays if len(a)])
    ranks = [max(1, math.ceil(p / 100 * size)) - 1 for p in PERCENTILES]
    values.partition(ranks)
    return tuple(int(values[k]) for k in ranks), int(values.max())


class _Fields(NamedTuple):
    """What the counts need of records: one list per field, in file order."""

    sample_id: Sequence[object]
    layout: Sequence[str]
    prompt_tokens: Sequence[int | None]
    completion_tokens: Sequence[int | None]
    cached_tokens: Sequence[int | None]
    finish_reason: Sequence[str | None]
    ts: Sequence[float | None]


class _ErrorLine(msgspec.Struct):
    sample_id: int | str | None = None
    ts: float | None = None


_ERROR_DECODER = msgspec.json.Decoder(_ErrorLine)


class _Errors:
    """Lines of errors.jsonl: how many, which ids, and the recent ones' times."""

    def __init__(self) -> None:
        self.lines = 0
        self.ids: set[object] = set()
        self.window: deque[float] = deque()

    def add(self, data: bytes, cutoff: float) -> list[object]:
        """Count the lines; return the ids not seen before."""
        new: list[object] = []
        for text in _text_lines(data):
            self.lines += 1
            try:
                error = _ERROR_DECODER.decode(text)
            except msgspec.DecodeError:
                continue
            if error.ts is not None and error.ts > cutoff:
                self.window.append(error.ts)
            if error.sample_id is not None and error.sample_id not in self.ids:
                self.ids.add(error.sample_id)
                new.append(error.sample_id)
        return new


class _Prompts:
    """Lines of prompts.jsonl and the ids of the pre-tokenized ones."""

    def __init__(self) -> None:
        self.lines = 0
        self.tokenized = 0
        self.tokens = 0

    def add(self, part: prompt_scan.PromptScan) -> None:
        """Count the lines of a scan of the file (or of the bytes appended to it)."""
        self.lines += part.lines
        self.tokenized += part.tokenized
        self.tokens += part.tokens


# --- one dataset -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    records: int | None
    max_tokens: int | None

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any], prompt_lines: int | None) -> _Target:
        counts = [entry.get("prompts"), entry.get("max_samples")]
        known = [int(c) for c in counts if isinstance(c, int) and not isinstance(c, bool)]
        records = min(known) if known else prompt_lines
        budget = entry.get("max_tokens")
        return cls(records, budget if isinstance(budget, int) and budget > 0 else None)


class _Dataset:
    """The three files of one dataset and what was counted from them."""

    def __init__(self, folder: Path, recent_rows: int) -> None:
        self.folder = folder
        self.recent_rows = recent_rows
        self.raw_cursor = _Cursor(folder / RAW_FILE)
        self.errors_cursor = _Cursor(folder / ERRORS_FILE)
        self.prompts_cursor = _Cursor(folder / PROMPTS_FILE)
        self.raw = _Raw(recent_rows)
        self.errors = _Errors()
        self.prompts = _Prompts()
        self.unresolved: set[object] = set()

    def update(self, cutoff: float, scanned: FileScan | None = None) -> None:
        """Read what was appended (or everything again, for a file that changed); the
        records of raw_responses.jsonl come from `scanned` when given."""
        self._prune(cutoff)
        self._update_errors(cutoff)
        if scanned is None:
            self._update_raw(cutoff)
        else:
            self._use_scan(scanned, cutoff)
        self._update_prompts()

    def _use_scan(self, scanned: FileScan, cutoff: float) -> None:
        self.raw_cursor.poll()  # the file's last write time
        self.raw = _Raw(self.recent_rows)
        self.unresolved = set(self.errors.ids)
        self.raw.add_scan(scanned, cutoff, self.unresolved)

    def _prune(self, cutoff: float) -> None:
        window, errors = self.raw.window, self.errors.window
        while window and window[0][0] <= cutoff:
            window.popleft()
        while errors and errors[0] <= cutoff:
            errors.popleft()

    def _update_errors(self, cutoff: float) -> None:
        change = self.errors_cursor.poll()
        if change in ("reset", "gone"):
            self.errors, self.unresolved = _Errors(), set()
        if change in ("grown", "reset"):
            cursor = self.errors_cursor
            for data, offset in _guarded(cursor.path, _line_chunks(cursor.path, cursor.offset)):
                new = self.errors.add(data, cutoff)
                self.unresolved |= self.raw.ids.without_records(new)
                cursor.advance(offset, 1)

    def _update_raw(self, cutoff: float) -> None:
        change = self.raw_cursor.poll()
        if change in ("reset", "gone"):
            self.raw = _Raw(self.recent_rows)
            self.unresolved = set(self.errors.ids)
        if change in ("grown", "reset"):
            cursor = self.raw_cursor
            self.raw.torn = False
            if cursor.offset == 0:
                self._start_from_cache(cutoff)
            blocks = iter_blocks(cursor.path, offset=cursor.offset, first_line=cursor.line)
            for block in _guarded(cursor.path, blocks):
                self.raw.add_block(block, cutoff, self.unresolved)
                cursor.advance(block.end_offset, block.first_line + block.lines)

    def _start_from_cache(self, cutoff: float) -> None:
        """Count what a scan cached beside the file (see :mod:`workbench.rundir.columns`), so that
        only the bytes after it are read; nothing when there is no usable cache."""
        cached = load_cached(self.raw_cursor.path, None)
        if cached is not None and cached[1] > 0:
            scan, offset = cached
            self.raw.add_scan(scan, cutoff, self.unresolved)
            self.raw_cursor.advance(offset, scan.lines + 1)

    def _update_prompts(self) -> None:
        """Count the whole file from the one read the reports share (kept beside it, see
        :mod:`workbench.rundir.prompt_scan`), then only the bytes appended since."""
        change = self.prompts_cursor.poll()
        if change in ("reset", "gone"):
            self.prompts = _Prompts()
        if change in ("grown", "reset"):
            cursor = self.prompts_cursor
            try:
                part = (prompt_scan.summary(cursor.path) if cursor.offset == 0
                        else prompt_scan.scan(cursor.path, offset=cursor.offset))
            except FileNotFoundError:
                return
            except OSError as exc:
                raise DataError(cursor.path, f"cannot read: {exc.strerror or exc}") from None
            self.prompts.add(part)
            cursor.advance(part.end_offset, 1)

    def snapshot(
        self, name: str, now: float, window: float, entry: Mapping[str, Any]
    ) -> DatasetStats:
        """The dataset's figures at ``now``."""
        raw = self.raw
        prompt_lines = self.prompts.lines if self.prompts_cursor.ident is not None else None
        target = _Target.from_manifest(entry, prompt_lines)
        tok_rate, req_rate, window_records = _rates(raw.window, raw.first_ts, now, window)
        percentiles, top = raw.percentiles()
        counted = len(raw.completions)
        stats = DatasetStats(
            name=name,
            records=raw.records,
            errors=self.errors.lines,
            failed_missing=len(self.unresolved),
            prompt_tokens=raw.prompt_tokens,
            completion_tokens=raw.completion_tokens,
            cached_tokens=raw.cached_tokens,
            avg_completion_tokens=raw.completion_tokens / counted if counted else None,
            percentiles=percentiles,
            max_completion_tokens=top,
            finish_reasons=dict(raw.reasons),
            truncation_rate=_truncation(raw.reasons),
            layouts=dict(raw.layouts),
            missing_completion_tokens=raw.records - counted,
            missing_prompt_tokens=raw.records - raw.prompt_counted,
            prepared_prompts=prompt_lines,
            prepared_prompt_tokens=self.prompts.tokens if self.prompts.tokenized else None,
            tokens_per_s=tok_rate,
            requests_per_s=req_rate,
            target_records=target.records,
            max_tokens=target.max_tokens,
            bad_lines=raw.bad_lines,
            torn_tail=raw.torn,
            last_write=self.raw_cursor.mtime,
            last_error_write=self.errors_cursor.mtime,
            recent=self._recent(window_records, now - window),
        )
        return _with_progress(stats)

    def _recent(self, window_records: int, cutoff: float) -> RecentStats:
        rows, missing_completion, missing_prompt, truncated, with_reason = self.raw.recent_counts()
        return RecentStats(
            rows=rows,
            missing_completion=missing_completion,
            missing_prompt=missing_prompt,
            truncated=truncated,
            with_reason=with_reason,
            window_records=window_records,
            window_errors=sum(1 for ts in self.errors.window if ts > cutoff),
        )


def _guarded(path: Path, items: Iterator[T]) -> Iterator[T]:
    """items, or nothing more once the file vanished; other read failures name the file."""
    try:
        yield from items
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None


def _truncation(reasons: Mapping[str, int]) -> float | None:
    known = sum(count for reason, count in reasons.items() if reason != "missing")
    return reasons.get("length", 0) / known if known else None


def _rates(
    window: Iterable[tuple[float, int]], first_ts: float | None, now: float, length: float
) -> tuple[float | None, float | None, int]:
    """(completion tok/s, records/s, records in the window) over the last ``length`` seconds."""
    cutoff = now - length
    recent = [(ts, tokens) for ts, tokens in window if ts > cutoff]
    if first_ts is None:
        return None, None, len(recent)
    span, tokens, count = length, sum(t for _, t in recent), len(recent)
    if first_ts > cutoff and recent:
        span = now - first_ts
        first = min(recent)
        tokens, count = tokens - first[1], count - 1
    if span <= 0:
        return 0.0, 0.0, len(recent)
    return tokens / span, count / span, len(recent)


def _with_progress(stats: DatasetStats) -> DatasetStats:
    """stats with remaining_records, finished and eta_s filled in."""
    remaining, token_left = _remaining(stats)
    finished = remaining is not None and remaining <= 0
    if stats.max_tokens is not None and stats.completion_tokens >= stats.max_tokens:
        finished = True
    eta = 0.0 if finished else _eta(remaining, token_left, stats)
    left = 0.0 if finished else _records_left(remaining, token_left, stats)
    return _replace(stats, remaining_records=left, finished=finished, eta_s=eta)


def _remaining(stats: DatasetStats) -> tuple[int | None, int | None]:
    """(records left, completion tokens left under the budget)."""
    records = None
    if stats.target_records is not None:
        records = max(0, stats.target_records - stats.records - stats.failed_missing)
    tokens = None
    if stats.max_tokens is not None:
        tokens = max(0, stats.max_tokens - stats.completion_tokens)
    return records, tokens


def _eta(records: int | None, tokens: int | None, stats: DatasetStats) -> float | None:
    candidates = []
    if records is not None and stats.requests_per_s:
        candidates.append(records / stats.requests_per_s)
    if tokens is not None and stats.tokens_per_s:
        candidates.append(tokens / stats.tokens_per_s)
    return min(candidates) if candidates else None


def _records_left(records: int | None, tokens: int | None, stats: DatasetStats) -> float | None:
    """Records still to come: by count, or by the token budget over the average reply."""
    by_tokens = None
    if tokens is not None and stats.avg_completion_tokens:
        by_tokens = tokens / stats.avg_completion_tokens
    known = [value for value in (records, by_tokens) if value is not None]
    return float(min(known)) if known else None


def _replace(stats: DatasetStats, **changes: Any) -> DatasetStats:
    return replace(stats, **changes)


# --- the total row ---------------------------------------------------------------------------


def _total(
    datasets: Sequence[DatasetStats], counted: int, ranks: tuple[tuple[int | None, ...], int | None]
) -> DatasetStats:
    """The sums over every dataset; ranks are the percentiles of all completion counts."""
    percentiles, top = ranks
    completion = sum(d.completion_tokens for d in datasets)
    reasons = _merged([d.finish_reasons for d in datasets])
    total = DatasetStats(
        name="total",
        records=sum(d.records for d in datasets),
        errors=sum(d.errors for d in datasets),
        failed_missing=sum(d.failed_missing for d in datasets),
        prompt_tokens=sum(d.prompt_tokens for d in datasets),
        completion_tokens=completion,
        cached_tokens=sum(d.cached_tokens for d in datasets),
        avg_completion_tokens=completion / counted if counted else None,
        percentiles=percentiles,
        max_completion_tokens=top,
        finish_reasons=reasons,
        truncation_rate=_truncation(reasons),
        layouts=_merged([d.layouts for d in datasets]),
        missing_completion_tokens=sum(d.missing_completion_tokens for d in datasets),
        missing_prompt_tokens=sum(d.missing_prompt_tokens for d in datasets),
        bad_lines=sum(d.bad_lines for d in datasets),
        torn_tail=any(d.torn_tail for d in datasets),
        last_write=max((d.last_write for d in datasets if d.last_write), default=None),
        last_error_write=max(
            (d.last_error_write for d in datasets if d.last_error_write), default=None
        ),
    )
    return _with_total_progress(total, datasets)


def _with_total_progress(total: DatasetStats, datasets: Sequence[DatasetStats]) -> DatasetStats:
    unfinished = [d for d in datasets if not d.finished]
    remaining = _sum_known([d.remaining_records for d in unfinished]) if unfinished else 0.0
    req_rate = _sum_known([d.requests_per_s for d in datasets], partial=True)
    eta = None
    if not unfinished:
        eta = 0.0
    elif remaining is not None and req_rate:
        eta = remaining / req_rate
    return _replace(
        total,
        prepared_prompts=_sum_known([d.prepared_prompts for d in datasets], partial=True),
        prepared_prompt_tokens=_sum_known(
            [d.prepared_prompt_tokens for d in datasets], partial=True
        ),
        tokens_per_s=_sum_known([d.tokens_per_s for d in datasets], partial=True),
        requests_per_s=req_rate,
        target_records=_sum_known([d.target_records for d in datasets]),
        remaining_records=remaining,
        finished=bool(datasets) and not unfinished,
        eta_s=eta,
        recent=_summed_recent([d.recent for d in datasets]),
    )


def _sum_known(values: Sequence[Any], *, partial: bool = False) -> Any:
    """The sum of values; None if none is known, or (unless partial) if any is unknown."""
    known = [v for v in values if v is not None]
    if not known or (not partial and len(known) < len(values)):
        return None
    return sum(known)


def _merged(counts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for mapping in counts:
        for key, count in mapping.items():
            merged[key] = merged.get(key, 0) + count
    return merged


def _summed_recent(items: Sequence[RecentStats]) -> RecentStats:
    names = RecentStats.__dataclass_fields__
    return RecentStats(**{name: sum(getattr(r, name) for r in items) for name in names})


# --- the collector ---------------------------------------------------------------------------


class _ManifestFile:
    """run.json, read again only when it changed; {} when absent or unreadable."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamp: tuple[int, int, int] | None = None
        self.data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except OSError:
            self.stamp, self.data = None, {}
            return self.data
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self.stamp:
            self.stamp, self.data = stamp, _load_json(self.path)
        return self.data


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _manifest_datasets(manifest: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    datasets = manifest.get("datasets")
    if not isinstance(datasets, dict):
        return {}
    return {str(k): v for k, v in datasets.items() if isinstance(v, dict)}


class StatsCollector:
    """Per-dataset statistics of a run directory, refreshed incrementally.

    ``clock`` gives the wall time used when :meth:`refresh` gets no ``now``; ``window`` is
    the recent window in seconds; ``recent_rows`` how many last records the recent counts
    cover. Datasets are those named in run.json (in its order), then any other
    subdirectory holding a raw, errors or prompts file (by name).
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        window: float = DEFAULT_WINDOW,
        recent_rows: int = RECENT_ROWS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.out = Path(out)
        self.window = window
        self.recent_rows = recent_rows
        self.clock = clock
        self._manifest = _ManifestFile(self.out / MANIFEST_FILE)
        self._datasets: dict[str, _Dataset] = {}
        self._ranks: tuple[tuple[int, ...], tuple[tuple[int | None, ...], int | None]] | None = None

    def refresh(self, now: float | None = None, *, scan: RunScan | None = None) -> RunStats:
        """Read what changed since the last call and return the figures at ``now``; the
        records of the datasets `scan` (a :func:`workbench.analyze.validate.scan_run` result) holds
        are counted from it instead of reading their raw files."""
        if not self.out.is_dir():
            raise _not_a_run_dir(self.out)
        now = self.clock() if now is None else now
        manifest = self._manifest.read()
        entries = _manifest_datasets(manifest)
        self._datasets = {name: self._dataset(name) for name in self._discover(entries)}
        stats = {}
        scanned = scan.files if scan is not None else {}
        for name, dataset in self._datasets.items():
            dataset.update(now - self.window, scanned.get(name))
            stats[name] = dataset.snapshot(name, now, self.window, entries.get(name, {}))
        raws = [dataset.raw for dataset in self._datasets.values()]
        total = _total(
            list(stats.values()), sum(len(r.completions) for r in raws), self._all_ranks(raws)
        )
        return RunStats(self.out, now, self.window, stats, total, manifest)

    def _dataset(self, name: str) -> _Dataset:
        return self._datasets.get(name) or _Dataset(self.out / name, self.recent_rows)

    def _all_ranks(self, raws: Sequence[_Raw]) -> tuple[tuple[int | None, ...], int | None]:
        """Percentiles over every dataset's completion counts, cached until one changes."""
        key = tuple(x for raw in raws for x in (raw.serial, len(raw.completions)))
        if self._ranks is None or self._ranks[0] != key:
            self._ranks = (key, _nearest_ranks([raw.completions for raw in raws]))
        return self._ranks[1]

    def _discover(self, entries: Mapping[str, Any]) -> list[str]:
        names = list(entries)
        found = []
        with os.scandir(self.out) as it:
            for entry in it:
                if entry.name in entries or entry.name in self._datasets:
                    continue
                if entry.is_dir() and _holds_run_files(Path(entry.path)):
                    found.append(entry.name)
        known = [n for n in self._datasets if n not in entries and (self.out / n).is_dir()]
        return names + sorted({*known, *found})


def _holds_run_files(folder: Path) -> bool:
    return any((folder / name).exists() for name in (RAW_FILE, ERRORS_FILE, PROMPTS_FILE))


def _not_a_run_dir(root: Path) -> InputError:
    what = "not a directory" if root.exists() else "no such directory"
    return InputError(f"{root}: not a run directory ({what})")


def _read_manifest_strictly(path: Path) -> None:
    """DataError naming the file (and line) unless run.json is a readable JSON object."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # the message names the line and column
        raise DataError(path, f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(path, "expected a JSON object")


def check_run_dir(out: str | os.PathLike[str], *, need_datasets: bool = True) -> None:
    """InputError unless out is a directory whose run.json (when present) is a JSON object and
    which holds run.json or a dataset folder (or anything, when `need_datasets` is false)."""
    root = Path(out)
    if not root.is_dir():
        raise _not_a_run_dir(root)
    manifest = root / MANIFEST_FILE
    if manifest.exists():
        _read_manifest_strictly(manifest)
        return
    if need_datasets and not any(p.is_dir() and _holds_run_files(p) for p in root.iterdir()):
        raise InputError(f"{root}: not a run directory (no {MANIFEST_FILE} and no "
                         f"<dataset>/{RAW_FILE})")


def collect_stats(
    out: str | os.PathLike[str],
    *,
    now: float | None = None,
    window: float = DEFAULT_WINDOW,
    scan: RunScan | None = None,
) -> RunStats:
    """A full scan of a run directory (one refresh of a new collector); with `scan` (a
    :func:`workbench.analyze.validate.scan_run` result of the same run) the raw files are not read
    again: a report's tables and its stats then count the very same records."""
    return StatsCollector(out, window=window).refresh(now, scan=scan)


# --- text ------------------------------------------------------------------------------------


def format_count(value: float | None) -> str:
    """``12,345``; ``-`` for unknown."""
    return "-" if value is None else f"{value:,.0f}"


def format_duration(seconds: float | None) -> str:
    """``45s``, ``12.5m``, ``3.2h``, ``2.1d``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Plain aligned columns: the first ``left`` columns to the left, the others right."""
    widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


_COUNT_HEADERS = (
    "dataset", "layout", "records", "errors", "failed", "prompt tok", "completion tok",
    "cached tok", "missing", "prepared tok",
)  # fmt: skip
_PROGRESS_HEADERS = (
    "dataset", "avg", "p50", "p90", "p99", "max", "length", "tok/s", "req/s", "done/target",
    "ETA",
)  # fmt: skip


def _count_row(d: DatasetStats) -> list[str]:
    counts = (
        d.records, d.errors, d.failed_missing, d.prompt_tokens, d.completion_tokens,
        d.cached_tokens, d.missing_completion_tokens, d.prepared_prompt_tokens,
    )  # fmt: skip
    return [d.name, d.layout, *(format_count(c) for c in counts)]


def _progress_row(d: DatasetStats) -> list[str]:
    spread = (d.avg_completion_tokens, *d.percentiles, d.max_completion_tokens)
    length = "-" if d.truncation_rate is None else f"{d.truncation_rate:.1%}"
    target = f"{d.records:,}/{format_count(d.target_records)}"
    eta = "done" if d.finished else format_duration(d.eta_s)
    rates = (_rate(d.tokens_per_s), _rate(d.requests_per_s))
    return [d.name, *(format_count(v) for v in spread), length, *rates, target, eta]


def _notes(d: DatasetStats) -> list[str]:
    notes = []
    if d.finish_reasons:
        reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(d.finish_reasons.items()))
        notes.append(f"finish reasons: {reasons}")
    if d.missing_completion_tokens or d.missing_prompt_tokens:
        notes.append(
            f"counts missing: completion_tokens in {d.missing_completion_tokens:,}, "
            f"prompt_tokens in {d.missing_prompt_tokens:,} of {d.records:,} records"
        )
    if d.bad_lines:
        notes.append(f"{d.bad_lines:,} unreadable lines")
    if d.torn_tail:
        notes.append("last line incomplete (torn or being written)")
    return notes


def format_stats_table(stats: RunStats) -> str:
    """The readable form of ``workbench stats``: counts, then spread and progress, then notes.

    Token columns count completion tokens unless named otherwise; ``missing`` is records
    without a completion count, ``length`` the truncation rate.
    """
    every = [*stats.datasets.values(), stats.total]
    lines = [
        format_table(_COUNT_HEADERS, [_count_row(d) for d in every], left=2),
        "",
        format_table(_PROGRESS_HEADERS, [_progress_row(d) for d in every]),
        "",
    ]
    for d in stats.datasets.values():
        lines += [f"{d.name}: {note}" for note in _notes(d)]
    lines.append(f"rates over the last {format_duration(stats.window)} of record timestamps")
    return "\n".join(lines)


def render_stats(
    out: str | os.PathLike[str], *, as_json: bool = False, now: float | None = None
) -> str:
    """What ``workbench stats OUT [--json]`` prints; InputError for a directory that is no run."""
    check_run_dir(out)
    stats = collect_stats(out, now=now)
    if as_json:
        return json.dumps(stats.to_dict(), indent=2)
    return format_stats_table(stats)
