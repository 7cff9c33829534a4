"""Figures and report blocks of a tuning sweep, drawn from shaped data.

The frames come from :mod:`workbench.tune` (`curves_frame`, `configs_frame`,
`results_frame`) and the recommendation from `tune.recommend_sweep`; nothing is computed
here. Figures return :class:`plotly.graph_objects.Figure`; blocks return
:class:`workbench.report.plots.Rendered` (escaped HTML, plus the data shown under the workbench
data mimetype so tools and tests can read it back from an executed notebook). A
configuration keeps its colour in every figure: its position in the sweep's order.

As in :mod:`workbench.report.plots`, a claim shows what it rests on: "within the limits"
beside the limits (in the column headers, and drawn in the latency figure), latencies in the
unit their range wants (latency_unit: never `15k` ms), a share as a percentage in a table as
in its chart, the model the sweep measured beside the job it projects, a failure reason
said once with its flags whole.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import __version__
from workbench.report.plots.blocks import REPORT_CSS, Rendered
from workbench.report.plots.blocks import Html as _Html
from workbench.report.plots.blocks import escaped as _e
from workbench.report.plots.figures import empty_figure as _empty
from workbench.report.plots.figures import series_colors as _series_colors
from workbench.report.plots.figures import series_groups as _series_groups
from workbench.report.plots.figures import series_names as _series_names
from workbench.tune import format_gpu_hours, format_gpus, format_hours
from workbench.tune.recommendation import LIMIT_LABELS, format_latency_ms

__all__ = [
    "capacity_figure",
    "fidelity_figure",
    "fidelity_view",
    "latency_figure",
    "points_view",
    "recommendation_view",
    "sweep_header",
    "throughput_figure",
    "usage_figure",
]

FAILED_COLOR = "#C62828"
_BOTTOM_LEGEND: dict[str, Any] = {
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "center", "x": 0.5},
    "margin": {"b": 120},
}
_LATENCIES = (("ttft", "TTFT", "ms"), ("itl", "ITL", "ms"), ("e2e", "end-to-end", "s"))


def latency_unit(values_ms: Iterable[Any]) -> tuple[float, str]:
    """(divisor, unit) for latencies in milliseconds: seconds when the largest known value
    is a second or more (a TTFT axis of `15k` ms reads as 15 s), else milliseconds."""
    known = [abs(float(v)) for v in values_ms if v is not None and not pd.isna(v)]
    return (1000.0, "s") if known and max(known) >= 1000 else (1.0, "ms")


def _column_unit(frame: pd.DataFrame, key: str, unit: str,
                 limits: Mapping[str, float] | None = None) -> tuple[float, str]:
    """The divisor and unit of a latency's p50 and p99 columns (`ttft`, "ms"), the limits
    on them included (their lines share the axis)."""
    if unit != "ms":
        return 1.0, unit
    columns = [c for c in (f"{key}_p50_ms", f"{key}_p99_ms") if c in frame]
    set_limits = [v for name, v in (limits or {}).items() if name.startswith(f"{key}_")]
    return latency_unit([*(v for c in columns for v in frame[c]), *set_limits])


def _limit_lines(fig: go.Figure, key: str, unit: str, scale: float, shown: str,
                 limits: Mapping[str, float], col: int) -> None:
    """A red dotted line per limit set on this latency (`ttft_p99_ms`), labelled."""
    for q in ("p50", "p99"):
        limit = limits.get(f"{key}_{q}_{unit}")
        if limit is None:
            continue
        fig.add_hline(y=limit / scale, line={"dash": "dot", "color": FAILED_COLOR, "width": 1.5},
                      annotation_text=f"limit {q} {limit / scale:,.3g} {shown}",
                      annotation_position="top left", annotation_font={"color": FAILED_COLOR, "size": 11},
                      row=1, col=col)


_REPEATED = ("out of memory",)
_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")


def reason_text(reason: str) -> str:
    """A failure reason with each marker said once: a launcher that prefixes "out of
    memory:" to a server line that says it again (`out of memory: sim: out of memory: ...`)
    keeps the text from its last mention."""
    lowered = reason.lower()
    for marker in _REPEATED:
        first, last = lowered.find(marker), lowered.rfind(marker)
        if first != last:
            reason, lowered = reason[:first] + reason[last:], lowered[:first] + lowered[last:]
    return reason


def _reason_html(reason: str) -> _Html:
    """reason_text escaped, each command-line flag kept on one line (never `--` /
    `mem-fraction-static`)."""
    escaped = html.escape(reason_text(reason))
    return _Html(_FLAG.sub(lambda m: f'<span class="wb-flag">{m.group(0)}</span>', escaped))


def _names(frame: pd.DataFrame) -> list[str]:
    return _series_names(frame, "config")


def _colors(frame: pd.DataFrame) -> dict[str, str]:
    return _series_colors(frame, "config")


def _groups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return _series_groups(frame, "config")


def _concurrency_axis(fig: go.Figure, curves: pd.DataFrame, **where: Any) -> None:
    """Concurrency on x (log when it spans 8x or more); one concurrency: configurations."""
    ticks = sorted({int(c) for c in curves["concurrency"]})
    if len(ticks) == 1:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=_names(curves),
                         title_text=f"configuration, at {ticks[0]} concurrent requests", **where)
        return
    fig.update_xaxes(type="log" if len(ticks) > 2 and ticks[-1] / ticks[0] >= 8 else "linear",
                     tickvals=ticks, title_text="concurrent requests", **where)


def _series(g: pd.DataFrame, y: pd.Series, name: str, color: str, hover: str, *,
            single: bool, faded: bool = False, **extra: Any) -> go.Bar | go.Scatter:
    """A configuration's values: a line against concurrency, or a bar when the sweep has a
    single concurrency (`hover` describes %{y} for either)."""
    tail = "<extra>" + _e(name) + "</extra>"
    if single:
        return go.Bar(x=[name] * len(g), y=y, name=name, hovertemplate=hover + tail,
                      marker={"color": color, "opacity": 0.45 if faded else 1.0}, **extra)
    return go.Scatter(x=g["concurrency"], y=y, name=name, mode="lines+markers",
                      line={"color": color, "width": 2, "dash": "dash" if faded else "solid"},
                      marker={"size": 7}, hovertemplate="%{x} concurrent: " + hover + tail, **extra)


def _single(curves: pd.DataFrame) -> bool:
    return int(curves["concurrency"].nunique()) == 1


# --- figures ---------------------------------------------------------------------------------


def throughput_figure(curves: pd.DataFrame,
                      title: str = "Output throughput by concurrency") -> go.Figure:
    """Output tok/s against concurrency, one line per configuration (curves_frame); one bar
    per configuration when the sweep has a single concurrency."""
    if curves.empty:
        return _empty(title, "no finished point")
    colors, fig, single = _colors(curves), go.Figure(), _single(curves)
    for name, g in _groups(curves):
        fig.add_trace(_series(
            g, g["output_throughput"], name, colors[name],
            "%{y:,.0f} tok/s<br>%{customdata[0]:.3f} req/s, %{customdata[1]:.1f} running",
            single=single, customdata=g[["request_throughput", "mean_running"]].to_numpy()))
    fig.update_layout(title={"text": title}, yaxis_title="output tokens / s",
                      yaxis_rangemode="tozero", showlegend=not single, **_BOTTOM_LEGEND)
    _concurrency_axis(fig, curves)
    return fig


def latency_figure(curves: pd.DataFrame,
                   limits: Mapping[str, float] | Sequence[tuple[str, float]] | None = None,
                   title: str = "Latency percentiles by concurrency") -> go.Figure:
    """TTFT, ITL and end-to-end latency, p50 and p99 (dashed line or faded bar), one colour
    per configuration (curves_frame), each in the unit its values want (latency_unit: TTFT
    in seconds once a queue makes it seconds). `limits` (Recommendation.limits: LatencyLimits
    field -> value) are drawn as red dotted lines in their panel, named. TTFT and ITL exist
    for streamed loads only."""
    if curves.empty:
        return _empty(title, "no finished point")
    colors, single, limits = _colors(curves), _single(curves), dict(limits or {})
    units = [_column_unit(curves, key, unit, limits) for key, _, unit in _LATENCIES]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=[
        f"{label} ({shown})" for (_, label, _), (_, shown) in zip(_LATENCIES, units, strict=True)])
    for col, ((key, _, unit), (scale, shown)) in enumerate(zip(_LATENCIES, units, strict=True), start=1):
        for name, g in _groups(curves):
            for q in ("p50", "p99"):
                fig.add_trace(_series(
                    g, g[f"{key}_{q}_{unit}"] / scale, name, colors[name],
                    f"{q} %{{y:,.{1 if shown == 'ms' else 2}f}} {shown}",
                    single=single, faded=q == "p99", legendgroup=name, offsetgroup=q,
                    showlegend=col == 1 and q == "p50"),
                    row=1, col=col)
        if curves[[f"{key}_p50_{unit}"]].isna().all().all():
            fig.add_annotation(text="not measured<br>(load without streaming)", showarrow=False,
                               xref=f"x{'' if col == 1 else col} domain",
                               yref=f"y{'' if col == 1 else col} domain", x=0.5, y=0.5,
                               font={"color": "#616e7c"})
        _limit_lines(fig, key, unit, scale, shown, limits, col)
        _concurrency_axis(fig, curves, row=1, col=col)
        fig.update_xaxes(showticklabels=not single, row=1, col=col)  # colours name them
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    kind = "faded bars" if single else "dashed lines"
    fig.update_layout(title={"text": f"{title} (p50, and p99 in {kind})"}, height=480,
                      barmode="group", **_BOTTOM_LEGEND)
    return fig


def capacity_figure(configs: pd.DataFrame,
                    title: str = "KV cache capacity per configuration") -> go.Figure:
    """The KV pool (max_total_num_tokens) of each configuration (configs_frame); a failed
    configuration is a red marker with its reason on hover."""
    if configs.empty:
        return _empty(title, "no configuration")
    colors = _colors(configs)
    ok = configs[configs["status"] == "ok"]
    failed = configs[configs["status"] != "ok"]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=[str(c) for c in ok["config"]], y=ok["max_total_num_tokens"], name="KV tokens",
        marker={"color": [colors[str(c)] for c in ok["config"]]},
        text=[f"{v:,.0f}" if pd.notna(v) else "-" for v in ok["max_total_num_tokens"]],
        textposition="outside", customdata=ok[["kv_cache_dtype", "args"]].to_numpy(),
        hovertemplate="%{x}: %{y:,.0f} tokens<br>KV %{customdata[0]}<br>%{customdata[1]}"
                      "<extra></extra>"))
    if not failed.empty:
        fig.add_trace(go.Scatter(
            x=[str(c) for c in failed["config"]], y=[0] * len(failed), name="failed to start",
            mode="markers+text", marker={"symbol": "x", "size": 14, "color": FAILED_COLOR},
            text=["failed"] * len(failed), textposition="top center",
            customdata=[[_e(reason_text(str(r)))] for r in failed["reason"]],
            hovertemplate="%{x}: %{customdata[0]}<extra></extra>"))
    fig.update_layout(title={"text": title}, yaxis_title="tokens in the KV pool (per rank)",
                      xaxis={"categoryorder": "array", "categoryarray": _names(configs)},
                      showlegend=not failed.empty)
    return fig


def usage_figure(curves: pd.DataFrame,
                 title: str = "Token usage and running requests by concurrency") -> go.Figure:
    """Peak KV token usage and mean running requests against concurrency (curves_frame)."""
    if curves.empty:
        return _empty(title, "no finished point")
    colors, single = _colors(curves), _single(curves)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["peak token usage", "running requests"],
                        horizontal_spacing=0.1)
    for name, g in _groups(curves):
        fig.add_trace(_series(g, g["peak_token_usage"] * 100, name, colors[name],
                              "%{y:.0f}% of the pool", single=single, legendgroup=name),
                      row=1, col=1)
        fig.add_trace(_series(
            g, g["mean_running"], name, colors[name],
            "%{y:.1f} running (max %{customdata[0]:.0f}), %{customdata[1]:.1f} queued",
            single=single, customdata=g[["max_running", "mean_queued"]].to_numpy(),
            legendgroup=name, showlegend=False), row=1, col=2)
    for col in (1, 2):
        _concurrency_axis(fig, curves, row=1, col=col)
    fig.update_yaxes(title_text="% of the KV pool", range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=1, col=2)
    fig.update_layout(title={"text": title}, height=480, showlegend=not single, **_BOTTOM_LEGEND)
    return fig


# --- report blocks ---------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]],
           classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        f'<tr class="{c}">' + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>"
        for row, c in zip(rows, classes or [""] * len(rows), strict=True))
    return f'<table class="wb-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None or pd.isna(value) else format(value, spec)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def sweep_header(overview: Mapping[str, Any], title: str = "Throughput tuning", *,
                 now: float | None = None) -> Rendered:
    """The report's title and the sweep's facts (tune.sweep_overview), with the workbench
    version and when the report was made (`now`, default the current time); carries
    REPORT_CSS."""
    rows = [("Sweep", overview.get("name")), ("Directory", overview.get("out")),
            ("Server", overview.get("launcher")),
            ("Model measured", overview.get("model")),
            ("Configurations", overview.get("configs")),
            ("Points", (f"{overview.get('finished')} of {overview.get('points')} finished, "
                        f"{overview.get('failed')} failed")),
            ("Concurrency", ", ".join(str(c) for c in overview.get("concurrency", []))),
            ("Streaming", "yes (TTFT and ITL measured)" if overview.get("stream") else "no"),
            ("Started", _when(overview.get("created"))),
            ("Report generated", _when(time.time() if now is None else now))]
    items = "".join(f'<div class="wb-item"><span class="wb-key">{_e(k)}</span>'
                    f'<span class="wb-value">{_e(v)}</span></div>' for k, v in rows)
    return Rendered(
        f'<div class="wb-report"><style>{REPORT_CSS}</style><div class="wb-header">'
        f'<div class="wb-kicker">EAGLE-3 data workbench · workbench {_e(__version__)}</div>'
        f'<h1>{_e(title)}</h1><div class="wb-meta">{items}</div></div></div>', dict(overview))


def _limit_header(label: str, name: str, unit: str, limits: Mapping[str, float]) -> str:
    """`TTFT p99 (s), limit 20 s`: a column's unit, and its limit when one is set."""
    limit = limits.get(name)
    if limit is None:
        return f"{label} ({unit})"
    shown = format_latency_ms(limit) if name.endswith("_ms") else f"{limit:,.3g} s"
    return f"{label} ({unit}), limit {shown}"


