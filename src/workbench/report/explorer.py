"""The explore notebook's explorer: a run's records loaded once, filtered by controls, with
figures and a record viewer that update in place.

    app = Explorer(run_dir, tokenizer=..., compare_run_dir=..., filters={...})
    app.controls()     datasets, finish reasons (and modes, in a run whose records carry
                       one), completion and prompt token ranges, a validation rule, text
                       in the decoded reply, a sample id
    app.scatter()      records (a sample of the selection); click a point to open it
    app.histogram()    completion tokens of the selection (and of the compared run)
    app.record_viewer() the record viewer: prompt, reasoning, answer, counts, findings
    app.board(*figures) the figures beside the record viewer

In JupyterLab (``interactive=True``) these return ipywidgets (plotly ``FigureWidget``) bound
to one selection: a control change refilters the loaded records and redraws every view; no
file is read again, except the few replies a text search decodes and the record opened.
The record opened is ringed in every figure that shows it, and the viewer always says how it
stands: shown, filtered out by the current filters, or (a typed sample id) not found. An
empty selection leaves every figure at its size, saying "no records match the filters".
Under papermill (``interactive=False``, what ``workbench report`` runs) the same calls return
static figures and report blocks of the selection the parameters give.

The filters are those of :func:`workbench.analyze.frames.filter_records` (``filters`` takes its
keyword arguments) plus ``search``; shaping is in :mod:`workbench.analyze.frames` and
:mod:`workbench.analyze.readback`, drawing in :mod:`workbench.report.plots`. A record of a
conversation regenerated turn by turn carries its ``turn`` (the record frame's column, NA for
single-turn records; the samples' and the opened record's ``turn``), which the hover, the
record viewer and the sample cards name beside the sample id. A record of a dataset that
mixes modes carries its ``mode`` (the record frame's column, NA otherwise): the ``mode``
filter (a name or a list) keeps the records of those modes, and the record viewer and the
sample cards name a record's mode beside its sample id.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analyze import frames, readback
from workbench.analyze.scan import scan_run
from workbench.errors import ConfigError
from workbench.report import plots

__all__ = ["FILTER_KEYS", "Explorer"]

FILTER_KEYS = ("dataset", "finish_reason", "truncated", "min_completion_tokens",
               "max_completion_tokens", "min_prompt_tokens", "max_prompt_tokens", "unclosed",
               "rule", "sample_id", "mode", "search")
_HINT = "Click a point in a figure, or enter a sample id above, to open a record here."
_FILTERED_OUT = "This record is filtered out by the current filters; the figures do not show it."


def _unset(value: object) -> bool:
    """A filter value that filters nothing (0 is a value: a sample id, a bound)."""
    return value is None or value is False or value == "" or (isinstance(value, list | tuple) and not value)


def _sized(fig: go.Figure) -> go.Figure:
    """A figure at the usual height even when empty (then saying that no record matches)."""
    if fig.data:
        return fig
    fig.update_layout(height=plots.HEIGHT)
    for note in fig.layout.annotations:
        note.text = plots.NO_MATCH
    return fig


class Explorer:
    """One run's records (and optionally a second run's, laid over them) and a selection."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        model_profile: str | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        compare_run_dir: str | os.PathLike[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        sample_size: int = 2000,
        samples_shown: int = 5,
        text_chars: int = 2000,
        search_limit: int = 5000,
        seed: int = 0,
        log: bool = False,
        interactive: bool = True,
    ) -> None:
        unknown = sorted(set(filters or {}) - set(FILTER_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"unknown filter (known: {', '.join(FILTER_KEYS)})")
        self.overview = frames.run_overview(run_dir, model_profile=model_profile)
        profile = self.overview.model_profile
        self.scan = scan_run(run_dir, model_profile=profile)  # one read of the run, cached
        self.records = frames.record_frame(self.scan)
        self.findings = frames.record_findings(self.scan)
        self.compare = (None if compare_run_dir is None else
                        frames.record_frame(compare_run_dir, model_profile=profile))
        self.compare_label = "" if compare_run_dir is None else Path(compare_run_dir).name
        self.tokenizer, self.interactive = tokenizer, interactive
        self.sample_size, self.samples_shown, self.text_chars = sample_size, samples_shown, text_chars
        self.search_limit, self.seed, self.log = search_limit, seed, log
        self.filters: dict[str, Any] = {k: v for k, v in (filters or {}).items() if not _unset(v)}
        self._texts: dict[tuple[str, int], str] = {}
        self._views: list[Callable[[], None]] = []  # redraws, called after every update
        self._viewer: Any = None
        self._openers: list[Callable[[], None]] = []  # ring the opened record, after every open
        self.opened: readback.RecordDetail | None = None
        self.missing: str | None = None  # why no record is shown (a sample id not found)
        self.searched = self.searchable = 0
        self.selected = self._select()

    # --- the selection -----------------------------------------------------------------------

    def _select(self) -> pd.DataFrame:
        given = {k: v for k, v in self.filters.items() if k != "search"}
        selected = frames.filter_records(self.records, findings=self.findings, **given)
        text = self.filters.get("search")
        self.searchable = len(selected)
        if not text:
            self.searched = 0
            return selected
        found, self.searched = readback.search_replies(
            self.scan, selected, text, tokenizer=self.tokenizer, limit=self.search_limit,
            cache=self._texts)
        return found

    def compared(self) -> pd.DataFrame | None:
        """The compared run's records under the same filters (rule and search left out: its
        findings and text are not loaded); datasets it does not have are skipped."""
        if self.compare is None:
            return None
        given = {k: v for k, v in self.filters.items() if k not in ("rule", "search")}
        if "dataset" in given:
            wanted = given["dataset"]
            names = [wanted] if isinstance(wanted, str) else list(wanted)
            given["dataset"] = [n for n in names if n in set(self.compare["dataset"].astype(str))]
        return frames.filter_records(self.compare, **given)

    @property
    def modes(self) -> list[str]:
        """The modes of the run's records, sorted (none in a run without modes)."""
        return sorted(str(m) for m in self.records["mode"].dropna().unique())

    def update(self, **changes: Any) -> pd.DataFrame:
        """Set filters (None, False, "" or an empty list clears one), reselect, redraw every
        view, and bring the record viewer up to date (a new sample id opens its record)."""
        for key, value in changes.items():
            if key not in FILTER_KEYS:
                raise ConfigError(key, f"unknown filter (known: {', '.join(FILTER_KEYS)})")
            if _unset(value):
                self.filters.pop(key, None)
            else:
                self.filters[key] = value
        self.selected = self._select()
        for refresh in self._views:
            refresh()
        if "sample_id" in changes:
            self.missing = None  # a new id is looked up; a cleared one is not said missing
        if "sample_id" in changes and "sample_id" in self.filters:
            self._open_sample(self.filters["sample_id"])  # a typed id opens its record
        else:
            self._show()  # the viewer says whether the filters still select its record
        return self.selected

    def on_update(self, redraw: Callable[[], None]) -> None:
        """Call redraw after every update (the widgets' figures register here)."""
        self._views.append(redraw)

    def on_open(self, ring: Callable[[], None]) -> None:
        """Call ring after every record opened and every update (the figures' highlight)."""
        self._openers.append(ring)

    def summary(self, *, compact: bool = False) -> plots.Rendered:
        """How many records the selection holds, per dataset, and the filters in plain words
        (the data: counts and filters); `compact` for the explorer's status line."""
        searched = (self.searched, self.searchable) if self.filters.get("search") else None
        return plots.selection_view(self.selected, self.records, self.filters, searched=searched,
                                    compact=compact)

    def record_state(self, dataset: str, line: int) -> str:
        """Where a record stands: "selected", "filtered out" (in the run, not in the
        selection) or "not found" (not in the run's records)."""
        for frame, state in ((self.selected, "selected"), (self.records, "filtered out")):
            if ((frame["dataset"].astype(str) == dataset) & (frame["line"] == line)).any():
                return state
        return "not found"

    # --- views -------------------------------------------------------------------------------

    def controls(self) -> Any:
        """The filter controls and a selection summary (static: the summary only)."""
        if not self.interactive:
            return self.summary()
        from workbench.report import widgets

        return widgets.controls(self)

    def scatter(self, x: str = "prompt_tokens", y: str = "completion_tokens", *,
                title: str | None = None) -> Any:
        """A sample of the selected records, x against y (points open their record)."""
        said = title or f"{x.replace('_', ' ').capitalize()} against {y.replace('_', ' ')} (sample)"

        def build() -> go.Figure:
            sample = frames.sample_records(self.selected, self.sample_size, seed=self.seed)
            other = self.compared()
            theirs = None if other is None else frames.sample_records(other, self.sample_size, seed=self.seed)
            return plots.explore_scatter(sample, x=x, y=y, log=self.log, title=said, compare=theirs,
                                         compare_label=self.compare_label,
                                         menu=not self.interactive and theirs is None)

        return self._figure(build)

    def histogram(self, *, bins: int = 40, title: str = "Completion tokens of the selected records") -> Any:
        """The selection's completion tokens per dataset (and the compared run's, dashed)."""

        def build() -> go.Figure:
            other = self.compared()
            mine = frames.histogram(self.selected, log=self.log, bins=bins, also=other)
            theirs = None if other is None else frames.histogram(other, log=self.log, bins=bins,
                                                                  also=self.selected)
            return _sized(plots.histogram_figure(mine, log=self.log, title=title, compare=theirs,
                                                 compare_label=self.compare_label))

        return self._figure(build)

    def _figure(self, build: Callable[[], go.Figure]) -> Any:
        if not self.interactive:
            return build()
        from workbench.report import widgets

        return widgets.figure(self, build)

    def detail(self, dataset: str, line: int) -> readback.RecordDetail:
        """One record of the run in full."""
        return readback.record_detail(self.scan, dataset, line, tokenizer=self.tokenizer)

    def open(self, dataset: str, line: int) -> readback.RecordDetail:
        """Show a record in the record viewer, ringed in the figures (and return it)."""
        found = self.detail(dataset, line)
        self.opened, self.missing = found, None
        self._show()
        return found

    def _open_sample(self, sample_id: object) -> None:
        """Open the record of a typed sample id: the first selected one, else the first in
        the run (the viewer then says it is filtered out), else say it is not found."""
        anywhere = frames.filter_records(self.records, sample_id=str(sample_id))
        if anywhere.empty:
            self.opened, self.missing = None, f"Sample id {sample_id}: not found in this run's records."
            self._show()
            return
        first = (self.selected if not self.selected.empty else anywhere).iloc[0]
        self.open(str(first["dataset"]), int(first["line"]))

    def viewer_content(self) -> plots.Rendered:
        """What the record viewer shows now: the opened record (with a notice when the
        filters leave it out), why none is shown, or how to open one."""
        if self.opened is None:
            if self.missing is None:
                return plots.Rendered(f'<div class="wb-report"><p class="wb-note">{_HINT}</p></div>')
            return plots.record_view(None, notice=self.missing)
        state = self.record_state(self.opened.dataset, self.opened.line)
        return plots.record_view(self.opened, notice=None if state == "selected" else _FILTERED_OUT)

    def turn_of(self, dataset: str, line: int) -> int | None:
        """A record's turn of its conversation (None for a single-turn record)."""
        found = self.records.loc[(self.records["dataset"].astype(str) == dataset)
                                 & (self.records["line"] == line), "turn"].dropna()
        return None if found.empty else int(found.iloc[0])

    def _show(self) -> None:
        if self._viewer is not None:
            self._viewer.value = self.viewer_content().html
        for ring in self._openers:
            ring()

    def record_viewer(self) -> Any:
        """The record viewer (static: `samples_shown` records of the selection in full)."""
        if not self.interactive:
            shown = readback.samples(self.scan, self.selected, n=self.samples_shown, seed=self.seed,
                                     tokenizer=self.tokenizer, chars=self.text_chars)
            return plots.samples_view(shown)
        from workbench.report import widgets

        if self._viewer is None:
            self._viewer = widgets.viewer(self.viewer_content().html)
        return self._viewer

    def board(self, *figures: Any) -> Any:
        """The figures beside the record viewer. In JupyterLab one widget: the figures on the
        left, the viewer on the right (it stays in view while the figures scroll), so a
        click opens its record next to the point. Static: the figures, then the record
        viewer's cards (the cell's value)."""
        if not self.interactive:
            from IPython.display import display

            for fig in figures:
                display(fig)
            return self.record_viewer()
        from workbench.report import widgets

        return widgets.board(list(figures), self.record_viewer())
