"""A report's per-dataset tables: what the record frame, the statistics and the validation
report add up to, per dataset.

    reasoning_summary     reasoning and answer tokens per dataset
    finish_mix            finish reasons per dataset, with max_new_tokens
    progress_state        how a dataset stands: running, done, budget reached, failed
    budget_table          target and budget used, state (running, done, budget reached, failed),
                          remaining tokens, projected time
    findings_table        validation findings per dataset and rule
    findings_over_time    per-record rule failures by record timestamp

Each takes a record frame (:func:`workbench.analyze.frames.record_frame`), the run's
statistics, its validation report or its scan, and returns a pandas frame whose dataset
column lists every dataset of the run; :mod:`workbench.report.plots` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from workbench.analyze.eta import stopped_by_budget
from workbench.analyze.findings import Finding, ValidationReport
from workbench.analyze.frames import (
    MISSING_REASON,
    RunOverview,
    RunSource,
    dataset_groups,
    dataset_names,
    known_values,
    labelled,
    scanned,
)
from workbench.analyze.rules import SEVERITY, counted_over, failed_rules, rule_bit
from workbench.analyze.stats import RunStats
from workbench.rundir.columns import Columns

__all__ = [
    "BUDGET_REACHED",
    "DONE",
    "FAILED",
    "MIN_BUCKET_RECORDS",
    "RUNNING",
    "budget_table",
    "findings_over_time",
    "findings_table",
    "finish_mix",
    "progress_state",
    "reasoning_summary",
]

MIN_BUCKET_RECORDS = 10  # a time bucket with fewer records gets no alarm colour
_NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                 43200, 86400)


# --- per-dataset tables ----------------------------------------------------------------------


def reasoning_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset with reasoning: records, mean and median reasoning and answer tokens,
    reasoning share of the reply tokens, replies without a think-end id (``unclosed``)."""
    rows = []
    for name, group in dataset_groups(frame):
        split = group[group["closed"].notna()]
        if split.empty:
            continue
        reasoning = known_values(split["reasoning_tokens"])
        answer = known_values(split["answer_tokens"])
        total = reasoning.sum() + answer.sum()
        rows.append({
            "dataset": name, "records": len(split),
            "mean_reasoning": reasoning.mean(), "mean_answer": answer.mean(),
            "median_reasoning": float(np.median(reasoning)), "median_answer": float(np.median(answer)),
            "reasoning_share": reasoning.sum() / total if total else None,
            "unclosed": int((~split["closed"].astype(bool)).sum()),
            "unclosed_stop": int(((~split["closed"].astype(bool)) & (split["finish_reason"] == "stop")).sum()),
        })
    columns = ["dataset", "records", "mean_reasoning", "mean_answer", "median_reasoning",
               "median_answer", "reasoning_share", "unclosed", "unclosed_stop"]
    return labelled(pd.DataFrame(rows, columns=columns), dataset_names(frame))


def finish_mix(frame: pd.DataFrame, overview: RunOverview) -> pd.DataFrame:
    """Per dataset and finish reason: count, share, and the dataset's truncation rate
    ("length" among records with a reason) next to its max_new_tokens."""
    rows = []
    for name, group in dataset_groups(frame):
        counts = group["finish_reason"].value_counts()
        with_reason = int(counts.drop(MISSING_REASON, errors="ignore").sum())
        length = int(counts.get("length", 0))
        rate = length / with_reason if with_reason else None
        for reason, count in sorted(counts.items(), key=lambda item: _reason_order(str(item[0]))):
            rows.append({"dataset": name, "reason": str(reason), "count": int(count),
                         "share": int(count) / len(group), "truncation_rate": rate,
                         "max_new_tokens": overview.max_new_tokens.get(name)})
    columns = ["dataset", "reason", "count", "share", "truncation_rate", "max_new_tokens"]
    return labelled(pd.DataFrame(rows, columns=columns), dataset_names(frame))


def _reason_order(reason: str) -> tuple[int, str]:
    order = {"stop": 0, "length": 1, "abort": 2, MISSING_REASON: 4}
    return order.get(reason, 3), reason


def _run_rate(group: pd.DataFrame) -> float | None:
    """Completion tokens per second from the first request's start to the last record."""
    ts = group["ts"].to_numpy(dtype="float64")
    known = ~np.isnan(ts)
    if known.sum() < 2:
        return None
    starts = ts - np.nan_to_num(group["e2e_latency"].to_numpy(dtype="float64"))
    span = float(ts[known].max() - starts[known].min())
    tokens = float(known_values(group["completion_tokens"]).sum())
    return tokens / span if span > 0 else None


