"""Figures and report blocks drawn from shaped data (see :mod:`workbench.analyze.explore`).

Figure builders return :class:`plotly.graph_objects.Figure` and compute no statistics: the
frames they take already hold every number drawn. Report blocks (header, tables, banner,
samples) return :class:`Rendered`: HTML in which every value is escaped (model text and
sample ids can hold ``<script>``), plus, for the blocks tests and tools read back, the data
shown as JSON under :data:`DATA_MIME`.

Colours are stable across a report: a dataset's colour is its position in the ``dataset``
categories of the frame (every shaped frame lists all of the run's datasets there);
finish reasons and severities have fixed colours.

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

from workbench.analyze.stats import RunStats
from workbench.report.jupyter import DATA_MIME, REPORT_ENV, fast_jupyter_imports
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
.wb-report .wb-code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere;margin:0;max-height:14em;overflow:auto;background:#f7f9fb;padding:4px 6px;border-radius:4px}
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


def _progress_cells(d: Any) -> list[object]:
    spread = (d.avg_completion_tokens, *d.percentiles, d.max_completion_tokens)
    eta = "done" if d.finished else format_duration(d.eta_s)
    target = f"{d.records:,}/{_count(d.target_records)}"
    return [d.name, *(_count(v) for v in spread), _pct(d.truncation_rate), _rate(d.tokens_per_s),
            _rate(d.requests_per_s), target, eta]


def stats_view(stats: RunStats) -> Rendered:
    """`workbench stats` as two tables; its JSON (``workbench stats --json``) is the data."""
    every = [*stats.datasets.values(), stats.total]
    classes = [""] * len(stats.datasets) + ["total"]
    counts = _table(
        ["dataset", "layout", "records", "errors", "failed", "prompt tok", "completion tok",
         "cached tok", "missing", "prepared tok"],
        [_count_cells(d) for d in every], numeric=range(2, 10), row_classes=classes,
        caption="Counts (tokens are completion tokens unless named; missing = records without a count)")
    progress = _table(
        ["dataset", "avg", "p50", "p90", "p99", "max", "length", "tok/s", "req/s", "done/target", "ETA"],
        [_progress_cells(d) for d in every], numeric=range(1, 11), row_classes=classes,
        caption="Completion tokens per record, truncation (finish_reason length), rates and progress")
    note = (f'<p class="wb-note">Rates over the last {_e(format_duration(stats.window))} of record '
            f"timestamps, as of {_e(_when(stats.now))}.</p>")
    return Rendered(f'<div class="wb-report">{counts}{progress}{note}</div>', stats.to_dict())


def budget_view(budget: pd.DataFrame) -> Rendered:
    """The budget table (explore.budget_table) with remaining tokens and projected time."""
    rows, classes = [], []
    for r in budget.itertuples(index=False):
        rows.append([r.dataset, f"{r.records:,} / {_count(r.target)}", _pct(r.done),
                     _count(r.completion_tokens), _count(r.max_tokens), _pct(r.budget_used),
                     _rate(r.tokens_per_s_recent), _rate(r.tokens_per_s_run),
                     _count(r.remaining_tokens), "done" if r.finished else format_duration(
                         None if _nan(r.projected_s) else float(r.projected_s))])
        classes.append("total" if r.dataset == "total" else "")
    table = _table(["dataset", "records / target", "done", "completion tok", "max_tokens",
                    "budget used", "tok/s recent", "tok/s run", "tokens left", "projected time"],
                   rows, numeric=range(1, 10), row_classes=classes)
    return Rendered(f'<div class="wb-report">{table}</div>', _records(budget))


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
                     _count(r.count), _pct(r.rate, 2), _count(r.records)])
        classes.append(f"sev-{sev}")
    table_html = _table(["dataset", "rule", "severity", "count", "rate", "records"], rows,
                        numeric=(3, 4, 5), row_classes=classes)
    raised_note = '"error (rate)": a warning rule whose rate passed its threshold. ' if escalated else ""
    note = (f'<p class="wb-note">{raised_note}Rates are over the dataset\'s records (prompts for '
            "missing_response).</p>")
    return Rendered(f'<div class="wb-report">{table_html}{note}</div>', _records(table))


def examples_view(examples: pd.DataFrame) -> Rendered:
    """Example records of each finding, model text escaped."""
    rows, classes = [], []
    for r in examples.itertuples(index=False):
        where = f"{r.file}:{r.line}"
        code = _Html(f'<pre class="wb-code">{_e(r.excerpt)}</pre>') if r.excerpt else "-"
        rows.append([r.dataset, r.rule, where, "-" if _nan(r.sample_id) else r.sample_id,
                     r.detail, code])
        classes.append(f"sev-{r.severity}")
    if not rows:
        return Rendered('<div class="wb-report"><p class="wb-note">No findings, no examples.</p></div>', [])
    body = _table(["dataset", "rule", "where", "sample_id", "detail", "end of the reply"], rows,
                  row_classes=classes)
    return Rendered(f'<div class="wb-report">{body}</div>', _records(examples))


def selection_view(selected: pd.DataFrame, frame: pd.DataFrame, filters: Mapping[str, Any]) -> Rendered:
    """How many records pass the explore filters, per dataset."""
    active = {k: v for k, v in filters.items() if v not in (None, False)}
    said = ", ".join(f"{k} = {v}" for k, v in active.items()) or "none"
    counts = selected.groupby("dataset", observed=True).size()
    totals = frame.groupby("dataset", observed=True).size()
    rows = [[name, f"{int(counts.get(name, 0)):,}", f"{int(total):,}"] for name, total in totals.items()]
    table = _table(["dataset", "selected", "records"], rows, numeric=(1, 2))
    data = {"selected": len(selected), "records": len(frame), "filters": active}
    return Rendered(f'<div class="wb-report"><p class="wb-note">Filters: {_e(said)}. '
                    f"{len(selected):,} of {len(frame):,} records selected.</p>{table}</div>", data)


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


def record_view(detail: Any) -> Rendered:
    """One record in full (explore.record_detail): counts, findings, prompt, reasoning and
    answer, model text escaped; the data is the detail itself."""
    title = f"{detail.dataset} · line {detail.line} · sample {detail.sample_id}"
    counts = _table(["finish reason", "matched stop", "prompt tok", "completion tok", "cached tok"],
                    [[detail.finish_reason or "-", "-" if detail.matched_stop is None else detail.matched_stop,
                      _count(detail.prompt_tokens), _count(detail.completion_tokens),
                      _count(detail.cached_tokens)]], numeric=(2, 3, 4))
    found = "".join(f"<li><b>{_e(rule)}</b>: {_e(text)}</li>" for rule, text in detail.findings)
    findings = f"<ul>{found}</ul>" if found else '<p class="wb-note">no per-record findings</p>'
    kind = "decoded, special tokens shown" if detail.decoded else "token ids (no tokenizer given)"
    parts = [("Prompt", detail.prompt if detail.prompt is not None else "(not in prompts.jsonl)")]
    parts += [("Reasoning", detail.reasoning)] if detail.reasoning is not None else []
    parts.append(("Answer", detail.answer))
    blocks = "".join(f'<div class="wb-part">{_e(name)} ({_e(kind)})</div>'
                     f'<pre class="wb-code wb-record-{name.lower()}">{_e(text) or "(empty)"}</pre>'
                     for name, text in parts)
    return Rendered(f'<div class="wb-report"><div class="wb-card wb-record"><h4>{_e(title)}</h4>'
                    f"{counts}{findings}{blocks}</div></div>", detail.to_dict())


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


def _log_axis(fig: go.Figure, log: bool, *, y: bool = False, **where: Any) -> None:
    if log:
        fig.update_xaxes(**LOG_TICKS, **where)
        if y:
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
    """Step outlines of explore.histogram: share of each dataset's records per bin; a second
    run's histogram (`compare`, on the same bins) as dashed outlines in the same colours."""
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
        fill=None if dashed else "tozeroy", fillcolor=None if dashed else _alpha(color, 0.12),
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


