"""Format validation of a run's outputs: rules over every record, findings per dataset.

Each rule has a stable id and a default severity (:data:`SEVERITY`, the one table of them).
Rules that are a matter of degree become errors above a rate (:class:`Thresholds`): a few
truncated replies are normal, a tenth of them means ``max_new_tokens`` is too small.

    rule                  default   what it counts (file)
    parse_error           error     lines that are not JSON objects (raw, prompts)
    torn_line             warning   a last line without newline: a writer died or is writing
    missing_field         error     records where a contract field cannot be read (flat records
                                    need every field; older layouts the ids, counts and finish)
    legacy_layout         info      records in the chat-completions or meta_info layout
    bad_type              error     lines whose known fields hold the wrong type
    duplicate_sample_id   error     a sample_id seen before in the same file (raw, prompts)
    missing_response      warning   a prepared prompt with no record (prompts)
    unsent_budget         info      a prepared prompt with no record in a dataset whose
                                    max_tokens budget stopped it (run.json budget_reached)
    orphan_response       warning   a record whose sample_id is not a prepared prompt
    no_prompts            warning   prompts.jsonl is absent: the two rules above cannot run
    token_count_mismatch  warning   completion_tokens != len(output_ids); some SGLang versions
                                    prepend prompt-suffix ids, so the example gives the difference
    truncated             warning   finish_reason "length"; error above truncated_error_rate.
                                    The example says when the cut fell inside the reasoning.
    empty_output          warning   no output ids, or only end ids
    aborted               warning   finish_reason "abort"
    reasoning_unclosed    warning   a reply that ended (not "length", not "abort") with no
                                    think-end id; a reply cut by "length" inside its reasoning
                                    is `truncated`, not this
    empty_answer          warning   nothing between the think-end id and the end id (or the
                                    end of a reply that ended)
    stray_think_start     warning   more think-start ids than the template allows: none when
                                    the template opens the reasoning (Kimi), one otherwise (Qwen3)
    stray_think_end       warning   more than one think-end id
    id_out_of_vocab       error     an output id outside [0, vocab_size)

The reasoning rules run when the model profile has a think-end id and the dataset did not
switch thinking off (its ``chat_template_kwargs`` set the profile's thinking argument to
false). Per-record rules live in :class:`RecordChecker`, which the export's filters use too.

Large files are cut into byte ranges at line starts and checked by worker processes; every
range streams its blocks, so memory stays bounded by the block size times the workers (plus
one small entry per record: its columns, the sample id for the duplicate and orphan rules).

:func:`scan_run` is that one pass over a run, keeping per record what the reports draw (the
columns of :class:`~workbench.rundir.columns.Columns`: counts, finish reason, times, the reasoning
split, the rules failed) next to the findings; :func:`validate_run` is its report. The scan of
each file is cached beside it, and a file that grew is read from where the last scan stopped
(see :mod:`workbench.rundir.columns`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple, TypeAlias

import msgspec
import numpy as np

from workbench.errors import ConfigError, DataError
from workbench.profiles import ModelProfile, get_profile
from workbench.rundir import prompt_scan
from workbench.rundir.columns import Columns, FileScan, Tally, cache_key, load_cached, save_cached
from workbench.rundir.records import MANIFEST_FILE, PROMPTS_FILE, RAW_FILE, Block, Row, iter_blocks

__all__ = [
    "DEFAULT_PROFILE",
    "RECORD_RULES",
    "SEVERITY",
    "DatasetDir",
    "DatasetReport",
    "Example",
    "Finding",
    "RecordChecker",
    "RunInfo",
    "RunScan",
    "Thresholds",
    "ValidationReport",
    "exit_code",
    "failed_rules",
    "format_report",
    "load_run",
    "paused_gc",
    "reasoning_expected",
    "record_failures",
    "record_problems",
    "rule_bit",
    "scan_run",
    "validate_run",
]

Severity: TypeAlias = Literal["error", "warning", "info"]
SampleId: TypeAlias = int | str

DEFAULT_PROFILE = "kimi-k2.5"

SEVERITY: dict[str, Severity] = {
    "parse_error": "error",
    "torn_line": "warning",
    "missing_field": "error",
    "legacy_layout": "info",
    "bad_type": "error",
    "duplicate_sample_id": "error",
    "missing_response": "warning",
    "unsent_budget": "info",
    "orphan_response": "warning",
    "no_prompts": "warning",
    "token_count_mismatch": "warning",
    "truncated": "warning",
    "empty_output": "warning",
    "aborted": "warning",
    "reasoning_unclosed": "warning",
    "empty_answer": "warning",
    "stray_think_start": "warning",
    "stray_think_end": "warning",
    "id_out_of_vocab": "error",
}

RECORD_RULES: tuple[str, ...] = (
    "missing_field",
    "token_count_mismatch",
    "truncated",
    "aborted",
    "empty_output",
    "id_out_of_vocab",
    "reasoning_unclosed",
    "stray_think_end",
    "empty_answer",
    "stray_think_start",
)

_PROBLEM_RULES = {"malformed": "parse_error", "not_object": "parse_error",
                  "bad_type": "bad_type", "torn": "torn_line"}
_PROMPT_RULES = {**_PROBLEM_RULES, "no_id": "missing_field",
                 "duplicate_id": "duplicate_sample_id"}  # prompt_scan's problem kinds
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
_RULE_ORDER = {rule: index for index, rule in enumerate(SEVERITY)}
_MB = 1 << 20
MIN_RANGE_BYTES = 32 * _MB  # a file is cut into ranges of at least this size for the workers
SCAN_BLOCK_BYTES = 256 << 10  # small blocks: the ids are checked while still in the CPU cache


class Thresholds(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Rates (share of a dataset's records, or prompts for missing_response) above which a
    rule is an error whatever its default severity; 1.0 never escalates."""

    truncated_error_rate: float = 0.05
    empty_output_error_rate: float = 0.01
    aborted_error_rate: float = 0.01
    reasoning_unclosed_error_rate: float = 0.02
    empty_answer_error_rate: float = 0.02
    stray_think_start_error_rate: float = 0.02
    stray_think_end_error_rate: float = 0.02
    token_count_mismatch_error_rate: float = 1.0
    missing_response_error_rate: float = 1.0
    orphan_response_error_rate: float = 1.0
    max_examples: int = 5

    def error_rate(self, rule: str) -> float | None:
        """The escalation rate of rule, or None when it has none."""
        value = getattr(self, f"{rule}_error_rate", None)
        return value if isinstance(value, float) else None


