"""The validation report: the format's verdict and the data's, the findings per dataset and
rule, example records, and the findings figures (rates per rule, and over time).

A claim shows its threshold: a finding's count says what it is out of (records, or
prompts). The banner is green only when the format passed and no data-quality rate passes
its limit (amber when only the data has a concern). An info finding never outweighs a
warning: findings_figure draws errors, warnings and the data-quality rates (near duplicates
teach nothing, whatever their severity) and lists the other info findings. Over time, a rate in a bucket of too few records is
a grey open circle (FEW_SYMBOL), explained in the legend, not part of the line.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analyze.findings import DATA_LIMITS
from workbench.analyze.tables import MIN_BUCKET_RECORDS
from workbench.analyze.validate import contamination_line
from workbench.report.plots.blocks import (
    Html,
    Rendered,
    count_text,
    escaped,
    html_table,
    is_nan,
    json_rows,
    pct,
    pill,
)
from workbench.report.plots.figures import empty_figure, series_colors, series_groups, series_names
from workbench.report.plots.style import SEVERITY_COLORS
from workbench.rundir.layout import PROMPTS_FILE
from workbench.text import format_duration

__all__ = [
    "DRAWN_RULES",
    "DRAWN_SEVERITIES",
    "FEW_SYMBOL",
    "examples_view",
    "findings_figure",
    "findings_over_time_figure",
    "findings_view",
    "validation_banner",
]

_RULE_PALETTE = ("#C62828", "#E67E00", "#1F6FB2", "#6A3D9A", "#2E7D32", "#B15928", "#00838F",
                 "#AD1457", "#5D4037", "#546E7A")


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def validation_banner(report: Any, benchmarks: Any = None) -> Rendered:
    """The format's verdict (pass or fail, with the counts behind it) and the data's (each
    data concern in words); green only when both are clean, amber when the format passed
    and the data has a concern. `benchmarks` (a RunBenchmarks) says whether the benchmarks
    checked against are run.json's. The data is ``workbench validate --json``."""
    findings = [(name, f) for name, ds in report.datasets.items() for f in ds.findings]
    errors = [(n, f) for n, f in findings if f.severity == "error"]
    warnings = sum(1 for _, f in findings if f.severity == "warning")
    records = sum(ds.records for ds in report.datasets.values())
    failed = sorted({n for n, _ in errors})
    clauses = report.data_clauses()
    if not report.ok:
        big, state = f"FAILED: {_plural(len(errors), 'error finding')} in {', '.join(failed)}", "fail"
    elif clauses:
        big, state = f"format passed; data: {_plural(len(clauses), 'concern')}", "concern"
    else:
        big, state = f"PASSED: no error findings in {len(report.datasets)} datasets; data: no concern", "pass"
    sub = (f"{_plural(len(errors), 'error finding')} · {_plural(warnings, 'warning finding')} · "
           f"{_plural(records, 'record')} · model profile {report.model_profile}")
    said = [f"data: {clause}" for clause in clauses]
    contamination = contamination_line(report, benchmarks)
    said += [contamination] if contamination is not None else []
    lines = "".join(f'<div class="wb-sub">{escaped(line)}</div>' for line in said)
    return Rendered(f'<div class="wb-report"><div class="wb-banner {state}"><div class="wb-big">'
                    f'{escaped(big)}</div><div class="wb-sub">{escaped(sub)}</div>{lines}</div></div>',
                    report.to_builtins())


def findings_view(table: pd.DataFrame) -> Rendered:
    """Findings per dataset and rule (explore.findings_table), severity in colour; when a
    finding is given per mode (its ``modes``), a "by mode" column says each mode's rate."""
    per_mode = "modes" in table.columns and any(map(_by_mode, table["modes"]))
    rows, classes, escalated = [], [], False
    for r in table.itertuples(index=False):
        sev = str(r.severity)
        raised = sev == "error" and r.default_severity not in (None, "error")
        escalated |= raised
        by_mode = [_by_mode(r.modes)] if per_mode else []
        rows.append([r.dataset, r.rule if r.rule is not None else "no findings",
                     pill("error (rate)" if raised else sev, SEVERITY_COLORS.get(sev, "#777")),
                     count_text(r.count), pct(r.rate, 2), _out_of(r.base, r.unit), *by_mode])
        classes.append(f"sev-{sev}")
    headers = ["dataset", "rule", "severity", "count", "rate", "out of", *(["by mode"] if per_mode else [])]
    table_html = html_table(headers, rows, numeric=(3, 4, 5), row_classes=classes)
    raised_note = '"error (rate)": a warning rule whose rate passed its threshold. ' if escalated else ""
    note = (f'<p class="wb-note">{raised_note}A count and its rate are out of the dataset\'s '
            "records, or out of its prepared prompts for the rules of prompts (missing_response, "
            "unsent_budget: prompts without a record; duplicate and near-duplicate prompts). "
            "unsent_budget is information, not a problem: the prompts a max_tokens budget left "
            "unsent.</p>")
    return Rendered(f'<div class="wb-report">{table_html}{note}</div>', json_rows(table))


