"""What the stats count of each file of a dataset, fed block by block as a file grows.

    RawCounts     raw_responses.jsonl: records, token totals, the completion counts (for
                  percentiles), finish reasons, layouts, unreadable lines, the record ids
                  (IdIndex: 8 bytes a record), the record times of the recent window and
                  the last records' missing counts and truncations
    TurnCounts    the records of conversations regenerated turn by turn (those with a
                  ``turn``): per conversation its turns, per turn index its records and
                  completion tokens, the conversations ended early by reason
    ModeCounts    per mode of a dataset that mixes modes (the records' ``mode``): records,
                  completion tokens and their counts (for the median), conversations (the
                  sample ids of records with a turn)
    ErrorCounts   errors.jsonl: failed attempts, the ids that failed, recent failure times
    PromptCounts  prompts.jsonl: prepared prompts, the pre-tokenized ones and their ids

Records are added one list per field (:class:`Fields`), from a block read here or from the
columns of a cached scan, so both paths count alike.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple, TypeGuard

import msgspec

from workbench.rundir import prompt_scan
from workbench.rundir.columns import FileScan
from workbench.rundir.cursor import text_lines
from workbench.rundir.records import Block

__all__ = ["PERCENTILES", "ErrorCounts", "Fields", "IdIndex", "ModeCounts", "ModeTally",
           "PromptCounts", "RawCounts", "TurnCounts", "nearest_ranks"]

PERCENTILES = (50, 90, 99)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SERIALS = itertools.count()


class IdIndex:
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


class RawCounts:
    """Everything counted from raw_responses.jsonl."""

    def __init__(self, recent_rows: int, *, mixing: bool = False) -> None:
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
        self.ids = IdIndex()
        self.turns = TurnCounts()
        self.modes = ModeCounts()
        self.mixing = mixing  # run.json says the dataset mixes modes: count them from the start
        self.first_ts: float | None = None
        self.window: deque[tuple[float, int]] = deque()
        self.last: deque[tuple[bool, bool, str | None]] = deque(maxlen=recent_rows)
        self._percentiles: tuple[int, tuple[int | None, ...], int | None] | None = None
        self._recent: tuple[int, tuple[int, ...]] | None = None

    def add_block(self, block: Block, cutoff: float, unresolved: set[object]) -> None:
        bad_lines = sum(1 for p in block.problems if p.kind != "torn")
        torn = any(p.kind == "torn" for p in block.problems)
        rows = block.rows
        fields = Fields(*([getattr(row, name) for row in rows] for name in Fields._fields))
        self.add_fields(fields, bad_lines, torn, cutoff, unresolved)

    def add_scan(self, scan: FileScan, cutoff: float, unresolved: set[object]) -> None:
        """Count the records of a scan (see :func:`workbench.analyze.scan.scan_run`)."""
        c = scan.columns
        counts = scan.tally.counts
        bad_lines = counts.get("parse_error", 0) + counts.get("bad_type", 0)
        fields = Fields(c.sample_id, c.layout, c.prompt_tokens, c.completion_tokens,
                         c.cached_tokens, c.finish_reason, c.ts, c.turn, c.ended, c.mode)
        self.add_fields(fields, bad_lines, scan.torn is not None, cutoff, unresolved)

    def add_fields(self, fields: Fields, bad_lines: int, torn: bool, cutoff: float,
                   unresolved: set[object]) -> None:
        """Count records given as one list per field, in file order."""
        if not self.modes.active and (self.mixing or any(m is not None for m in fields.mode)):
            self.modes.start(self.records, self.completion_tokens, self.completions)
        self.records += len(fields.layout)
        self.bad_lines += bad_lines
        self.torn = torn
        self._add_counts(fields)
        self._add_labels(fields, unresolved)
        self._add_times(fields, cutoff)
        self.turns.add(fields)
        self.modes.add(fields)
        size = self.last.maxlen or 1
        self.last.extend(zip((c is None for c in fields.completion_tokens[-size:]),
                             (p is None for p in fields.prompt_tokens[-size:]),
                             fields.finish_reason[-size:]))

    def _add_counts(self, fields: Fields) -> None:
        completions = [c for c in fields.completion_tokens if c is not None]
        low, high = _INT64  # JSON allows any integer: kept in 64 bits for the percentiles
        self.completions.extend([min(max(c, low), high) for c in completions])
        self.completion_tokens += sum(completions)
        prompts = [p for p in fields.prompt_tokens if p is not None]
        self.prompt_tokens += sum(prompts)
        self.prompt_counted += len(prompts)
        self.cached_tokens += sum(c for c in fields.cached_tokens if c is not None)

    def _add_labels(self, fields: Fields, unresolved: set[object]) -> None:
        for counts, values in ((self.reasons, fields.finish_reason), (self.layouts, fields.layout)):
            for value, count in Counter(values).items():
                key = "missing" if value is None else value
                counts[key] = counts.get(key, 0) + count
        self.ids.extend(fields.sample_id)
        if unresolved:
            unresolved.difference_update(fields.sample_id)

    def _add_times(self, fields: Fields, cutoff: float) -> None:
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
            values, top = nearest_ranks([self.completions])
            self._percentiles = (len(self.completions), values, top)
        return self._percentiles[1], self._percentiles[2]


def nearest_ranks(arrays: Sequence[array[int]]) -> tuple[tuple[int | None, ...], int | None]:
    """Nearest-rank percentiles and the max over the values of several arrays."""
    size = sum(len(a) for a in arrays)
    if size == 0:
        return (None,) * len(PERCENTILES), None
    import numpy as np

    values = np.concatenate([np.frombuffer(a, dtype=np.int64) for a in arrays if len(a)])
    ranks = [max(1, math.ceil(p / 100 * size)) - 1 for p in PERCENTILES]
    values.partition(ranks)
    return tuple(int(values[k]) for k in ranks), int(values.max())


class Fields(NamedTuple):
    """What the counts need of records: one list per field, in file order."""

    sample_id: Sequence[object]
    layout: Sequence[str]
    prompt_tokens: Sequence[int | None]
    completion_tokens: Sequence[int | None]
    cached_tokens: Sequence[int | None]
    finish_reason: Sequence[str | None]
    ts: Sequence[float | None]
    turn: Sequence[int | None]
    ended: Sequence[str | None]
    mode: Sequence[str | None]


class TurnCounts:
    """The records with a turn (conversations regenerated turn by turn, ``turns: each``).

    ``per_conversation`` counts each sample id's turn records (a repeated (sample id, turn)
    counted twice, as records are); ``by_turn`` holds per turn index [records, completion
    tokens] (records without a completion count add none); ``ended`` counts the reasons
    conversations ended for (the ``ended`` of their records).
    """

    def __init__(self) -> None:
        self.records = 0
        self.per_conversation: dict[object, int] = {}
        self.by_turn: dict[int, list[int]] = {}
        self.ended: dict[str, int] = {}

    def add(self, fields: Fields) -> None:
        """Count the records of fields that have a turn (nothing for single-turn ones)."""
        if not any(turn is not None for turn in fields.turn):
            return
        for sample_id, turn, tokens, ended in zip(fields.sample_id, fields.turn,
                                                  fields.completion_tokens, fields.ended,
                                                  strict=True):
            if turn is None:
                continue
            self.records += 1
            self.per_conversation[sample_id] = self.per_conversation.get(sample_id, 0) + 1
            counts = self.by_turn.setdefault(turn, [0, 0])
            counts[0] += 1
            counts[1] += tokens or 0
            if ended is not None:
                self.ended[ended] = self.ended.get(ended, 0) + 1


class ModeTally:
    """One mode's records: how many, those with a completion count (``counted``, their
    counts in ``completions``, in 64 bits as :class:`RawCounts` keeps them) and their
    completion tokens, and the sample ids of its records with a turn (its conversations)."""

    def __init__(self) -> None:
        self.records = 0
        self.completion_tokens = 0
        self.completions = array("q")
        self.conversations: set[object] = set()
        self._median: tuple[int, int | None] | None = None

    @property
    def counted(self) -> int:
        return len(self.completions)

    def median(self) -> int | None:
        """The nearest-rank median of the completion counts (``workbench stats``' p50),
        cached until new ones arrive."""
        if self._median is None or self._median[0] != len(self.completions):
            self._median = (len(self.completions), nearest_ranks([self.completions])[0][0])
        return self._median[1]


class ModeCounts:
    """The records of a dataset that mixes modes, per mode (``mode``; None: records without
    one).

    Counting starts once the dataset is known to mix modes (run.json says so, or a record
    names a mode): :meth:`start` then puts every record counted before under None, so the
    tallies always cover every record of the file.
    """

    def __init__(self) -> None:
        self.active = False
        self.by_mode: dict[str | None, ModeTally] = {}

    def start(self, records: int, completion_tokens: int, completions: array[int]) -> None:
        """Start counting; the records already counted (`records`, with these completion
        counts and tokens) had no mode."""
        self.active = True
        if records:
            earlier = self.by_mode.setdefault(None, ModeTally())
            earlier.records += records
            earlier.completion_tokens += completion_tokens
            earlier.completions.extend(completions)

    def add(self, fields: Fields) -> None:
        """Count the records of fields by their mode (nothing before :meth:`start`)."""
        if not self.active:
            return
        low, high = _INT64
        for sample_id, mode, tokens, turn in zip(fields.sample_id, fields.mode,
                                                 fields.completion_tokens, fields.turn,
                                                 strict=True):
            tally = self.by_mode.get(mode)
            if tally is None:
                tally = self.by_mode[mode] = ModeTally()
            tally.records += 1
            if tokens is not None:
                tally.completion_tokens += tokens
                tally.completions.append(min(max(tokens, low), high))
            if turn is not None:
                tally.conversations.add(sample_id)


class _ErrorLine(msgspec.Struct):
    sample_id: int | str | None = None
    ts: float | None = None


_ERROR_DECODER = msgspec.json.Decoder(_ErrorLine)


class ErrorCounts:
    """Lines of errors.jsonl: how many, which ids, and the recent ones' times."""

    def __init__(self) -> None:
        self.lines = 0
        self.ids: set[object] = set()
        self.window: deque[float] = deque()

    def add(self, data: bytes, cutoff: float) -> list[object]:
        """Count the lines; return the ids not seen before."""
        new: list[object] = []
        for text in text_lines(data):
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


class PromptCounts:
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
