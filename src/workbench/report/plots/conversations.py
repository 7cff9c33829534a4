"""Datasets regenerated turn by turn (``turns: each``), drawn from the frames of
:func:`workbench.analyze.conversations.conversation_frames`: a table of each dataset's
conversations, turns per conversation, completion tokens by turn index and the conversations
ended early by reason. A run without such a dataset says so, plainly, in the table's place and in each
figure.

The box of a turn is drawn from the quartiles the frame holds (no statistic is computed
here); its whiskers reach the smallest and the largest reply of that turn.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.report.plots.blocks import Rendered, count_text, html_table, json_rows, pct
from workbench.report.plots.figures import empty_figure, series_colors, series_groups

__all__ = [
    "NO_TURNS",
    "conversations_view",
    "ended_figure",
    "turn_tokens_figure",
    "turns_per_conversation_figure",
]

NO_TURNS = ("This run has no dataset regenerated turn by turn (turns: each): every record is a "
            "single reply, so there are no conversations to show.")
_NO_TURNS_SHORT = "no dataset regenerated turn by turn (turns: each)"


def _no_turns() -> Rendered:
    return Rendered(f'<div class="wb-report"><p class="wb-note">{html.escape(NO_TURNS)}</p></div>',
                    {"turn_datasets": [], "note": NO_TURNS})


def conversations_view(conversations: Any) -> Rendered:
    """Per turns dataset: conversations, turns, turns per conversation (mean, max) and the
    conversations ended early (count and share); without one, a note saying so."""
    if conversations.empty:
        return _no_turns()
    rows = [[r.dataset, count_text(r.conversations), count_text(r.turns), f"{r.mean_turns:.2f}",
             count_text(r.max_turns), count_text(r.ended_early), pct(r.ended_share)]
            for r in conversations.summary.itertuples(index=False)]
    table = html_table(["dataset", "conversations", "turns", "turns per conversation", "max turns",
                        "ended early", "of conversations"], rows, numeric=range(1, 7))
    note = ('<p class="wb-note">A conversation is a sample id; its turns are its records (one per '
            "generated assistant turn). Ended early: the data could not carry the conversation on "
            "after that turn (the reasons are in the chart below).</p>")
    return Rendered(f'<div class="wb-report">{table}{note}</div>',
                    {"turn_datasets": list(conversations.turn_datasets),
                     "summary": json_rows(conversations.summary)})


def turns_per_conversation_figure(per_conversation: pd.DataFrame,
                                  title: str = "Turns per conversation") -> go.Figure:
    """Bars side by side per dataset: the share of its conversations that have n turns."""
    if per_conversation.empty:
        return empty_figure(title, _NO_TURNS_SHORT)
    colors, fig = series_colors(per_conversation), go.Figure()
    for name, g in series_groups(per_conversation):
        fig.add_trace(go.Bar(
            x=g["turns"], y=g["share"] * 100, name=name, marker_color=colors[name],
            customdata=g["conversations"],
            hovertemplate="%{x} turns: %{customdata:,} conversations (%{y:.1f}%)<extra>"
                          + html.escape(name) + "</extra>"))
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="turns in the conversation",
                      yaxis_title="% of the dataset's conversations", xaxis={"dtick": 1})
    return fig


def _box(g: pd.DataFrame, name: str, color: str) -> go.Box:
    return go.Box(
        x=[f"turn {t}" for t in g["turn"]], q1=g["q1"], median=g["median"], q3=g["q3"],
        lowerfence=g["min"], upperfence=g["max"], mean=g["mean"], name=name, marker_color=color,
        line={"color": color}, boxpoints=False, customdata=g[["records", "completion_tokens"]].to_numpy(),
        hovertemplate="%{x}: %{customdata[0]:,} records, %{customdata[1]:,} completion tokens<extra>"
                      + html.escape(name) + "</extra>")


def turn_tokens_figure(turn_tokens: pd.DataFrame,
                       title: str = "Completion tokens by turn index") -> go.Figure:
    """A box per turn index and dataset (quartiles, the mean dashed, whiskers from the
    smallest to the largest reply); the hover says each box's records and tokens."""
    drawn = turn_tokens[turn_tokens["counted"] > 0] if not turn_tokens.empty else turn_tokens
    if drawn.empty:
        return empty_figure(title, _NO_TURNS_SHORT if turn_tokens.empty else "no completion counts")
    colors, fig = series_colors(drawn), go.Figure()
    for name, g in series_groups(drawn):
        fig.add_trace(_box(g, name, colors[name]))
    fig.update_traces(boxmean=True)
    fig.update_layout(title={"text": title}, boxmode="group", xaxis_title="turn (0: the first reply)",
                      yaxis_title="completion tokens per record", yaxis={"rangemode": "tozero"})
    return fig


def ended_figure(ended: pd.DataFrame, *, turn_datasets: tuple[str, ...] | None = None,
                 title: str = "Conversations ended early, by reason") -> go.Figure:
    """Horizontal bars per reason and dataset: conversations ended early, labelled with the
    share of the dataset's conversations; the hover says what the reason means."""
    if ended.empty:
        none = turn_datasets is not None and len(turn_datasets) > 0
        return empty_figure(title, "no conversation ended early" if none else _NO_TURNS_SHORT)
    colors, fig = series_colors(ended), go.Figure()
    for name, g in series_groups(ended):
        fig.add_trace(go.Bar(
            y=g["reason"], x=g["conversations"], name=name, orientation="h", marker_color=colors[name],
            text=[f"{c:,} ({pct(s)})" for c, s in zip(g["conversations"], g["share"], strict=True)],
            textposition="auto", customdata=[html.escape(str(m)) for m in g["meaning"]],
            hovertemplate="%{y}: %{x:,} conversations<br>%{customdata}<extra>" + html.escape(name)
                          + "</extra>"))
    reasons = list(dict.fromkeys(ended.sort_values("conversations", ascending=False)["reason"]))
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="conversations",
                      yaxis={"categoryorder": "array", "categoryarray": reasons[::-1]},
                      height=max(280, 140 + 36 * len(reasons) * max(1, len(series_groups(ended)))),
                      margin={"l": 130})
    return fig
