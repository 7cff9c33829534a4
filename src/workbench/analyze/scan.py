"""The one scan of a run: every raw file read once, for validation and for every report.

:func:`scan_run` reads each dataset's raw_responses.jsonl with its output ids, checks every
record against the per-record rules (:mod:`workbench.analyze.rules`), and keeps per record
what the reports draw (the :class:`~workbench.rundir.columns.Columns`: counts, finish reason,
times, the reasoning split, the rules failed; in a dataset that mixes modes the split and
the reasoning rules follow each record's mode) next to the tallies; prompts.jsonl is read
meanwhile (:mod:`workbench.rundir.prompt_scan`), and the findings of each dataset are built
from both (:mod:`workbench.analyze.findings`). A report, the stats of that report and the
explorer then count the very same records.

Each block's output ids come as one array (:func:`~workbench.rundir.reader.iter_blocks` with
``id_arrays``): the format rules and the quality figures (:mod:`workbench.rundir.figures`)
take them from it in the same pass. Large files are cut into byte ranges at line starts and
checked by worker processes; every range streams its blocks, so memory stays bounded by the
block size times the workers (plus one small entry per record: its columns, the sample id
for the duplicate and orphan rules).
The scan of each file is cached beside it, and a file that grew is read from where the last
scan stopped (:mod:`workbench.rundir.columns`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO, NamedTuple

from workbench import loops
from workbench.analyze.findings import ValidationReport, dataset_report, read_prompt_ids
from workbench.analyze.quality import (
    QUALITY_VERSION,
    Decontamination,
    add_quality,
    data_findings,
    prompt_figures,
)
from workbench.analyze.rules import (
    PROBLEM_RULES,
    RECORD_RULES,
    RULE_BITS,
    IdStats,
    RecordChecker,
    Thresholds,
    dataset_checker,
)
from workbench.analyze.turn_prompts import check_turn_prompts
from workbench.errors import DataError
from workbench.profiles import ModelProfile
from workbench.rundir.cache import Stamp, cache_key, file_stamp
from workbench.rundir.columns import SCAN_CACHE, Columns, FileScan, Tally
from workbench.rundir.figures import (
    OVERLAP_ENTRY,
    FigureStore,
    figures_path,
    load_figures,
    overlaps_path,
)
from workbench.rundir.id_arrays import IdArrays, of_lists, prepare
from workbench.rundir.layout import RAW_FILE, DatasetDir
from workbench.rundir.reader import ROWS_AT_BLOCK_BYTES, iter_blocks, paused_gc
from workbench.rundir.records import Block, Row
from workbench.rundir.run import RunInfo, load_run
from workbench.sketch import compiled

__all__ = ["MIN_RANGE_BYTES", "SCAN_BLOCK_BYTES", "RunScan", "scan_run"]

_MB = 1 << 20

MIN_RANGE_BYTES = 32 * _MB  # a file is cut into ranges of at least this size for the workers

# small blocks: the ids are checked while still in the CPU cache (rows_at reads back by them)
SCAN_BLOCK_BYTES = ROWS_AT_BLOCK_BYTES


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
    decontaminate: Decontamination | None = None,
    figures: bool | None = None,
    turn_prompts: bool = False,
) -> RunScan:
    """Read every raw file of run directory `out` once: validation and per-record columns.

    The model profile is `model_profile`, else run.json's, else kimi-k2.5. `workers` worker
    processes check large files (default: the CPU count, at most 16; 1 checks in-process).
    With `cache`, each file's scan is kept beside it and only bytes appended since are read
    (see :mod:`workbench.rundir.columns`); with `figures` (default: `cache`), the reply
    figures generate kept as it wrote (:mod:`workbench.rundir.figures`) are taken instead of
    computed again. `decontaminate`: the benchmarks whose n-grams
    are looked for in the replies (each record's ``overlap`` column). The run-level data
    findings (duplicates, contamination: :mod:`workbench.analyze.quality`) join the report.
    With `turn_prompts`, each turn's prompt of a ``turns: each`` dataset is checked against
    the rendering of its history (:mod:`workbench.analyze.turn_prompts`: validate's, not
    cached; a dataset it cannot check gets a note in the report).
    DataError/ConfigError for bad input (not a run, unreadable run.json, unknown profile).
    """
    thresholds = thresholds or Thresholds()
    run = load_run(out, only)
    profile = run.profile(model_profile)
    workers = workers or _default_workers()
    try:
        use_figures = cache if figures is None else figures
        files = [_file(ds, dataset_checker(ds, profile, vocab_size, thresholds),
                       thresholds, cache, decontaminate, use_figures)
                 for ds in run.datasets]
        jobs, owners = _plan_jobs(files, workers, decontaminate)
        with loops.sized(sum(job.end - job.start for job in jobs)), \
                _job_runner(jobs, workers) as results:
            prompts = [read_prompt_ids(ds, thresholds, cache) for ds in run.datasets]  # meanwhile
            figures = prompt_figures(run, decontaminate, cache=cache,  # meanwhile too
                                     kept=use_figures, share=thresholds.template_share)
            scans = _merged(results, owners, files)
        if cache:
            _save(files, scans, owners)
    except OSError as exc:
        raise DataError(exc.filename or out, f"cannot read: {exc.strerror or exc}") from None
    with loops.sized(0):  # the comparisons read what was kept: no loops loaded for them
        data = data_findings(run, scans, thresholds, decontaminate, prompts=figures)
    notes = _turn_findings(run, profile, thresholds, data) if turn_prompts else []
    reports = {ds.name: dataset_report(scan, prompt, thresholds,
                                        ds.settings.get("budget_reached") is True, data[ds.name])
               for ds, scan, prompt in zip(run.datasets, scans, prompts, strict=True)}
    report = ValidationReport(all(r.ok for r in reports.values()), profile.name, reports,
                              decontaminate.names if decontaminate is not None else [], notes)
    return RunScan(run, profile, {ds.name: scan for ds, scan in zip(run.datasets, scans, strict=True)},
                   report)


def _turn_findings(run: RunInfo, profile: ModelProfile, thresholds: Thresholds,
                   data: dict[str, list[tuple[str, Tally]]]) -> list[str]:
    """Add each turns dataset's turn_prompt_mismatch tally to its data tallies; the notes
    of the datasets it could not check."""
    notes = []
    for ds in run.datasets:
        check = check_turn_prompts(ds, profile, thresholds.max_examples)
        if check.tally is not None:
            data[ds.name] = [*data[ds.name], (RAW_FILE, check.tally)]
        if check.note is not None:
            notes.append(check.note)
    return notes


@dataclass(frozen=True, slots=True)
class _RangeJob:
    path: str
    start: int
    end: int
    last: bool
    checker: RecordChecker
    max_examples: int
    decontaminate: Decontamination | None = None
    figures: str | None = None  # the reply figures kept by generate, if any
    overlaps: str | None = None  # and the replies' overlaps with the benchmarks


def _scan_range(job: _RangeJob) -> FileScan:
    """Check every record whose line starts in [job.start, job.end); run in a worker.

    The last range reads to the end of the file (a torn last line included); another range
    stops inside the block that crosses its end, counting that block's lines up to it.
    """
    part = FileScan(Tally(job.max_examples), end_offset=job.start if job.last else job.end)
    blocks = iter_blocks(job.path, offset=job.start, id_arrays=True, block_bytes=SCAN_BLOCK_BYTES)
    known = load_figures(Path(job.figures)) if job.figures else None
    overlaps = load_figures(Path(job.overlaps), OVERLAP_ENTRY) if job.overlaps else None
    with paused_gc():
        for block in blocks:
            if not job.last and block.start_offset >= job.end:
                break
            lines = block.first_line - 1 + block.lines
            if not job.last and block.end_offset > job.end:
                lines = block.first_line - 1 + _count_lines(job.path, block.start_offset, job.end)
            _scan_block(block, lines, job.checker, part, job.decontaminate, known, overlaps)
            part.lines = max(part.lines, lines)
            if job.last:
                part.end_offset = block.end_offset
    return part


def _scan_block(block: Block, lines: int, checker: RecordChecker, part: FileScan,
                decontaminate: Decontamination | None = None,
                known: FigureStore | None = None, overlaps: FigureStore | None = None) -> None:
    """Tally the block's problems and rows up to line `lines` (a torn line after it too),
    and add the rows' columns."""
    add = part.tally.add
    for problem in block.problems:
        if problem.kind == "torn":
            part.torn = (problem.line, problem.detail)
        elif problem.line <= lines:
            add(PROBLEM_RULES[problem.kind], problem.line, problem.detail)
    if block.lines:
        part.blocks.append((block.first_line, block.start_offset))
    bad_type = {p.line for p in block.problems if p.kind == "bad_type"}
    rows, ids = _rows_up_to(block, lines)
    part.records += len(rows)
    found, stats = checker._check(rows, figures=True, known=known, ids=ids)
    for row, problems in zip(rows, found, strict=True):
        if row.layout != "flat":
            add("legacy_layout", row.line, f"{row.layout} layout")
        for rule, detail in problems:
            if rule != "missing_field" or row.line not in bad_type:
                add(rule, row.line, detail)
    _add_columns(part.columns, rows, found, stats, checker)
    flat = stats.flat
    assert stats.figures is not None
    add_quality(part.columns, flat.ids, flat.starts, flat.ends, stats.figures, stats.special,
                decontaminate, overlaps)


def _rows_up_to(block: Block, lines: int) -> tuple[list[Row], IdArrays]:
    """The block's rows up to line `lines` and their output ids."""
    rows, ids = block.rows, block.ids if block.ids is not None else of_lists([])
    if rows and rows[-1].line > lines:
        rows = [row for row in rows if row.line <= lines]
        ends = ids.ends[:len(rows)]
        ids = IdArrays(ids.ids[:ends[-1] if len(ends) else 0], ids.starts[:len(rows)], ends)
    return rows, ids


_ROW_COLUMNS = ("line", "sample_id", "layout", "prompt_tokens", "completion_tokens",
                "cached_tokens", "finish_reason", "ts", "e2e_latency", "turn", "ended", "mode")


def _add_columns(
    columns: Columns, rows: list[Row], found: list[list[tuple[str, str]]], stats: IdStats,
    checker: RecordChecker,
) -> None:
    for name in _ROW_COLUMNS:
        getattr(columns, name).extend(map(attrgetter(name), rows))
    columns.output_len.extend(None if ids is None else len(ids) for ids in stats.replies)
    for row, ids, first in zip(rows, stats.replies, stats.end_first, strict=True):
        reasoning, answer, closed = checker.split(ids, first, row.mode)
        columns.reasoning_tokens.append(reasoning)
        columns.answer_tokens.append(answer)
        columns.closed.append(closed)
    bits = RULE_BITS
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
    prepare()  # the id parser and the figures' pass ready once here, not in every worker
    compiled.prepare()
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        yield pool.map(_scan_range, jobs)


class _File(NamedTuple):
    """A raw file to scan: its checker, its cache key, what is known of it already, and its
    stamp before anything was read (what a saved scan was read from)."""

    path: Path
    checker: RecordChecker
    key: str
    known: FileScan
    offset: int
    cached: bool
    stamp: Stamp | None
    figures: str | None
    overlaps: str | None


def _file(ds: DatasetDir, checker: RecordChecker, thresholds: Thresholds, cache: bool,
          decontaminate: Decontamination | None, use_figures: bool) -> _File:
    """The file with its cached scan (when `cache` and one fits), else an empty one."""
    path = ds.raw_path
    think_end = checker.profile.think_end if checker.splits else None
    store = figures_path(ds.folder, think_end, checker.repetition_ngram)
    kept = str(store) if use_figures and store.is_file() else None
    overlap_store = None if decontaminate is None else overlaps_path(ds.folder, decontaminate)
    overlaps = (str(overlap_store) if use_figures and overlap_store is not None
                and overlap_store.is_file() else None)
    if path.exists() and not path.is_file():
        raise DataError(path, "cannot read: not a regular file")
    key = cache_key(*checker.settings(), thresholds.max_examples,
                    RECORD_RULES, thresholds.record_limits(), QUALITY_VERSION,
                    None if decontaminate is None else decontaminate.key)
    # a scan made under other rules, limits or benchmarks is not reused
    stamp = file_stamp(path)  # before any read: what a saved scan was read from
    found = SCAN_CACHE.load(path, key) if cache else None
    if found is None:
        return _File(path, checker, key, FileScan(Tally(thresholds.max_examples)), 0, False, stamp,
                     kept, overlaps)
    return _File(path, checker, key, found[0], found[1], True, stamp, kept, overlaps)


def _plan_jobs(files: Sequence[_File], workers: int, decontaminate: Decontamination | None,
               ) -> tuple[list[_RangeJob], list[int]]:
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
                                  file.known.tally.max_examples, decontaminate, file.figures,
                                  file.overlaps))
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
            SCAN_CACHE.save(file.path, file.key, scan.kept(), scan.end_offset, file.stamp)
