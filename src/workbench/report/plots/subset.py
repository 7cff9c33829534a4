"""The sent subset against the whole dataset (subset.compare_subsets): prompt lengths as
cumulative shares, and the tables of its tests (KS for lengths, chi-square for the shares of
source-like fields), biased rows marked.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analyze.subset import MAX_LEVELS, SOURCE_FIELDS
from workbench.report.plots.blocks import Rendered, escaped, html_table, is_nan, json_rows, pill
from workbench.report.plots.figures import empty_figure, log_axis, series_colors, series_groups

__all__ = [
    "subset_lengths_figure",
    "subset_view",
]


def subset_lengths_figure(curves: pd.DataFrame, *, log: bool = False,
                          title: str = "Prompt length: sent subset against the whole dataset") -> go.Figure:
    """subset.compare_subsets(...).length_curves as cumulative shares per dataset: the whole
    dataset solid, the sent subset dashed (apart: a biased subset); `log`: a log length axis."""
    if curves.empty:
        return empty_figure(title, "no prompts")
    colors, fig = series_colors(curves), go.Figure()
    for name, g in series_groups(curves):
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
    log_axis(fig, log)
    return fig


def subset_view(comparison: Any) -> Rendered:
    """The tables of subset.compare_subsets: prompt length per dataset (KS test), and the
    shares of each source-like field (chi-square test); biased rows marked."""
    rows, classes = [], []
    for r in comparison.lengths.itertuples(index=False):
        rows.append([r.dataset, f"{r.sent:,} / {r.whole:,}", _number(r.mean_whole), _number(r.mean_sent),
                     _ratio(r.mean_ratio), _ratio(r.ks_d), _pvalue(r.ks_p),
                     pill("biased", "#c0392b") if r.biased else "fair"])
        classes.append("")
    html_parts = [html_table(["dataset", "sent / whole", "mean prompt (whole)", "mean prompt (sent)",
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
                         pill("biased", "#c0392b") if t.biased else "fair"])
        html_parts.append(html_table(["dataset", "field", "values", "total variation", "p-value",
                                      "share whole -> sent", ""], rows, numeric=range(2, 5),
                                     caption="Shares of source-like fields"))
    html_parts.append(_untested_note(comparison))
    records = {"lengths": json_rows(comparison.lengths), "shares": json_rows(comparison.shares),
               "share_tests": json_rows(comparison.share_tests)}
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
    return (f'<p class="wb-note">No chi-square test of shares: {escaped(which)} source-like field '
            f"({escaped(', '.join(SOURCE_FIELDS))}; with text values, at most {MAX_LEVELS} distinct), "
            "so only the prompt lengths are compared.</p>")


def _number(value: object) -> str:
    return "-" if is_nan(value) else f"{float(value):,.0f}"  # type: ignore[arg-type]


def _ratio(value: object) -> str:
    return "-" if is_nan(value) else f"{float(value):.3f}"  # type: ignore[arg-type]


def _pvalue(value: object) -> str:
    if is_nan(value):
        return "-"
    return "< 0.001" if float(value) < 0.001 else f"{float(value):.3f}"  # type: ignore[arg-type]
