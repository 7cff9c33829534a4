"""The explorer's JupyterLab face: ipywidgets controls, plotly FigureWidgets, a record viewer.

Every function takes a :class:`Selection` (the :class:`~workbench.report.explorer.Explorer`)
and binds widgets to it: a control change calls its ``update`` (which redraws every figure
made here, in place), a click on a point opens that record in the viewer. The explorer
imports this module only in interactive mode, so papermill reports never load ipywidgets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.analyze.explore import RunOverview
from workbench.report import plots

__all__ = ["Selection", "controls", "figure", "viewer"]


class Selection(Protocol):
    """What the widgets bind to: a run's records and findings, the filters, and the calls
    that refilter, open a record and register a redraw."""

    records: pd.DataFrame
    findings: pd.DataFrame
    filters: dict[str, Any]
    overview: RunOverview

    def update(self, **changes: Any) -> pd.DataFrame: ...
    def open(self, dataset: str, line: int) -> Any: ...
    def on_update(self, redraw: Callable[[], None]) -> None: ...
    def summary(self) -> plots.Rendered: ...

_WIDE = widgets.Layout(width="460px")
_STYLE = {"description_width": "150px"}


def _range(app: Selection, column: str, key: str) -> widgets.IntRangeSlider:
    values = app.records[column].dropna()
    top = int(values.max()) if len(values) else 1
    low = app.filters.get(f"min_{key}", 0)
    high = app.filters.get(f"max_{key}", top)
    return widgets.IntRangeSlider(value=(low, high), min=0, max=max(top, 1), continuous_update=False,
                                  description=f"{column.replace('_', ' ')}", layout=_WIDE, style=_STYLE)


def _rule_options(app: Selection) -> list[tuple[str, str]]:
    """("any record", "") then each rule that fired, with its count ("" is shown, None is not)."""
    counts = app.findings.groupby("rule").size().sort_values(ascending=False)
    return [("any record", ""), *((f"{rule} ({count:,} record{'' if count == 1 else 's'})", str(rule))
                                   for rule, count in counts.items())]


def _picked(values: tuple[Any, ...], every: list[Any]) -> list[Any] | None:
    """A multiple choice as a filter: None when everything (or nothing) is picked."""
    return None if not values or len(values) == len(every) else list(values)


def _bounds(pair: tuple[int, int], slider: widgets.IntRangeSlider) -> tuple[int | None, int | None]:
    low, high = pair
    return (None if low <= slider.min else low), (None if high >= slider.max else high)


def _initial(app: Selection, key: str, every: list[str]) -> tuple[str, ...]:
    given = app.filters.get(key)
    if given is None:
        return tuple(every)
    return (given,) if isinstance(given, str) else tuple(given)


def controls(app: Selection) -> widgets.VBox:
    """The filter controls bound to app, and a line saying what is selected."""
    names = list(app.overview.datasets)
    reasons = sorted(str(r) for r in app.records["finish_reason"].dropna().unique())
    pick = {
        "dataset": widgets.SelectMultiple(options=names, value=_initial(app, "dataset", names),
                                          rows=min(5, max(2, len(names))), description="datasets",
                                          layout=_WIDE, style=_STYLE),
        "finish_reason": widgets.SelectMultiple(options=reasons, value=_initial(app, "finish_reason", reasons),
                                                rows=min(4, max(2, len(reasons))), description="finish reason",
                                                layout=_WIDE, style=_STYLE),
    }
    ranges = {"completion_tokens": _range(app, "completion_tokens", "completion_tokens"),
              "prompt_tokens": _range(app, "prompt_tokens", "prompt_tokens")}
    rule = widgets.Dropdown(options=_rule_options(app), value=app.filters.get("rule", ""),
                            description="validation rule", layout=_WIDE, style=_STYLE)
    search = widgets.Text(value=app.filters.get("search", ""), placeholder="text in the decoded reply",
                          description="reply contains", continuous_update=False, layout=_WIDE, style=_STYLE)
    sample = widgets.Text(value=str(app.filters.get("sample_id", "")), placeholder="a sample id",
                          description="sample id", continuous_update=False, layout=_WIDE, style=_STYLE)
    status = widgets.HTML(app.summary().html)

    def changed(_: Any = None) -> None:
        update: dict[str, Any] = {key: _picked(w.value, list(w.options)) for key, w in pick.items()}
        for column, slider in ranges.items():
            update[f"min_{column}"], update[f"max_{column}"] = _bounds(slider.value, slider)
        update.update(rule=rule.value, search=search.value.strip(), sample_id=sample.value.strip())
        status.value = "<i>filtering…</i>"
        selected = app.update(**update)
        status.value = app.summary().html
        if update["sample_id"] and len(selected):
            first = selected.iloc[0]
            app.open(str(first["dataset"]), int(first["line"]))

    for control in (*pick.values(), *ranges.values(), rule, search, sample):
        control.observe(changed, names="value")
    left = widgets.VBox([*pick.values(), rule])
    right = widgets.VBox([*ranges.values(), search, sample])
    return widgets.VBox([widgets.HBox([left, right]), status])


def _clicked(app: Selection) -> Callable[[Any, Any, Any], None]:
    def opened(trace: Any, points: Any, _state: Any) -> None:
        if points.point_inds and trace.customdata is not None:  # a trace is one dataset's points
            app.open(str(trace.legendgroup), int(trace.customdata[points.point_inds[0]]))

    return opened


def _layout(fig: go.Figure) -> dict[str, Any]:
    """A figure's layout without its template (the same for every figure)."""
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)
    return layout


def figure(app: Selection, build: Callable[[], go.Figure]) -> go.FigureWidget:
    """A FigureWidget redrawn in place (same widget, new traces) whenever app's selection
    changes; clicking a point opens its record."""
    widget = go.FigureWidget(build())
    on_click = _clicked(app)

    def bind() -> None:
        for trace in widget.data:
            if trace.customdata is not None and trace.meta != plots.COMPARED:  # this run's points
                trace.on_click(on_click)

    def refresh() -> None:
        fresh = build()
        with widget.batch_update():
            widget.data = ()
            widget.add_traces(list(fresh.data))
            if _layout(fresh) != _layout(widget):  # mostly the same: skip the costly check
                widget.layout = fresh.layout
        bind()

    bind()
    app.on_update(refresh)
    return widget


def viewer(hint: str) -> widgets.HTML:
    """The record viewer: an HTML widget the explorer fills with plots.record_view."""
    return widgets.HTML(f'<div class="wb-report"><p class="wb-note">{hint}</p></div>')
