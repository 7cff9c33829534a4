"""Token distributions of a run's datasets: completion tokens per record (histogram, CDF),
prompt against completion tokens, the reasoning and answer split, finish reasons.

Overlapping distributions are outlines, never translucent fills that blend; a second run
(`compare`) is drawn in the same colours, dashed or open. A marker the text names is the
one drawn, and the legend says what it means: TRUNCATED_SYMBOL crosses (finish length),
UNCLOSED_SYMBOL open diamonds (reasoning without a think-end id).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.report.plots.blocks import count_text, is_nan, pct
from workbench.report.plots.figures import (
    LogChoice,
    empty_figure,
    hover_ids,
    is_log,
    log_axis,
    series_colors,
    series_groups,
)
from workbench.report.plots.style import PART_COLORS, REASON_COLORS

__all__ = [
    "COMPARED",
    "TRUNCATED_SYMBOL",
    "UNCLOSED_SYMBOL",
    "cdf_figure",
    "finish_mix_figure",
    "histogram_figure",
    "reasoning_figure",
    "scatter_figure",
]

TRUNCATED_SYMBOL = "x"  # finish "length"; no other marker uses it
COMPARED = "compared run"  # the `meta` of a second run's traces (their points are not this run's)
UNCLOSED_SYMBOL = "diamond-open"  # reasoning without a think-end id


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
        return empty_figure(title, "no records")
    colors, fig = series_colors(hist), go.Figure()
    runs = [(hist, "", False)] + ([(compare, f" ({compare_label})", True)] if compare is not None else [])
    for shaped, suffix, dashed in runs:
        for name, g in series_groups(shaped):
            fig.add_trace(_histogram_trace(g, name + suffix, _compare_color(colors, name), dashed))
    fig.update_layout(title={"text": title}, xaxis_title="completion tokens" + (" (log)" if log else ""),
                      yaxis_title="% of the dataset's records")
    log_axis(fig, log)
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
        return empty_figure(title, "no records")
    colors, fig = series_colors(curve), go.Figure()
    for name, g in series_groups(curve):
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
    log_axis(fig, log)
    return fig


def _point_data(rows: pd.DataFrame) -> dict[str, Any]:
    """A trace's per-point data: ``customdata`` the record's line (its dataset is the trace's
    legendgroup), ``hovertext`` its sample id (escaped; with its turn when the frame has a
    ``turn`` column and the record one) and finish reason. Flat arrays, which
    plotly takes and copies whole (nested lists are checked and copied item by item)."""
    ids = pd.Series(hover_ids(rows["sample_id"]), index=rows.index, dtype=object)
    if "turn" in rows.columns:  # a record of a conversation regenerated turn by turn
        turns = rows["turn"].map(lambda t: "" if pd.isna(t) else f" · turn {int(t)}").astype(object)
        ids = ids + turns
    text = "sample " + ids + "<br>finish " + rows["finish_reason"].astype(str).astype(object)
    return {"customdata": rows["line"].to_numpy(dtype="int64"), "hovertext": text.to_numpy(dtype=object)}


def _values(column: pd.Series) -> np.ndarray:
    """A count column as floats (NA as NaN, which plotly leaves out)."""
    return column.astype("Float64").to_numpy(dtype="float64", na_value=np.nan)


def _compare_points(compare: pd.DataFrame, colors: Mapping[str, str], x: str, y: str,
                    label: str) -> list[go.Scatter]:
    traces = []
    for name, g in series_groups(compare):
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
        return empty_figure(title, "no records")
    colors, fig = series_colors(sample), go.Figure()
    for name, g in series_groups(sample):
        hover = "%{hovertext}<br>" + x + " %{x:,} · " + y + " %{y:,}<extra>" + html.escape(name) + "</extra>"
        fig.add_traces(_split_markers(g, g["finish_reason"] == "length", name=name, color=colors[name],
                                      symbol=TRUNCATED_SYMBOL, x=x, y=y, hover=hover))
    if compare is not None:
        fig.add_traces(_compare_points(compare, colors, x, y, compare_label))
    if (sample["finish_reason"] == "length").any():
        fig.add_trace(_symbol_key(TRUNCATED_SYMBOL, "truncated (finish length)"))
    fig.update_layout(title={"text": title},
                      xaxis_title=x.replace("_", " ") + (" (log)" if is_log(log, x) else ""),
                      yaxis_title=y.replace("_", " ") + (" (log)" if is_log(log, y) else ""))
    log_axis(fig, log, y=True, x_column=x, y_column=y)
    return fig


def reasoning_figure(summary: pd.DataFrame, sample: pd.DataFrame,
                     title: str = "Reasoning and answer tokens (split at the think-end id)") -> go.Figure:
    """Mean reasoning and answer tokens per dataset (labelled with the reasoning share), and
    a sample of records (open diamonds: no think-end id)."""
    if summary.empty:
        return empty_figure(title, "no dataset with reasoning (thinking off, or a profile without think-end id)")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.36, 0.64], horizontal_spacing=0.09,
                        subplot_titles=("mean tokens per record", "records (sample)"))
    names = list(summary["dataset"].astype(str))
    for part in ("reasoning", "answer"):
        means = summary[f"mean_{part}"]
        fig.add_trace(go.Bar(x=names, y=means, name=f"{part} (mean)", marker_color=PART_COLORS[part],
                             text=[f"{v:,.0f}" for v in means], textposition="inside",
                             hovertemplate="%{x}: %{y:,.0f} " + part + " tokens<extra></extra>"),
                      row=1, col=1)
    for r in summary.itertuples():
        share = "-" if is_nan(r.reasoning_share) else f"{r.reasoning_share:.0%} reasoning"
        fig.add_annotation(x=str(r.dataset), y=r.mean_reasoning + r.mean_answer, text=share,
                           showarrow=False, yanchor="bottom", font={"size": 11}, row=1, col=1)
    colors = series_colors(sample)
    split = sample[sample["closed"].notna()]
    for name, g in series_groups(split):
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
        return empty_figure(title, "no records")
    per = mix.drop_duplicates("dataset")
    labels = {r.dataset: f"<b>{html.escape(str(r.dataset))}</b><br><span style='font-size:11px'>"
                         f"max_new_tokens {count_text(r.max_new_tokens)}<br>truncated "
                         f"{pct(r.truncation_rate)}</span>" for r in per.itertuples()}
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
