"""Per-dataset statistics of a run directory, collected incrementally.

:class:`StatsCollector` remembers, for every file it reads, the byte offset it reached and
parses only what was appended since the previous :meth:`~StatsCollector.refresh` (a file
that changed otherwise is read again: :class:`workbench.rundir.cursor.Cursor`). The result equals a fresh full scan at the same ``now``,
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
                                :func:`workbench.rundir.rates.record_rates`: completion tokens
                                and records per second over the last ``window`` seconds of
                                record ``ts`` values; while the first record is inside the
                                window, over the time since it (that record only marks the
                                start); a finished dataset's over its first to its last
                                record, fixed once it is finished; None without any ``ts``
    target_records, max_tokens  from run.json: ``prompts`` (capped by ``max_samples``) and
                                ``max_tokens``; else the line count of prompts.jsonl
    budget_reached              run.json says the token budget stopped the dataset (the
                                runner stops once the next reply would not fit)
    finished                    records plus failed ids reach the target, or the completion
                                tokens reach ``max_tokens``, or the budget stopped it
    all_failed                  finished without a record: every prompt it was to send
                                failed (errors.jsonl); its state is "failed", never "done"
    eta_s                       what is left (records, or tokens under a budget, whichever
                                ends first) over the recent rate; 0 when finished, None
                                without a target or a rate

The progress figures (target, rates, finished, ETA) are :mod:`workbench.analyze.eta`'s; the
counting of each file is :mod:`workbench.analyze.counters`; the text of ``workbench stats``
is :mod:`workbench.analyze.stats_text`. The total row sums the datasets (its rates: the
current ones of the datasets still running summed, a finished dataset's left out; its ETA what
is left at that rate; once the whole run is finished, over the run's first to last record).
Lines that are not rows are counted in ``bad_lines``; a last line without newline
only sets ``torn_tail`` until it is complete.

A dataset whose records carry a ``turn`` (conversations regenerated turn by turn, ``turns:
each``: one record per generated assistant turn) also gets ``turns`` (:class:`TurnStats`,
None for a single-turn dataset, whose figures are unchanged):

    conversations               distinct sample ids among the records with a turn
    turns                       records with a turn
    turns per conversation      mean (turns over conversations) and max
    by_turn                     per turn index (0, 1, ...): records and completion tokens
    ended                       conversations ended early, by reason (records' ``ended``)

A dataset that mixes modes (run.json's ``modes``, or records that carry a ``mode``) also gets
``modes`` (:class:`ModeStats`, None for any other dataset, whose figures are unchanged):

    source                      the deployment sample the modes were taken from (run.json's
                                ``modes_source``; None: written in the manifest)
    per mode, in run.json's order (then modes only the records name, then the records
    without a mode):
    wanted                      its weight as a share of the weights (None: not in run.json)
    records, record_share       its records, and their share of the dataset's records
    conversations, conversation_share
                                for a dataset regenerated turn by turn: the distinct sample
                                ids of its records with a turn, and their share (the mix is
                                drawn per conversation, so this is the mix written)
    completion tokens           total, mean and nearest-rank median over its records with a
                                completion count
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.analyze.counters import (
    ErrorCounts,
    ModeCounts,
    ModeTally,
    PromptCounts,
    RawCounts,
    TurnCounts,
    nearest_ranks,
)
from workbench.analyze.eta import Progress, Target, progress, total_progress
from workbench.errors import DataError
from workbench.rundir import prompt_scan
from workbench.rundir.columns import SCAN_CACHE, FileScan
from workbench.rundir.cursor import Cursor, guarded, line_chunks
from workbench.rundir.layout import DatasetDir, find_datasets
from workbench.rundir.manifest import ManifestWatcher, dataset_entries
from workbench.rundir.rates import RATE_WINDOW, RecordTimes, merged_times
from workbench.rundir.reader import iter_blocks
from workbench.rundir.run import run_root

if TYPE_CHECKING:
    from workbench.analyze.scan import RunScan

__all__ = [
    "DEFAULT_WINDOW",
    "NO_MODE",
    "RECENT_ROWS",
    "DatasetStats",
    "ModeFigures",
    "ModeStats",
    "RecentStats",
    "RunStats",
    "StatsCollector",
    "TurnStats",
    "collect_stats",
    "requested_mix",
]

DEFAULT_WINDOW = RATE_WINDOW
RECENT_ROWS = 1000
NO_MODE = "(no mode)"  # how the records of a dataset that mixes modes that name none are shown


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
class TurnStats:
    """The conversations of a dataset regenerated turn by turn (the module docstring);
    ``by_turn`` holds (turn, records, completion tokens) in turn order."""

    conversations: int
    turns: int
    mean_turns: float | None
    max_turns: int
    by_turn: tuple[tuple[int, int, int], ...]
    ended: Mapping[str, int]

    @classmethod
    def of(cls, counts: TurnCounts) -> TurnStats | None:
        """The figures of the counted turns; None when no record had one."""
        if not counts.records:
            return None
        per = counts.per_conversation
        by_turn = tuple((turn, *counts.by_turn[turn]) for turn in sorted(counts.by_turn))
        return cls(len(per), counts.records, counts.records / len(per), max(per.values()),
                   by_turn, dict(sorted(counts.ended.items())))

    def to_dict(self) -> dict[str, Any]:
        """The ``turns`` object of ``workbench stats --json``."""
        return {
            "conversations": self.conversations,
            "turns": self.turns,
            "turns_per_conversation": {"mean": _round(self.mean_turns, 3), "max": self.max_turns},
            "by_turn": [{"turn": turn, "records": records, "completion_tokens": tokens}
                        for turn, records, tokens in self.by_turn],
            "ended": dict(self.ended),
        }


def requested_mix(ds: DatasetDir) -> dict[str, float]:
    """The modes run.json gives the dataset, each with its weight as a share of their sum
    (in run.json's order; a weight that is no positive number counts as none)."""
    weights = {mode["name"]: _weight(mode.get("weight")) for mode in ds.modes}
    total = sum(weights.values())
    return {name: (weight / total if total > 0 else 0.0) for name, weight in weights.items()}


def _weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return 0.0
    return float(value)


@dataclass(frozen=True, slots=True)
class ModeFigures:
    """One mode of a dataset that mixes modes (the module docstring); ``name`` None stands
    for the records without a mode, ``conversations`` None outside a turns dataset."""

    name: str | None
    wanted: float | None
    records: int
    record_share: float | None
    conversations: int | None
    conversation_share: float | None
    completion_tokens: int
    counted: int
    mean_completion_tokens: float | None
    median_completion_tokens: int | None

    @property
    def written(self) -> float | None:
        """The share written, to set against ``wanted``: of the conversations in a turns
        dataset (modes are drawn per conversation), else of the records."""
        return self.record_share if self.conversations is None else self.conversation_share

    def to_dict(self) -> dict[str, Any]:
        """One item of the ``modes.by_mode`` list of ``workbench stats --json``."""
        return {
            "mode": self.name,
            "wanted_share": _round(self.wanted, 4),
            "records": self.records,
            "record_share": _round(self.record_share, 4),
            "conversations": self.conversations,
            "conversation_share": _round(self.conversation_share, 4),
            "completion_tokens": self.completion_tokens,
            "mean_completion_tokens": _round(self.mean_completion_tokens, 3),
            "median_completion_tokens": self.median_completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class ModeStats:
    """The modes of a dataset that mixes them: what was asked against what was written (the
    module docstring); ``unit`` says what the written shares are of."""

    source: str | None
    unit: str  # "conversations" (a turns dataset) or "records"
    modes: tuple[ModeFigures, ...]

    @classmethod
    def of(cls, counts: ModeCounts, ds: DatasetDir, turns: bool) -> ModeStats | None:
        """The figures of a dataset's modes; None for a dataset that mixes none."""
        wanted = requested_mix(ds)
        named = [mode for mode in counts.by_mode if mode is not None]
        if not wanted and not named:
            return None
        order: list[str | None] = [*wanted, *sorted(m for m in named if m not in wanted)]
        if None in counts.by_mode:
            order.append(None)
        tallies = [counts.by_mode.get(mode) or ModeTally() for mode in order]
        records = sum(t.records for t in tallies)
        conversations = sum(len(t.conversations) for t in tallies)
        figures = tuple(_mode_figures(mode, wanted.get(mode) if mode else None, tally, records,
                                      conversations if turns else None)
                        for mode, tally in zip(order, tallies, strict=True))
        return cls(ds.modes_source, "conversations" if turns else "records", figures)

    def to_dict(self) -> dict[str, Any]:
        """The ``modes`` object of ``workbench stats --json``."""
        return {"source": self.source, "written_of": self.unit,
                "by_mode": [mode.to_dict() for mode in self.modes]}


def _share(part: int, whole: int | None) -> float | None:
    return part / whole if whole else None


def _mode_figures(name: str | None, wanted: float | None, tally: ModeTally, records: int,
                  conversations: int | None) -> ModeFigures:
    """One mode's figures; `conversations` the dataset's (None outside a turns dataset)."""
    own = None if conversations is None else len(tally.conversations)
    return ModeFigures(
        name=name, wanted=wanted, records=tally.records,
        record_share=_share(tally.records, records), conversations=own,
        conversation_share=None if own is None else _share(own, conversations),
        completion_tokens=tally.completion_tokens, counted=tally.counted,
        mean_completion_tokens=_share(tally.completion_tokens, tally.counted),
        median_completion_tokens=tally.median())


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
    budget_reached: bool = False
    remaining_records: float | None = None
    finished: bool = False
    eta_s: float | None = None
    bad_lines: int = 0
    torn_tail: bool = False
    last_write: float | None = None
    last_error_write: float | None = None
    recent: RecentStats = field(default_factory=RecentStats)
    turns: TurnStats | None = None
    modes: ModeStats | None = None

    @property
    def layout(self) -> str:
        return _layout_name(self.layouts)

    @property
    def all_failed(self) -> bool:
        """Finished without a record: every prompt it was to send failed."""
        return self.finished and not self.records and self.failed_missing > 0

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
            "budget_reached": self.budget_reached,
            "remaining_records": _round(self.remaining_records, 1),
            "finished": self.finished,
            "all_failed": self.all_failed,
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
            **({} if self.turns is None else {"turns": self.turns.to_dict()}),
            **({} if self.modes is None else {"modes": self.modes.to_dict()}),
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


# --- one dataset -----------------------------------------------------------------------------


class _Dataset:
    """The three files of one dataset and what was counted from them."""

    def __init__(self, ds: DatasetDir, recent_rows: int, window: float = RATE_WINDOW) -> None:
        self.ds = ds
        self.recent_rows = recent_rows
        self.times = RecordTimes(window)  # what the rates are taken from
        self.raw_cursor = Cursor(ds.raw_path)
        self.errors_cursor = Cursor(ds.errors_path)
        self.prompts_cursor = Cursor(ds.prompts_path)
        self.raw = self._new_raw()
        self.errors = ErrorCounts()
        self.prompts = PromptCounts()
        self.unresolved: set[object] = set()

    def _new_raw(self) -> RawCounts:
        return RawCounts(self.recent_rows, mixing=bool(self.ds.modes))

    def update(self, cutoff: float, scanned: FileScan | None = None) -> None:
        """Read what was appended (or everything again, for a file that changed); the
        records of raw_responses.jsonl come from `scanned` when given."""
        self._prune(cutoff)
        self.raw.mixing = bool(self.ds.modes)  # run.json as it is now
        self._update_errors(cutoff)
        if scanned is None:
            self._update_raw(cutoff)
        else:
            self._use_scan(scanned, cutoff)
        self._update_prompts()

    def _use_scan(self, scanned: FileScan, cutoff: float) -> None:
        self.raw_cursor.poll()  # the file's last write time
        self.raw = self._new_raw()
        self.unresolved = set(self.errors.ids)
        self.raw.add_scan(scanned, cutoff, self.unresolved)
        self.times = RecordTimes(self.times.window)
        self.times.extend(scanned.columns.ts, scanned.columns.completion_tokens, cutoff)

    def _prune(self, cutoff: float) -> None:
        window, errors = self.raw.window, self.errors.window
        while window and window[0][0] <= cutoff:
            window.popleft()
        while errors and errors[0] <= cutoff:
            errors.popleft()

    def _update_errors(self, cutoff: float) -> None:
        change = self.errors_cursor.poll()
        if change in ("reset", "gone"):
            self.errors, self.unresolved = ErrorCounts(), set()
        if change in ("grown", "reset"):
            cursor = self.errors_cursor
            for data, offset in guarded(cursor.path, line_chunks(cursor.path, cursor.offset)):
                new = self.errors.add(data, cutoff)
                self.unresolved |= self.raw.ids.without_records(new)
                cursor.advance(offset, 1)

    def _update_raw(self, cutoff: float) -> None:
        change = self.raw_cursor.poll()
        if change in ("reset", "gone"):
            self.raw = self._new_raw()
            self.unresolved = set(self.errors.ids)
            self.times = RecordTimes(self.times.window)
        if change in ("grown", "reset"):
            cursor = self.raw_cursor
            self.raw.torn = False
            if cursor.offset == 0:
                self._start_from_cache(cutoff)
            blocks = iter_blocks(cursor.path, offset=cursor.offset, first_line=cursor.line)
            for block in guarded(cursor.path, blocks):
                self.raw.add_block(block, cutoff, self.unresolved)
                rows = block.rows
                self.times.extend([r.ts for r in rows], [r.completion_tokens for r in rows], cutoff)
                cursor.advance(block.end_offset, block.first_line + block.lines)

    def _start_from_cache(self, cutoff: float) -> None:
        """Count what a scan cached beside the file (see :mod:`workbench.rundir.columns`), so that
        only the bytes after it are read; nothing when there is no usable cache."""
        cached = SCAN_CACHE.load(self.raw_cursor.path, None)
        if cached is not None and cached[1] > 0:
            scan, offset = cached
            self.raw.add_scan(scan, cutoff, self.unresolved)
            self.times.extend(scan.columns.ts, scan.columns.completion_tokens, cutoff)
            self.raw_cursor.advance(offset, scan.lines + 1)

    def _update_prompts(self) -> None:
        """Count the whole file from the one read the reports share (kept beside it, see
        :mod:`workbench.rundir.prompt_scan`), then only the bytes appended since."""
        change = self.prompts_cursor.poll()
        if change in ("reset", "gone"):
            self.prompts = PromptCounts()
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

    def snapshot(self, now: float, window: float) -> DatasetStats:
        """The dataset's figures at ``now``."""
        raw = self.raw
        prompt_lines = self.prompts.lines if self.prompts_cursor.ident is not None else None
        target = Target.from_manifest(self.ds.settings, prompt_lines)
        tok_rate, req_rate = self.times.rates(now)
        window_records = sum(1 for ts, _ in raw.window if ts > now - window)
        percentiles, top = raw.percentiles()
        counted = len(raw.completions)
        stats = DatasetStats(
            name=self.ds.name,
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
            budget_reached=target.budget_reached,
            bad_lines=raw.bad_lines,
            torn_tail=raw.torn,
            last_write=self.raw_cursor.mtime,
            last_error_write=self.errors_cursor.mtime,
            recent=self._recent(window_records, now - window),
            turns=TurnStats.of(raw.turns),
            modes=ModeStats.of(raw.modes, self.ds, self._turns()),
        )
        stats = replace(stats, **progress(stats)._asdict())
        if stats.finished:  # its rates over its running time: fixed from now on
            tok_rate, req_rate = self.times.rates(now, finished=True)
            stats = replace(stats, tokens_per_s=tok_rate, requests_per_s=req_rate)
        return stats

    def _turns(self) -> bool:
        """Whether the dataset is regenerated turn by turn (run.json says so, or its
        records carry a turn)."""
        return self.raw.turns.records > 0 or self.ds.settings.get("turns") == "each"

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


def _truncation(reasons: Mapping[str, int]) -> float | None:
    known = sum(count for reason, count in reasons.items() if reason != "missing")
    return reasons.get("length", 0) / known if known else None


# --- the total row ---------------------------------------------------------------------------


def _total(
    datasets: Sequence[DatasetStats], counted: int, ranks: tuple[tuple[int | None, ...], int | None],
    times: Sequence[RecordTimes], now: float,
) -> DatasetStats:
    """The sums over every dataset; ranks are the percentiles of all completion counts,
    times the datasets' record times."""
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
    return _with_total_progress(total, datasets, times, now)


def _with_total_progress(total: DatasetStats, datasets: Sequence[DatasetStats],
                         times: Sequence[RecordTimes], now: float) -> DatasetStats:
    """The run's rates: the current ones of its datasets still running summed (a finished
    dataset's are left out, its records of the window too), so that the ETA is what is left
    at the pace of what still runs; once every dataset is finished, over the run's first to
    last record."""
    running = [d for d in datasets if not d.finished]
    req_rate = _sum_known([d.requests_per_s for d in running], partial=True)
    tok_rate = _sum_known([d.tokens_per_s for d in running], partial=True)
    parts = [Progress(d.remaining_records, d.finished, d.eta_s) for d in datasets]
    progressed = total_progress(parts, req_rate)
    if progressed.finished:
        tok_rate, req_rate = merged_times(times).rates(now, finished=True)
    return replace(
        total,
        prepared_prompts=_sum_known([d.prepared_prompts for d in datasets], partial=True),
        prepared_prompt_tokens=_sum_known(
            [d.prepared_prompt_tokens for d in datasets], partial=True
        ),
        tokens_per_s=tok_rate,
        requests_per_s=req_rate,
        target_records=_sum_known([d.target_records for d in datasets]),
        recent=_summed_recent([d.recent for d in datasets]),
        **progressed._asdict(),
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
        self._manifest = ManifestWatcher(self.out)
        self._datasets: dict[str, _Dataset] = {}
        self._ranks: tuple[tuple[int, ...], tuple[tuple[int | None, ...], int | None]] | None = None

    def refresh(self, now: float | None = None, *, scan: RunScan | None = None) -> RunStats:
        """Read what changed since the last call and return the figures at ``now``; the
        records of the datasets `scan` (a :func:`workbench.analyze.scan.scan_run` result) holds
        are counted from it instead of reading their raw files."""
        run_root(self.out)
        now = self.clock() if now is None else now
        manifest = self._manifest.read()
        self._datasets = {ds.name: self._dataset(ds) for ds in self._discover(manifest)}
        stats = {}
        scanned = scan.files if scan is not None else {}
        for name, dataset in self._datasets.items():
            dataset.update(now - self.window, scanned.get(name))
            stats[name] = dataset.snapshot(now, self.window)
        raws = [dataset.raw for dataset in self._datasets.values()]
        times = [dataset.times for dataset in self._datasets.values()]
        total = _total(list(stats.values()), sum(len(r.completions) for r in raws),
                       self._all_ranks(raws), times, now)
        return RunStats(self.out, now, self.window, stats, total, manifest)

    def _dataset(self, ds: DatasetDir) -> _Dataset:
        known = self._datasets.get(ds.name)
        if known is None or known.ds.folder != ds.folder:
            return _Dataset(ds, self.recent_rows, self.window)
        known.ds = ds  # its run.json entry as it is now
        return known

    def _all_ranks(self, raws: Sequence[RawCounts]) -> tuple[tuple[int | None, ...], int | None]:
        """Percentiles over every dataset's completion counts, cached until one changes."""
        key = tuple(x for raw in raws for x in (raw.serial, len(raw.completions)))
        if self._ranks is None or self._ranks[0] != key:
            self._ranks = (key, nearest_ranks([raw.completions for raw in raws]))
        return self._ranks[1]

    def _discover(self, manifest: dict[str, Any]) -> list[DatasetDir]:
        """The run's datasets (:func:`~workbench.rundir.layout.find_datasets`), then those
        seen before whose folder is still there (their files moved aside, say)."""
        found = find_datasets(self.out, dataset_entries(manifest))
        names = {ds.name for ds in found}
        gone = [known.ds for name, known in self._datasets.items()
                if name not in names and known.ds.folder.is_dir()]
        return found + sorted(gone, key=lambda ds: ds.name)


def collect_stats(
    out: str | os.PathLike[str],
    *,
    now: float | None = None,
    window: float = DEFAULT_WINDOW,
    scan: RunScan | None = None,
) -> RunStats:
    """A full scan of a run directory (one refresh of a new collector); with `scan` (a
    :func:`workbench.analyze.scan.scan_run` result of the same run) the raw files are not read
    again: a report's tables and its stats then count the very same records."""
    return StatsCollector(out, window=window).refresh(now, scan=scan)


