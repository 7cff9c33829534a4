"""A run's outputs shaped into the tables the report notebooks show.

Everything here reads a run directory and returns plain data (pandas frames, small frozen
dataclasses); :mod:`workbench.report.plots` draws them and counts nothing. The notebooks call one
function of each per section. What reads records takes the run directory or, so that a
report reads the run once, the result of :func:`workbench.analyze.scan.scan_run`.

    run_overview          the report header: run.json facts, datasets, model profile
    record_frame          one row per record: token counts, finish reason, time, and the
                          split of output_ids at the profile's think-end id
    log_axes, wants_log   per token column, whether its axis should be logarithmic (the
                          values span more than two decades, or a long tail)
    histogram, cdf        completion-token distributions (linear or log-spaced bins)
    sample_records        a seeded sample of each dataset's rows (scatter plots)
    reasoning_summary     reasoning and answer tokens per dataset
    finish_mix            finish reasons per dataset, with max_new_tokens
    budget_table          target and budget used, state (running, done, budget reached),
                          remaining tokens, projected time
    findings_table        validation findings per dataset and rule
    examples_table        the findings' example records, with a text or id excerpt
    findings_over_time    per-record rule failures by record timestamp
    filter_records        the explorer's filters (datasets, finish reasons, token ranges, a
                          validation rule via record_findings, a sample id)
    record_findings       the per-record validation rules each record fails
    samples               chosen records with their output decoded (or their ids)
    record_detail         one record in full: prompt, reasoning, answer, counts, findings
    search_replies        the selected records whose decoded reply holds a text

The reasoning split, per record: ids before the first think-end id are reasoning, ids after
it are the answer, trailing end ids (end_ids, eos_id) count in neither. A reply without the
think-end id is all reasoning (``closed`` False). A dataset that switched thinking off, or a
profile without a think-end id, has no reasoning: the whole reply is answer, ``closed`` NA.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from workbench.analyze.eta import stopped_by_budget
from workbench.analyze.findings import ValidationReport
from workbench.analyze.rules import (
    SEVERITY,
    RecordChecker,
    counted_over,
    failed_rules,
    reasoning_expected,
    rule_bit,
)
from workbench.analyze.scan import SCAN_BLOCK_BYTES, RunScan, scan_run
from workbench.analyze.stats import RunStats
from workbench.errors import ConfigError
from workbench.profiles import ModelProfile
from workbench.rundir.columns import Columns, FileScan
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE, DatasetDir
from workbench.rundir.records import Row, iter_blocks
from workbench.rundir.run import RunInfo, load_run
from workbench.tokenizer import load_tokenizer

__all__ = [
    "BUDGET_REACHED",
    "DONE",
    "MIN_BUCKET_RECORDS",
    "RECORD_COLUMNS",
    "RUNNING",
    "RecordDetail",
    "RunOverview",
    "Sample",
    "budget_table",
    "cdf",
    "examples_table",
    "filter_records",
    "findings_over_time",
    "findings_table",
    "finish_mix",
    "histogram",
    "log_axes",
    "progress_state",
    "reasoning_summary",
    "record_detail",
    "record_findings",
    "record_frame",
    "run_overview",
    "sample_records",
    "samples",
    "search_replies",
    "wants_log",
]

RECORD_COLUMNS: tuple[str, ...] = (
    "dataset", "line", "sample_id", "prompt_tokens", "completion_tokens", "cached_tokens",
    "finish_reason", "ts", "e2e_latency", "output_len", "reasoning_tokens", "answer_tokens",
    "closed",
)  # fmt: skip
_INT_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens", "output_len",
                "reasoning_tokens", "answer_tokens")
MISSING_REASON = "missing"
MIN_BUCKET_RECORDS = 10  # a time bucket with fewer records gets no alarm colour
_NICE_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                 43200, 86400)


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunOverview:
    """What a report header says about a run (None where run.json does not say)."""

    run_dir: Path
    model: str | None
    model_profile: str
    server_url: str | None
    created: float | None
    updated: float | None
    generated: float
    workbench_version: str | None
    datasets: tuple[str, ...]
    max_new_tokens: Mapping[str, int | None] = field(default_factory=dict)
    max_tokens: Mapping[str, int | None] = field(default_factory=dict)
    reasoning: Mapping[str, bool] = field(default_factory=dict)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _max_new_tokens(ds: DatasetDir) -> int | None:
    sampling = ds.settings.get("sampling")
    return _int(sampling.get("max_new_tokens")) if isinstance(sampling, dict) else None


def _run(run_dir: str | os.PathLike[str], model_profile: str | None) -> tuple[RunInfo, ModelProfile]:
    run = load_run(run_dir)
    return run, run.profile(model_profile)


def run_overview(
    run_dir: str | os.PathLike[str], *, model_profile: str | None = None, now: float | None = None
) -> RunOverview:
    """The header facts of a run directory (DataError when it is not one)."""
    run, profile = _run(run_dir, model_profile)
    manifest = run.manifest
    return RunOverview(
        run_dir=Path(run_dir).resolve(),
        model=_text(manifest.get("model")),
        model_profile=profile.name,
        server_url=_text(manifest.get("server_url")),
        created=_number(manifest.get("created")),
        updated=_number(manifest.get("updated")),
        generated=time.time() if now is None else now,
        workbench_version=_text(manifest.get("workbench_version")),
        datasets=tuple(ds.name for ds in run.datasets),
        max_new_tokens={ds.name: _max_new_tokens(ds) for ds in run.datasets},
        max_tokens={ds.name: _int(ds.settings.get("max_tokens")) for ds in run.datasets},
        reasoning={ds.name: reasoning_expected(profile, ds.chat_template_kwargs)
                   for ds in run.datasets},
    )


# --- one row per record ----------------------------------------------------------------------


RunSource = str | os.PathLike[str] | RunScan


def _scanned(source: RunSource, model_profile: str | None = None,
             datasets: Sequence[str] = ()) -> RunScan:
    """The scan of a run (read, or only its new bytes with the cache), or the scan given."""
    if isinstance(source, RunScan):
        return source
    return scan_run(source, model_profile=model_profile, only=datasets)


def record_frame(
    run_dir: RunSource,
    *,
    model_profile: str | None = None,
    datasets: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per record of every dataset (or of `datasets`), columns RECORD_COLUMNS.

    `run_dir` may be a :func:`~workbench.analyze.scan.scan_run` result, so that one scan feeds
    every table of a report. Counts that cannot be read are NA (nullable Int64), never 0;
    ``finish_reason`` is "missing" when absent; ``time`` is ``ts`` as a UTC datetime. The
    split of output ids into reasoning and answer is :meth:`RecordChecker.split`.
    """
    scan = _scanned(run_dir, model_profile, datasets)
    names = [name for name in scan.files if not datasets or name in datasets]
    columns = [scan.files[name].columns for name in names]
    return _typed_frame(columns, names)


