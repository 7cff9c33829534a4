"""The explorer's JupyterLab face: ipywidgets controls, plotly FigureWidgets, a record viewer.

Every function takes a :class:`Selection` (the :class:`~workbench.report.explorer.Explorer`)
and binds widgets to it: a control change calls its ``update`` (which redraws every figure
made here, in place), a click on a point opens that record in the viewer and rings it in
every figure that shows it. The explorer imports this module only in interactive mode, so
papermill reports never load ipywidgets.

A FigureWidget sends a layout to plotly.js as a *relayout*, which merges: a key left out
keeps its old value in the browser. So every layout sent here sets the keys that any state
changes (height, the axes' visibility and range, the "no records" note) explicitly, and an
empty selection is drawn by switching them, never by leaving them out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analyze.frames import RunOverview
from workbench.analyze.readback import RecordDetail
from workbench.report import plots

__all__ = ["Selection", "board", "controls", "figure", "viewer"]

RING = "opened record"  # the `meta` of the trace that rings the opened record
_EMPTY_NOTE = "wb-empty"  # the name of the annotation an empty figure shows

# The explorer's own styles: the board's record column stays in view while the figures
# scroll (sticky, so no box between it and the notebook's scroller may scroll itself); the
# board's cell is always laid out (plotly sizes a figure once, when drawn: in a cell Lab
# skips off screen it would take plotly's default 700 px and run under the record column);
# checkbox lists scroll past a few names; text wraps at spaces.
_CSS = """<style>
.jp-Cell:has(.wb-explorer-board){content-visibility:visible}
.jp-OutputArea:has(.wb-explorer-board),.jp-OutputArea-child:has(.wb-explorer-board),
.jp-OutputArea-output:has(.wb-explorer-board){overflow:visible;min-width:0}
.wb-explorer-board{min-width:0;max-width:100%}
.wb-explorer-records{position:sticky;top:4px;align-self:flex-start;max-height:calc(100vh - 150px);overflow-y:auto;overflow-x:hidden}
.wb-explorer-records .widget-html-content{line-height:1.4;white-space:normal;width:100%;min-width:0}
.wb-explorer-records .wb-report .wb-card{margin:0 4px 0 0}
.wb-explorer-records .wb-report .wb-table{display:block;overflow-x:auto;min-width:0}
.wb-explorer-records .wb-report .wb-code{max-height:22em;overflow-wrap:break-word;word-break:normal}
.wb-explorer-checks{max-height:96px;overflow-y:auto;border:1px solid #e4e7eb;border-radius:4px;padding:0 4px}
.wb-explorer-checks .widget-checkbox{height:22px}
.wb-report .wb-notice{background:#FFF4E5;border-left:4px solid #E67E00;padding:6px 10px;margin:0 0 8px;font-size:13px}
.wb-selection .wb-empty{color:#C62828;font-weight:600}
.wb-selection .wb-note{margin:2px 0}
.wb-explorer-gap{gap:14px}
</style>"""


class Selection(Protocol):
    """What the widgets bind to: a run's records and findings, the filters, the record
    opened, and the calls that refilter, open a record and register a redraw."""

    records: pd.DataFrame
    findings: pd.DataFrame
    filters: dict[str, Any]
    overview: RunOverview
    opened: RecordDetail | None

    @property
    def modes(self) -> list[str]: ...
    def update(self, **changes: Any) -> pd.DataFrame: ...
    def open(self, dataset: str, line: int) -> Any: ...
    def on_update(self, redraw: Callable[[], None]) -> None: ...
    def on_open(self, ring: Callable[[], None]) -> None: ...
    def summary(self, *, compact: bool = False) -> plots.Rendered: ...


_FULL = widgets.Layout(width="100%")
_STYLE = {"description_width": "136px"}


# --- controls --------------------------------------------------------------------------------


class _Checks:
    """A list of checkboxes (no Ctrl-click needed): ticked names are the filter; none or
    all ticked means no filter."""

    def __init__(self, title: str, names: list[str], ticked: tuple[str, ...]) -> None:
        self.boxes = [widgets.Checkbox(value=name in ticked, description=name, indent=False,
                                       layout=widgets.Layout(width="auto")) for name in names]
        box = widgets.VBox(self.boxes)
        box.add_class("wb-explorer-checks")
        self.title = title
        self.label = widgets.HTML()
        self._say()
        for check in self.boxes:
            check.observe(lambda _: self._say(), names="value")
        self.widget = widgets.VBox([self.label, box], layout=_FULL)

    def _say(self) -> None:
        none = not any(b.value for b in self.boxes)
        self.label.value = f"<b>{self.title}</b>" + (" <i>(none ticked: all)</i>" if none else "")

    @property
    def value(self) -> list[str] | None:
        ticked = [b.description for b in self.boxes if b.value]
        return None if not ticked or len(ticked) == len(self.boxes) else ticked

    def reset(self) -> None:
        for b in self.boxes:
            b.value = True


def _range(app: Selection, column: str) -> widgets.IntRangeSlider:
    values = app.records[column].dropna()
    top = max(int(values.max()) if len(values) else 1, 1)
    low = app.filters.get(f"min_{column}", 0)
    high = app.filters.get(f"max_{column}", top)
    return widgets.IntRangeSlider(value=(low, high), min=0, max=top, continuous_update=False,
                                  description=column.replace("_", " "), layout=_FULL, style=_STYLE)


def _rule_options(app: Selection) -> list[tuple[str, str]]:
    """("any record", "") then each rule that fired, with its count ("" is shown, None is not)."""
    counts = app.findings.groupby("rule").size().sort_values(ascending=False)
    return [("any record", ""), *((f"{rule} ({count:,} record{'' if count == 1 else 's'})", str(rule))
                                   for rule, count in counts.items())]


def _bounds(slider: widgets.IntRangeSlider) -> tuple[int | None, int | None]:
    low, high = slider.value
    return (None if low <= slider.min else low), (None if high >= slider.max else high)


def _initial(app: Selection, key: str, every: list[str]) -> tuple[str, ...]:
    given = app.filters.get(key)
    if given is None:
        return tuple(every)
    return (given,) if isinstance(given, str) else tuple(given)


class _Controls:
    """The filter controls of one selection: each change sends only its own filters."""

    def __init__(self, app: Selection) -> None:
        self.app = app
        names = list(app.overview.datasets)
        reasons = sorted(str(r) for r in app.records["finish_reason"].dropna().unique())
        self.checks = {"dataset": _Checks("datasets", names, _initial(app, "dataset", names)),
                       "finish_reason": _Checks("finish reason", reasons, _initial(app, "finish_reason", reasons))}
        modes = app.modes
        if modes:  # a run whose records carry a mode: one more list
            self.checks["mode"] = _Checks("mode", modes, _initial(app, "mode", modes))
        self.ranges = {column: _range(app, column) for column in ("completion_tokens", "prompt_tokens")}
        self.rule = widgets.Dropdown(options=_rule_options(app), value=app.filters.get("rule", ""),
                                     description="validation rule", layout=_FULL, style=_STYLE)
        self.search = widgets.Text(value=app.filters.get("search", ""), placeholder="text in the decoded reply",
                                   description="reply contains", continuous_update=False, layout=_FULL,
                                   style=_STYLE)
        self.sample = widgets.Text(value=str(app.filters.get("sample_id", "")), placeholder="a sample id",
                                   description="sample id", continuous_update=False, layout=_FULL, style=_STYLE)
        self.reset_button = widgets.Button(description="Reset filters", icon="undo",
                                           tooltip="clear every filter", layout=widgets.Layout(width="150px"))
        self.status = widgets.HTML(app.summary(compact=True).html, layout=_FULL)
        self.quiet = False  # set while Reset moves every control (one update at the end)
        self._bind()

    def _bind(self) -> None:
        for key, checks in self.checks.items():
            for box in checks.boxes:
                box.observe(lambda _, key=key: self.changed(key), names="value")
        for column, slider in self.ranges.items():
            slider.observe(lambda _, column=column: self.changed(column), names="value")
        for key, control in (("rule", self.rule), ("search", self.search), ("sample_id", self.sample)):
            control.observe(lambda _, key=key: self.changed(key), names="value")
        self.reset_button.on_click(lambda _: self.reset())

    def _values(self, key: str) -> dict[str, Any]:
        if key in self.checks:
            return {key: self.checks[key].value}
        if key in self.ranges:
            low, high = _bounds(self.ranges[key])
            return {f"min_{key}": low, f"max_{key}": high}
        control = {"rule": self.rule, "search": self.search, "sample_id": self.sample}[key]
        return {key: str(control.value).strip()}

    def changed(self, *keys: str) -> None:
        if self.quiet:
            return
        update: dict[str, Any] = {}
        for key in keys:
            update.update(self._values(key))
        self.status.value = '<div class="wb-report"><p class="wb-note"><i>filtering…</i></p></div>'
        self.app.update(**update)
        self.status.value = self.app.summary(compact=True).html

    def reset(self) -> None:
        """Every control back to no filter, then one update."""
        self.quiet = True
        try:
            for checks in self.checks.values():
                checks.reset()
            for slider in self.ranges.values():
                slider.value = (slider.min, slider.max)
            self.rule.value, self.search.value, self.sample.value = "", "", ""
        finally:
            self.quiet = False
        self.changed(*self.checks, *self.ranges, "rule", "search", "sample_id")

    def widget(self) -> widgets.VBox:
        lists = widgets.HBox([checks.widget for checks in self.checks.values()],
                             layout=widgets.Layout(flex="2 1 0", min_width="0"))
        fields = widgets.VBox([*self.ranges.values(), self.rule, self.search, self.sample],
                              layout=widgets.Layout(flex="3 1 0", min_width="0"))
        row = widgets.HBox([lists, fields], layout=_FULL)
        foot = widgets.HBox([self.reset_button, self.status], layout=widgets.Layout(width="100%",
                                                                                     align_items="center"))
        for box in (lists, row, foot):
            box.add_class("wb-explorer-gap")
        return widgets.VBox([widgets.HTML(_CSS, layout=widgets.Layout(display="none")), row, foot])


def controls(app: Selection) -> widgets.VBox:
    """The filter controls bound to app: datasets, finish reasons (and modes, when the
    run's records carry one) as checkboxes, token
    ranges, a validation rule, reply text, a sample id, a Reset button, and a line saying
    what is selected and by which filters."""
    return _Controls(app).widget()


# --- figures ---------------------------------------------------------------------------------


def _clicked(app: Selection) -> Callable[[Any, Any, Any], None]:
    def opened(trace: Any, points: Any, _state: Any) -> None:
        if points.point_inds and trace.customdata is not None:  # a trace is one dataset's points
            app.open(str(trace.legendgroup), int(trace.customdata[points.point_inds[0]]))

    return opened


def _empty_note(shown: bool) -> dict[str, Any]:
    return {"name": _EMPTY_NOTE, "text": plots.NO_MATCH, "visible": shown, "showarrow": False,
            "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "font": {"size": 15, "color": "#616e7c"}}


def _layout(fig: go.Figure) -> dict[str, Any]:
    """fig's layout with every key an empty selection changes set explicitly: the usual
    height, the axes shown (or hidden when there is no trace), their range or autorange,
    and the "no records match" note shown or hidden."""
    layout = fig.layout.to_plotly_json()
    empty = not fig.data
    notes = [] if empty else [a for a in layout.get("annotations", []) if a.get("name") != _EMPTY_NOTE]
    layout["annotations"] = [*notes, _empty_note(empty)]
    layout["height"] = plots.HEIGHT if empty else layout.get("height", plots.HEIGHT)
    for axis in ("xaxis", "yaxis"):
        props = layout.setdefault(axis, {})
        props["visible"] = not empty
        if "range" not in props:
            props["autorange"] = True
    return layout


def _same(layout: dict[str, Any], widget: go.FigureWidget) -> bool:
    """Whether widget already has this layout (the template left out of the comparison)."""
    mine = {k: v for k, v in layout.items() if k != "template"}
    theirs = {k: v for k, v in widget.layout.to_plotly_json().items() if k != "template"}
    return mine == theirs


def _ring() -> go.Scatter:
    return go.Scatter(x=[None], y=[None], mode="markers", meta=RING, showlegend=False, hoverinfo="skip",
                      marker={"symbol": "circle-open", "size": 18, "color": "#111111", "line": {"width": 3}})


def _clickable(trace: Any) -> bool:
    """A trace of this run's records: one dataset (its legendgroup), lines as customdata."""
    return bool(trace.legendgroup) and trace.customdata is not None and trace.meta not in (plots.COMPARED, RING)


def _rings(fig: go.Figure) -> list[go.Scatter]:
    """The ring trace, for a figure whose points open records."""
    return [_ring()] if any(_clickable(t) for t in fig.data) else []


def _where(widget: go.FigureWidget, opened: RecordDetail | None) -> tuple[Any, Any]:
    """(x, y) of the opened record's point in widget, or (None, None) when it is not drawn."""
    if opened is None:
        return None, None
    for trace in widget.data:
        if _clickable(trace) and trace.legendgroup == opened.dataset:
            at = np.flatnonzero(np.asarray(trace.customdata) == opened.line)
            if len(at):
                return trace.x[at[0]], trace.y[at[0]]
    return None, None


def _fit_when_drawn(widget: go.FigureWidget) -> None:
    """Refit the figure's width to its column once the browser has drawn it: plotly.js may
    draw a widget before it is on the page, at its default 700 px (running under the record
    viewer), and measures again only on a relayout with ``autosize``. Its word that it drew
    is the trace deltas it sends back (its layout deltas do not reach Python)."""

    def drawn(change: dict[str, Any]) -> None:
        if change["new"] and not widget.layout.autosize:  # after a new layout too: refit again
            widget.plotly_relayout({"autosize": True})

    widget.observe(drawn, names="_js2py_traceDeltas")


def figure(app: Selection, build: Callable[[], go.Figure]) -> go.FigureWidget:
    """A FigureWidget redrawn in place (same widget, new traces) whenever app's selection
    changes, at the same height when the selection is empty; clicking a point opens its
    record, which a ring marks in every figure that shows it."""
    first = build()
    widget = go.FigureWidget(data=first.data, layout=_layout(first))
    on_click = _clicked(app)

    def bind() -> None:
        for trace in widget.data:
            if _clickable(trace):  # this run's points
                trace.on_click(on_click)

    def ring() -> None:
        if widget.data and widget.data[-1].meta == RING:
            x, y = _where(widget, app.opened)
            widget.data[-1].update(x=[x], y=[y])

    def refresh() -> None:
        fresh = build()
        layout = _layout(fresh)
        with widget.batch_update():
            widget.data = ()
            widget.add_traces([*fresh.data, *_rings(fresh)])
            if not _same(layout, widget):
                widget.layout = layout
        bind()
        ring()

    widget.add_traces(_rings(first))
    _fit_when_drawn(widget)
    bind()
    app.on_update(refresh)
    app.on_open(ring)
    return widget


# --- the record viewer and the board ---------------------------------------------------------


def viewer(markup: str) -> widgets.HTML:
    """The record viewer: an HTML widget the explorer fills (plots.record_view)."""
    return widgets.HTML(markup, layout=widgets.Layout(width="100%"))


def board(figures: list[Any], records: widgets.Widget) -> widgets.HBox:
    """The figures on the left, the record viewer on the right, kept in view while the
    figures scroll: a clicked point's record opens beside it."""
    column = widgets.VBox(figures, layout=widgets.Layout(flex="3 1 0", min_width="0"))
    side = widgets.VBox([records], layout=widgets.Layout(flex="2 1 0", min_width="320px"))
    side.add_class("wb-explorer-records")
    row = widgets.HBox([widgets.HTML(_CSS, layout=widgets.Layout(display="none")), column, side],
                       layout=widgets.Layout(width="100%", align_items="flex-start", overflow="visible"))
    row.add_class("wb-explorer-gap")
    row.add_class("wb-explorer-board")  # no scrolling box around the viewer: it sticks to the notebook's
    return row