RUNNING, DONE, BUDGET_REACHED, FAILED = "running", "done", "budget reached", "failed"


def progress_state(ds: Any) -> str:
    """How a dataset (a DatasetStats) stands: "budget reached" when its max_tokens budget
    stopped it short of its target (run.json's ``budget_reached``: the runner stops a dataset
    once the next reply would not fit, below the budget itself; or its completion tokens
    reached the budget: :func:`workbench.analyze.eta.stopped_by_budget`), "failed" when it
    finished without a record (every prompt it was to send failed: ``all_failed``), "done"
    when it is otherwise finished, else "running" (a run stopped by hand too: a resume carries
    it on; one that has written nothing yet too)."""
    if not ds.finished:
        return RUNNING
    if ds.all_failed:
        return FAILED
    return BUDGET_REACHED if stopped_by_budget(ds) else DONE


def _remaining_tokens(ds: Any, max_tokens: int | None, state: str) -> float | None:
    """Tokens left: none once the dataset is done or stopped by its budget; else records
    left times the mean reply, or the budget left, whichever is less."""
    if state != RUNNING:
        return 0.0
    known = []
    if ds.remaining_records is not None and ds.avg_completion_tokens is not None:
        known.append(ds.remaining_records * ds.avg_completion_tokens)
    if max_tokens:
        known.append(float(max(0, max_tokens - ds.completion_tokens)))
    return min(known) if known else None


def _projected(remaining: float | None, rate: float | None) -> float | None:
    if remaining == 0:
        return 0.0
    return remaining / rate if remaining is not None and rate else None


def _budget_row(ds: Any, group: pd.DataFrame, max_tokens: int | None,
                remaining: float | None, state: str) -> dict[str, Any]:
    run_rate = _run_rate(group) if not group.empty else None
    rate = ds.tokens_per_s or run_rate
    return {
        "dataset": ds.name, "records": ds.records, "target": ds.target_records,
        "done": ds.records / ds.target_records if ds.target_records else None,
        "completion_tokens": ds.completion_tokens, "max_tokens": max_tokens,
        "budget_used": ds.completion_tokens / max_tokens if max_tokens else None,
        "tokens_per_s_recent": ds.tokens_per_s, "tokens_per_s_run": run_rate,
        "remaining_tokens": remaining, "projected_s": _projected(remaining, rate),
        "state": state, "finished": state != RUNNING,
    }


