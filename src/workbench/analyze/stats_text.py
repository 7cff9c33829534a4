"""``workbench stats``: a run's statistics as text (or JSON).

Two tables (counts; spread and progress), then notes per dataset, then for each dataset of
conversations regenerated turn by turn its turns: conversations, turns per conversation,
completion tokens by turn index and the conversations ended early by reason; then for each
dataset that mixes modes the mix asked for against the mix written (records per mode, and
conversations per mode in a turns dataset) and each mode's completion tokens, naming the
deployment sample the modes were taken from. Token columns count completion tokens unless
named otherwise:

    failed        failed ids still without a record (errors counts failed attempts)
    missing       records whose completion count cannot be read (never counted as 0)
    prepared tok  the token ids of prompts.jsonl: what was sent (- for text prompts)
    length        the share of replies cut at max_new_tokens

A dataset that finished without a record (every prompt it was to send failed) shows
``failed`` where a finished one shows ``done``, and a note: ``A: no record written: all 30
prompts failed (see A/errors.jsonl)`` (:func:`no_record_note`, the monitor's ALERT too).
"""

from __future__ import annotations

import json
import os

from workbench.analyze.eta import stopped_by_budget
from workbench.analyze.stats import (
    NO_MODE,
    DatasetStats,
    ModeFigures,
    ModeStats,
    RunStats,
    TurnStats,
    collect_stats,
)
from workbench.rundir.run import check_run_dir
from workbench.text import format_count, format_duration, format_rate, format_table

__all__ = ["format_stats_table", "no_record_note", "render_stats"]


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


def no_record_note(d: DatasetStats) -> str | None:
    """`no record written: all 30 prompts failed (see A/errors.jsonl)` for a dataset that
    finished without a record; None for any other."""
    if not d.all_failed:
        return None
    prompts = "the prompt" if d.failed_missing == 1 else f"all {d.failed_missing:,} prompts"
    return f"no record written: {prompts} failed (see {d.name}/errors.jsonl)"


def _state(d: DatasetStats) -> str:
    """What the ETA column says: failed, budget reached, done, or the time left."""
    if not d.finished:
        return format_duration(d.eta_s)
    if d.all_failed:
        return "failed"
    return "budget reached" if stopped_by_budget(d) else "done"


def _progress_row(d: DatasetStats) -> list[str]:
    spread = (d.avg_completion_tokens, *d.percentiles, d.max_completion_tokens)
    length = "-" if d.truncation_rate is None else f"{d.truncation_rate:.1%}"
    target = f"{d.records:,}/{format_count(d.target_records)}"
    eta = _state(d)
    rates = (format_rate(d.tokens_per_s), format_rate(d.requests_per_s))
    return [d.name, *(format_count(v) for v in spread), length, *rates, target, eta]


def _notes(d: DatasetStats) -> list[str]:
    failed = no_record_note(d)
    notes = [] if failed is None else [failed]
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


_TURN_HEADERS = ("turn", "records", "completion tok")


def _turn_lines(name: str, turns: TurnStats) -> list[str]:
    """A turns dataset's conversations, its completion tokens by turn and its early ends."""
    mean = "-" if turns.mean_turns is None else f"{turns.mean_turns:.2f}"
    lines = [(f"{name}: {turns.conversations:,} conversations, {turns.turns:,} turns "
              f"({mean} per conversation, max {turns.max_turns:,})")]
    rows = [[str(turn), format_count(records), format_count(tokens)]
            for turn, records, tokens in turns.by_turn]
    lines += ["  " + line for line in format_table(_TURN_HEADERS, rows).splitlines()]
    ended = ", ".join(f"{reason} {count:,}" for reason, count in turns.ended.items())
    lines.append(f"{name}: conversations ended early: {ended or 'none'}")
    return lines


def _share_text(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _mode_row(mode: ModeFigures, turns: bool) -> list[str]:
    counts = [format_count(mode.records)]
    if turns:
        counts = [format_count(mode.conversations), *counts]
    spread = (mode.mean_completion_tokens, mode.median_completion_tokens)
    return [NO_MODE if mode.name is None else mode.name, _share_text(mode.wanted),
            _share_text(mode.written), *counts, format_count(mode.completion_tokens),
            *(format_count(v) for v in spread)]


def _mode_lines(name: str, modes: ModeStats) -> list[str]:
    """A dataset's mix of modes, asked against written, and each mode's completion tokens."""
    turns = modes.unit == "conversations"
    source = "" if modes.source is None else f", taken from the deployment sample {modes.source}"
    lines = [f"{name}: modes, wanted against written (share of {modes.unit}){source}"]
    headers = ["mode", "wanted", "written", *(["conversations"] if turns else []), "records",
               "completion tok", "avg", "p50"]
    rows = [_mode_row(mode, turns) for mode in modes.modes]
    lines += ["  " + line for line in format_table(headers, rows, left=1).splitlines()]
    return lines


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
    for d in stats.datasets.values():
        if d.turns is not None:
            lines += _turn_lines(d.name, d.turns)
    for d in stats.datasets.values():
        if d.modes is not None:
            lines += _mode_lines(d.name, d.modes)
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
