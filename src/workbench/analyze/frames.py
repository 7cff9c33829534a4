"""A run's header and its records as one frame: what the report's tables and plots start from.

    run_overview          the report header: run.json facts, datasets, model profile
    record_frame          one row per record: token counts, finish reason, time, the
                          split of output_ids at the profile's think-end id, the turn
                          of a conversation regenerated turn by turn and the mode of a
                          dataset that mixes modes (NA otherwise)
    log_axes, wants_log   per token column, whether its axis should be logarithmic (the
                          values span more than two decades, or a long tail)
    histogram, cdf        completion-token distributions (linear or log-spaced bins)
    sample_records        a seeded sample of each dataset's rows (scatter plots)
    filter_records        the explorer's filters (datasets, finish reasons, token ranges, a
                          validation rule via record_findings, a sample id)
    record_findings       the per-record validation rules each record fails

What reads records takes a ``RunSource``: the run directory or, so that a report reads the
run once, the result of :func:`workbench.analyze.scan.scan_run` (:func:`scanned` gives the
scan either way). :mod:`workbench.analyze.tables` and :mod:`workbench.analyze.readback` use
that and the frame's helpers: ``dataset_groups``, ``dataset_names``, ``labelled``,
``known_values``.

The reasoning split, per record: ids before the first think-end id are reasoning, ids after
it are the answer, trailing end ids (end_ids, eos_id) count in neither. A reply without the
think-end id is all reasoning (``closed`` False). A dataset that switched thinking off, or a
profile without a think-end id, has no reasoning: the whole reply is answer, ``closed`` NA.
In a dataset that mixes modes, a record's own mode says (its chat-template arguments over the
dataset's, :meth:`~workbench.rundir.layout.DatasetDir.template_kwargs`): a record of a mode
that switched thinking off is all answer. The split is the scan's
(:meth:`workbench.analyze.rules.RecordChecker.split`); the frame holds what it gives.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analyze.rules import dataset_checker, failed_rules
from workbench.analyze.scan import RunScan, scan_run
from workbench.errors import ConfigError
from workbench.profiles import ModelProfile
from workbench.rundir.columns import Columns
from workbench.rundir.layout import DatasetDir
from workbench.rundir.run import RunInfo, load_run

__all__ = [
    "MISSING_REASON",
    "RECORD_COLUMNS",
    "RunOverview",
    "RunSource",
    "cdf",
    "dataset_groups",
    "dataset_names",
    "filter_records",
    "histogram",
    "known_values",
    "labelled",
    "log_axes",
    "record_findings",
    "record_frame",
    "run_overview",
    "sample_records",
    "scanned",
    "wants_log",
]

RECORD_COLUMNS: tuple[str, ...] = (
    "dataset", "line", "sample_id", "turn", "ended", "mode", "prompt_tokens", "completion_tokens",
    "cached_tokens", "finish_reason", "ts", "e2e_latency", "output_len", "reasoning_tokens",
    "answer_tokens", "closed",
)  # fmt: skip
_INT_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens", "output_len",
                "reasoning_tokens", "answer_tokens")
MISSING_REASON = "missing"


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunOverview:
    """What a report header says about a run (None where run.json does not say).

    ``reasoning``: per dataset, whether its replies should hold reasoning; for a dataset
    that mixes modes, whether any of its modes' should."""

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
        reasoning={ds.name: _reasoning(profile, ds) for ds in run.datasets},
    )


def _reasoning(profile: ModelProfile, ds: DatasetDir) -> bool:
    """Whether the dataset's replies should hold reasoning: any of its modes' when it mixes
    modes, else its own (the split its records' scan made)."""
    return dataset_checker(ds, profile).splits


# --- one row per record ----------------------------------------------------------------------


RunSource = str | os.PathLike[str] | RunScan