# --- results ---------------------------------------------------------------------------------


class Example(msgspec.Struct):
    """Where a rule fired: a line of `file` (raw_responses.jsonl or prompts.jsonl)."""

    line: int
    detail: str
    file: str = RAW_FILE


class Finding(msgspec.Struct):
    """One rule's result for a dataset; `rate` is count over records (prompts when missing)."""

    rule: str
    severity: Severity
    count: int
    examples: list[Example]
    rate: float | None = None


class DatasetReport(msgspec.Struct):
    ok: bool
    records: int
    prompts: int | None
    findings: list[Finding]


class ValidationReport(msgspec.Struct):
    ok: bool
    model_profile: str
    datasets: dict[str, DatasetReport]

    def to_builtins(self) -> dict[str, Any]:
        """The report as JSON-ready dicts: {"ok", "model_profile", "datasets": {...}}."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


def exit_code(report: ValidationReport, *, strict: bool = False) -> int:
    """0 unless strict and some finding is an error, then 1 (bad input raises instead)."""
    return 1 if strict and not report.ok else 0


# --- per-record rules ------------------------------------------------------------------------

_REQUIRED = ("sample_id", "output_ids", "prompt_tokens", "completion_tokens", "finish_reason")
_REQUIRED_FLAT = (*_REQUIRED, "cached_tokens", "e2e_latency", "ts")
_ENDED_EARLY = ("length", "abort")


def _missing_fields(row: Row) -> list[str]:
    """Contract fields of row that could not be read."""
    if (
        row.sample_id is not None and row.output_ids is not None and row.prompt_tokens is not None
        and row.completion_tokens is not None and row.finish_reason is not None
        and (row.layout != "flat" or (row.cached_tokens is not None
                                      and row.e2e_latency is not None and row.ts is not None))
    ):
        return []
    names = _REQUIRED_FLAT if row.layout == "flat" else _REQUIRED
    return [name for name in names if getattr(row, name) is None]


class _IdStats(NamedTuple):
    """Per-row facts about the output ids of a batch of rows, found with a few array passes.

    Positions are within the row's ids; -1 when absent. `after_end` is the id right after the
    first think-end id (-1 when there is none).
    """

    bad_vocab: list[int]
    end_count: list[int]
    end_first: list[int]
    after_end: list[int]
    start_count: list[int]


class _Flat(NamedTuple):
    """The ids of a batch of rows in one array; row i holds ids[starts[i]:ends[i]]."""

    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, id_lists: Sequence[list[int]]) -> _Flat:
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ends = np.cumsum(lengths)
        flat: list[int] = []
        for ids in id_lists:
            flat.extend(ids)
        try:
            array = np.fromiter(flat, dtype=np.int64, count=len(flat))
        except OverflowError:  # beyond 64 bits: out of any vocabulary, so clip
            array = np.array([min(max(i, -1), 1 << 62) for i in flat], dtype=np.int64)
        return cls(array, ends - lengths, ends)

    def locate(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat positions where mask holds, and the row of each."""
        positions = np.flatnonzero(mask)
        return positions, np.searchsorted(self.ends, positions, side="right")

    def first_where(self, mask: np.ndarray) -> np.ndarray:
        """Per row, the position (within the row) of the first id where mask holds, or -1."""
        positions, rows = self.locate(mask)
        first = np.full(len(self.ends), -1, dtype=np.int64)
        unique, index = np.unique(rows, return_index=True)
        first[unique] = positions[index] - self.starts[unique]
        return first

    def count_where(self, mask: np.ndarray) -> list[int]:
        """Per row, how many ids mask holds for."""
        counts: list[int] = np.bincount(self.locate(mask)[1], minlength=len(self.ends)).tolist()
        return counts

    def after(self, position: np.ndarray) -> list[int]:
        """Per row, the id after the row position (-1 for none: no position, or the end)."""
        following = np.full(len(self.ends), -1, dtype=np.int64)
        rows = np.flatnonzero(position >= 0)
        flat = self.starts[rows] + position[rows] + 1
        inside = flat < self.ends[rows]
        following[rows[inside]] = self.ids[flat[inside]]
        ids: list[int] = following.tolist()
        return ids


