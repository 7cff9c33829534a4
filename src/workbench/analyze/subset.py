"""The sent subset of each dataset against the whole dataset: does a budget keep a fair one?

A run with a budget sends part of a dataset. The runner draws it in a seeded random order,
but a run in file order (`order: file`, or older runs) keeps the head of the file, which is
biased when the file is sorted or grouped. Per dataset of a run directory:

    lengths    prompt tokens of the sent prompts (those with a record) against all of
               prompts.jsonl (the dataset as prepared; text prompts: characters over
               `TEXT_CHARS_PER_TOKEN`, see :mod:`workbench.rundir.prompt_scan`): means, their
               ratio, and the two-sample Kolmogorov-Smirnov statistic D with its p-value
               (scipy)
    shares     for each source-like field of the dataset file (`SOURCE_FIELDS`, text values,
               at most `MAX_LEVELS` distinct ones): each value's share of the sent prompts and
               of the whole file, the total variation distance, and the chi-square test of
               the sent counts against the whole file's shares (p-value)

A prompt is sent when a record has its id: the top-level ``sample_id`` of raw_responses.jsonl,
or, given the run's scan (:func:`workbench.analyze.scan.scan_run`, not read again), each record's
id as validation reads it (``sample_id``, else ``custom_id``, else ``id``): the same for the
records the workbench writes. Every prompt is counted in "whole", so a run that sent everything
compares equal. A dataset
is flagged `biased` when the mean prompt length is off by more than `MEAN_TOLERANCE` and D's
p-value is under `ALPHA`, or a field's chi-square p-value is under `ALPHA` with a total
variation distance above `SHARE_TOLERANCE`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from workbench.rundir import prompt_scan
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.records import SampleId
from workbench.rundir.run import load_run

if TYPE_CHECKING:
    from workbench.analyze.scan import RunScan
    from workbench.rundir.columns import FileScan

__all__ = ["SOURCE_FIELDS", "SubsetComparison", "compare_subsets"]

SOURCE_FIELDS = ("source", "dataset", "origin", "subset", "category", "task", "topic", "domain",
                 "language", "lang", "type", "kind")
MAX_LEVELS = 50
ALPHA = 0.01
MEAN_TOLERANCE = 0.05
SHARE_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class SubsetComparison:
    """The comparison of a run's datasets (frames, one row per dataset or per value)."""

    lengths: pd.DataFrame  # dataset, whole, sent, mean_whole, mean_sent, mean_ratio, ks_d, ks_p, biased
    length_curves: pd.DataFrame  # dataset, group ("whole" or "sent"), value, fraction (at or below)
    shares: pd.DataFrame  # dataset, field, value, whole_share, sent_share
    share_tests: pd.DataFrame  # dataset, field, levels, tvd, chi2, chi2_p, biased


def compare_subsets(
    run_dir: str | os.PathLike[str], *, scan: RunScan | None = None
) -> SubsetComparison:
    """The subset comparison of every dataset of `run_dir` that has prompts.jsonl; with
    `scan` (the run's scan_run result), its datasets and records' ids come from it."""
    run = scan.run if scan is not None else load_run(run_dir)
    lengths, samples, shares, tests = [], [], [], []
    for ds in run.datasets:
        name, entry = ds.name, ds.settings
        prompt_lengths = _prompt_lengths(ds.prompts_path)
        if not prompt_lengths:
            continue
        sent_ids = _sent_ids(ds.raw_path, scan.files.get(name) if scan else None)
        sent = {k: v for k, v in prompt_lengths.items() if k in sent_ids}
        lengths.append(_length_row(name, list(prompt_lengths.values()), list(sent.values())))
        samples += _curve(name, "whole", list(prompt_lengths.values()))
        samples += _curve(name, "sent", list(sent.values()))
        for field, values in _source_fields(entry, set(prompt_lengths)).items():
            share_rows, test = _share_rows(name, field, values, sent_ids)
            shares += share_rows
            tests.append(test)
    return SubsetComparison(
        pd.DataFrame(lengths, columns=["dataset", "whole", "sent", "mean_whole", "mean_sent",
                                       "mean_ratio", "ks_d", "ks_p", "biased"]),
        pd.DataFrame(samples, columns=["dataset", "group", "value", "fraction"]),
        pd.DataFrame(shares, columns=["dataset", "field", "value", "whole_share", "sent_share"]),
        pd.DataFrame(tests, columns=["dataset", "field", "levels", "tvd", "chi2", "chi2_p",
                                     "biased"]))


