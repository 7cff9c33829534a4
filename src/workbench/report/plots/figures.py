"""What every figure shares: a dataset's colour, the figure drawn when there is nothing to
draw, and token axes that are logarithmic where the data want it.

Colours are stable across a report: a dataset's colour is its position in the ``dataset``
categories of the frame (every shaped frame lists all of the run's datasets there), so
:func:`series_colors` of any frame of a run gives a dataset the same colour.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.report.plots.style import PALETTE

__all__ = [
    "LOG_TICKS",
    "LogChoice",
    "empty_figure",
    "hover_ids",
    "is_log",
    "log_axis",
    "series_colors",
    "series_groups",
    "series_names",
]


def series_names(frame: pd.DataFrame, column: str = "dataset") -> list[str]:
    values = frame[column]
    if isinstance(values.dtype, pd.CategoricalDtype):
        return [str(c) for c in values.cat.categories]
    return list(dict.fromkeys(str(v) for v in values))


def series_colors(frame: pd.DataFrame, column: str = "dataset") -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series_names(frame, column))}


def series_groups(frame: pd.DataFrame, column: str = "dataset") -> list[tuple[str, pd.DataFrame]]:
    return [(str(n), g) for n, g in frame.groupby(column, observed=True, sort=True)]


def empty_figure(title: str, message: str) -> go.Figure:
    fig = go.Figure(layout={"title": {"text": title}, "height": 220})
    fig.add_annotation(text=message, showarrow=False, font={"size": 14, "color": "#616e7c"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


LOG_TICKS: dict[str, Any] = {"type": "log", "dtick": 1, "tickformat": "~s",
                             "minor": {"dtick": "D1", "showgrid": True, "gridcolor": "#f3f5f7"}}
"""A log axis ticked at powers of ten as plain numbers (1, 10, 100, 1k), unlabelled minor
grid lines between them."""


LogChoice = bool | Mapping[str, bool]
"""Log axes: one answer for every token axis of a figure, or one per column
(explore.log_axes: chosen by the data when a report's ``log_axis`` is None)."""


def is_log(log: LogChoice, column: str) -> bool:
    return bool(log.get(column, False)) if isinstance(log, Mapping) else bool(log)


def log_axis(fig: go.Figure, log: LogChoice, *, y: bool = False, x_column: str = "",
             y_column: str = "", **where: Any) -> None:
    """LOG_TICKS on x (and on y with `y`) where `log` says so for the axis's column."""
    if is_log(log, x_column):
        fig.update_xaxes(**LOG_TICKS, **where)
    if y and is_log(log, y_column):
        fig.update_yaxes(**LOG_TICKS, **where)


def hover_ids(values: Iterable[object]) -> list[str]:
    return [html.escape(str(v)) for v in values]