def _by_mode(modes: object) -> str:
    """`direct 7.5% (3 of 40), think 0.0% (0 of 120)`; blank for a finding not given per mode."""
    if not isinstance(modes, Mapping) or not modes:
        return ""
    return ", ".join(f"{name} {pct(m['rate'])} ({count_text(m['count'])} of {count_text(m['records'])})"
                     for name, m in modes.items())


def _out_of(base: object, unit: object) -> str:
    """`300 prompts`; `-` when the base is unknown."""
    return "-" if is_nan(base) else f"{count_text(base)} {unit}"


def _has_turns(frame: pd.DataFrame) -> bool:
    """Whether a frame of records names turns (a dataset regenerated turn by turn)."""
    return "turn" in frame.columns and bool(frame["turn"].notna().any())


def examples_view(examples: pd.DataFrame) -> Rendered:
    """Example records of each finding (explore.examples_table), model text escaped; with
    a ``turn`` column (a run with conversations regenerated turn by turn), each example's
    turn beside its sample id ("-" for a single-turn record)."""
    turns = _has_turns(examples)
    rows, classes = [], []
    for r in examples.itertuples(index=False):
        where = f"{r.file}:{r.line}"
        code = (Html(f'<pre class="wb-code">{escaped(r.excerpt)}</pre>') if r.excerpt
                else "(a prompt: no reply)" if r.file == PROMPTS_FILE else "-")
        turn = ["-" if is_nan(r.turn) else int(r.turn)] if turns else []
        rows.append([r.dataset, r.rule, where, "-" if is_nan(r.sample_id) else r.sample_id,
                     *turn, r.detail, code])
        classes.append(f"sev-{r.severity}")
    if not rows:
        return Rendered('<div class="wb-report"><p class="wb-note">No findings, no examples.</p></div>', [])
    headers = ["dataset", "rule", "where", "sample_id", *(["turn"] if turns else []), "detail",
               "end of the reply"]
    body = html_table(headers, rows, row_classes=classes)
    return Rendered(f'<div class="wb-report">{body}</div>', json_rows(examples))


_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
DRAWN_SEVERITIES = ("error", "warning")
DRAWN_RULES = tuple(DATA_LIMITS)  # data-quality rules: drawn whatever their severity


def _info_lines(info: pd.DataFrame) -> list[str]:
    """One line per info rule: its rate in each dataset (`rule: B1 47.3%, B2 78.8%`)."""
    lines = []
    for rule, g in info.groupby("rule", sort=False):
        rates = ", ".join(f"{r.dataset} {pct(r.rate)} ({count_text(r.count)} of {_out_of(r.base, r.unit)})"
                          for r in g.itertuples(index=False))
        lines.append(f"{html.escape(str(rule))}: {html.escape(rates)}")
    return lines


def findings_figure(table: pd.DataFrame,
                    title: str = "Findings: share of records per rule (errors, warnings, data quality)",
                    ) -> go.Figure:
    """Rate of every error and warning finding and of every data-quality rule (DRAWN_RULES:
    near duplicates, duplicates, loops, contamination, info or not) per rule, one bar per
    dataset, errors first (explore.findings_table). The other info findings are listed under
    the bars, never drawn: a note (the prompts a budget left unsent) must not outweigh a
    warning."""
    rated = table[table["rule"].notna() & table["rate"].notna()]
    drawn = rated["severity"].isin(DRAWN_SEVERITIES) | rated["rule"].isin(DRAWN_RULES)
    found = rated[drawn]
    info = _info_lines(rated[~drawn])
    if found.empty:
        fig = empty_figure(title, "no error or warning finding, nor a data-quality rate")
    else:
        fig = _findings_bars(found, series_colors(table), title)
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
    for name, g in series_groups(found):
        fig.add_trace(go.Bar(
            y=g["rule"], x=g["rate"] * 100, name=name, orientation="h", marker_color=colors[name],
            customdata=list(zip(g["count"], g["severity"], [_out_of(b, u) for b, u in zip(
                g["base"], g["unit"], strict=True)], strict=True)),
            hovertemplate="%{y}: %{customdata[0]:,} of %{customdata[2]} (%{x:.2f}%), "
                          "%{customdata[1]}<extra>" + html.escape(name) + "</extra>"))
    fig.update_layout(title={"text": title}, barmode="group",
                      xaxis_title="% of the dataset's records (of its prompts for prompt rules)",
                      yaxis={"categoryorder": "array", "categoryarray": rules, "autorange": "reversed"},
                      height=max(260, 140 + 28 * len(rules) * len(series_groups(found))))
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
        return empty_figure(title, "no records with a timestamp")
    present = [n for n in series_names(over_time) if (over_time["dataset"] == n).any()]
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
    colors, traces = series_colors(over_time), []
    for name in present:
        buckets = over_time[over_time["dataset"] == name].drop_duplicates("start").sort_values("start")
        ends = buckets["start"] + pd.to_timedelta(buckets["seconds"], unit="s")
        x = [*buckets["start"], ends.iloc[-1]]
        y = [*buckets["records"], buckets["records"].iloc[-1]]
        traces.append(go.Scatter(x=x, y=y, mode="lines", name=f"{name}: records written",
                                 line={"shape": "hv", "color": colors[name], "width": 1.5},
                                 hovertemplate="%{y:,} records<extra>" + html.escape(name) + "</extra>"))
    return traces
