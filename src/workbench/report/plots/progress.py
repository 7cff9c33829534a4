"""Where a run stands: its counts, completion tokens, rates and progress (`workbench stats`
as tables), and each dataset's progress against its target and its token budget.

A dataset its ``max_tokens`` budget stopped says "budget reached"
(tables.progress_state), never an ETA, and a total agrees with its rows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analyze.stats import RunStats
from workbench.analyze.tables import BUDGET_REACHED, DONE, RUNNING, progress_state
from workbench.report.plots.blocks import (
    Rendered,
    count_text,
    escaped,
    html_table,
    is_nan,
    json_rows,
    pct,
    utc_text,
)
from workbench.report.plots.figures import empty_figure
from workbench.report.plots.style import PART_COLORS
from workbench.text import format_duration

__all__ = [
    "COUNTS_NOTE",
    "budget_figure",
    "budget_view",
    "stats_view",
]


def _rate(value: object) -> str:
    if is_nan(value):
        return "-"
    number = float(value)  # type: ignore[arg-type]
    return f"{number:,.2f}" if number < 10 else f"{number:,.0f}"


def _count_cells(d: Any) -> list[object]:
    counts = (d.records, d.errors, d.failed_missing, d.prompt_tokens, d.completion_tokens,
              d.cached_tokens, d.missing_completion_tokens, d.prepared_prompt_tokens)
    return [d.name, d.layout, *(count_text(c) for c in counts)]


def _progress_cells(d: Any, state: str) -> list[object]:
    spread = (d.avg_completion_tokens, *d.percentiles, d.max_completion_tokens)
    eta = format_duration(d.eta_s) if state == RUNNING else state
    target = f"{d.records:,}/{count_text(d.target_records)}"
    return [d.name, *(count_text(v) for v in spread), pct(d.truncation_rate), _rate(d.tokens_per_s),
            _rate(d.requests_per_s), target, eta]


COUNTS_NOTE = (
    "errors: failed request attempts (lines of errors.jsonl; a retried request can fail more "
    "than once); failed: prompts with a failed attempt and no record (given up, or still being "
    "retried); missing: "
    "records without a completion_tokens count (left out of the token figures, never counted "
    "as 0); prepared tok: the prompt ids of prompts.jsonl, every prompt prepared to be sent, "
    "sent or not ('-' when the prompts are text the server tokenizes).")


def _states(stats: RunStats) -> list[str]:
    """Each dataset's progress state (explore.progress_state), then the run's: running
    while a dataset is, else done."""
    states = [progress_state(d) for d in stats.datasets.values()]
    return [*states, RUNNING if RUNNING in states or not states else DONE]


def stats_view(stats: RunStats) -> Rendered:
    """`workbench stats` as two tables; its JSON (``workbench stats --json``) is the data.
    A dataset stopped by its token budget says "budget reached" where a running one has its
    ETA."""
    every = [*stats.datasets.values(), stats.total]
    classes = [""] * len(stats.datasets) + ["total"]
    counts = html_table(
        ["dataset", "layout", "records", "errors", "failed", "prompt tok", "completion tok",
         "cached tok", "missing", "prepared tok"],
        [_count_cells(d) for d in every], numeric=range(2, 10), row_classes=classes,
        caption="Counts (tokens are completion tokens unless named)")
    states = _states(stats)
    progress = html_table(
        ["dataset", "avg", "p50", "p90", "p99", "max", "length", "tok/s", "req/s", "done/target",
         "state / ETA"],
        [_progress_cells(d, s) for d, s in zip(every, states, strict=True)], numeric=range(1, 11),
        row_classes=classes,
        caption="Completion tokens per record, truncation (finish_reason length), rates and progress")
    note = (f'<p class="wb-note">{escaped(COUNTS_NOTE)} Rates over the last '
            f"{escaped(format_duration(stats.window))} of record timestamps, as of "
            f"{escaped(utc_text(stats.now))}; a dataset stopped by its max_tokens budget says "
            "\"budget reached\" (its remaining prompts are not sent).</p>")
    return Rendered(f'<div class="wb-report">{counts}{progress}{note}</div>', stats.to_dict())


def budget_view(budget: pd.DataFrame) -> Rendered:
    """The budget table (explore.budget_table): its state, remaining tokens and projected
    time (a state, not a time, once a dataset is done or stopped by its budget)."""
    rows, classes = [], []
    for r in budget.itertuples(index=False):
        left = "-" if r.state == RUNNING and is_nan(r.remaining_tokens) else count_text(r.remaining_tokens)
        when = (format_duration(None if is_nan(r.projected_s) else float(r.projected_s))
                if r.state == RUNNING else "-")
        rows.append([r.dataset, f"{r.records:,} / {count_text(r.target)}", pct(r.done),
                     count_text(r.completion_tokens), count_text(r.max_tokens), pct(r.budget_used),
                     _rate(r.tokens_per_s_recent), _rate(r.tokens_per_s_run), r.state, left, when])
        classes.append("total" if r.dataset == "total" else "")
    table = html_table(["dataset", "records / target", "done", "completion tok", "max_tokens",
                        "budget used", "tok/s recent", "tok/s run", "state", "tokens left",
                        "projected time"],
                       rows, numeric=(1, 2, 3, 4, 5, 6, 7, 9, 10), row_classes=classes)
    note = ('<p class="wb-note">budget reached: the dataset\'s max_tokens budget stopped it (the '
            "runner sends no request whose reply might not fit, so it can stop just below the "
            "budget, or pass it by the replies in flight); its remaining prompts are not sent, "
            "nothing is left to wait for. The total is running while one dataset is.</p>")
    return Rendered(f'<div class="wb-report">{table}{note}</div>', json_rows(budget))


def budget_figure(budget: pd.DataFrame, title: str = "Progress against target and token budget") -> go.Figure:
    """Per dataset: records done of the target, completion tokens of max_tokens (over 100%
    when replies in flight passed the budget), labelled "budget reached" when the budget
    stopped the dataset (explore.budget_table's state)."""
    rows = budget[budget["dataset"] != "total"]
    if rows.empty:
        return empty_figure(title, "no datasets")
    names = list(rows["dataset"])
    fig = go.Figure()
    fig.add_trace(go.Bar(y=names, x=rows["done"] * 100, name="records of target", orientation="h",
                         marker_color=PART_COLORS["reasoning"], text=[pct(v, 0) for v in rows["done"]],
                         textposition="outside"))
    states = rows["state"] if "state" in rows else pd.Series("", index=rows.index)
    fig.add_trace(go.Bar(y=names, x=rows["budget_used"] * 100, name="tokens of max_tokens",
                         orientation="h", marker_color=PART_COLORS["answer"],
                         text=["" if is_nan(v) else pct(v, 0) + (f" · {s}" if s == BUDGET_REACHED else "")
                               for v, s in zip(rows["budget_used"], states, strict=True)],
                         textposition="outside"))
    fig.add_vline(x=100, line={"dash": "dot", "color": "#616e7c"})
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% used",
                      yaxis={"autorange": "reversed"}, height=max(260, 130 + 60 * len(names)))
    return fig