def _id_stats(id_lists: Sequence[list[int]], checker: RecordChecker) -> _IdStats:
    if not id_lists:
        return _IdStats([], [], [], [], [])
    flat = _Flat.of(id_lists)
    ids, n = flat.ids, len(id_lists)
    bad_vocab = flat.first_where((ids >= checker.vocab_size) | (ids < 0)).tolist()
    profile = checker.profile
    if not checker.reasoning:
        return _IdStats(bad_vocab, [0] * n, [-1] * n, [-1] * n, [0] * n)
    is_end = ids == profile.think_end
    end_first = flat.first_where(is_end)
    start_count = [0] * n if profile.think_start is None else flat.count_where(ids == profile.think_start)
    return _IdStats(bad_vocab, flat.count_where(is_end), end_first.tolist(), flat.after(end_first),
                    start_count)


class RecordChecker:
    """The per-record rules for one model profile; rows must be read with output ids.

    `reasoning` False skips the reasoning rules (thinking switched off); `vocab_size`
    defaults to the profile's. :meth:`check_rows` looks at the ids of a batch of rows with a
    few numpy passes (no Python loop over ids); the rules themselves are
    :meth:`_row_problems`, written once for validation and the export's filters.
    """

    def __init__(
        self, profile: ModelProfile, *, vocab_size: int | None = None, reasoning: bool = True
    ) -> None:
        self.profile = profile
        self.vocab_size = vocab_size if vocab_size is not None else profile.vocab_size
        self.reasoning = reasoning and profile.think_end is not None
        ends = (*profile.end_ids, *(() if profile.eos_id is None else (profile.eos_id,)))
        self.end_ids = frozenset(ends)
        self.starts_allowed = 0 if profile.think_in_template else 1

    def failures(self, row: Row) -> set[str]:
        """The ids of the per-record rules row fails."""
        return {rule for rule, _ in self.problems(row)}

    def problems(self, row: Row) -> list[tuple[str, str]]:
        """(rule, detail) for every per-record rule row fails, in RECORD_RULES order."""
        return self.check_rows([row])[0]

    def check_rows(self, rows: Sequence[Row]) -> list[list[tuple[str, str]]]:
        """The problems of each row (see :meth:`problems`), the ids of all checked at once."""
        return self._check(rows)[0]

    def _check(self, rows: Sequence[Row]) -> tuple[list[list[tuple[str, str]]], _IdStats]:
        """The problems of each row and the facts about their ids."""
        stats = _id_stats([row.output_ids or [] for row in rows], self)
        return [self._row_problems(row, stats, index) for index, row in enumerate(rows)], stats

    def split(self, ids: list[int] | None, end_first: int) -> tuple[int | None, int | None, bool | None]:
        """(reasoning tokens, answer tokens, closed) of one reply whose first think-end id is
        at end_first (-1: none). Ids before it are reasoning, ids after it the answer;
        trailing end ids count in neither. Without reasoning the whole reply is answer."""
        if ids is None:
            return None, None, None
        body = len(ids)
        while body and ids[body - 1] in self.end_ids:
            body -= 1
        if not self.reasoning:
            return 0, body, None
        if end_first < 0:
            return body, 0, False
        return end_first, max(0, body - end_first - 1), True

    def _row_problems(self, row: Row, stats: _IdStats, i: int) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        missing = _missing_fields(row)
        if missing:
            found.append(("missing_field", "cannot read " + ", ".join(missing)))
        ids = row.output_ids
        finish = row.finish_reason
        if ids is not None and row.completion_tokens is not None and len(ids) != row.completion_tokens:
            found.append(("token_count_mismatch", _count_detail(len(ids), row.completion_tokens)))
        if finish == "length":
            found.append(("truncated", self._truncated_detail(ids, stats.end_first[i])))
        elif finish == "abort":
            found.append(("aborted", f"finish_reason abort after {_count(ids)} ids"))
        if ids is None or self._empty(ids, found):
            return found
        if stats.bad_vocab[i] >= 0:
            position = stats.bad_vocab[i]
            detail = (f"output_ids[{position}] = {ids[position]} outside "
                      f"[0, {self.vocab_size}) of {self.profile.name}")
            found.append(("id_out_of_vocab", detail))
        if self.reasoning:
            self._reasoning_problems(ids, finish, stats, i, found)
        return found

    def _empty(self, ids: list[int], found: list[tuple[str, str]]) -> bool:
        """Record empty_output; True when the ids hold nothing but end ids."""
        if ids and (len(ids) > 4 or not self.end_ids.issuperset(ids)):
            return False
        found.append(("empty_output", f"output_ids {ids}"))
        return True

    def _truncated_detail(self, ids: list[int] | None, end_first: int) -> str:
        detail = f"finish_reason length after {_count(ids)} ids"
        if self.reasoning and ids is not None and end_first < 0:
            detail += ", inside the reasoning (no think-end id)"
        return detail

    def _reasoning_problems(
        self, ids: list[int], finish: str | None, stats: _IdStats, i: int,
        found: list[tuple[str, str]],
    ) -> None:
        end, start = self.profile.think_end, self.profile.think_start
        assert end is not None
        first, ended = stats.end_first[i], finish not in _ENDED_EARLY
        if first < 0 and ended:
            detail = f"finish_reason {finish} after {len(ids)} ids, no think-end id {end}"
            found.append(("reasoning_unclosed", detail))
        if stats.end_count[i] > 1:
            detail = (f"{stats.end_count[i]} think-end ids {end} "
                      f"(at {first} and {ids.index(end, first + 1)})")
            found.append(("stray_think_end", detail))
        if first >= 0 and ended and (stats.after_end[i] < 0 or stats.after_end[i] in self.end_ids):
            detail = f"nothing after the think-end id at {first} of {len(ids)} ids"
            found.append(("empty_answer", detail))
        if start is not None and stats.start_count[i] > self.starts_allowed:
            detail = (f"{stats.start_count[i]} think-start ids {start} (first at "
                      f"{ids.index(start)}), the template allows {self.starts_allowed}")
            found.append(("stray_think_start", detail))


