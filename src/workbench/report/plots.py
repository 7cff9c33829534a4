"""Figures and report blocks drawn from shaped data (see :mod:`workbench.analyze.explore`).

Figure builders return :class:`plotly.graph_objects.Figure` and compute no statistics: the
frames they take already hold every number drawn. Report blocks (header, tables, banner,
samples) return :class:`Rendered`: HTML in which every value is escaped (model text and
sample ids can hold ``<script>``), plus, for the blocks tests and tools read back, the data
shown as JSON under :data:`DATA_MIME`.

Colours are stable across a report: a dataset's colour is its position in the ``dataset``
categories of the frame (every shaped frame lists all of the run's datasets there);
finish reasons and severities have fixed colours.

What a report shows is so, and says what it rests on:

- a state is said as it is: a dataset its ``max_tokens`` budget stopped says "budget reached"
  (explore.progress_state), never an ETA, and a total agrees with its rows;
- a claim shows its threshold: a finding's count says what it is out of (records, or
  prompts), a rule's limit is drawn where its rate is;
- a marker the text names is the one drawn, and the legend says what each means:
  TRUNCATED_SYMBOL crosses, UNCLOSED_SYMBOL open diamonds, FEW_SYMBOL grey open circles;
- units fit the range: token axes are logarithmic where the data want it
  (explore.log_axes), counts and rates never share an axis;
- an info finding never outweighs a warning: findings_figure draws errors and warnings
  and lists the info findings;
- overlapping distributions are outlines, never translucent fills that blend.

:func:`setup_notebook` makes figures render, in a report run, with plotly.js inlined once
in the notebook (so an exported HTML file opens offline; see :class:`OfflineRenderer`) and
with the plotly mimetype as well; in JupyterLab with the mimetype only (Lab draws it), so
saving a notebook never stores plotly.js.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer
from plotly.subplots import make_subplots

from workbench.analyze.explore import (
    BUDGET_REACHED,
    DONE,
    MIN_BUCKET_RECORDS,
    RUNNING,
    progress_state,
)
from workbench.analyze.stats import RunStats
from workbench.analyze.subset import MAX_LEVELS, SOURCE_FIELDS
from workbench.report.jupyter import DATA_MIME, REPORT_ENV, fast_jupyter_imports
from workbench.rundir.layout import PROMPTS_FILE
from workbench.text import format_count, format_duration

__all__ = [
    "PALETTE",
    "REASON_COLORS",
    "SEVERITY_COLORS",
    "OfflineRenderer",
    "Rendered",
    "budget_figure",
    "budget_view",
    "cdf_figure",
    "contamination_view",
    "examples_view",
    "explore_scatter",
    "findings_figure",
    "findings_over_time_figure",
    "findings_view",
    "finish_mix_figure",
    "histogram_figure",
    "quality_view",
    "reasoning_figure",
    "record_view",
    "repetition_figure",
    "report_header",
    "samples_view",
    "scatter_figure",
    "scores_figure",
    "scores_view",
    "selection_view",
    "setup_notebook",
    "stats_view",
    "subset_lengths_figure",
    "subset_view",
    "validation_banner",
]

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B",
           "#9D755D", "#FF9DA6", "#79706E")
REASON_COLORS = {"stop": "#4C9F70", "length": "#E3A33B", "abort": "#C62828", "missing": "#A0A0A0"}
SEVERITY_COLORS = {"error": "#C62828", "warning": "#E67E00", "info": "#1F6FB2", "ok": "#2E7D32"}
_RULE_PALETTE = ("#C62828", "#E67E00", "#1F6FB2", "#6A3D9A", "#2E7D32", "#B15928", "#00838F",
                 "#AD1457", "#5D4037", "#546E7A")
_FONT = "Inter, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
TEMPLATE = "workbench"
HEIGHT = 420


# --- notebook setup --------------------------------------------------------------------------


def _template() -> go.layout.Template:
    layout = go.Layout(
        font={"family": _FONT, "size": 13, "color": "#1f2933"},
        title={"x": 0.0, "xanchor": "left", "font": {"size": 16}},
        colorway=list(PALETTE),
        margin={"l": 70, "r": 30, "t": 70, "b": 60},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1.0},
        hoverlabel={"font": {"family": _FONT}},
        height=HEIGHT,
    )
    return go.layout.Template(layout=layout)


class OfflineRenderer(MimetypeRenderer):  # type: ignore[misc]
    """Figures as HTML that needs no network: plotly.js inlined in the first figure drawn
    (an exported notebook is read top to bottom), no MathJax; plus the plotly mimetype,
    which JupyterLab draws instead."""

    def __init__(self) -> None:
        self.drawn: list[bool] = []  # shared by the shallow copies plotly renders with

    def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, Any]:
        markup = pio.to_html(
            fig_dict, include_plotlyjs=not self.drawn, include_mathjax=False, full_html=False,
            default_width="100%", config={"displaylogo": False, "responsive": True}, validate=False)
        self.drawn.append(True)
        return {**pio.renderers["plotly_mimetype"].to_mimebundle(fig_dict), "text/html": markup}


def setup_notebook(offline: bool | None = None) -> None:
    """Figures in the workbench style, rendered for where the notebook runs.

    In a report run (`offline`, by default when :data:`REPORT_ENV` is set, as
    :mod:`workbench.report.render` does for its kernels) with plotly.js inlined once
    (OfflineRenderer), so the exported HTML opens offline. Elsewhere (JupyterLab) only the
    plotly mimetype, which Lab draws with its own plotly.js: a saved notebook then holds the
    figures' data, not a copy of the library (megabytes per save).
    """
    fast_jupyter_imports()  # plotly's renderers import nbformat
    # merged once: a "plotly_white+workbench" default is merged again for every figure
    pio.templates[TEMPLATE] = pio.templates.merge_templates("plotly_white", _template())
    pio.templates.default = TEMPLATE
    if offline is None:
        offline = os.environ.get(REPORT_ENV) == "1"
    if offline:
        pio.renderers[TEMPLATE] = OfflineRenderer()
        pio.renderers.default = TEMPLATE
    else:
        pio.renderers.default = "plotly_mimetype"


# --- report blocks ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rendered:
    """A block of report HTML; `data` (JSON-ready) travels with it under DATA_MIME."""

    html: str
    data: Any = None

    def _repr_mimebundle_(
        self, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
    ) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/html": self.html, "text/plain": _plain(self.html)}
        if self.data is not None:
            bundle[DATA_MIME] = self.data
        return bundle

    def _repr_html_(self) -> str:
        return self.html


def _plain(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<style.*?</style>|<[^>]+>", " ", markup, flags=re.DOTALL)).strip()[:2000]


class _Html(str):
    """Markup built here from escaped parts: inserted as is."""


def _e(value: object) -> str:
    return value if isinstance(value, _Html) else html.escape("" if value is None else str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: Iterable[int] = (),
           row_classes: Sequence[str] | None = None, caption: str | None = None) -> _Html:
    right = set(numeric)

    def cells(tag: str, values: Sequence[object]) -> str:
        return "".join(f'<{tag}{" class=num" if i in right else ""}>{_e(v)}</{tag}>'
                       for i, v in enumerate(values))

    classes = row_classes or [""] * len(rows)
    body = "".join(f'<tr class="{c}">{cells("td", r)}</tr>' for r, c in zip(rows, classes, strict=True))
    head = f"<caption>{_e(caption)}</caption>" if caption else ""
    return _Html(f'<table class="wb-table">{head}<thead><tr>{cells("th", headers)}</tr></thead>'
                 f"<tbody>{body}</tbody></table>")


def _pill(label: str, color: str) -> _Html:
    return _Html(f'<span class="wb-pill" style="background:{color}">{_e(label)}</span>')


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or _nan(value) else f"{value:.{digits}%}"


def _nan(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _count(value: object) -> str:
    return "-" if _nan(value) else format_count(float(value))  # type: ignore[arg-type]


def _rate(value: object) -> str:
    if _nan(value):
        return "-"
    number = float(value)  # type: ignore[arg-type]
    return f"{number:,.2f}" if number < 10 else f"{number:,.0f}"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


REPORT_CSS = """
.wb-report{font-family:__FONT__;color:#1f2933}
.wb-header{border-bottom:3px solid #4C78A8;padding:4px 0 14px;margin-bottom:8px}
.wb-kicker{text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:#4C78A8;font-weight:600}
.wb-report .wb-header h1{font-size:28px;margin:4px 0 12px;font-weight:650}
.wb-meta{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:5px 32px;font-size:13px}
.wb-item{display:flex;gap:12px;min-width:0}
.wb-key{color:#616e7c;font-weight:500;flex:0 0 130px}
.wb-value{font-family:ui-monospace,Menlo,Consolas,monospace;overflow-wrap:anywhere;min-width:0}
.wb-table{border-collapse:collapse;font-size:13px;margin:6px 0 14px;min-width:50%}
.wb-table caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0 6px;color:#323f4b}
.wb-report .wb-table th{background:#f1f4f8;color:#323f4b;font-weight:600;text-align:left;padding:6px 10px;border:0;border-bottom:2px solid #cbd2d9;white-space:nowrap}
.wb-report .wb-table td{padding:5px 10px;border:0;border-bottom:1px solid #e4e7eb;vertical-align:top;text-align:left;background:none}
.wb-report .wb-table .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.wb-report .wb-table tr.total td{font-weight:650;border-top:2px solid #9aa5b1;background:#fafbfc}
.wb-table tr.sev-error td:first-child{box-shadow:inset 4px 0 #C62828}
.wb-table tr.sev-warning td:first-child{box-shadow:inset 4px 0 #E67E00}
.wb-table tr.sev-info td:first-child{box-shadow:inset 4px 0 #1F6FB2}
.wb-table tr.sev-ok td:first-child{box-shadow:inset 4px 0 #2E7D32}
.wb-pill{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600}
.wb-report .wb-banner{border-radius:8px;padding:16px 20px;margin:8px 0 16px;color:#fff}
.wb-banner .wb-big{font-size:22px;font-weight:700}.wb-banner .wb-sub{font-size:14px;margin-top:4px;opacity:.95}
.wb-banner.pass{background:#2E7D32}.wb-banner.fail{background:#C62828}
.wb-report .wb-code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere;margin:0;max-height:14em;overflow:auto;background:#f7f9fb;padding:4px 6px;border-radius:4px}
.wb-report .wb-table .wb-code{min-width:36ch;max-width:80ch}
.wb-report .wb-flag{white-space:nowrap;font-family:ui-monospace,Menlo,Consolas,monospace}
.wb-report .wb-card{border:1px solid #d9e2ec;border-radius:8px;padding:10px 14px;margin:10px 0}
.wb-report .wb-card h4{margin:0 0 6px;font-size:14px;font-weight:650}.wb-report .wb-part{font-size:12px;color:#616e7c;margin:6px 0 2px;font-weight:600}
.wb-report .wb-note{color:#616e7c;font-size:13px;margin:2px 0 10px}
""".replace("__FONT__", _FONT)


def report_header(overview: Any, title: str) -> Rendered:
    """The report's title and run facts (a RunOverview); also carries REPORT_CSS."""
    rows = [
        ("Run directory", str(overview.run_dir)), ("Model", overview.model or "-"),
        ("Model profile", overview.model_profile), ("Server", overview.server_url or "-"),
        ("Run started", _when(overview.created)), ("Run updated", _when(overview.updated)),
        ("Datasets", ", ".join(overview.datasets)), ("Report generated", _when(overview.generated)),
    ]
    items = "".join(f'<div class="wb-item"><span class="wb-key">{_e(k)}</span>'
                    f'<span class="wb-value">{_e(v)}</span></div>' for k, v in rows)
    version = f" · workbench {overview.workbench_version}" if overview.workbench_version else ""
    return Rendered(
        f'<div class="wb-report"><style>{REPORT_CSS}</style><div class="wb-header">'
        f'<div class="wb-kicker">EAGLE-3 data workbench{_e(version)}</div><h1>{_e(title)}</h1>'
        f'<div class="wb-meta">{items}</div></div></div>'
    )


def _count_cells(d: Any) -> list[object]:
    counts = (d.records, d.errors, d.failed_missing, d.prompt_tokens, d.completion_tokens,
              d.cached_tokens, d.missing_completion_tokens, d.prepared_prompt_tokens)
    return [d.name, d.layout, *(_count(c) for c in counts)]


def _progress_cells(d: Any, state: str) -> list[object]:
    spread = (d.avg_completion_tokens, *d.percentiles, d.max_completion_tokens)
    eta = format_duration(d.eta_s) if state == RUNNING else state
    target = f"{d.records:,}/{_count(d.target_records)}"
    return [d.name, *(_count(v) for v in spread), _pct(d.truncation_rate), _rate(d.tokens_per_s),
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
    counts = _table(
        ["dataset", "layout", "records", "errors", "failed", "prompt tok", "completion tok",
         "cached tok", "missing", "prepared tok"],
        [_count_cells(d) for d in every], numeric=range(2, 10), row_classes=classes,
        caption="Counts (tokens are completion tokens unless named)")
    states = _states(stats)
    progress = _table(
        ["dataset", "avg", "p50", "p90", "p99", "max", "length", "tok/s", "req/s", "done/target",
         "state / ETA"],
        [_progress_cells(d, s) for d, s in zip(every, states, strict=True)], numeric=range(1, 11),
        row_classes=classes,
        caption="Completion tokens per record, truncation (finish_reason length), rates and progress")
    note = (f'<p class="wb-note">{_e(COUNTS_NOTE)} Rates over the last '
            f"{_e(format_duration(stats.window))} of record timestamps, as of "
            f"{_e(_when(stats.now))}; a dataset stopped by its max_tokens budget says "
            "\"budget reached\" (its remaining prompts are not sent).</p>")
    return Rendered(f'<div class="wb-report">{counts}{progress}{note}</div>', stats.to_dict())


def budget_view(budget: pd.DataFrame) -> Rendered:
    """The budget table (explore.budget_table): its state, remaining tokens and projected
    time (a state, not a time, once a dataset is done or stopped by its budget)."""
    rows, classes = [], []
    for r in budget.itertuples(index=False):
        left = "-" if r.state == RUNNING and _nan(r.remaining_tokens) else _count(r.remaining_tokens)
        when = (format_duration(None if _nan(r.projected_s) else float(r.projected_s))
                if r.state == RUNNING else "-")
        rows.append([r.dataset, f"{r.records:,} / {_count(r.target)}", _pct(r.done),
                     _count(r.completion_tokens), _count(r.max_tokens), _pct(r.budget_used),
                     _rate(r.tokens_per_s_recent), _rate(r.tokens_per_s_run), r.state, left, when])
        classes.append("total" if r.dataset == "total" else "")
    table = _table(["dataset", "records / target", "done", "completion tok", "max_tokens",
                    "budget used", "tok/s recent", "tok/s run", "state", "tokens left",
                    "projected time"],
                   rows, numeric=(1, 2, 3, 4, 5, 6, 7, 9, 10), row_classes=classes)
    note = ('<p class="wb-note">budget reached: the dataset\'s max_tokens budget stopped it (the '
            "runner sends no request whose reply might not fit, so it can stop just below the "
            "budget, or pass it by the replies in flight); its remaining prompts are not sent, "
            "nothing is left to wait for. The total is running while one dataset is.</p>")
    return Rendered(f'<div class="wb-report">{table}{note}</div>', _records(budget))


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame as JSON-ready rows (NA and NaN as null, numpy scalars as Python ones)."""
    import json

    return json.loads(frame.to_json(orient="records", date_format="iso"))  # type: ignore[no-any-return]


def validation_banner(report: Any) -> Rendered:
    """Pass or fail, with the counts behind it; the data is ``workbench validate --json``."""
    findings = [(name, f) for name, ds in report.datasets.items() for f in ds.findings]
    errors = [(n, f) for n, f in findings if f.severity == "error"]
    warnings = sum(1 for _, f in findings if f.severity == "warning")
    records = sum(ds.records for ds in report.datasets.values())
    failed = sorted({n for n, _ in errors})
    if report.ok:
        big = f"PASSED: no error findings in {len(report.datasets)} datasets"
    else:
        big = f"FAILED: {_plural(len(errors), 'error finding')} in {', '.join(failed)}"
    sub = (f"{_plural(len(errors), 'error finding')} · {_plural(warnings, 'warning finding')} · "
           f"{_plural(records, 'record')} · model profile {report.model_profile}")
    state = "pass" if report.ok else "fail"
    return Rendered(f'<div class="wb-report"><div class="wb-banner {state}"><div class="wb-big">'
                    f'{_e(big)}</div><div class="wb-sub">{_e(sub)}</div></div></div>',
                    report.to_builtins())


def findings_view(table: pd.DataFrame) -> Rendered:
    """Findings per dataset and rule (explore.findings_table), severity in colour."""
    rows, classes, escalated = [], [], False
    for r in table.itertuples(index=False):
        sev = str(r.severity)
        raised = sev == "error" and r.default_severity not in (None, "error")
        escalated |= raised
        rows.append([r.dataset, r.rule if r.rule is not None else "no findings",
                     _pill("error (rate)" if raised else sev, SEVERITY_COLORS.get(sev, "#777")),
                     _count(r.count), _pct(r.rate, 2), _out_of(r.base, r.unit)])
        classes.append(f"sev-{sev}")
    table_html = _table(["dataset", "rule", "severity", "count", "rate", "out of"], rows,
                        numeric=(3, 4, 5), row_classes=classes)
    raised_note = '"error (rate)": a warning rule whose rate passed its threshold. ' if escalated else ""
    note = (f'<p class="wb-note">{raised_note}A count and its rate are out of the dataset\'s '
            "records, or out of its prepared prompts for the rules of prompts (missing_response, "
            "unsent_budget: prompts without a record; duplicate and near-duplicate prompts). "
            "unsent_budget is information, not a problem: the prompts a max_tokens budget left "
            "unsent.</p>")
    return Rendered(f'<div class="wb-report">{table_html}{note}</div>', _records(table))


def _out_of(base: object, unit: object) -> str:
    """`300 prompts`; `-` when the base is unknown."""
    return "-" if _nan(base) else f"{_count(base)} {unit}"


def examples_view(examples: pd.DataFrame) -> Rendered:
    """Example records of each finding, model text escaped."""
    rows, classes = [], []
    for r in examples.itertuples(index=False):
        where = f"{r.file}:{r.line}"
        code = (_Html(f'<pre class="wb-code">{_e(r.excerpt)}</pre>') if r.excerpt
                else "(a prompt: no reply)" if r.file == PROMPTS_FILE else "-")
        rows.append([r.dataset, r.rule, where, "-" if _nan(r.sample_id) else r.sample_id,
                     r.detail, code])
        classes.append(f"sev-{r.severity}")
    if not rows:
        return Rendered('<div class="wb-report"><p class="wb-note">No findings, no examples.</p></div>', [])
    body = _table(["dataset", "rule", "where", "sample_id", "detail", "end of the reply"], rows,
                  row_classes=classes)
    return Rendered(f'<div class="wb-report">{body}</div>', _records(examples))


_FILTER_NAMES = {"dataset": "dataset", "finish_reason": "finish reason", "rule": "failing rule",
                 "sample_id": "sample id"}


def _listed(value: object) -> str:
    values = list(value) if isinstance(value, list | tuple | set) else [value]
    return ", ".join(str(v) for v in values)


def _span(low: object, high: object) -> str:
    if low is not None and high is not None:
        return f"{_count(low)} to {_count(high)}"
    return f"at least {_count(low)}" if low is not None else f"at most {_count(high)}"


def _filter_words(filters: Mapping[str, Any], searched: tuple[int, int] | None) -> list[str]:
    """The active filters in plain words: ``dataset: a, b``, ``completion tokens: 10 to 300``,
    ``reply contains "x" (searched the first 5,000 of 9,000 records)``."""
    said = [f"{_FILTER_NAMES[key]}: {_listed(filters[key])}" for key in _FILTER_NAMES if key in filters]
    for column in ("completion_tokens", "prompt_tokens"):
        low, high = filters.get(f"min_{column}"), filters.get(f"max_{column}")
        if low is not None or high is not None:
            said.append(f"{column.replace('_', ' ')}: {_span(low, high)}")
    if filters.get("truncated"):
        said.append("truncated replies only (finish length)")
    if filters.get("unclosed"):
        said.append("reasoning without a think-end id only")
    if filters.get("search"):
        part = ""
        if searched is not None and searched[0] < searched[1]:
            part = f" (searched the first {searched[0]:,} of {searched[1]:,} records)"
        said.append(f'reply contains "{filters["search"]}"{part}')
    return said


def selection_view(selected: pd.DataFrame, frame: pd.DataFrame, filters: Mapping[str, Any], *,
                   searched: tuple[int, int] | None = None, compact: bool = False) -> Rendered:
    """How many records pass the explore filters, per dataset, and the filters in plain words
    (`searched`: how many of how many records a text search read). `compact`: one line per
    fact (the explorer's status line) instead of a table."""
    active = {k: v for k, v in filters.items() if v not in (None, False, "")}
    words = "; ".join(_filter_words(active, searched)) or "none (every record)"
    counts = selected.groupby("dataset", observed=True).size()
    totals = frame.groupby("dataset", observed=True).size()
    parts = [(str(name), int(counts.get(name, 0)), int(total)) for name, total in totals.items()]
    data = {"selected": len(selected), "records": len(frame), "filters": active}
    head = f"<b>{len(selected):,}</b> of {len(frame):,} records selected"
    empty = (' <span class="wb-empty">No record matches these filters: clear one, or press Reset.</span>'
             if selected.empty and len(frame) else "")
    if compact:
        per = " · ".join(f"{_e(name)} {n:,} of {total:,}" for name, n, total in parts)
        return Rendered(f'<div class="wb-report wb-selection"><p class="wb-note">{head} ({per}).{empty}</p>'
                        f'<p class="wb-note">Filters: {_e(words)}.</p></div>', data)
    table = _table(["dataset", "selected", "records"], [[name, f"{n:,}", f"{total:,}"] for name, n, total in parts],
                   numeric=(1, 2))
    return Rendered(f'<div class="wb-report"><p class="wb-note">Filters: {_e(words)}. {head}.{empty}</p>'
                    f"{table}</div>", data)


def samples_view(samples: Sequence[Any]) -> Rendered:
    """Cards of sample records (explore.samples): reasoning and answer, escaped."""
    cards = [_sample_card(s) for s in samples]
    body = "".join(cards) or '<p class="wb-note">No record matches the filters.</p>'
    return Rendered(f'<div class="wb-report">{body}</div>', [s.to_dict() for s in samples])


def _sample_card(s: Any) -> str:
    title = (f"{s.dataset} · line {s.line} · sample {s.sample_id} · finish {s.finish_reason} · "
             f"{_count(s.prompt_tokens)} prompt / {_count(s.completion_tokens)} completion tokens")
    kind = "decoded text" if s.decoded else "token ids (no tokenizer given)"
    parts = [("Reasoning", s.reasoning)] if s.reasoning is not None else []
    parts.append(("Answer", s.answer))
    blocks = "".join(f'<div class="wb-part">{_e(name)} ({_e(kind)})</div>'
                     f'<pre class="wb-code">{_e(text) or "(empty)"}</pre>' for name, text in parts)
    cut = '<div class="wb-note">cut at the character limit</div>' if s.cut else ""
    return f'<div class="wb-card"><h4>{_e(title)}</h4>{blocks}{cut}</div>'


def _stop_text(detail: Any) -> str:
    """The matched stop as its token's name and id (``<|im_end|> (163586)``), or as given."""
    if detail.matched_stop is None:
        return "-"
    name = getattr(detail, "matched_stop_name", None)
    return f"{name} ({detail.matched_stop})" if name and name != str(detail.matched_stop) else str(detail.matched_stop)


def record_view(detail: Any | None, *, notice: str | None = None) -> Rendered:
    """One record in full (explore.record_detail): counts, findings, prompt, reasoning and
    answer, model text escaped; the data is the detail itself. `notice` says first, in a
    warning box, what the user must know about it (filtered out, not found); without a
    detail the notice alone is shown."""
    said = f'<p class="wb-notice">{_e(notice)}</p>' if notice else ""
    if detail is None:
        return Rendered(f'<div class="wb-report"><div class="wb-card wb-record-missing">{said}</div></div>',
                        {"notice": notice})
    title = f"{detail.dataset} · line {detail.line} · sample {detail.sample_id}"
    facts = [("finish reason", detail.finish_reason or "-"), ("matched stop", _stop_text(detail)),
             ("prompt tokens", _count(detail.prompt_tokens)), ("completion tokens", _count(detail.completion_tokens)),
             ("cached tokens", _count(detail.cached_tokens))]
    counts = ('<p class="wb-facts">' + "".join(  # wraps in a narrow panel, unlike a table's columns
        f'<span style="display:inline-block;margin:0 16px 4px 0"><span class="wb-key">{_e(key)}</span> '
        f"<b>{_e(value)}</b></span>" for key, value in facts) + "</p>")
    found = "".join(f"<li><b>{_e(rule)}</b>: {_e(text)}</li>" for rule, text in detail.findings)
    findings = f"<ul>{found}</ul>" if found else '<p class="wb-note">no per-record findings</p>'
    kind = "decoded, special tokens shown" if detail.decoded else "token ids (no tokenizer given)"
    parts = [("Prompt", detail.prompt if detail.prompt is not None else "(not in prompts.jsonl)")]
    parts += [("Reasoning", detail.reasoning)] if detail.reasoning is not None else []
    parts.append(("Answer", detail.answer))
    blocks = "".join(f'<div class="wb-part">{_e(name)} ({_e(kind)})</div>'
                     f'<pre class="wb-code wb-record-{name.lower()}">{_e(text) or "(empty)"}</pre>'
                     for name, text in parts)
    data = {**detail.to_dict(), "notice": notice}
    return Rendered(f'<div class="wb-report"><div class="wb-card wb-record">{said}<h4>{_e(title)}</h4>'
                    f"{counts}{findings}{blocks}</div></div>", data)


# --- figures ---------------------------------------------------------------------------------


def _names(frame: pd.DataFrame, column: str = "dataset") -> list[str]:
    values = frame[column]
    if isinstance(values.dtype, pd.CategoricalDtype):
        return [str(c) for c in values.cat.categories]
    return list(dict.fromkeys(str(v) for v in values))


def _colors(frame: pd.DataFrame, column: str = "dataset") -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(_names(frame, column))}


def _present(frame: pd.DataFrame, column: str = "dataset") -> list[tuple[str, pd.DataFrame]]:
    return [(str(n), g) for n, g in frame.groupby(column, observed=True, sort=True)]


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure(layout={"title": {"text": title}, "height": 220})
    fig.add_annotation(text=message, showarrow=False, font={"size": 14, "color": "#616e7c"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _alpha(color: str, alpha: float) -> str:
    red, green, blue = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


LOG_TICKS: dict[str, Any] = {"type": "log", "dtick": 1, "tickformat": "~s",
                             "minor": {"dtick": "D1", "showgrid": True, "gridcolor": "#f3f5f7"}}
"""A log axis ticked at powers of ten as plain numbers (1, 10, 100, 1k), unlabelled minor
grid lines between them."""
TRUNCATED_SYMBOL = "x"  # finish "length"; no other marker uses it
COMPARED = "compared run"  # the `meta` of a second run's traces (their points are not this run's)
UNCLOSED_SYMBOL = "diamond-open"  # reasoning without a think-end id


LogChoice = bool | Mapping[str, bool]
"""Log axes: one answer for every token axis of a figure, or one per column
(explore.log_axes: chosen by the data when a report's ``log_axis`` is None)."""


def _is_log(log: LogChoice, column: str) -> bool:
    return bool(log.get(column, False)) if isinstance(log, Mapping) else bool(log)


def _log_axis(fig: go.Figure, log: LogChoice, *, y: bool = False, x_column: str = "",
              y_column: str = "", **where: Any) -> None:
    """LOG_TICKS on x (and on y with `y`) where `log` says so for the axis's column."""
    if _is_log(log, x_column):
        fig.update_xaxes(**LOG_TICKS, **where)
    if y and _is_log(log, y_column):
        fig.update_yaxes(**LOG_TICKS, **where)


def _split_markers(g: pd.DataFrame, mask: pd.Series, *, name: str, color: str, symbol: str,
                   x: str, y: str, hover: str) -> list[go.Scatter]:
    """One dataset's points as two traces of one legend group: circles (the legend entry,
    drawn even when empty) and the points of `mask` in `symbol` (never in the legend, so
    the dataset's legend marker is always a circle)."""
    marked = mask.fillna(False).astype(bool).to_numpy()
    traces = []
    for part, points in (("circle", ~marked), (symbol, marked)):
        if part == symbol and not points.any():
            continue
        rows = g[points]
        traces.append(go.Scatter(
            x=_values(rows[x]), y=_values(rows[y]), name=name, legendgroup=name, showlegend=part == "circle",
            mode="markers", marker={"color": color, "symbol": part, "size": 6, "opacity": 0.7},
            hovertemplate=hover, **_point_data(rows)))
    return traces


def _symbol_key(symbol: str, label: str) -> go.Scatter:
    """A legend-only entry saying what a marker symbol means."""
    return go.Scatter(x=[None], y=[None], mode="markers", name=label, legendgroup=f"key-{symbol}",
                      marker={"symbol": symbol, "color": "#616e7c", "size": 8}, hoverinfo="skip")


def _compare_color(colors: Mapping[str, str], name: str) -> str:
    return colors.get(name, "#616e7c")


def histogram_figure(hist: pd.DataFrame, *, log: bool = False,
                     title: str = "Completion tokens per record",
                     compare: pd.DataFrame | None = None, compare_label: str = "run B") -> go.Figure:
    """Step outlines of explore.histogram, unfilled (translucent fills over each other blend
    into one colour): share of each dataset's records per bin; a second run's histogram
    (`compare`, on the same bins) as dashed outlines in the same colours. `log` must be what
    the bins were made with (log-spaced bins on a log axis)."""
    if hist.empty and (compare is None or compare.empty):
        return _empty(title, "no records")
    colors, fig = _colors(hist), go.Figure()
    runs = [(hist, "", False)] + ([(compare, f" ({compare_label})", True)] if compare is not None else [])
    for shaped, suffix, dashed in runs:
        for name, g in _present(shaped):
            fig.add_trace(_histogram_trace(g, name + suffix, _compare_color(colors, name), dashed))
    fig.update_layout(title={"text": title}, xaxis_title="completion tokens" + (" (log)" if log else ""),
                      yaxis_title="% of the dataset's records")
    _log_axis(fig, log)
    return fig


def _histogram_trace(g: pd.DataFrame, name: str, color: str, dashed: bool) -> go.Scatter:
    x = [*g["left"], g["right"].iloc[-1]]
    y = [*(g["share"] * 100), g["share"].iloc[-1] * 100]
    custom = [[f"{a:,.0f}–{b:,.0f}", c] for a, b, c in zip(g["left"], g["right"], g["count"], strict=True)]
    return go.Scatter(
        x=x, y=y, name=name, mode="lines",
        line={"shape": "hv", "color": color, "width": 2, "dash": "dash" if dashed else "solid"},
        customdata=[*custom, custom[-1]],
        hovertemplate="%{customdata[0]} tokens<br>%{customdata[1]} records (%{y:.1f}%)<extra>"
                      + html.escape(name) + "</extra>")


def cdf_figure(curve: pd.DataFrame, *, log: bool = False,
               max_new_tokens: Mapping[str, int | None] | None = None,
               title: str = "Cumulative share of records by completion tokens") -> go.Figure:
    """explore.cdf per dataset; a dashed line marks each dataset's max_new_tokens."""
    if curve.empty:
        return _empty(title, "no records")
    colors, fig = _colors(curve), go.Figure()
    for name, g in _present(curve):
        fig.add_trace(go.Scatter(
            x=g["value"], y=g["fraction"] * 100, name=name, mode="lines",
            line={"shape": "hv", "color": colors[name], "width": 2},
            hovertemplate="≤ %{x:,} tokens: %{y:.1f}%<extra>" + html.escape(name) + "</extra>"))
    caps: dict[int, list[str]] = {}
    for name, cap in (max_new_tokens or {}).items():
        if cap and name in colors:
            caps.setdefault(cap, []).append(name)
    for cap, names in caps.items():
        color = colors[names[0]] if len(names) == 1 else "#616e7c"
        fig.add_vline(x=cap, line={"dash": "dash", "color": color, "width": 1.5})
        fig.add_annotation(x=math.log10(cap) if log else cap, y=4, xanchor="right", yanchor="bottom", showarrow=False,
                           text=f"max_new_tokens {cap:,}<br>{', '.join(names)}",
                           font={"size": 11, "color": color}, align="right",
                           xref="x", yref="y", bgcolor="rgba(255,255,255,0.8)")
    fig.update_layout(title={"text": title}, xaxis_title="completion tokens" + (" (log)" if log else ""),
                      yaxis_title="% of records at or below", yaxis_range=[0, 101])
    _log_axis(fig, log)
    return fig


def _hover_ids(values: Iterable[object]) -> list[str]:
    return [html.escape(str(v)) for v in values]


def _point_data(rows: pd.DataFrame) -> dict[str, Any]:
    """A trace's per-point data: ``customdata`` the record's line (its dataset is the trace's
    legendgroup), ``hovertext`` its sample id (escaped) and finish reason. Flat arrays, which
    plotly takes and copies whole (nested lists are checked and copied item by item)."""
    ids = pd.Series(_hover_ids(rows["sample_id"]), index=rows.index, dtype=object)
    text = "sample " + ids + "<br>finish " + rows["finish_reason"].astype(str).astype(object)
    return {"customdata": rows["line"].to_numpy(dtype="int64"), "hovertext": text.to_numpy(dtype=object)}


def _values(column: pd.Series) -> np.ndarray:
    """A count column as floats (NA as NaN, which plotly leaves out)."""
    return column.astype("Float64").to_numpy(dtype="float64", na_value=np.nan)


def _compare_points(compare: pd.DataFrame, colors: Mapping[str, str], x: str, y: str,
                    label: str) -> list[go.Scatter]:
    traces = []
    for name, g in _present(compare):
        shown = f"{name} ({label})"
        traces.append(go.Scatter(
            x=_values(g[x]), y=_values(g[y]), name=shown, legendgroup=shown, mode="markers", meta=COMPARED,
            marker={"color": _compare_color(colors, name), "symbol": "circle-open", "size": 6, "opacity": 0.5},
            hovertemplate="%{hovertext}<br>" + x + " %{x:,} · " + y + " %{y:,}<extra>"
            + html.escape(shown) + "</extra>", **_point_data(g)))
    return traces


def scatter_figure(sample: pd.DataFrame, *, log: LogChoice = False, x: str = "prompt_tokens",
                   y: str = "completion_tokens",
                   title: str = "Prompt tokens against completion tokens (sample)",
                   compare: pd.DataFrame | None = None, compare_label: str = "run B") -> go.Figure:
    """Sampled records, columns x against y; truncated ones (finish length) drawn as crosses.
    Each point carries its record's line as customdata (see _point_data). A second
    run's sample (`compare`) is drawn as open circles in the same colours. `log`: both axes,
    or per column (explore.log_axes)."""
    if sample.empty and (compare is None or compare.empty):
        return _empty(title, "no records")
    colors, fig = _colors(sample), go.Figure()
    for name, g in _present(sample):
        hover = "%{hovertext}<br>" + x + " %{x:,} · " + y + " %{y:,}<extra>" + html.escape(name) + "</extra>"
        fig.add_traces(_split_markers(g, g["finish_reason"] == "length", name=name, color=colors[name],
                                      symbol=TRUNCATED_SYMBOL, x=x, y=y, hover=hover))
    if compare is not None:
        fig.add_traces(_compare_points(compare, colors, x, y, compare_label))
    if (sample["finish_reason"] == "length").any():
        fig.add_trace(_symbol_key(TRUNCATED_SYMBOL, "truncated (finish length)"))
    fig.update_layout(title={"text": title},
                      xaxis_title=x.replace("_", " ") + (" (log)" if _is_log(log, x) else ""),
                      yaxis_title=y.replace("_", " ") + (" (log)" if _is_log(log, y) else ""))
    _log_axis(fig, log, y=True, x_column=x, y_column=y)
    return fig


_PART_COLORS = {"reasoning": "#334E68", "answer": "#9FB3C8"}


def reasoning_figure(summary: pd.DataFrame, sample: pd.DataFrame,
                     title: str = "Reasoning and answer tokens (split at the think-end id)") -> go.Figure:
    """Mean reasoning and answer tokens per dataset (labelled with the reasoning share), and
    a sample of records (open diamonds: no think-end id)."""
    if summary.empty:
        return _empty(title, "no dataset with reasoning (thinking off, or a profile without think-end id)")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.36, 0.64], horizontal_spacing=0.09,
                        subplot_titles=("mean tokens per record", "records (sample)"))
    names = list(summary["dataset"].astype(str))
    for part in ("reasoning", "answer"):
        means = summary[f"mean_{part}"]
        fig.add_trace(go.Bar(x=names, y=means, name=f"{part} (mean)", marker_color=_PART_COLORS[part],
                             text=[f"{v:,.0f}" for v in means], textposition="inside",
                             hovertemplate="%{x}: %{y:,.0f} " + part + " tokens<extra></extra>"),
                      row=1, col=1)
    for r in summary.itertuples():
        share = "-" if _nan(r.reasoning_share) else f"{r.reasoning_share:.0%} reasoning"
        fig.add_annotation(x=str(r.dataset), y=r.mean_reasoning + r.mean_answer, text=share,
                           showarrow=False, yanchor="bottom", font={"size": 11}, row=1, col=1)
    colors = _colors(sample)
    split = sample[sample["closed"].notna()]
    for name, g in _present(split):
        hover = "%{hovertext}<br>reasoning %{x:,} · answer %{y:,}<extra>" + html.escape(name) + "</extra>"
        fig.add_traces(_split_markers(g, g["closed"].eq(False), name=name, color=colors[name],
                                      symbol=UNCLOSED_SYMBOL, x="reasoning_tokens", y="answer_tokens",
                                      hover=hover), rows=1, cols=2)
    if split["closed"].eq(False).any():
        fig.add_trace(_symbol_key(UNCLOSED_SYMBOL, "no think-end id"), row=1, col=2)
    fig.update_layout(title={"text": title}, barmode="stack", height=500,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0.5,
                              "xanchor": "center", "traceorder": "normal"},
                      margin={"b": 110})
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_xaxes(title_text="reasoning tokens", row=1, col=2)
    fig.update_yaxes(title_text="answer tokens", row=1, col=2)
    return fig


def finish_mix_figure(mix: pd.DataFrame, title: str = "Finish reasons and truncation") -> go.Figure:
    """100% bars of finish reasons per dataset, labelled with max_new_tokens and the
    truncation rate."""
    if mix.empty:
        return _empty(title, "no records")
    per = mix.drop_duplicates("dataset")
    labels = {r.dataset: f"<b>{html.escape(str(r.dataset))}</b><br><span style='font-size:11px'>"
                         f"max_new_tokens {_count(r.max_new_tokens)}<br>truncated "
                         f"{_pct(r.truncation_rate)}</span>" for r in per.itertuples()}
    fig = go.Figure()
    for reason in dict.fromkeys(mix["reason"]):
        part = mix[mix["reason"] == reason]
        fig.add_trace(go.Bar(
            y=[labels[d] for d in part["dataset"]], x=part["share"] * 100, name=str(reason),
            orientation="h", marker_color=REASON_COLORS.get(str(reason), "#6A3D9A"),
            text=[f"{s:.1%}" if s >= 0.06 else "" for s in part["share"]], textposition="inside",
            insidetextanchor="middle", customdata=part["count"],
            hovertemplate=str(reason) + ": %{customdata:,} records (%{x:.1f}%)<extra></extra>"))
    fig.update_layout(title={"text": title}, barmode="stack", xaxis_title="% of records",
                      legend={"traceorder": "normal"},
                      xaxis_range=[0, 100], yaxis={"autorange": "reversed"},
                      height=max(280, 130 + 80 * len(per)), margin={"l": 170}, bargap=0.35)
    return fig


def budget_figure(budget: pd.DataFrame, title: str = "Progress against target and token budget") -> go.Figure:
    """Per dataset: records done of the target, completion tokens of max_tokens (over 100%
    when replies in flight passed the budget), labelled "budget reached" when the budget
    stopped the dataset (explore.budget_table's state)."""
    rows = budget[budget["dataset"] != "total"]
    if rows.empty:
        return _empty(title, "no datasets")
    names = list(rows["dataset"])
    fig = go.Figure()
    fig.add_trace(go.Bar(y=names, x=rows["done"] * 100, name="records of target", orientation="h",
                         marker_color=_PART_COLORS["reasoning"], text=[_pct(v, 0) for v in rows["done"]],
                         textposition="outside"))
    states = rows["state"] if "state" in rows else pd.Series("", index=rows.index)
    fig.add_trace(go.Bar(y=names, x=rows["budget_used"] * 100, name="tokens of max_tokens",
                         orientation="h", marker_color=_PART_COLORS["answer"],
                         text=["" if _nan(v) else _pct(v, 0) + (f" · {s}" if s == BUDGET_REACHED else "")
                               for v, s in zip(rows["budget_used"], states, strict=True)],
                         textposition="outside"))
    fig.add_vline(x=100, line={"dash": "dot", "color": "#616e7c"})
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% used",
                      yaxis={"autorange": "reversed"}, height=max(260, 130 + 60 * len(names)))
    return fig


_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
DRAWN_SEVERITIES = ("error", "warning")


def _info_lines(info: pd.DataFrame) -> list[str]:
    """One line per info rule: its rate in each dataset (`rule: B1 47.3%, B2 78.8%`)."""
    lines = []
    for rule, g in info.groupby("rule", sort=False):
        rates = ", ".join(f"{r.dataset} {_pct(r.rate)} ({_count(r.count)} of {_out_of(r.base, r.unit)})"
                          for r in g.itertuples(index=False))
        lines.append(f"{html.escape(str(rule))}: {html.escape(rates)}")
    return lines


def findings_figure(table: pd.DataFrame,
                    title: str = "Findings: share of records per rule (errors and warnings)") -> go.Figure:
    """Rate of every error and warning finding per rule, one bar per dataset, errors first
    (explore.findings_table). Info findings are listed under the bars, never drawn as bars:
    a note (the prompts a budget left unsent, near duplicates) must not outweigh a warning."""
    rated = table[table["rule"].notna() & table["rate"].notna()]
    found = rated[rated["severity"].isin(DRAWN_SEVERITIES)]
    info = _info_lines(rated[~rated["severity"].isin(DRAWN_SEVERITIES)])
    if found.empty:
        fig = _empty(title, "no error or warning finding")
    else:
        fig = _findings_bars(found, _colors(table), title)
    if info:
        fig.add_annotation(text="<b>info, not drawn</b> (see the table)<br>" + "<br>".join(info),
                           showarrow=False, xref="paper", yref="paper", x=0, y=0, xanchor="left",
                           yanchor="top", yshift=-60 if not found.empty else -10, align="left",
                           font={"size": 11, "color": SEVERITY_COLORS["info"]})
        fig.update_layout(height=fig.layout.height + 24 + 16 * len(info),
                          margin={"b": 80 + 16 * len(info)})
    return fig


def _findings_bars(found: pd.DataFrame, colors: Mapping[str, str], title: str) -> go.Figure:
    ranked = found.assign(rank=found["severity"].map(_SEVERITY_RANK)).sort_values("rank", kind="stable")
    rules = list(dict.fromkeys(ranked["rule"]))
    fig = go.Figure()
    for name, g in _present(found):
        fig.add_trace(go.Bar(
            y=g["rule"], x=g["rate"] * 100, name=name, orientation="h", marker_color=colors[name],
            customdata=list(zip(g["count"], g["severity"], [_out_of(b, u) for b, u in zip(
                g["base"], g["unit"], strict=True)], strict=True)),
            hovertemplate="%{y}: %{customdata[0]:,} of %{customdata[2]} (%{x:.2f}%), "
                          "%{customdata[1]}<extra>" + html.escape(name) + "</extra>"))
    fig.update_layout(title={"text": title}, barmode="group",
                      xaxis_title="% of the dataset's records (of its prompts for prompt rules)",
                      yaxis={"categoryorder": "array", "categoryarray": rules, "autorange": "reversed"},
                      height=max(260, 140 + 28 * len(rules) * len(_present(found))))
    return fig


def _middle(buckets: pd.DataFrame) -> pd.Series:
    """Where a time bucket is drawn: its middle."""
    return buckets["start"] + pd.to_timedelta(buckets["seconds"] / 2, unit="s")


_FEW_COLOR = "#9aa5b1"


FEW_SYMBOL = "circle-open"  # a rule's rate in a bucket of too few records to say much


def _rule_traces(part: pd.DataFrame, rule: str, color: str, name: str) -> list[go.Scatter]:
    """A rule's share failing per bucket: a line over buckets with enough records, grey open
    circles (no line, no alarm colour; the legend entry FEW_LABEL says what they are) over
    buckets with fewer; counts in the hover."""
    enough = part["enough"].astype(bool) if "enough" in part else pd.Series(True, index=part.index)
    hover = (rule + ": %{customdata[0]} of %{customdata[1]} records (%{y:.1f}%)%{customdata[2]}"
             "<extra>" + html.escape(name) + "</extra>")
    traces = []
    for full, rows in ((True, part), (False, part[~enough])):
        rate = rows["rate"].where(enough[rows.index]) if full else rows["rate"]
        note = "" if full else "<br>a bucket of too few records: the rate says little"
        custom = [[c, n, note] for c, n in zip(rows["count"], rows["records"], strict=True)]
        style = ({"mode": "lines+markers", "line": {"color": color, "width": 2}, "marker": {"size": 5},
                  "name": rule, "legendgroup": rule, "showlegend": False} if full else
                 {"mode": "markers", "marker": {"size": 6, "color": _FEW_COLOR, "symbol": FEW_SYMBOL},
                  "name": f"{rule} (few records)", "legendgroup": "few", "showlegend": False})
        if full or not rows.empty:
            traces.append(go.Scatter(x=_middle(rows), y=rate * 100, connectgaps=False,
                                     customdata=custom, hovertemplate=hover, **style))
    return traces


def _time_legend(rules: Sequence[str], colors: Mapping[str, str], few: int) -> list[go.Scatter]:
    """Legend-only entries: each rule's line, and what a grey open circle is."""
    keys = [go.Scatter(x=[None], y=[None], mode="lines+markers", name=rule, legendgroup=rule,
                       line={"color": colors[rule], "width": 2}, hoverinfo="skip") for rule in rules]
    keys.append(go.Scatter(x=[None], y=[None], mode="markers", legendgroup="few",
                           name=f"rate in a bucket of fewer than {few} records (says little)",
                           marker={"size": 7, "color": _FEW_COLOR, "symbol": FEW_SYMBOL},
                           hoverinfo="skip"))
    return keys


def findings_over_time_figure(over_time: pd.DataFrame,
                              title: str = "Findings over time (per-record rules, by record timestamp)",
                              *, min_records: int = MIN_BUCKET_RECORDS) -> go.Figure:
    """A top panel of the records written per time bucket (a step line per dataset, its own
    count axis), then per dataset the share of them failing each rule (% axis; lines broken
    where nothing was written). A bucket of fewer than `min_records` records (the
    ``enough`` column of explore.findings_over_time) is a grey open circle, explained in the
    legend, not part of the line. The time axis spans the buckets, so one bucket is a point
    in a bucket-wide range."""
    if over_time.empty:
        return _empty(title, "no records with a timestamp")
    present = [n for n in _names(over_time) if (over_time["dataset"] == n).any()]
    fig = make_subplots(rows=len(present) + 1, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.7] + [1.0] * len(present),
                        subplot_titles=["records written per bucket",
                                        *(f"{n}: % of its records failing" for n in present)])
    rules = sorted(str(r) for r in over_time["rule"].dropna().unique())
    colors = {rule: _RULE_PALETTE[i % len(_RULE_PALETTE)] for i, rule in enumerate(rules)}
    fig.add_traces(_written_traces(over_time, present), rows=1, cols=1)
    for row, name in enumerate(present, start=2):
        g = over_time[over_time["dataset"] == name]
        for rule in rules:
            fig.add_traces(_rule_traces(g[g["rule"] == rule].sort_values("start"), rule,
                                        colors[rule], name), rows=row, cols=1)
        fig.update_yaxes(title_text="% failing", rangemode="tozero", row=row, col=1)
    if rules:
        fig.add_traces(_time_legend(rules, colors, min_records), rows=2, cols=1)
    else:
        fig.add_annotation(text="no per-record rule failed", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.4, font={"size": 14, "color": "#2E7D32"})
    width = int(over_time["seconds"].iloc[0])
    fig.update_yaxes(title_text="records", rangemode="tozero", tickformat=",d", row=1, col=1)
    fig.update_xaxes(range=[over_time["start"].min(), over_time["start"].max()
                            + pd.Timedelta(seconds=width)])
    height = 300 + 190 * len(present)
    fig.update_layout(title={"text": f"{title}; buckets of {format_duration(width)}"},
                      height=height, **_legend_below(height, 150))
    fig.update_xaxes(title_text="record time (UTC)", row=len(present) + 1, col=1)
    return fig


def _legend_below(height: int, bottom: int) -> dict[str, Any]:
    """A horizontal legend under the x axis title (in a bottom margin of `bottom` px)."""
    plot = height - 70 - bottom  # the template's top margin
    return {"legend": {"orientation": "h", "yanchor": "top", "y": -75 / plot, "xanchor": "left",
                       "x": 0.0}, "margin": {"b": bottom}}


def _written_traces(over_time: pd.DataFrame, present: Sequence[str]) -> list[go.Scatter]:
    """Records written per bucket, a step line per dataset in its colour."""
    colors, traces = _colors(over_time), []
    for name in present:
        buckets = over_time[over_time["dataset"] == name].drop_duplicates("start").sort_values("start")
        ends = buckets["start"] + pd.to_timedelta(buckets["seconds"], unit="s")
        x = [*buckets["start"], ends.iloc[-1]]
        y = [*buckets["records"], buckets["records"].iloc[-1]]
        traces.append(go.Scatter(x=x, y=y, mode="lines", name=f"{name}: records written",
                                 line={"shape": "hv", "color": colors[name], "width": 1.5},
                                 hovertemplate="%{y:,} records<extra>" + html.escape(name) + "</extra>"))
    return traces


NO_MATCH = "no records match the filters"


def _count_axis(values: Sequence[pd.Series]) -> dict[str, Any]:
    """A linear count axis from 0 to just past the largest value (0 to 1 when there is none),
    ticked at whole numbers: never the -1 to 1 plotly picks for a column of zeros."""
    tops = [float(v.max()) for v in values if len(v) and not _nan(v.max())]
    top = max(tops, default=0.0)
    if top < 5:
        return {"range": [0, max(top, 1.0) * 1.08], "autorange": False, "tickmode": "linear", "tick0": 0, "dtick": 1}
    return {"range": [0, top * 1.05], "autorange": False, "tickmode": "auto", "rangemode": "nonnegative"}


def _keep_legend(fig: go.Figure) -> None:
    """Give a legend trace with no points one empty point: plotly.js leaves traces without
    data out of the legend, so a dataset whose points are all truncated lost its entry."""
    for trace in fig.data:
        if trace.showlegend is not False and trace.x is not None and len(trace.x) == 0:
            trace.update(x=[None], y=[None], customdata=None, hovertext=None)


def _no_match(fig: go.Figure) -> go.Figure:
    """An empty figure at the usual height, saying why it is empty."""
    fig.update_layout(height=HEIGHT)
    for note in fig.layout.annotations:
        note.text = NO_MATCH
    return fig


def explore_scatter(sample: pd.DataFrame, *, x: str = "prompt_tokens", y: str = "completion_tokens",
                    log: bool = False, title: str = "Records: pick a dataset in the menu",
                    compare: pd.DataFrame | None = None, compare_label: str = "run B",
                    menu: bool = True) -> go.Figure:
    """The explorer's scatter_figure: every dataset in the legend (even with only truncated
    points), count axes from 0, the usual height when empty; with `menu`, a dataset menu
    (plotly buttons: works offline, without widgets)."""
    fig = scatter_figure(sample, x=x, y=y, log=log, title=title, compare=compare, compare_label=compare_label)
    if not menu:  # the legend from the left under the title: it wraps, never runs off
        fig.update_layout(legend={"x": 0.0, "xanchor": "left"}, title={"y": 0.98, "yanchor": "top"},
                          margin={"t": 80})
    if not fig.data:
        return _no_match(fig)
    _keep_legend(fig)
    if not log:
        both = [sample] + ([compare] if compare is not None else [])
        fig.update_layout(height=HEIGHT, xaxis=_count_axis([f[x] for f in both]),
                          yaxis=_count_axis([f[y] for f in both]))
    present = [name for name, _ in _present(sample)]
    if not menu or not present:
        return fig
    groups = [trace.legendgroup for trace in fig.data]

    def showing(names: Sequence[str]) -> list[bool]:
        return [group in names or group not in present for group in groups]

    buttons = [{"label": "all datasets", "method": "update", "args": [{"visible": showing(present)}]}]
    buttons += [{"label": name, "method": "update", "args": [{"visible": showing([name])}]}
                for name in present]
    fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "down", "x": 0.0, "y": 1.02,
                                    "xanchor": "left", "yanchor": "bottom"}], margin={"t": 110})
    return fig


def subset_lengths_figure(curves: pd.DataFrame, *, log: bool = False,
                          title: str = "Prompt length: sent subset against the whole dataset") -> go.Figure:
    """subset.compare_subsets(...).length_curves as cumulative shares per dataset: the whole
    dataset solid, the sent subset dashed (apart: a biased subset); `log`: a log length axis."""
    if curves.empty:
        return _empty(title, "no prompts")
    colors, fig = _colors(curves), go.Figure()
    for name, g in _present(curves):
        for group, dash in (("whole", "solid"), ("sent", "dash")):
            part = g[g["group"] == group]
            if part.empty:
                continue
            fig.add_trace(go.Scatter(
                x=part["value"], y=part["fraction"] * 100,
                name=f"{name} {group}", mode="lines",
                line={"shape": "hv", "color": colors[name], "width": 2, "dash": dash},
                hovertemplate="≤ %{x:,} tokens: %{y:.1f}%<extra>" + html.escape(f"{name} {group}") + "</extra>"))
    fig.update_layout(title={"text": title}, xaxis_title="prompt tokens" + (" (log)" if log else ""),
                      yaxis_title="% of prompts at or below", yaxis_range=[0, 101])
    _log_axis(fig, log)
    return fig


def subset_view(comparison: Any) -> Rendered:
    """The tables of subset.compare_subsets: prompt length per dataset (KS test), and the
    shares of each source-like field (chi-square test); biased rows marked."""
    rows, classes = [], []
    for r in comparison.lengths.itertuples(index=False):
        rows.append([r.dataset, f"{r.sent:,} / {r.whole:,}", _number(r.mean_whole), _number(r.mean_sent),
                     _ratio(r.mean_ratio), _ratio(r.ks_d), _pvalue(r.ks_p),
                     _pill("biased", "#c0392b") if r.biased else "fair"])
        classes.append("")
    html_parts = [_table(["dataset", "sent / whole", "mean prompt (whole)", "mean prompt (sent)",
                          "ratio", "KS D", "p-value", ""], rows, numeric=range(1, 7),
                         row_classes=classes, caption="Prompt length")]
    tests = comparison.share_tests
    if not tests.empty:
        shares = comparison.shares
        rows = []
        for t in tests.itertuples(index=False):
            part = shares[(shares["dataset"] == t.dataset) & (shares["field"] == t.field)]
            top = ", ".join(f"{v.value} {v.whole_share:.0%} -> {v.sent_share:.0%}"
                            for v in part.head(6).itertuples(index=False))
            rows.append([t.dataset, t.field, t.levels, _ratio(t.tvd), _pvalue(t.chi2_p), top,
                         _pill("biased", "#c0392b") if t.biased else "fair"])
        html_parts.append(_table(["dataset", "field", "values", "total variation", "p-value",
                                  "share whole -> sent", ""], rows, numeric=range(2, 5),
                                 caption="Shares of source-like fields"))
    html_parts.append(_untested_note(comparison))
    records = {"lengths": _records(comparison.lengths), "shares": _records(comparison.shares),
               "share_tests": _records(comparison.share_tests)}
    return Rendered(f'<div class="wb-report">{"".join(html_parts)}</div>', records)


def _untested_note(comparison: Any) -> str:
    """Which datasets got no chi-square test of shares, and why: their file has no
    source-like field (subset.SOURCE_FIELDS, with text values, at most MAX_LEVELS of them)."""
    tested = set(comparison.share_tests["dataset"].astype(str))
    untested = [str(d) for d in comparison.lengths["dataset"] if str(d) not in tested]
    if not untested:
        return ""
    which = ("no dataset file has a" if not tested
             else f"the file of {', '.join(untested)} has no")
    return (f'<p class="wb-note">No chi-square test of shares: {_e(which)} source-like field '
            f"({_e(', '.join(SOURCE_FIELDS))}; with text values, at most {MAX_LEVELS} distinct), "
            "so only the prompt lengths are compared.</p>")


def _number(value: object) -> str:
    return "-" if _nan(value) else f"{float(value):,.0f}"  # type: ignore[arg-type]


def _ratio(value: object) -> str:
    return "-" if _nan(value) else f"{float(value):.3f}"  # type: ignore[arg-type]


def _pvalue(value: object) -> str:
    if _nan(value):
        return "-"
    return "< 0.001" if float(value) < 0.001 else f"{float(value):.3f}"  # type: ignore[arg-type]


# --- data quality ------------------------------------------------------------------------------

_QUALITY_HEADERS = {
    "duplicate_prompt": "dup prompts", "near_duplicate_prompt": "near-dup prompts",
    "duplicate_reply": "dup replies", "near_duplicate_reply": "near-dup replies",
    "contaminated_prompt": "contam. prompts", "contaminated_reply": "contam. replies",
    "repetition": "loops", "special_heavy": "special-heavy", "no_answer": "no answer",
}


def quality_view(table: pd.DataFrame, *, benchmarks: bool = False) -> Rendered:
    """The data-quality counts per dataset (quality_frames.quality_table), each with its share
    of the dataset's records (prompts for the prompt columns)."""
    rules = [c for c in _QUALITY_HEADERS if c in table.columns]
    rows = []
    for r in table.to_dict("records"):
        cells: list[object] = [r["dataset"], _count(r["records"]), _count(r["prompts"])]
        for rule in rules:
            base = r["prompts"] if rule.endswith("_prompt") else r["records"]
            count = int(r[rule])
            share = f" ({count / base:.1%})" if count and base and not _nan(base) else ""
            cells.append("-" if rule.startswith("contaminated") and not benchmarks
                         else f"{count:,}{share}")
        rows.append(cells)
    headers = ["dataset", "records", "prompts", *(_QUALITY_HEADERS[r] for r in rules)]
    body = _table(headers, rows, numeric=range(1, len(headers)),
                  caption="Duplicates, benchmark contamination and degenerate replies")
    note = ('<p class="wb-note">dup: the same ids (prompts: ids, or normalised words of a text) '
            "as an earlier prompt or reply of the run (the first copy is not counted); near-dup: "
            "a MinHash estimate of shingle overlap at the near-duplicate threshold or more; "
            "contam.: holds an n-gram of a benchmark (<code>decontaminate</code>, else the ones "
            "generate was given; '-': none); loops and special-heavy: the repetition and "
            "special_heavy rules (a reply mostly inside repeated n-grams, or mostly special "
            "ids); no answer: reasoning that "
            "never reached an answer (no think-end id, nothing after it, or cut inside it).</p>")
    return Rendered(f'<div class="wb-report">{body}{note}</div>', _records(table))


def repetition_figure(hist: pd.DataFrame, threshold: float,
                      title: str = "Share of each reply inside repeated n-grams") -> go.Figure:
    """explore.histogram of quality_frames.repeat_shares, the repetition rule's limit marked;
    the y axis is logarithmic: the few replies in a loop are what matters."""
    if hist.empty:
        return _empty(title, "no replies with ids")
    colors, fig = _colors(hist), go.Figure()
    for name, g in _present(hist):
        fig.add_trace(go.Bar(
            x=(g["left"] + g["right"]) / 2 * 100, y=g["count"], name=name,
            marker_color=colors[name], width=(g["right"] - g["left"]) * 100 * 0.9 / max(1, len(_present(hist))),
            customdata=list(zip(g["left"] * 100, g["right"] * 100, g["share"] * 100, strict=True)),
            hovertemplate="%{customdata[0]:.0f}–%{customdata[1]:.0f}% repeated: %{y:,} replies "
                          "(%{customdata[2]:.2f}%)<extra>" + html.escape(name) + "</extra>"))
    fig.add_vline(x=threshold * 100, line={"color": SEVERITY_COLORS["warning"], "dash": "dash"},
                  annotation_text=f"repetition rule: {threshold:.0%}", annotation_position="top")
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% of the reply's ids "
                      "inside an n-gram that occurs twice or more in its part (reasoning or answer)",
                      yaxis_title="replies (log)",
                      xaxis={"range": [0, 100]})
    fig.update_yaxes(**LOG_TICKS)
    return fig


def contamination_view(table: pd.DataFrame, notes: Sequence[str] = ()) -> Rendered:
    """Per benchmark and dataset, the prompts and replies holding one of its n-grams
    (quality_frames.contamination_table); `notes`: lines on how the benchmarks were chosen
    (the run's, files gone), shown above."""
    said = "".join(f'<p class="wb-note">{html.escape(note)}</p>' for note in notes)
    if table.empty:
        return Rendered(f'<div class="wb-report">{said}<p class="wb-note">No benchmark looked '
                        "for: pass <code>decontaminate</code> (benchmark files), or "
                        "<code>workbench generate --decontaminate</code> to keep them with the "
                        "run.</p></div>", [])
    rows = [[r["benchmark"], f"{r['items']:,}" + (f" ({r['skipped']:,} too short)" if r["skipped"] else ""),
             r["dataset"], _count(r["prompts"]), _count(r["replies"])]
            for r in table.to_dict("records")]
    body = _table(["benchmark", "items", "dataset", "prompts", "replies"], rows, numeric=(3, 4),
                  caption="Records holding an n-gram of a benchmark item")
    return Rendered(f'<div class="wb-report">{said}{body}</div>', _records(table))


def scores_view(scores: pd.DataFrame) -> go.Figure | Rendered:
    """:func:`scores_figure` of a scored run; a line saying how to score one otherwise."""
    if scores.empty:
        return Rendered('<div class="wb-report"><p class="wb-note">Not scored: <code>workbench '
                        "score RUN --server URL</code> adds each reply's likelihood under the "
                        "target beside the run.</p></div>", [])
    return scores_figure(scores)


def scores_figure(scores: pd.DataFrame,
                  title: str = "On-policy score: mean NLL of each reply under the target") -> go.Figure:
    """Box plots of the per-record mean NLL per dataset (quality_frames.score_frame): replies
    the target finds unlikely sit high."""
    if scores.empty:
        return _empty(title, "not scored")
    colors, fig = _colors(scores), go.Figure()
    for name, g in _present(scores):
        fig.add_trace(go.Box(y=g["nll"], name=name, marker_color=colors[name], boxpoints="outliers",
                             customdata=_hover_ids(g["sample_id"]),
                             hovertemplate="sample %{customdata}: NLL %{y:.3f}<extra></extra>"))
    fig.update_layout(title={"text": title}, yaxis_title="mean NLL per token (nats)", showlegend=False)
    return fig