def scanned(source: RunSource, model_profile: str | None = None,
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

    ``turn`` (Int64) and ``ended`` (string) are a record's turn of its conversation and why
    the conversation ended after it, for a dataset regenerated turn by turn (``turns:
    each``); NA for a single-turn record, and for a turn after which the conversation went
    on. ``mode`` (string) is the mode a record of a dataset that mixes modes was generated
    in (NA elsewhere). Every record frame has these columns, so its shape does not depend
    on the run.
    """
    scan = scanned(run_dir, model_profile, datasets)
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
    frame["turn"] = pd.array(_joined(columns, "turn"), dtype="Int64")
    frame["ended"] = pd.array(_joined(columns, "ended"), dtype="string")
    frame["mode"] = pd.array(_joined(columns, "mode"), dtype="string")
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


def dataset_groups(frame: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    for name, group in frame.groupby("dataset", observed=True, sort=True):
        yield str(name), group


def dataset_names(frame: pd.DataFrame) -> list[str]:
    """Every dataset of the run (the categories of a record frame), else those present."""
    values = frame["dataset"]
    if isinstance(values.dtype, pd.CategoricalDtype):
        return [str(c) for c in values.cat.categories]
    return list(dict.fromkeys(str(v) for v in values))


def labelled(shaped: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """shaped with its dataset column categorical over names (plots colour by position)."""
    shaped["dataset"] = pd.Categorical(shaped["dataset"].astype(str), categories=list(names))
    return shaped


def known_values(values: pd.Series) -> np.ndarray:
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
    return {column: wants_log(known_values(frame[column])) for column in columns}


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
    known = known_values(frame[column])
    if also is not None:
        known = np.concatenate([known, known_values(also[column])])
    edges = _edges(known, log, bins)
    parts = []
    for name, group in dataset_groups(frame):
        values = np.clip(known_values(group[column]), edges[0], edges[-1])
        counts, _ = np.histogram(values, edges)
        total = max(1, int(counts.sum()))
        parts.append(pd.DataFrame({"dataset": name, "left": edges[:-1], "right": edges[1:],
                                   "count": counts, "share": counts / total}))
    return labelled(_concat(parts, ["dataset", "left", "right", "count", "share"]),
                    dataset_names(frame))


def cdf(frame: pd.DataFrame, column: str = "completion_tokens", *, points: int = 300) -> pd.DataFrame:
    """The empirical CDF per dataset, at most `points` steps each: dataset, value, fraction."""
    parts = []
    for name, group in dataset_groups(frame):
        values = np.sort(known_values(group[column]))
        if values.size == 0:
            continue
        fraction = np.arange(1, values.size + 1) / values.size
        keep = np.unique(np.linspace(0, values.size - 1, min(points, values.size)).round().astype(int))
        parts.append(pd.DataFrame({"dataset": name, "value": values[keep], "fraction": fraction[keep]}))
    return labelled(_concat(parts, ["dataset", "value", "fraction"]), dataset_names(frame))


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def sample_records(frame: pd.DataFrame, n: int, *, seed: int = 0) -> pd.DataFrame:
    """At most n rows of each dataset, drawn with seed (the same rows for the same inputs)."""
    parts = [group.sample(min(n, len(group)), random_state=seed)
             for _, group in dataset_groups(frame)]
    return pd.concat(parts) if parts else frame.iloc[0:0]


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
    unknown = [name for name in wanted if name not in dataset_names(frame)]
    if unknown:
        known = ", ".join(dataset_names(frame)) or "none"
        raise ConfigError("dataset", f"unknown dataset {unknown[0]!r} (known: {known})")


def _record_keys(datasets: pd.Series, lines: pd.Series, names: list[str]) -> np.ndarray:
    """One int64 per (dataset, line): the dataset's position in names, then the line."""
    codes = pd.Categorical(datasets.astype(str), categories=names).codes.astype("int64")
    return (codes << 32) | lines.to_numpy(dtype="int64")


def _with_rule(frame: pd.DataFrame, rule: str, findings: pd.DataFrame | None) -> np.ndarray:
    if findings is None:
        raise ConfigError("rule", "filtering by rule needs the records' findings (record_findings)")
    hits = findings[findings["rule"] == rule]
    names = dataset_names(frame)
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
    mode: str | Sequence[str] | None = None,
    findings: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The rows that pass every given filter: dataset(s), mode(s) (a dataset that mixes
    modes; a record without one passes no mode filter), finish reason(s), truncated
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
    modes = _one_or_many(mode)
    if modes is not None and "mode" in frame.columns:
        keep &= frame["mode"].isin(modes).fillna(False).astype(bool).to_numpy()
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
    scan = scanned(run_dir, model_profile)
    rows: list[tuple[str, int, str]] = []
    for name, file in scan.files.items():
        rules: dict[int, list[str]] = {}
        for line, mask in zip(file.columns.line, file.columns.failed, strict=True):
            if mask:
                rows.extend((name, line, rule) for rule in rules.setdefault(mask, failed_rules(mask)))
    return pd.DataFrame(rows, columns=["dataset", "line", "rule"])