def _count_detail(length: int, completion: int) -> str:
    diff = length - completion
    hint = " (prepended prompt-suffix ids?)" if diff > 0 else ""
    return f"len(output_ids) {length} vs completion_tokens {completion} ({diff:+d}){hint}"


def _count(ids: list[int] | None) -> str:
    return "?" if ids is None else str(len(ids))


@functools.lru_cache(maxsize=32)
def _checker(profile: ModelProfile, vocab_size: int | None, reasoning: bool) -> RecordChecker:
    return RecordChecker(profile, vocab_size=vocab_size, reasoning=reasoning)


def record_problems(
    row: Row, profile: ModelProfile, vocab_size: int | None = None, *, reasoning: bool = True
) -> list[tuple[str, str]]:
    """(rule, detail) for each per-record rule row (read with output ids) fails."""
    return _checker(profile, vocab_size, reasoning).problems(row)


def record_failures(
    row: Row, profile: ModelProfile, vocab_size: int | None = None, *, reasoning: bool = True
) -> set[str]:
    """The ids of the per-record rules row (read with output ids) fails."""
    return _checker(profile, vocab_size, reasoning).failures(row)


def reasoning_expected(profile: ModelProfile, chat_template_kwargs: Mapping[str, Any]) -> bool:
    """Whether replies should hold reasoning: a reasoning profile, thinking not switched off."""
    if profile.think_end is None:
        return False
    kwarg = profile.thinking_kwarg
    return not (kwarg is not None and chat_template_kwargs.get(kwarg) is False)


# --- the run directory -----------------------------------------------------------------------


class DatasetDir(msgspec.Struct):
    """One dataset folder of a run; `settings` is its run.json entry ({} when absent)."""

    name: str
    folder: Path
    settings: dict[str, Any]

    @property
    def raw_path(self) -> Path:
        return self.folder / RAW_FILE

    @property
    def prompts_path(self) -> Path:
        return self.folder / PROMPTS_FILE

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        kwargs = self.settings.get("chat_template_kwargs")
        return kwargs if isinstance(kwargs, dict) else {}