def _sent_ids(raw: Path, scanned: FileScan | None) -> set[SampleId]:
    """The ids that have a record: from the scan of raw when given, else read."""
    if scanned is not None:
        return {sid for sid in scanned.columns.sample_id if sid is not None}
    return read_sample_ids(raw)[0] if raw.exists() else set()


def _prompt_lengths(path: Path) -> dict[int | str, int]:
    """sample_id -> prompt tokens, from the one read of prompts.jsonl the reports share (kept
    beside the file while it is unchanged: it is written once, before the replies); a
    conversation regenerated turn by turn counts its first prompt."""
    if not path.exists():
        return {}
    lengths: dict[int | str, int] = {}
    for (sample_id, _), length in prompt_scan.summary(path).length_of().items():
        lengths.setdefault(sample_id, length)
    return lengths


def _curve(name: str, group: str, lengths: list[int]) -> list[tuple[str, str, int, float]]:
    """The cumulative share of prompts at or below each length."""
    if not lengths:
        return []
    values, counts = np.unique(np.asarray(lengths), return_counts=True)
    fractions = np.cumsum(counts) / len(lengths)
    return [(name, group, int(v), float(f)) for v, f in zip(values, fractions, strict=True)]


def _length_row(name: str, whole: list[int], sent: list[int]) -> tuple[Any, ...]:
    from scipy.stats import ks_2samp

    mean_whole = float(np.mean(whole))
    if not sent:
        return (name, len(whole), 0, mean_whole, None, None, None, None, False)
    mean_sent = float(np.mean(sent))
    test = ks_2samp(sent, whole)
    ratio = mean_sent / mean_whole if mean_whole else None
    biased = bool(ratio is not None and abs(ratio - 1) > MEAN_TOLERANCE and test.pvalue < ALPHA)
    return (name, len(whole), len(sent), mean_whole, mean_sent, ratio, float(test.statistic),
            float(test.pvalue), biased)


def _source_fields(entry: Mapping[str, Any], ids: set[int | str]) -> dict[str, dict[int | str, str]]:
    """field -> (sample_id -> value) for the dataset file's source-like text fields, over the
    prompts of the run."""
    path, id_field = entry.get("path"), entry.get("id_field") or "sample_id"
    if not isinstance(path, str) or not Path(path).is_file():
        return {}
    values: dict[str, dict[int | str, str]] = {}
    for row in _rows(Path(path), [id_field, *SOURCE_FIELDS]):
        sample_id = row.get(id_field)
        if not isinstance(sample_id, int | str) or sample_id not in ids:
            continue
        for field in SOURCE_FIELDS:
            value = row.get(field)
            if isinstance(value, str):
                values.setdefault(field, {})[sample_id] = value
    return {f: v for f, v in values.items() if 1 < len(set(v.values())) <= MAX_LEVELS}


def _rows(path: Path, columns: list[str]) -> Iterator[Mapping[str, Any]]:
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        names = set(pq.ParquetFile(path).schema_arrow.names)
        table = pq.read_table(path, columns=[c for c in dict.fromkeys(columns) if c in names])
        yield from table.to_pylist()
        return
    wanted = set(columns)
    with path.open("rb") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield {k: v for k, v in row.items() if k in wanted}


def _share_rows(name: str, field: str, values: Mapping[int | str, str],
                sent_ids: set[int | str]) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    from scipy.stats import chisquare

    whole = pd.Series(list(values.values())).value_counts()
    sent = pd.Series([v for k, v in values.items() if k in sent_ids]).value_counts()
    sent = sent.reindex(whole.index, fill_value=0)
    whole_share = whole / whole.sum()
    sent_share = sent / sent.sum() if sent.sum() else sent.astype(float)
    rows = [(name, field, value, float(whole_share[value]), float(sent_share[value]))
            for value in whole.index]
    if not sent.sum():
        return rows, (name, field, len(whole), None, None, None, False)
    tvd = float((whole_share - sent_share).abs().sum() / 2)
    test = chisquare(sent.to_numpy(), whole_share.to_numpy() * sent.sum())
    biased = bool(test.pvalue < ALPHA and tvd > SHARE_TOLERANCE)
    return rows, (name, field, len(whole), tvd, float(test.statistic), float(test.pvalue), biased)