def _joined(columns: Sequence[Columns], name: str) -> list[Any]:
    values: list[Any] = []
    for part in columns:
        values.extend(getattr(part, name))
    return values


def _typed_frame(columns: Sequence[Columns], names: list[str]) -> pd.DataFrame:
    lengths = [len(part) for part in columns]
    codes = np.repeat(np.arange(len(names)), lengths).astype("int32")
    frame = pd.DataFrame({"dataset": pd.Categorical.from_codes(codes, categories=names)})
    frame["line"] = np.array(_joined(columns, "line"), dtype="int64")
    frame["sample_id"] = pd.Series(_joined(columns, "sample_id"), dtype="object")
    for column in _INT_COLUMNS:
        frame[column] = pd.array(_joined(columns, column), dtype="Int64")
    reasons = _joined(columns, "finish_reason")
    frame["finish_reason"] = pd.array([MISSING_REASON if r is None else r for r in reasons],
                                      dtype="string")
    for column in ("ts", "e2e_latency"):
        values = [math.nan if v is None else v for v in _joined(columns, column)]
        frame[column] = np.array(values, dtype="float64")
    frame["closed"] = pd.array(_joined(columns, "closed"), dtype="boolean")
    frame["time"] = pd.to_datetime(frame["ts"], unit="s", utc=True)
    return frame[[*RECORD_COLUMNS, "time"]]