class RunInfo(msgspec.Struct):
    """A run directory: its run.json ({} when absent) and its dataset folders."""

    out: Path
    manifest: dict[str, Any]
    datasets: list[DatasetDir]

    @property
    def profile_name(self) -> str:
        name = self.manifest.get("model_profile")
        return name if isinstance(name, str) else DEFAULT_PROFILE

    def profile(self, override: str | None = None) -> ModelProfile:
        """The override, else run.json's model_profile, else kimi-k2.5."""
        if override is not None:
            return get_profile(override, "--model-profile")
        return get_profile(self.profile_name, f"{self.out / MANIFEST_FILE}: model_profile")


def load_run(out: str | os.PathLike[str], only: Sequence[str] = ()) -> RunInfo:
    """The datasets of run directory `out`: run.json's, then any other folder holding records.

    A folder that itself holds raw_responses.jsonl is a run of one dataset named after it.
    DataError when out is not a directory, run.json is not a JSON object or there is no
    dataset; ConfigError for a name in `only` that is not a dataset.
    """
    root = Path(out)
    if not root.is_dir():
        raise DataError(root, "not a directory (expected a run's output directory)")
    manifest = _read_manifest(root / MANIFEST_FILE)
    datasets = _find_datasets(root, manifest)
    if not datasets:
        raise DataError(root, f"no datasets: expected <name>/{RAW_FILE} or {MANIFEST_FILE}")
    return RunInfo(root, manifest, _select(datasets, only))


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DataError(path, f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(path, "expected a JSON object")
    return data


def _find_datasets(root: Path, manifest: Mapping[str, Any]) -> list[DatasetDir]:
    if (root / RAW_FILE).is_file() and not manifest:
        return [DatasetDir(root.resolve().name, root, {})]
    entries = manifest.get("datasets")
    entries = entries if isinstance(entries, dict) else {}
    found = [DatasetDir(str(name), root / str(name), value if isinstance(value, dict) else {})
             for name, value in entries.items()]
    listed = set(entries)
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in listed):
        if (folder / RAW_FILE).is_file() or (folder / PROMPTS_FILE).is_file():
            found.append(DatasetDir(folder.name, folder, {}))
    return found


def _select(datasets: list[DatasetDir], only: Sequence[str]) -> list[DatasetDir]:
    if not only:
        return datasets
    names = [ds.name for ds in datasets]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ConfigError("--only", f"unknown dataset {unknown[0]!r} (known: {', '.join(names)})")
    return [ds for ds in datasets if ds.name in only]


# --- tallying --------------------------------------------------------------------------------


_RULE_BITS = {rule: 1 << index for index, rule in enumerate(RECORD_RULES)}


def failed_rules(mask: int) -> list[str]:
    """The per-record rules of a :class:`~workbench.rundir.columns.Columns` ``failed`` mask."""
    return [rule for rule, bit in _RULE_BITS.items() if mask & bit]


def rule_bit(rule: str) -> int:
    """The bit of a per-record rule in a ``failed`` mask (see :func:`failed_rules`)."""
    return _RULE_BITS[rule]


@dataclass(frozen=True, slots=True)
class _RangeJob:
    path: str
    start: int
    end: int
    last: bool
    checker: RecordChecker
    max_examples: int


def _scan_range(job: _RangeJob) -> FileScan:
    """Check every record whose line starts in [job.start, job.end); run in a worker.

    The last range reads to the end of the file (a torn last line included); another range
    stops inside the block that crosses its end, counting that block's lines up to it.
    """
    part = FileScan(Tally(job.max_examples), end_offset=job.start if job.last else job.end)
    blocks = iter_blocks(job.path, offset=job.start, with_output_ids=True,
                         block_bytes=SCAN_BLOCK_BYTES)
    with paused_gc():
        for block in blocks:
            if not job.last and block.start_offset >= job.end:
                break
            lines = block.first_line - 1 + block.lines
            if not job.last and block.end_offset > job.end:
                lines = block.first_line - 1 + _count_lines(job.path, block.start_offset, job.end)
            _scan_block(block, lines, job.checker, part)
            part.lines = max(part.lines, lines)
            if job.last:
                part.end_offset = block.end_offset
    return part


def _scan_block(block: Block, lines: int, checker: RecordChecker, part: FileScan) -> None:
    """Tally the block's problems and rows up to line `lines` (a torn line after it too),
    and add the rows' columns."""
    add = part.tally.add
    for problem in block.problems:
        if problem.kind == "torn":
            part.torn = (problem.line, problem.detail)
        elif problem.line <= lines:
            add(_PROBLEM_RULES[problem.kind], problem.line, problem.detail)
    if block.lines:
        part.blocks.append((block.first_line, block.start_offset))
    bad_type = {p.line for p in block.problems if p.kind == "bad_type"}
    rows = [row for row in block.rows if row.line <= lines]
    part.records += len(rows)
    found, stats = checker._check(rows)
    for row, problems in zip(rows, found, strict=True):
        if row.layout != "flat":
            add("legacy_layout", row.line, f"{row.layout} layout")
        for rule, detail in problems:
            if rule != "missing_field" or row.line not in bad_type:
                add(rule, row.line, detail)
    _add_columns(part.columns, rows, found, stats.end_first, checker)