def _violation_text(text: str) -> str:
    """`ttft_p99_ms 25,000 > 20,000` as `TTFT p99 25 s > 20 s` (as is when not that form)."""
    parts = text.split()
    if len(parts) != 4 or parts[2] != ">" or parts[0] not in LIMIT_LABELS:
        return text
    try:
        value, limit = (float(p.replace(",", "")) for p in (parts[1], parts[3]))
    except ValueError:
        return text
    if parts[0].endswith("_ms"):
        shown = [format_latency_ms(v) for v in (value, limit)]
    elif parts[0] == "max_error_rate":
        shown = [f"{v * 100:.3g}%" for v in (value, limit)]
    else:
        shown = [f"{v:,.3g} s" for v in (value, limit)]
    return f"{LIMIT_LABELS[parts[0]]} {shown[0]} > {shown[1]}"


def _limits_cell(r: Any) -> object:
    if r.reason:
        return _reason_html(r.reason)
    if r.excluded:
        return r.excluded
    return "no: " + "; ".join(_violation_text(v) for v in r.violations) if r.violations else "yes"


def recommendation_view(rec: Any) -> Rendered:
    """A banner with the recommendation and the projection, the limits it was chosen within
    and the model it was measured on against the job's, and one row per configuration at
    the chosen concurrency (a tune.Recommendation); latencies in the unit their values want."""
    state = "pass" if rec.best is not None else "fail"
    big = (f"{rec.best}: {rec.projection_text}" if rec.best and rec.remaining_tokens is not None
           else (rec.best or "no configuration within the limits"))
    banner = (f'<div class="wb-banner {state}"><div class="wb-big">{_e(big)}</div>'
              f'<div class="wb-sub">{_e(rec.text)}</div></div>')
    limits = dict(rec.limits)
    ttft_scale, ttft_unit = latency_unit(r.ttft_p99_ms for r in rec.rows)
    itl_scale, itl_unit = latency_unit(r.itl_p50_ms for r in rec.rows)
    headers = ["configuration", "output tok/s", "vs baseline", "running", "KV tokens",
               _limit_header("TTFT p99", "ttft_p99_ms", ttft_unit, limits),
               _limit_header("ITL p50", "itl_p50_ms", itl_unit, limits),
               _limit_header("e2e p50", "e2e_p50_s", "s", limits),
               "projected job time", "GPU-hours", "within the limits"]
    rows, classes = [], []
    for r in rec.rows:
        mark = " (recommended)" if r.config == rec.best else (
            " (baseline)" if r.config == rec.baseline else "")
        rows.append([r.config + mark, _num(r.output_throughput, ",.0f"), _num(r.ratio, ".2f") + "x"
                     if r.ratio is not None else "-", _num(r.mean_running, ".1f"),
                     _num(r.max_total_num_tokens, ",.0f"), _latency(r.ttft_p99_ms, ttft_scale),
                     _latency(r.itl_p50_ms, itl_scale), _num(r.e2e_p50_s, ",.1f"),
                     format_hours(r.hours),
                     "-" if r.gpu_hours is None else f"{format_gpu_hours(r.gpu_hours)} ({format_gpus(r.gpus)})",
                     _limits_cell(r)])
        classes.append("sev-ok" if r.config == rec.best else (
            "sev-error" if r.status != "ok" or r.excluded else (
                "sev-warning" if r.violations else "")))
    notes = [(f"At concurrency {rec.concurrency}. Limits a recommended point must respect (the "
              f"sweep's parameter file): {rec.limits_text}.")]
    if rec.models_text:
        notes.append(rec.models_text)
    caption = "".join(f'<div class="wb-note">{_e(n)}</div>' for n in notes)
    return Rendered(f'<div class="wb-report">{banner}{caption}{_table(headers, rows, classes)}</div>',
                    rec.to_dict())