def budget_table(stats: RunStats, frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, then "total": records against the target, completion tokens against
    ``max_tokens``, the state (:func:`progress_state`), the throughput (over the recent window of
    `stats`, and over the whole run from record times), the tokens left and the time they
    take at the recent throughput (the run's when there is none): none left once a dataset
    is done, failed or stopped by its budget. The total's tokens left are the datasets' sum
    (unknown when one is), its state "running" while one dataset is, "failed" when no dataset
    wrote a record and they failed, else "done"; its budget is the sum when every dataset has
    one."""
    groups = dict(dataset_groups(frame))
    rows, left, states = [], [], []
    for name, ds in stats.datasets.items():
        states.append(progress_state(ds))
        left.append(_remaining_tokens(ds, ds.max_tokens, states[-1]))
        rows.append(_budget_row(ds, groups.get(name, frame.iloc[0:0]), ds.max_tokens, left[-1],
                                states[-1]))
    budgets = [ds.max_tokens for ds in stats.datasets.values()]
    budget = sum(b for b in budgets if b) if budgets and all(budgets) else None
    remaining = None if any(x is None for x in left) else float(sum(x for x in left if x))
    total = RUNNING if RUNNING in states or not states else DONE
    total = FAILED if total == DONE and stats.total.all_failed else total
    rows.append(_budget_row(stats.total, frame, budget, remaining, total))
    return pd.DataFrame(rows)


# --- validation ------------------------------------------------------------------------------


def findings_table(report: ValidationReport) -> pd.DataFrame:
    """One row per dataset and rule that fired (a dataset without findings gets one row with
    rule None and severity "ok"): dataset, rule, severity, count, rate, records, and what
    the count is out of: ``base`` of ``unit`` (rules.counted_over: the prepared prompts for
    a prompt rule, such as the prompts a budget left unsent, else the records), and
    ``modes``: a finding given per mode (mode_mismatch in a dataset that mixes modes) as
    {mode: {"count", "records", "rate"}}, None for any other."""
    rows = []
    for name, ds in report.datasets.items():
        for finding in ds.findings:
            unit = counted_over(finding.rule)
            rows.append({"dataset": name, "rule": finding.rule, "severity": finding.severity,
                         "count": finding.count, "rate": finding.rate, "records": ds.records,
                         "default_severity": SEVERITY.get(finding.rule),
                         "base": ds.prompts if unit == "prompts" else ds.records, "unit": unit,
                         "modes": _mode_rates(finding)})
        if not ds.findings:
            rows.append({"dataset": name, "rule": None, "severity": "ok", "count": 0,
                         "rate": None, "records": ds.records, "default_severity": None,
                         "base": ds.records, "unit": "records", "modes": None})
    columns = ["dataset", "rule", "severity", "count", "rate", "records", "default_severity",
               "base", "unit", "modes"]
    return labelled(pd.DataFrame(rows, columns=columns), list(report.datasets))


def _mode_rates(finding: Finding) -> dict[str, dict[str, Any]] | None:
    """A finding's count per mode as plain dicts (None when it is not given per mode)."""
    if not finding.modes:
        return None
    return {mode: {"count": m.count, "records": m.records, "rate": m.rate}
            for mode, m in finding.modes.items()}


def _bucket_seconds(span: float, buckets: int) -> int:
    wanted = max(span / max(1, buckets), 1.0)
    return next((s for s in _NICE_SECONDS if s >= wanted), math.ceil(wanted / 86400) * 86400)


def _failure_times(columns: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(ts, failed mask) of every record of a dataset that has a ts, as arrays."""
    ts = np.array([math.nan if t is None else t for t in columns.ts], dtype="float64")
    known = ~np.isnan(ts)
    return ts[known], np.array(columns.failed, dtype="int64")[known]


def findings_over_time(
    run_dir: RunSource,
    *,
    model_profile: str | None = None,
    buckets: int = 40,
    min_records: int = MIN_BUCKET_RECORDS,
) -> pd.DataFrame:
    """Per dataset, time bucket and per-record rule: records in the bucket, failures, rate.

    Buckets are a round number of seconds (about `buckets` over the run's time span), from
    record ``ts``; records without one are left out. Columns: dataset, start (UTC datetime),
    seconds, records, rule, count, rate, enough: one row per dataset, bucket and rule that
    failed anywhere in the run (rule None when none did); rate is NaN in a bucket without
    records; ``enough`` is False for a bucket of fewer than `min_records` records, whose
    rate says little (the last records of a run are its longest, often truncated, replies).
    `run_dir` may be a :func:`~workbench.analyze.scan.scan_run` result (nothing read again).
    """
    scan = scanned(run_dir, model_profile)
    names = list(scan.files)
    times = {name: _failure_times(file.columns) for name, file in scan.files.items()}
    times = {name: found for name, found in times.items() if len(found[0])}
    if not times:
        columns = ["dataset", "start", "seconds", "records", "rule", "count", "rate", "enough"]
        return labelled(pd.DataFrame(columns=columns), names)
    every = np.concatenate([ts for ts, _ in times.values()])
    width = _bucket_seconds(float(every.max() - every.min()), buckets)
    shaped = _bucketed(times, width)
    shaped["enough"] = shaped["records"] >= min_records
    return labelled(shaped, names)


def _bucketed(times: Mapping[str, tuple[np.ndarray, np.ndarray]], width: int) -> pd.DataFrame:
    """Every bucket from the first record's to the last one's, per dataset (empty ones with
    0 records and rate NaN, so plotted lines break where nothing was written); per bucket,
    one row per rule that failed anywhere (sorted), or one row of rule None."""
    index = {name: np.floor(ts / width).astype("int64") for name, (ts, _) in times.items()}
    first = min(int(i.min()) for i in index.values())
    size = max(int(i.max()) for i in index.values()) - first + 1
    masks = np.concatenate([mask for _, mask in times.values()])
    rules: list[str | None] = [*sorted(failed_rules(int(np.bitwise_or.reduce(masks))))] or [None]
    parts = []
    for name, (_, mask) in times.items():
        at = index[name] - first
        records = np.bincount(at, minlength=size)
        hits = np.stack([np.bincount(at[(mask & rule_bit(rule)) != 0], minlength=size)
                         if rule else np.zeros(size, dtype="int64") for rule in rules], axis=1)
        count = np.repeat(records, len(rules))
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(count > 0, hits.ravel() / count, math.nan)
        parts.append(pd.DataFrame({
            "dataset": name, "start": np.repeat((first + np.arange(size)) * width, len(rules)),
            "seconds": width, "records": count, "rule": rules * size, "count": hits.ravel(),
            "rate": rate}))
    frame = pd.concat(parts, ignore_index=True)
    frame["start"] = pd.to_datetime(frame["start"], unit="s", utc=True)
    return frame
