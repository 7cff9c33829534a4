"""Datasets that mix modes (``modes``), drawn from the frames of
:func:`workbench.analyze.modes.mode_frames`: the "Modes" section of the token-distribution
report. Its heading, the mix asked for against the mix written (a table per dataset, naming
the deployment sample the modes were taken from), bars of the two mixes, and each mode's
completion tokens (a box per mode: quartiles, the mean dashed, whiskers from the shortest to
the longest reply).

A run without a dataset that mixes modes has no such section: every builder here returns
None, which a notebook cell shows as nothing. No statistic is computed here: the frames hold
every number drawn.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analyze.modes import REQUESTED, WRITTEN, Modes
from workbench.report.plots.blocks import (
    Html,
    Rendered,
    count_text,
    escaped,
    html_table,
    is_nan,
    json_rows,
    pct,
)
from workbench.report.plots.figures import hover_ids, series_colors, series_groups

__all__ = ["MIX_COLORS", "mode_mix_figure", "mode_tokens_figure", "modes_view"]

MIX_COLORS = {REQUESTED: "#9FB3C8", WRITTEN: "#334E68"}

_INTRO = ("A dataset that mixes modes draws each conversation's mode to the weights asked for "
          "(chat-template arguments and sampling per mode, e.g. thinking on or off). Requested: "
          "the weights as shares; written: the share of the records (of the conversations, for a "
          "dataset regenerated turn by turn) generated in each mode. The figures are those of "
          "<code>workbench stats</code>; the median is its p50.")


def _number(value: object, digits: int = 1) -> str:
    return "-" if is_nan(value) else f"{float(value):,.{digits}f}"  # type: ignore[arg-type]


def _reasoning_cell(row: Any) -> str:
    if not row.reasoning:
        return "off"
    return f"{_number(row.mean_reasoning)} / {_number(row.mean_answer)}"


def _dataset_table(name: str, mix: pd.DataFrame, tokens: pd.DataFrame) -> Html:
    """One dataset's modes: the mix, then each mode's completion tokens."""
    turns = bool((mix["of"] == "conversations").any())
    rows = []
    for m, t in zip(mix.itertuples(index=False), tokens.itertuples(index=False), strict=True):
        counts = [count_text(m.conversations)] if turns else []
        rows.append([m.mode, pct(m.wanted), pct(m.written), *counts, count_text(m.records),
                     count_text(t.completion_tokens), _number(t.mean), count_text(t.median),
                     _reasoning_cell(t)])
    headers = ["mode", "requested", "written", *(["conversations"] if turns else []), "records",
               "completion tokens", "mean", "median", "reasoning / answer (mean)"]
    of = "conversations" if turns else "records"
    return html_table(headers, rows, numeric=range(1, len(headers) - 1),
                      caption=f"{name}: written as a share of its {of}")


def _source_note(name: str, source: str | None) -> str:
    if source is None:
        return (f'<p class="wb-note">{escaped(name)}: the modes and weights written in the '
                "manifest.</p>")
    return (f'<p class="wb-note">{escaped(name)}: modes and weights taken from the deployment '
            f'sample <code>{escaped(source)}</code> (the share of its requests per combination of '
            "chat-template arguments).</p>")


def modes_view(modes: Modes) -> Rendered | None:
    """The section's heading and, per dataset that mixes modes, its table and where its modes
    came from; None for a run without such a dataset."""
    if modes.empty:
        return None
    parts = []
    for name in modes.mode_datasets:
        mix = modes.mix[modes.mix["dataset"].astype(str) == name]
        tokens = modes.tokens[modes.tokens["dataset"].astype(str) == name]
        parts.append(_dataset_table(name, mix, tokens) + _source_note(name, modes.sources.get(name)))
    return Rendered(
        f'<div class="wb-report"><h2>Modes</h2><p class="wb-note">{_INTRO}</p>{"".join(parts)}</div>',
        {"mode_datasets": list(modes.mode_datasets), "sources": dict(modes.sources),
         "mix": json_rows(modes.mix), "tokens": json_rows(modes.tokens)})


def mode_mix_figure(modes: Modes, title: str = "Modes: requested against written") -> go.Figure | None:
    """Bars per dataset and mode: the share asked for beside the share written (hover: the
    count written); None for a run without a dataset that mixes modes."""
    if modes.empty:
        return None
    fig = go.Figure()
    for mix, g in modes.bars.groupby("mix", sort=False):
        x = [hover_ids(g["dataset"].astype(str)), hover_ids(g["mode"])]  # labels: escaped
        shares = [None if is_nan(s) else float(s) * 100 for s in g["share"]]
        fig.add_trace(go.Bar(
            x=x, y=shares, name=str(mix), marker_color=MIX_COLORS[str(mix)],
            text=[pct(s) for s in g["share"]], textposition="outside",
            customdata=[count_text(c) for c in g["count"]],
            hovertemplate="%{x}: %{y:.1f}%" + (" (%{customdata} written)" if mix == WRITTEN else "")
                          + "<extra>" + html.escape(str(mix)) + "</extra>"))
    fig.update_layout(title={"text": title}, barmode="group", yaxis_title="% of the dataset",
                      yaxis={"rangemode": "tozero"}, xaxis_title="dataset, mode")
    return fig


def _box(g: pd.DataFrame, name: str, color: str) -> go.Box:
    return go.Box(
        x=hover_ids(g["mode"]), q1=g["q1"], median=g["median"], q3=g["q3"], lowerfence=g["min"],
        upperfence=g["max"], mean=g["mean"], name=name, marker_color=color, line={"color": color},
        boxpoints=False, customdata=g[["records", "completion_tokens"]].to_numpy(),
        hovertemplate="%{x}: %{customdata[0]:,} records, %{customdata[1]:,} completion tokens"
                      "<extra>" + html.escape(name) + "</extra>")


def mode_tokens_figure(modes: Modes, title: str = "Completion tokens by mode") -> go.Figure | None:
    """A box per mode and dataset (quartiles, the mean dashed, whiskers from the shortest to
    the longest reply); None for a run without a dataset that mixes modes."""
    if modes.empty:
        return None
    drawn = modes.tokens[modes.tokens["counted"] > 0]
    colors, fig = series_colors(modes.tokens), go.Figure()
    for name, g in series_groups(drawn):
        fig.add_trace(_box(g, name, colors[name]))
    fig.update_traces(boxmean=True)
    fig.update_layout(title={"text": title}, boxmode="group", xaxis_title="mode",
                      yaxis_title="completion tokens per record", yaxis={"rangemode": "tozero"})
    if drawn.empty:
        fig.add_annotation(text="no completion counts yet", showarrow=False,
                           font={"size": 14, "color": "#616e7c"})
    return fig