def _latency(ms: float | None, scale: float) -> str:
    """A latency in milliseconds shown in the column's unit (scale 1000: seconds)."""
    if ms is None or pd.isna(ms):
        return "-"
    return f"{ms / scale:,.2f}" if scale > 1 else f"{ms:,.1f}"


def points_view(frame: pd.DataFrame) -> Rendered:
    """Every point of the sweep (results_frame), failures with their reason."""
    ttft_scale, ttft_unit = latency_unit(frame["ttft_p50_ms"])
    itl_scale, itl_unit = latency_unit(frame["itl_p50_ms"])
    headers = ["configuration", "concurrency", "repeat", "status", "output tok/s", "req/s",
               f"TTFT p50 ({ttft_unit})", f"ITL p50 ({itl_unit})", "e2e p50 (s)",
               "peak KV usage", "hit rate", "errors", "note"]
    rows = [[r.config, r.concurrency, r.repeat, r.status, _num(r.output_throughput, ",.0f"),
             _num(r.request_throughput, ".3f"), _latency(r.ttft_p50_ms, ttft_scale),
             _latency(r.itl_p50_ms, itl_scale), _num(r.e2e_p50_s, ",.1f"),
             _share(r.peak_token_usage), _share(r.cache_hit_rate), r.errors,
             "" if pd.isna(r.reason) else _reason_html(str(r.reason))]
            for r in frame.itertuples()]
    classes = ["sev-error" if r.status != "ok" else "" for r in frame.itertuples()]
    data = [{k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in row.items()}
            for row in frame.astype({"config": str}).to_dict("records")]
    return Rendered(f'<div class="wb-report">{_table(headers, rows, classes)}</div>', data)