def _groups(frame: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    for name, group in frame.groupby("dataset", observed=True, sort=True):
        yield str(name), group


def _names(frame: pd.DataFrame) -> list[str]:
    """Every dataset of the run (the categories of a record frame), else those present."""
    values = frame["dataset"]
    if isinstance(values.dtype, pd.CategoricalDtype):
        return [str(c) for c in values.cat.categories]
    return list(dict.fromkeys(str(v) for v in values))


def _labelled(shaped: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """shaped with its dataset column categorical over names (plots colour by position)."""
    shaped["dataset"] = pd.Categorical(shaped["dataset"].astype(str), categories=list(names))
    return shaped


def _known(values: pd.Series) -> np.ndarray:
    return values.dropna().to_numpy(dtype="float64")


# --- distributions ---------------------------------------------------------------------------

LOG_DECADES = 2.0  # a token axis spanning more decades than this is drawn logarithmic
LOG_TAIL = 10.0  # ... and one whose largest value is this many times its median
TOKEN_AXES = ("prompt_tokens", "completion_tokens")


def wants_log(values: np.ndarray, *, decades: float = LOG_DECADES, tail: float = LOG_TAIL) -> bool:
    """Whether a log axis shows these values better than a linear one: their positive values
    span more than `decades` powers of ten, or the largest is more than `tail` times the
    median (on a linear axis the median record would sit in the left tenth, the bulk of
    the records squeezed into one corner by a few long ones)."""
    positive = values[values > 0]
    if positive.size < 2:
        return False
    top, low, middle = float(positive.max()), float(positive.min()), float(np.median(positive))
    return math.log10(top / low) > decades or top > tail * middle


def log_axes(frame: pd.DataFrame, log: bool | None = None, *,
             columns: Sequence[str] = TOKEN_AXES) -> dict[str, bool]:
    """Per column, whether its axis is logarithmic: `log` when given (a report's
    ``log_axis`` parameter), else chosen by the data (:func:`wants_log`)."""
    if log is not None:
        return {column: bool(log) for column in columns}
    return {column: wants_log(_known(frame[column])) for column in columns}


def _edges(values: np.ndarray, log: bool, bins: int) -> np.ndarray:
    if values.size == 0:
        return np.array([0.0, 1.0])
    low, high = float(values.min()), float(values.max())
    if log:
        low = max(low, 1.0)
        high = max(high, low + 1.0)
        return np.geomspace(low, high * 1.0001, bins + 1)
    return np.histogram_bin_edges(values, bins=bins, range=(low, max(high, low + 1.0)))


def histogram(
    frame: pd.DataFrame, column: str = "completion_tokens", *, log: bool = False, bins: int = 40,
    also: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Counts per bin and dataset: dataset, left, right, count, share (of the dataset's rows
    with the value). Bins are shared by all datasets (and span `also`'s values too, so two
    runs' histograms share them); log-spaced bins put 0 in the first."""
    known = _known(frame[column])
    if also is not None:
        known = np.concatenate([known, _known(also[column])])
    edges = _edges(known, log, bins)
    parts = []
    for name, group in _groups(frame):
        values = np.clip(_known(group[column]), edges[0], edges[-1])
        counts, _ = np.histogram(values, edges)
        total = max(1, int(counts.sum()))
        parts.append(pd.DataFrame({"dataset": name, "left": edges[:-1], "right": edges[1:],
                                   "count": counts, "share": counts / total}))
    return _labelled(_concat(parts, ["dataset", "left", "right", "count", "share"]), _names(frame))


def cdf(frame: pd.DataFrame, column: str = "completion_tokens", *, points: int = 300) -> pd.DataFrame:
    """The empirical CDF per dataset, at most `points` steps each: dataset, value, fraction."""
    parts = []
    for name, group in _groups(frame):
        values = np.sort(_known(group[column]))
        if values.size == 0:
            continue
        fraction = np.arange(1, values.size + 1) / values.size
        keep = np.unique(np.linspace(0, values.size - 1, min(points, values.size)).round().astype(int))
        parts.append(pd.DataFrame({"dataset": name, "value": values[keep], "fraction": fraction[keep]}))
    return _labelled(_concat(parts, ["dataset", "value", "fraction"]), _names(frame))


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def sample_records(frame: pd.DataFrame, n: int, *, seed: int = 0) -> pd.DataFrame:
    """At most n rows of each dataset, drawn with seed (the same rows for the same inputs)."""
    parts = [group.sample(min(n, len(group)), random_state=seed) for _, group in _groups(frame)]
    return pd.concat(parts) if parts else frame.iloc[0:0]


# --- per-dataset tables ----------------------------------------------------------------------


def reasoning_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset with reasoning: records, mean and median reasoning and answer tokens,
    reasoning share of the reply tokens, replies without a think-end id (``unclosed``)."""
    rows = []
    for name, group in _groups(frame):
        split = group[group["closed"].notna()]
        if split.empty:
            continue
        reasoning, answer = _known(split["reasoning_tokens"]), _known(split["answer_tokens"])
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
    return _labelled(pd.DataFrame(rows, columns=columns), _names(frame))


def finish_mix(frame: pd.DataFrame, overview: RunOverview) -> pd.DataFrame:
    """Per dataset and finish reason: count, share, and the dataset's truncation rate
    ("length" among records with a reason) next to its max_new_tokens."""
    rows = []
    for name, group in _groups(frame):
        counts = group["finish_reason"].value_counts()
        with_reason = int(counts.drop(MISSING_REASON, errors="ignore").sum())
        length = int(counts.get("length", 0))
        rate = length / with_reason if with_reason else None
        for reason, count in sorted(counts.items(), key=lambda item: _reason_order(str(item[0]))):
            rows.append({"dataset": name, "reason": str(reason), "count": int(count),
                         "share": int(count) / len(group), "truncation_rate": rate,
                         "max_new_tokens": overview.max_new_tokens.get(name)})
    columns = ["dataset", "reason", "count", "share", "truncation_rate", "max_new_tokens"]
    return _labelled(pd.DataFrame(rows, columns=columns), _names(frame))


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
    tokens = float(_known(group["completion_tokens"]).sum())
    return tokens / span if span > 0 else None


RUNNING, DONE, BUDGET_REACHED = "running", "done", "budget reached"


def progress_state(ds: Any) -> str:
    """How a dataset (a DatasetStats) stands: "budget reached" when its max_tokens budget
    stopped it short of its target (run.json's ``budget_reached``: the runner stops a dataset
    once the next reply would not fit, below the budget itself; or its completion tokens
    reached the budget: :func:`workbench.analyze.eta.stopped_by_budget`), "done" when it is
    otherwise finished, else "running" (a run stopped by hand too: a resume carries it on)."""
    if not ds.finished:
        return RUNNING
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
    is done or stopped by its budget. The total's tokens left are the datasets' sum (unknown
    when one is), its state "running" while one dataset is; its budget is the sum when
    every dataset has one."""
    groups = dict(_groups(frame))
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
    rows.append(_budget_row(stats.total, frame, budget, remaining, total))
    return pd.DataFrame(rows)


# --- validation ------------------------------------------------------------------------------


def findings_table(report: ValidationReport) -> pd.DataFrame:
    """One row per dataset and rule that fired (a dataset without findings gets one row with
    rule None and severity "ok"): dataset, rule, severity, count, rate, records, and what
    the count is out of: ``base`` of ``unit`` (rules.counted_over: the prepared prompts for
    a prompt rule, such as the prompts a budget left unsent, else the records)."""
    rows = []
    for name, ds in report.datasets.items():
        for finding in ds.findings:
            unit = counted_over(finding.rule)
            rows.append({"dataset": name, "rule": finding.rule, "severity": finding.severity,
                         "count": finding.count, "rate": finding.rate, "records": ds.records,
                         "default_severity": SEVERITY.get(finding.rule),
                         "base": ds.prompts if unit == "prompts" else ds.records, "unit": unit})
        if not ds.findings:
            rows.append({"dataset": name, "rule": None, "severity": "ok", "count": 0,
                         "rate": None, "records": ds.records, "default_severity": None,
                         "base": ds.records, "unit": "records"})
    columns = ["dataset", "rule", "severity", "count", "rate", "records", "default_severity",
               "base", "unit"]
    return _labelled(pd.DataFrame(rows, columns=columns), list(report.datasets))


def _rows_at(path: Path, lines: set[int], index: FileScan | None = None) -> dict[int, Row]:
    """The rows (with output ids) at the given line numbers of a raw file: read from the
    block holding each (in the scan's block index), else from the file's start."""
    found: dict[int, Row] = {}
    if not lines or not path.is_file():
        return found
    starts = {index.block_at(line) if index else (0, 1) for line in lines}
    for offset, first in sorted(starts, reverse=True):  # each block reads only its own lines
        wanted = {line for line in lines if line >= first and line not in found}
        found.update(_rows_from(path, offset, first, wanted))
    return found


def _rows_from(path: Path, offset: int, first: int, lines: set[int]) -> dict[int, Row]:
    found: dict[int, Row] = {}
    last = max(lines)
    for block in iter_blocks(path, offset=offset, first_line=first, with_output_ids=True,
                             block_bytes=SCAN_BLOCK_BYTES):
        found.update((row.line, row) for row in block.rows if row.line in lines)
        if block.first_line + block.lines > last:
            break
    return found


def _decoder(tokenizer: str | os.PathLike[str] | None) -> Any:
    if tokenizer is None:
        return None

    with warnings.catch_warnings():  # tqdm, imported by transformers, warns in a kernel without widgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        return load_tokenizer(Path(tokenizer))


def _id_names(profile: ModelProfile) -> dict[int, str]:
    names = {end: "<end>" for end in profile.end_ids}
    if profile.eos_id is not None:
        names[profile.eos_id] = "<eos>"
    if profile.think_start is not None:
        names[profile.think_start] = "<think>"
    if profile.think_end is not None:
        names[profile.think_end] = "</think>"
    return names


def _render_ids(ids: Sequence[int], names: Mapping[int, str]) -> str:
    return " ".join(names.get(i, str(i)) for i in ids)


def _excerpt(ids: list[int] | None, decoder: Any, names: Mapping[int, str], chars: int) -> str:
    """The end of a reply (where format problems show): decoded text, or its last ids."""
    if not ids:
        return "" if ids is None else "(no output ids)"
    if decoder is not None:
        text = decoder.decode(ids, skip_special_tokens=False)
        return text if len(text) <= chars else "…" + text[-chars:]
    keep = max(8, chars // 8)
    shown = _render_ids(ids[-keep:], names)
    return shown if len(ids) <= keep else "… " + shown


def examples_table(
    report: ValidationReport | RunScan,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    chars: int = 400,
) -> pd.DataFrame:
    """Every example of every finding: dataset, rule, severity, file, line, detail, and for
    a record its sample_id, finish_reason, completion_tokens and an excerpt of its end
    (decoded with `tokenizer`, else its last ids with the profile's special ids named); for
    a line of prompts.jsonl (a prompt without a record, a duplicate prompt) its sample_id.
    Given a :func:`~workbench.analyze.scan.scan_run` result, only the examples' blocks are read."""
    scan = report if isinstance(report, RunScan) else None
    report = report.report if isinstance(report, RunScan) else report
    run = scan.run if scan is not None else load_run(_required(run_dir), list(report.datasets))
    profile = run.profile(report.model_profile)
    decoder, names = _decoder(tokenizer), _id_names(profile)
    rows = []
    for ds in run.datasets:
        findings = report.datasets[ds.name].findings
        wanted = {e.line for f in findings for e in f.examples if e.file == RAW_FILE}
        records = _rows_at(ds.raw_path, wanted, scan.files.get(ds.name) if scan else None)
        prompt_ids = _prompt_ids_at(ds.prompts_path, {e.line for f in findings for e in f.examples
                                                      if e.file == PROMPTS_FILE})
        for finding in findings:
            for example in finding.examples:
                row = records.get(example.line) if example.file == RAW_FILE else None
                rows.append(_example_row(ds.name, finding, example, row, decoder, names, chars))
                if example.file == PROMPTS_FILE:
                    rows[-1]["sample_id"] = prompt_ids.get(example.line)
    return pd.DataFrame(rows, columns=["dataset", "rule", "severity", "file", "line", "detail",
                                       "sample_id", "finish_reason", "completion_tokens",
                                       "excerpt"])


class _PromptId(msgspec.Struct):
    sample_id: Any = None


def _prompt_ids_at(path: Path, lines: set[int]) -> dict[int, Any]:
    """The sample_id at each of the given (1-based) lines of prompts.jsonl, read up to the
    last of them; a line that is not a prompt object is left out."""
    found: dict[int, Any] = {}
    if not lines or not path.is_file():
        return found
    decoder, last = msgspec.json.Decoder(_PromptId), max(lines)
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if number in lines:
                try:
                    found[number] = decoder.decode(line).sample_id
                except msgspec.DecodeError:
                    pass
            if number >= last:
                break
    return found


def _required(run_dir: str | os.PathLike[str] | None) -> str | os.PathLike[str]:
    if run_dir is None:
        raise ConfigError("run_dir", "needed with a validation report (or pass the run's scan)")
    return run_dir


def _example_row(name: str, finding: Any, example: Any, row: Row | None, decoder: Any,
                 names: Mapping[int, str], chars: int) -> dict[str, Any]:
    return {
        "dataset": name, "rule": finding.rule, "severity": finding.severity,
        "file": example.file, "line": example.line, "detail": example.detail,
        "sample_id": None if row is None else row.sample_id,
        "finish_reason": None if row is None else row.finish_reason,
        "completion_tokens": None if row is None else row.completion_tokens,
        "excerpt": "" if row is None else _excerpt(row.output_ids, decoder, names, chars),
    }


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
    scan = _scanned(run_dir, model_profile)
    names = list(scan.files)
    times = {name: _failure_times(file.columns) for name, file in scan.files.items()}
    times = {name: found for name, found in times.items() if len(found[0])}
    if not times:
        columns = ["dataset", "start", "seconds", "records", "rule", "count", "rate", "enough"]
        return _labelled(pd.DataFrame(columns=columns), names)
    every = np.concatenate([ts for ts, _ in times.values()])
    width = _bucket_seconds(float(every.max() - every.min()), buckets)
    shaped = _bucketed(times, width)
    shaped["enough"] = shaped["records"] >= min_records
    return _labelled(shaped, names)


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


# --- exploration -----------------------------------------------------------------------------


def _one_or_many(value: str | Sequence[str] | None) -> list[str] | None:
    return None if value is None else [value] if isinstance(value, str) else list(value)


def _between(values: pd.Series, low: int | None, high: int | None) -> pd.Series:
    keep = pd.Series(True, index=values.index)
    if low is not None:
        keep &= (values >= low).fillna(False).astype(bool)
    if high is not None:
        keep &= (values <= high).fillna(False).astype(bool)
    return keep


def _check_datasets(frame: pd.DataFrame, wanted: list[str]) -> None:
    unknown = [name for name in wanted if name not in _names(frame)]
    if unknown:
        known = ", ".join(_names(frame)) or "none"
        raise ConfigError("dataset", f"unknown dataset {unknown[0]!r} (known: {known})")


def _record_keys(datasets: pd.Series, lines: pd.Series, names: list[str]) -> np.ndarray:
    """One int64 per (dataset, line): the dataset's position in names, then the line."""
    codes = pd.Categorical(datasets.astype(str), categories=names).codes.astype("int64")
    return (codes << 32) | lines.to_numpy(dtype="int64")


def _with_rule(frame: pd.DataFrame, rule: str, findings: pd.DataFrame | None) -> np.ndarray:
    if findings is None:
        raise ConfigError("rule", "filtering by rule needs the records' findings (record_findings)")
    hits = findings[findings["rule"] == rule]
    names = _names(frame)
    return np.isin(_record_keys(frame["dataset"], frame["line"], names),
                   _record_keys(hits["dataset"], hits["line"], names))


def filter_records(
    frame: pd.DataFrame,
    *,
    dataset: str | Sequence[str] | None = None,
    finish_reason: str | Sequence[str] | None = None,
    truncated: bool = False,
    min_completion_tokens: int | None = None,
    max_completion_tokens: int | None = None,
    min_prompt_tokens: int | None = None,
    max_prompt_tokens: int | None = None,
    unclosed: bool = False,
    rule: str | None = None,
    sample_id: str | int | None = None,
    findings: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The rows that pass every given filter: dataset(s), finish reason(s), truncated
    (finish "length"), completion and prompt token ranges (bounds included), reasoning
    without a think-end id, a per-record validation rule that fired (needs `findings`, a
    record_findings frame), a sample id (compared as text). ConfigError for a dataset the
    run does not have."""
    keep = pd.Series(True, index=frame.index)
    datasets, reasons = _one_or_many(dataset), _one_or_many(finish_reason)
    if datasets is not None:
        _check_datasets(frame, datasets)
        keep &= frame["dataset"].isin(datasets).to_numpy()
    if reasons is not None:
        keep &= frame["finish_reason"].isin(reasons).fillna(False).astype(bool)
    if truncated:
        keep &= frame["finish_reason"] == "length"
    keep &= _between(frame["completion_tokens"], min_completion_tokens, max_completion_tokens)
    keep &= _between(frame["prompt_tokens"], min_prompt_tokens, max_prompt_tokens)
    if unclosed:
        keep &= frame["closed"].eq(False).fillna(False).astype(bool)
    if sample_id is not None and str(sample_id) != "":
        keep &= frame["sample_id"].map(str) == str(sample_id)
    if rule is not None:
        keep &= _with_rule(frame, rule, findings)
    return frame[keep]


def record_findings(run_dir: RunSource, *, model_profile: str | None = None) -> pd.DataFrame:
    """One row per record and per-record validation rule it fails (the rules of
    ``workbench validate`` that look at one record): dataset, line, rule. From the scan's
    per-record masks: nothing is read again when `run_dir` is a scan."""
    scan = _scanned(run_dir, model_profile)
    rows: list[tuple[str, int, str]] = []
    for name, file in scan.files.items():
        rules: dict[int, list[str]] = {}
        for line, mask in zip(file.columns.line, file.columns.failed, strict=True):
            if mask:
                rows.extend((name, line, rule) for rule in rules.setdefault(mask, failed_rules(mask)))
    return pd.DataFrame(rows, columns=["dataset", "line", "rule"])


@dataclass(frozen=True, slots=True)
class Sample:
    """One record shown in full: its reasoning and answer as text (decoded) or ids."""

    dataset: str
    line: int
    sample_id: int | str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning: str | None
    answer: str
    decoded: bool
    cut: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clip(text: str, chars: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= chars else (text[:chars], True)


def _parts(ids: list[int], profile: ModelProfile, reasoning: bool) -> tuple[list[int] | None, list[int]]:
    """(reasoning ids up to the think-end id, answer ids); no reasoning part without thinking."""
    if not reasoning or profile.think_end is None:
        return None, ids
    if profile.think_end not in ids:
        return ids, []
    cut = ids.index(profile.think_end) + 1
    return ids[:cut], ids[cut:]


def _sample(name: str, row: Row, profile: ModelProfile, reasoning: bool, decoder: Any,
            chars: int) -> Sample:
    head, tail = _parts(row.output_ids or [], profile, reasoning)
    names = _id_names(profile)

    def show(ids: list[int]) -> tuple[str, bool]:
        return _clip(_show(ids, decoder, names), chars)

    thought, cut_head = show(head) if head is not None else (None, False)
    answer, cut_tail = show(tail)
    return Sample(name, row.line, row.sample_id, row.finish_reason, row.prompt_tokens,
                  row.completion_tokens, thought, answer, decoder is not None, cut_head or cut_tail)


def samples(
    run_dir: RunSource,
    selected: pd.DataFrame,
    *,
    n: int = 10,
    seed: int = 0,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
    chars: int = 2000,
) -> list[Sample]:
    """Up to n of the `selected` rows (a record_frame slice), drawn with seed, read back with
    their output ids: decoded with `tokenizer` when given, else as ids; each part is cut
    to `chars` characters. Only the chosen records' blocks are read (the scan's index)."""
    scan = _scanned(run_dir, model_profile)
    run, profile = scan.run, scan.profile
    chosen = selected.sample(min(n, len(selected)), random_state=seed).sort_values(["dataset", "line"])
    decoder = _decoder(tokenizer)
    shown = []
    for ds in run.datasets:
        lines = chosen.loc[chosen["dataset"] == ds.name, "line"].tolist()
        reasoning = reasoning_expected(profile, ds.chat_template_kwargs)
        found = _rows_at(ds.raw_path, set(lines), scan.files.get(ds.name))
        for line, row in sorted(found.items()):
            shown.append(_sample(ds.name, row, profile, reasoning, decoder, chars))
    return shown


# --- one record, and search in the decoded replies -------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordDetail:
    """One record opened in full: prompt, reasoning and answer (decoded with special tokens
    visible, or as ids), counts, and the per-record findings it has."""

    dataset: str
    line: int
    sample_id: int | str | None
    finish_reason: str | None
    matched_stop: int | str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    prompt: str | None
    reasoning: str | None
    answer: str
    decoded: bool
    findings: tuple[tuple[str, str], ...]
    matched_stop_name: str | None = None  # the stop token's text (<|im_end|>), else the profile's name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _PromptLine(msgspec.Struct):
    sample_id: Any = None
    input_ids: list[int] | None = None
    text: str | None = None


_PROMPT_DECODER = msgspec.json.Decoder(_PromptLine)


def _prompt_of(path: Path, sample_id: object, decoder: Any, names: Mapping[int, str]) -> str | None:
    """The prompt of `sample_id` as sent (prompts.jsonl): decoded ids, or its text. The file
    is read from its start up to that prompt (prompts are not in the scan)."""
    if sample_id is None or not path.is_file():
        return None
    with path.open("rb") as lines:
        for raw in lines:
            try:
                prompt = _PROMPT_DECODER.decode(raw)
            except msgspec.DecodeError:
                continue
            if prompt.sample_id == sample_id:
                if prompt.input_ids is not None:
                    return _show(prompt.input_ids, decoder, names)
                return prompt.text
    return None


def _show(ids: Sequence[int], decoder: Any, names: Mapping[int, str]) -> str:
    return decoder.decode(list(ids), skip_special_tokens=False) if decoder else _render_ids(ids, names)


def _stop_name(matched: int | str | None, decoder: Any, names: Mapping[int, str]) -> str | None:
    """A matched stop id as text: the tokenizer's token (``<|im_end|>``), else the profile's
    name for it (``<end>``); a stop string is itself; None when there is no name."""
    if matched is None or isinstance(matched, str):
        return matched
    return _show([matched], decoder, names) if decoder is not None or matched in names else None


def record_detail(
    run_dir: RunSource,
    dataset: str,
    line: int,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
) -> RecordDetail:
    """The record at `line` of `dataset`'s raw file, in full (ConfigError when there is
    none); with a scan, only the block holding it is read."""
    scan = _scanned(run_dir, model_profile)
    profile, ds = scan.profile, scan.run.dataset(dataset)
    row = _rows_at(ds.raw_path, {line}, scan.files.get(ds.name)).get(line)
    if row is None:
        raise ConfigError("line", f"{ds.raw_path}: no readable record at line {line}")
    reasoning = reasoning_expected(profile, ds.chat_template_kwargs)
    decoder, names = _decoder(tokenizer), _id_names(profile)
    head, tail = _parts(row.output_ids or [], profile, reasoning)
    problems = RecordChecker(profile, reasoning=reasoning).check_rows([row])[0]
    return RecordDetail(
        dataset, line, row.sample_id, row.finish_reason, row.matched_stop, row.prompt_tokens,
        row.completion_tokens, row.cached_tokens,
        _prompt_of(ds.prompts_path, row.sample_id, decoder, names),
        None if head is None else _show(head, decoder, names), _show(tail, decoder, names),
        decoder is not None, tuple(problems), _stop_name(row.matched_stop, decoder, names))


def search_replies(
    run_dir: RunSource,
    selected: pd.DataFrame,
    text: str,
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    model_profile: str | None = None,
    limit: int = 5000,
    cache: dict[tuple[str, int], str] | None = None,
) -> tuple[pd.DataFrame, int]:
    """The rows of `selected` whose decoded reply (special tokens visible; ids without a
    tokenizer) holds `text` (case-insensitive), and how many rows were searched: the first
    `limit` of the selection. `cache` keeps decoded replies between calls."""
    scan = _scanned(run_dir, model_profile)
    decoder, names = _decoder(tokenizer), _id_names(scan.profile)
    store = {} if cache is None else cache
    searched = selected.iloc[:limit]
    for ds in scan.run.datasets:
        lines = searched.loc[searched["dataset"].astype(str) == ds.name, "line"]
        todo = {int(n) for n in lines if (ds.name, int(n)) not in store}
        for at, row in _rows_at(ds.raw_path, todo, scan.files.get(ds.name)).items():
            store[(ds.name, at)] = _show(row.output_ids or [], decoder, names).casefold()
    needle = text.casefold()
    keys = zip(searched["dataset"].astype(str), searched["line"].astype(int), strict=True)
    hits = [needle in store.get(key, "") for key in keys]
    return searched[pd.Series(hits, index=searched.index, dtype=bool)], len(searched)