def _add_columns(
    columns: Columns, rows: list[Row], found: list[list[tuple[str, str]]], end_first: list[int],
    checker: RecordChecker,
) -> None:
    columns.line.extend(row.line for row in rows)
    columns.sample_id.extend(row.sample_id for row in rows)
    columns.layout.extend(row.layout for row in rows)
    columns.prompt_tokens.extend(row.prompt_tokens for row in rows)
    columns.completion_tokens.extend(row.completion_tokens for row in rows)
    columns.cached_tokens.extend(row.cached_tokens for row in rows)
    columns.finish_reason.extend(row.finish_reason for row in rows)
    columns.ts.extend(row.ts for row in rows)
    columns.e2e_latency.extend(row.e2e_latency for row in rows)
    columns.output_len.extend(None if row.output_ids is None else len(row.output_ids)
                              for row in rows)
    for row, first in zip(rows, end_first, strict=True):
        reasoning, answer, closed = checker.split(row.output_ids, first)
        columns.reasoning_tokens.append(reasoning)
        columns.answer_tokens.append(answer)
        columns.closed.append(closed)
    bits = _RULE_BITS
    columns.failed.extend(sum({bits[rule] for rule, _ in problems}) for problems in found)


def _count_lines(path: str, start: int, end: int) -> int:
    """Newlines in bytes [start, end) of path."""
    count = 0
    with open(path, "rb") as file:
        file.seek(start)
        left = end - start
        while left > 0 and (data := file.read(min(left, 8 * _MB))):
            count += data.count(b"\n")
            left -= len(data)
    return count


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection while blocks of id lists stream by: they hold no reference
    cycles, and collections would walk every list (validation and export use it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- planning and running ranges -------------------------------------------------------------



def _line_start_at_or_after(file: BinaryIO, position: int, size: int) -> int:
    """The first line start at or after position (size when none)."""
    if position <= 0:
        return 0
    file.seek(position - 1)
    offset = position - 1
    while data := file.read(1 << 16):
        found = data.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(data)
    return size


def _plan_ranges(path: Path, parts: int, start: int = 0) -> list[tuple[int, int]]:
    """About `parts` byte ranges of path from the line start `start`, each at a line start."""
    size = path.stat().st_size
    parts = max(1, min(parts, (size - start) // MIN_RANGE_BYTES))
    with open(path, "rb") as file:
        cuts = sorted({start, *(_line_start_at_or_after(file, start + (size - start) * k // parts,
                                                        size) for k in range(1, parts))})
    cuts = [c for c in cuts if c < size] or [start]
    return list(zip(cuts, [*cuts[1:], size], strict=True))  # the last one ends at size


def _default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 16))


@contextlib.contextmanager
def _job_runner(jobs: list[_RangeJob], workers: int) -> Iterator[Iterator[FileScan]]:
    """The jobs' scans, in order, as they finish: computed lazily in this process, or
    started at once in worker processes when that pays (so the caller can work meanwhile)."""
    if workers <= 1 or len(jobs) <= 1 or sum(j.end - j.start for j in jobs) < MIN_RANGE_BYTES:
        yield map(_scan_range, jobs)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        yield pool.map(_scan_range, jobs)


class _File(NamedTuple):
    """A raw file to scan: its checker, its cache key, and what is known of it already."""

    path: Path
    checker: RecordChecker
    key: str
    known: FileScan
    offset: int
    cached: bool


def _file(path: Path, checker: RecordChecker, thresholds: Thresholds, cache: bool) -> _File:
    """The file with its cached scan (when `cache` and one fits), else an empty one."""
    if path.exists() and not path.is_file():
        raise DataError(path, "cannot read: not a regular file")
    key = cache_key(checker.profile, checker.vocab_size, checker.reasoning, thresholds.max_examples)
    found = load_cached(path, key) if cache else None
    if found is None:
        return _File(path, checker, key, FileScan(Tally(thresholds.max_examples)), 0, False)
    return _File(path, checker, key, found[0], found[1], True)


def _plan_jobs(files: Sequence[_File], workers: int) -> tuple[list[_RangeJob], list[int]]:
    """The range jobs of what is new in the raw files, and the index of each one's file."""
    jobs: list[_RangeJob] = []
    owners: list[int] = []
    for index, file in enumerate(files):
        if not file.path.is_file() or file.path.stat().st_size <= file.offset:
            continue
        ranges = _plan_ranges(file.path, workers, file.offset)
        for number, (start, end) in enumerate(ranges, start=1):
            last = number == len(ranges)
            jobs.append(_RangeJob(str(file.path), start, end, last, file.checker,
                                  file.known.tally.max_examples))
            owners.append(index)
    return jobs, owners


def _merged(parts: Iterator[FileScan], owners: list[int], files: Sequence[_File]) -> list[FileScan]:
    """One scan per file: what was known, then the new parts in order."""
    merged = [file.known for file in files]
    for owner, part in zip(owners, parts, strict=True):
        merged[owner].merge(part)
    return merged


def _save(files: Sequence[_File], scans: Sequence[FileScan], owners: list[int]) -> None:
    """Cache every scan that read something new (or had no cache yet)."""
    for index, (file, scan) in enumerate(zip(files, scans, strict=True)):
        if file.path.is_file() and (index in owners or not file.cached):
            save_cached(file.path, file.key, scan, scan.end_offset)


# --- sample ids: duplicates, missing and orphan responses ------------------------------------


@dataclass(slots=True)
class _Prompts:
    lines: dict[SampleId, int]
    tally: Tally


def _read_prompts(ds: DatasetDir, thresholds: Thresholds, cache: bool = True) -> _Prompts | None:
    """Each prompt's first line; parse problems and repeats tallied (prompts.jsonl lines),
    from the one read of prompts.jsonl the reports share (see :mod:`workbench.rundir.prompt_scan`)."""
    path = ds.prompts_path
    if not path.is_file():
        return None
    found = prompt_scan.summary(path, cache=cache)
    tally = Tally(thresholds.max_examples)
    for line, kind, detail in found.problems:
        tally.add(_PROMPT_RULES[kind], line, detail)
    return _Prompts(found.first_line_of(), tally)


def _id_findings(
    scan: FileScan, prompts: _Prompts | None, tally: Tally, budget_reached: bool = False
) -> None:
    """Duplicate and orphan records into tally; missing responses into the prompts' tally
    (as `unsent_budget` when the dataset's token budget stopped it)."""
    first_line: dict[SampleId, int] = {}
    for sample_id, line in zip(scan.columns.sample_id, scan.columns.line, strict=True):
        if sample_id is None:
            continue
        seen = first_line.setdefault(sample_id, line)
        if seen != line:
            tally.add("duplicate_sample_id", line, f"sample_id {sample_id!r} also at line {seen}")
        elif prompts is not None and sample_id not in prompts.lines:
            tally.add("orphan_response", line, f"sample_id {sample_id!r} is not a prepared prompt")
    if prompts is not None:
        answered = first_line.keys()
        missing = sorted(line for sid, line in prompts.lines.items() if sid not in answered)
        rule, detail = (("unsent_budget", "not sent: the max_tokens budget was reached")
                        if budget_reached else ("missing_response", "prepared prompt without a record"))
        for line in missing:
            prompts.tally.add(rule, line, detail)


# --- findings --------------------------------------------------------------------------------


def _findings(
    tallies: Iterable[tuple[str, Tally]], records: int, prompts: int | None,
    thresholds: Thresholds,
) -> list[Finding]:
    """Findings of every rule that fired, errors first."""
    counts: dict[str, int] = {}
    examples: dict[str, list[Example]] = {}
    for file, tally in tallies:
        for rule, count in tally.counts.items():
            counts[rule] = counts.get(rule, 0) + count
            examples.setdefault(rule, []).extend(
                Example(line, detail, file) for line, detail in tally.examples[rule])
    found = [_finding(rule, count, examples[rule], records, prompts, thresholds)
             for rule, count in counts.items()]
    return sorted(found, key=lambda f: (_SEVERITY_ORDER[f.severity], _RULE_ORDER[f.rule]))


def _finding(
    rule: str, count: int, examples: list[Example], records: int, prompts: int | None,
    thresholds: Thresholds,
) -> Finding:
    base = prompts if rule in ("missing_response", "unsent_budget") else records
    rate = count / base if base and rule != "no_prompts" else None
    severity = SEVERITY[rule]
    limit = thresholds.error_rate(rule)
    if limit is not None and rate is not None and rate > limit:
        severity = "error"
    return Finding(rule, severity, count, examples[: thresholds.max_examples], rate)


def _dataset_report(
    scan: FileScan, prompts: _Prompts | None, thresholds: Thresholds, budget_reached: bool = False
) -> DatasetReport:
    records = Tally(thresholds.max_examples)
    tallies: list[tuple[str, Tally]] = [(RAW_FILE, scan.tally), (RAW_FILE, records)]
    if scan.torn is not None:
        records.add("torn_line", *scan.torn)
    if prompts is not None:
        tallies.append((PROMPTS_FILE, prompts.tally))
    else:
        absent = Tally(thresholds.max_examples)
        absent.add("no_prompts", 0, "file not found: missing and orphan responses not checked")
        tallies.append((PROMPTS_FILE, absent))
    _id_findings(scan, prompts, records, budget_reached)
    count = len(prompts.lines) if prompts is not None else None
    findings = _findings(tallies, scan.records, count, thresholds)
    ok = not any(f.severity == "error" for f in findings)
    return DatasetReport(ok, scan.records, count, findings)


def _dataset_checker(
    ds: DatasetDir, profile: ModelProfile, vocab_size: int | None
) -> RecordChecker:
    reasoning = reasoning_expected(profile, ds.chat_template_kwargs)
    return RecordChecker(profile, vocab_size=vocab_size, reasoning=reasoning)


@dataclass(frozen=True, slots=True)
class RunScan:
    """One scan of a run: its datasets, the model profile, every raw file's
    :class:`~workbench.rundir.columns.FileScan` (by dataset name) and the validation report."""

    run: RunInfo
    profile: ModelProfile
    files: dict[str, FileScan]
    report: ValidationReport


def scan_run(
    out: str | os.PathLike[str],
    *,
    model_profile: str | None = None,
    thresholds: Thresholds | None = None,
    only: Sequence[str] = (),
    vocab_size: int | None = None,
    workers: int | None = None,
    cache: bool = True,
) -> RunScan:
    """Read every raw file of run directory `out` once: validation and per-record columns.

    The model profile is `model_profile`, else run.json's, else kimi-k2.5. `workers` worker
    processes check large files (default: the CPU count, at most 16; 1 checks in-process).
    With `cache`, each file's scan is kept beside it and only bytes appended since are read
    (see :mod:`workbench.rundir.columns`). DataError/ConfigError for bad input (not a run,
    unreadable run.json, unknown profile).
    """
    thresholds = thresholds or Thresholds()
    run = load_run(out, only)
    profile = run.profile(model_profile)
    workers = workers or _default_workers()
    try:
        files = [_file(ds.raw_path, _dataset_checker(ds, profile, vocab_size), thresholds, cache)
                 for ds in run.datasets]
        jobs, owners = _plan_jobs(files, workers)
        with _job_runner(jobs, workers) as results:
            prompts = [_read_prompts(ds, thresholds, cache) for ds in run.datasets]  # meanwhile
            scans = _merged(results, owners, files)
        if cache:
            _save(files, scans, owners)
    except OSError as exc:
        raise DataError(exc.filename or out, f"cannot read: {exc.strerror or exc}") from None
    reports = {ds.name: _dataset_report(scan, prompt, thresholds,
                                        ds.settings.get("budget_reached") is True)
               for ds, scan, prompt in zip(run.datasets, scans, prompts, strict=True)}
    report = ValidationReport(all(r.ok for r in reports.values()), profile.name, reports)
    return RunScan(run, profile, {ds.name: scan for ds, scan in zip(run.datasets, scans, strict=True)},
                   report)


def validate_run(
    out: str | os.PathLike[str],
    *,
    model_profile: str | None = None,
    thresholds: Thresholds | None = None,
    only: Sequence[str] = (),
    vocab_size: int | None = None,
    workers: int | None = None,
    cache: bool = True,
) -> ValidationReport:
    """Validate every dataset of run directory `out` (see the module docstring for the rules
    and :func:`scan_run` for the arguments)."""
    return scan_run(out, model_profile=model_profile, thresholds=thresholds, only=only,
                    vocab_size=vocab_size, workers=workers, cache=cache).report


# --- text ------------------------------------------------------------------------------------


def format_report(report: ValidationReport) -> str:
    """The report as lines of text for a terminal."""
    lines = [f"model profile {report.model_profile}: {'ok' if report.ok else 'FAILED'}"]
    for name, ds in report.datasets.items():
        prompts = "?" if ds.prompts is None else f"{ds.prompts:,}"
        lines.append(f"{name}: {ds.records:,} records, {prompts} prompts: "
                     f"{'ok' if ds.ok else 'FAILED'}")
        lines.extend(_format_finding(f) for f in ds.findings)
        if not ds.findings:
            lines.append("  no findings")
    return "\n".join(lines)


def _format_finding(finding: Finding) -> str:
    rate = f" ({finding.rate:.1%})" if finding.rate is not None else ""
    head = f"  {finding.severity:<7} {finding.rule:<21} {finding.count:>8,}{rate}"
    examples = [f"      {e.file}:{e.line}: {e.detail}" for e in finding.examples]
    return "\n".join([head, *examples])