def _share(value: float | None) -> str:
    """A share of 0 to 1 as a percentage (`54%`), as the figures draw it."""
    return "-" if value is None or pd.isna(value) else f"{value:.0%}"


def fidelity_figure(frame: pd.DataFrame,
                    title: str = "Output throughput against fidelity to the baseline") -> go.Figure:
    """One point per probed configuration (fidelity_frame): x the share of its probe replies
    identical to the baseline's, y its output tok/s; an excluded one is a red cross, the
    noise floor and the exclusion line (floor - threshold) are dashed."""
    if frame.empty:
        return _empty(title, "no fidelity probe (fidelity.prompts 0, or not run yet)")
    colors = _colors(frame)
    fig = go.Figure()
    for row in frame.itertuples():
        excluded = isinstance(row.excluded, str)
        fig.add_trace(go.Scatter(
            x=[100 * row.identical_share], y=[row.output_throughput], name=str(row.config),
            mode="markers+text", text=[str(row.config)], textposition="top center",
            marker={"size": 13, "symbol": "x" if excluded else "circle",
                    "color": FAILED_COLOR if excluded else colors[str(row.config)]},
            customdata=[[_num(row.agreement, ".3f"), _num(row.first_divergence, ",.0f"),
                         _num(row.logprob_diff, ".4f"), _e(row.excluded or "kept")]],
            hovertemplate="%{text}: %{y:,.0f} tok/s, %{x:.0f}% identical<br>agreement "
                          "%{customdata[0]}, first divergence %{customdata[1]}, logprob "
                          "difference %{customdata[2]}<br>%{customdata[3]}<extra></extra>"))
    floor = frame["floor_identical_share"].dropna()
    if not floor.empty:
        at = 100 * float(floor.iloc[0])
        line = at - 100 * float(frame["threshold"].iloc[0])
        fig.add_vline(x=at, line_dash="dot", line_color="#607D8B",
                      annotation_text="noise floor", annotation_position="top left")
        fig.add_vline(x=line, line_dash="dash", line_color=FAILED_COLOR,
                      annotation_text="excluded left of here", annotation_position="bottom left")
    fig.update_layout(title={"text": title}, showlegend=False,
                      xaxis={"title": "probe replies identical to the baseline's (%)",
                             "range": [-5, 105]},
                      yaxis={"title": "output tok/s at the chosen concurrency",
                             "range": [0, 1.25 * _top(frame["output_throughput"])]})
    return fig


def _top(values: pd.Series) -> float:
    """The largest value, 1 when there is none (all unknown or zero)."""
    top = values.max()
    return float(top) if pd.notna(top) and top > 0 else 1.0


def fidelity_view(frame: pd.DataFrame) -> Rendered:
    """The probe's figures per configuration (fidelity_frame), excluded ones marked."""
    headers = ["configuration", "output tok/s", "identical", "mean first divergence",
               "agreement", "logprob difference", "verdict"]
    rows, classes = [], []
    for r in frame.itertuples():
        mark = " (baseline, restarted)" if r.baseline else ""
        rows.append([f"{r.config}{mark}", _num(r.output_throughput, ",.0f"),
                     _num(100 * r.identical_share, ".0f") + "%",
                     _num(r.first_divergence, ",.0f"), _num(r.agreement, ".3f"),
                     _num(r.logprob_diff, ".4f"),
                     r.excluded if isinstance(r.excluded, str) else "within the noise floor"])
        classes.append("sev-error" if isinstance(r.excluded, str) else "")
    data = [{k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in row.items()}
            for row in frame.astype({"config": str}).to_dict("records")]
    return Rendered(f'<div class="wb-report">{_table(headers, rows, classes)}</div>', data)