def scatter_figure(sample: pd.DataFrame, *, log: bool = False, x: str = "prompt_tokens",
                   y: str = "completion_tokens",
                   title: str = "Prompt tokens against completion tokens (sample)",
                   compare: pd.DataFrame | None = None, compare_label: str = "run B") -> go.Figure:
    """Sampled records, columns x against y; truncated ones (finish length) drawn as crosses.
    Each point carries its record's line as customdata (see _point_data). A second
    run's sample (`compare`) is drawn as open circles in the same colours."""
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
    fig.update_layout(title={"text": title}, xaxis_title=x.replace("_", " "),
                      yaxis_title=y.replace("_", " "))
    _log_axis(fig, log, y=True)
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
    when replies in flight passed the budget)."""
    rows = budget[budget["dataset"] != "total"]
    if rows.empty:
        return _empty(title, "no datasets")
    names = list(rows["dataset"])
    fig = go.Figure()
    fig.add_trace(go.Bar(y=names, x=rows["done"] * 100, name="records of target", orientation="h",
                         marker_color=_PART_COLORS["reasoning"], text=[_pct(v, 0) for v in rows["done"]],
                         textposition="outside"))
    fig.add_trace(go.Bar(y=names, x=rows["budget_used"] * 100, name="tokens of max_tokens",
                         orientation="h", marker_color=_PART_COLORS["answer"],
                         text=["" if _nan(v) else _pct(v, 0) for v in rows["budget_used"]],
                         textposition="outside"))
    fig.add_vline(x=100, line={"dash": "dot", "color": "#616e7c"})
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% used",
                      yaxis={"autorange": "reversed"}, height=max(260, 130 + 60 * len(names)))
    return fig


def findings_figure(table: pd.DataFrame, title: str = "Findings: share of records per rule") -> go.Figure:
    """Rate of every finding per rule, one bar per dataset (explore.findings_table)."""
    found = table[table["rule"].notna() & table["rate"].notna()]
    if found.empty:
        return _empty(title, "no findings with a rate")
    colors, fig = _colors(table), go.Figure()
    for name, g in _present(found):
        fig.add_trace(go.Bar(
            y=g["rule"], x=g["rate"] * 100, name=name, orientation="h", marker_color=colors[name],
            customdata=list(zip(g["count"], g["severity"], strict=True)),
            hovertemplate="%{y}: %{customdata[0]:,} records (%{x:.2f}%), %{customdata[1]}<extra>"
                          + html.escape(name) + "</extra>"))
    rules = len(dict.fromkeys(found["rule"]))
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% of records",
                      yaxis={"autorange": "reversed"}, height=max(260, 140 + 28 * rules * len(_present(found))))
    return fig


def _middle(buckets: pd.DataFrame) -> pd.Series:
    """Where a time bucket is drawn: its middle."""
    return buckets["start"] + pd.to_timedelta(buckets["seconds"] / 2, unit="s")


_FEW_COLOR = "#9aa5b1"


def _rule_traces(part: pd.DataFrame, rule: str, color: str, name: str, *, first: bool) -> list[go.Scatter]:
    """A rule's share failing per bucket: a line over buckets with enough records, grey open
    markers (no line, no alarm colour) over buckets with fewer; counts in the hover."""
    enough = part["enough"].astype(bool) if "enough" in part else pd.Series(True, index=part.index)
    hover = (rule + ": %{customdata[0]} of %{customdata[1]} records (%{y:.1f}%)%{customdata[2]}"
             "<extra>" + html.escape(name) + "</extra>")
    traces = []
    for full, rows in ((True, part), (False, part[~enough])):
        rate = rows["rate"].where(enough[rows.index]) if full else rows["rate"]
        note = "" if full else "<br>too few records to say much"
        custom = [[c, n, note] for c, n in zip(rows["count"], rows["records"], strict=True)]
        style = ({"mode": "lines+markers", "line": {"color": color, "width": 2}, "marker": {"size": 5},
                  "name": rule, "showlegend": first} if full else
                 {"mode": "markers", "marker": {"size": 6, "color": _FEW_COLOR, "symbol": "circle-open"},
                  "name": f"{rule} (few records)", "showlegend": False})
        if full or not rows.empty:
            traces.append(go.Scatter(x=_middle(rows), y=rate * 100, legendgroup=rule, connectgaps=False,
                                     customdata=custom, hovertemplate=hover, **style))
    return traces


def findings_over_time_figure(over_time: pd.DataFrame,
                              title: str = "Findings over time (per-record rules, by record timestamp)") -> go.Figure:
    """Per dataset panel: records written per time bucket (grey bars, right axis) and the share
    of them failing each rule (lines, broken where nothing was written; a bucket of too few
    records, see explore.findings_over_time, is a grey open marker, not part of the line)."""
    if over_time.empty:
        return _empty(title, "no records with a timestamp")
    present = [n for n in _names(over_time) if (over_time["dataset"] == n).any()]
    fig = make_subplots(rows=len(present), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=present, specs=[[{"secondary_y": True}]] * len(present))
    rules = sorted(str(r) for r in over_time["rule"].dropna().unique())
    colors = {rule: _RULE_PALETTE[i % len(_RULE_PALETTE)] for i, rule in enumerate(rules)}
    for row, name in enumerate(present, start=1):
        g = over_time[over_time["dataset"] == name]
        buckets = g.drop_duplicates("start").sort_values("start")
        fig.add_trace(go.Bar(x=_middle(buckets), y=buckets["records"], name="records written",
                             marker_color="rgba(154,165,177,0.35)", showlegend=row == 1,
                             width=float(buckets["seconds"].iloc[0]) * 1000 * 0.9,
                             legendgroup="records", hovertemplate="%{y:,} records<extra></extra>"),
                      row=row, col=1, secondary_y=True)
        for rule in rules:
            part = g[g["rule"] == rule].sort_values("start")
            fig.add_traces(_rule_traces(part, rule, colors[rule], name, first=row == 1),
                           rows=row, cols=1)
        fig.update_yaxes(title_text="% failing", rangemode="tozero", row=row, col=1, secondary_y=False)
        fig.update_yaxes(title_text="records", rangemode="tozero", showgrid=False, tickmode="auto",
                         nticks=4, tickformat=",d", row=row, col=1, secondary_y=True)
    if not rules:
        fig.add_annotation(text="no per-record rule failed", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.5, font={"size": 14, "color": "#2E7D32"})
    width = int(over_time["seconds"].iloc[0])
    fig.update_layout(title={"text": f"{title}; buckets of {format_duration(width)}"},
                      height=max(340, 140 + 230 * len(present)))
    fig.update_xaxes(title_text="record time (UTC)", row=len(present), col=1)
    return fig


def explore_scatter(sample: pd.DataFrame, *, x: str = "prompt_tokens", y: str = "completion_tokens",
                    log: bool = False, title: str = "Records: pick a dataset in the menu") -> go.Figure:
    """scatter_figure with a dataset menu (plotly buttons: works offline, without widgets)."""
    fig = scatter_figure(sample, x=x, y=y, log=log, title=title)
    present = [name for name, _ in _present(sample)]
    if not present:
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


def subset_lengths_figure(curves: pd.DataFrame,
                          title: str = "Prompt length: sent subset against the whole dataset") -> go.Figure:
    """subset.compare_subsets(...).length_curves as cumulative shares per dataset: the whole
    dataset solid, the sent subset dashed (apart: a biased subset)."""
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
    fig.update_layout(title={"text": title}, xaxis_title="prompt tokens",
                      yaxis_title="% of prompts at or below", yaxis_range=[0, 101])
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
    records = {"lengths": _records(comparison.lengths), "shares": _records(comparison.shares),
               "share_tests": _records(comparison.share_tests)}
    return Rendered(f'<div class="wb-report">{"".join(html_parts)}</div>', records)


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
            "contam.: holds an n-gram of a benchmark given with --decontaminate ('-': none "
            "given); loops and special-heavy: the repetition and special_heavy rules (a reply "
            "mostly inside repeated n-grams, or mostly special ids); no answer: reasoning that "
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


def contamination_view(table: pd.DataFrame) -> Rendered:
    """Per benchmark and dataset, the prompts and replies holding one of its n-grams
    (quality_frames.contamination_table)."""
    if table.empty:
        return Rendered('<div class="wb-report"><p class="wb-note">No benchmark given: '
                        "pass <code>decontaminate</code> (benchmark files) to look for "
                        "them.</p></div>", [])
    rows = [[r["benchmark"], f"{r['items']:,}" + (f" ({r['skipped']:,} too short)" if r["skipped"] else ""),
             r["dataset"], _count(r["prompts"]), _count(r["replies"])]
            for r in table.to_dict("records")]
    body = _table(["benchmark", "items", "dataset", "prompts", "replies"], rows, numeric=(3, 4),
                  caption="Records holding an n-gram of a benchmark item")
    return Rendered(f'<div class="wb-report">{body}</div>', _records(table))


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
