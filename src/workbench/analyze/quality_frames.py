"""The data-quality section of the format_validation report, as shaped data.

:func:`quality_table` gives one row per dataset with what the quality rules found
(:mod:`workbench.analyze.quality` for duplicates and contamination, the degeneracy rules of
:mod:`workbench.analyze.rules`); :func:`repeat_shares` the per-record share of each reply inside
a repeated n-gram, for a histogram; :func:`contamination_table` the flagged records per
benchmark; :func:`score_frame` the on-policy scores kept beside the run (``workbench score``),
when there are any. The plots are :mod:`workbench.report.plots`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analyze.quality import (
    DATA_RULES,
    Decontamination,
    RunBenchmarks,
    benchmark_counts,
    run_benchmarks,
)
from workbench.analyze.rules import rule_bit
from workbench.analyze.scan import RunScan
from workbench.analyze.score import load_scores
from workbench.rundir.run import load_run

__all__ = [
    "QUALITY_COLUMNS",
    "contamination_table",
    "decontamination",
    "quality_table",
    "repeat_shares",
    "score_frame",
]

DEGENERACY = ("repetition", "special_heavy", "no_answer")

QUALITY_COLUMNS = ["dataset", "records", "prompts", *DATA_RULES, *DEGENERACY]


def decontamination(run_dir: str | os.PathLike[str], files: Sequence[str] | None, *,
                    field: str | None = None, ngram: int | None = None,
                    tokenizer: str | None = None) -> RunBenchmarks:
    """The benchmarks of a report's `decontaminate` parameter: its files (an empty list:
    none), else (None) the ones generate was given (run.json)."""
    return run_benchmarks(load_run(run_dir), files, field=field, ngram=ngram, tokenizer=tokenizer)


def quality_table(scan: RunScan) -> pd.DataFrame:
    """Per dataset: records, prompts, the count of each run-level rule (DATA_RULES), and of the
    degenerate replies: in a loop (repetition), mostly special ids (special_heavy), reasoning
    that never reached an answer (no_answer: a reply with reasoning expected and no think-end
    id, or nothing after it)."""
    rows = []
    for name, ds in scan.report.datasets.items():
        counts = {f.rule: f.count for f in ds.findings}
        columns = scan.files[name].columns
        failed = np.asarray(columns.failed, dtype=np.int64)
        no_answer = (failed & (rule_bit("reasoning_unclosed") | rule_bit("empty_answer"))) != 0
        cut_in_reasoning = np.array([c is False and f == "length" for c, f in
                                     zip(columns.closed, columns.finish_reason, strict=True)],
                                    dtype=bool)
        row = {"dataset": name, "records": ds.records, "prompts": ds.prompts,
               **{rule: counts.get(rule, 0) for rule in DATA_RULES},
               "repetition": counts.get("repetition", 0),
               "special_heavy": counts.get("special_heavy", 0),
               "no_answer": int((no_answer | cut_in_reasoning).sum()) if len(failed) else 0}
        rows.append(row)
    return pd.DataFrame(rows, columns=QUALITY_COLUMNS)


def repeat_shares(scan: RunScan) -> pd.DataFrame:
    """One row per record with output ids: dataset, repeat_share (0 to 1)."""
    parts = []
    for name, file in scan.files.items():
        columns = file.columns
        keep = [share for share, length in zip(columns.repeat_share, columns.output_len,
                                               strict=True) if length]
        parts.append(pd.DataFrame({"dataset": name, "repeat_share": np.asarray(keep, dtype=float)}))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"dataset": [], "repeat_share": []})
    frame["dataset"] = pd.Categorical(frame["dataset"].astype(str), categories=list(scan.files))
    return frame


def contamination_table(scan: RunScan, decontaminate: Decontamination | None) -> pd.DataFrame:
    """Per benchmark and dataset: items, prompts and replies holding one of its n-grams
    (empty without benchmarks)."""
    columns = ["benchmark", "items", "skipped", "dataset", "prompts", "replies"]
    if decontaminate is None:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(benchmark_counts(scan.run, list(scan.files.values()), decontaminate),
                        columns=columns)


def score_frame(scan: RunScan) -> pd.DataFrame:
    """The on-policy scores kept beside the run (dataset, sample_id, nll, entropy, tokens,
    and turn when a dataset's conversations were regenerated turn by turn: a row per
    (sample_id, turn)); empty when the run was not scored."""
    parts = []
    for ds in scan.run.datasets:
        scores = load_scores(ds.folder)
        if not scores.empty:
            parts.append(scores.assign(dataset=ds.name))
    if not parts:
        return pd.DataFrame(columns=["dataset", "sample_id", "nll", "entropy", "tokens"])
    frame = pd.concat(parts, ignore_index=True)
    frame["dataset"] = pd.Categorical(frame["dataset"], categories=list(scan.files))
    return frame
