"""The explorer of a run whose dataset mixes modes: a mode filter (the parameters' ``mode``,
and a checkbox list in JupyterLab) narrows the selection, its figures and its samples; the
sample cards and the record viewer name the record's mode; a run without modes has no such
list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pytest
from test_findings_modes import write_mixed_run

from workbench.report.explorer import Explorer


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_mixed_run(tmp_path / "out")


def _all(root: Any, kind: type) -> list[Any]:
    found = [root] if isinstance(root, kind) else []
    for child in getattr(root, "children", ()):
        found += _all(child, kind)
    return found


def _labels(root: Any) -> list[str]:
    return [w.value for w in _all(root, widgets.HTML)]


def test_the_static_explorer_keeps_the_parameters_modes(run: Path) -> None:
    app = Explorer(run, interactive=False, filters={"mode": "direct"})
    assert app.modes == ["direct", "think"]
    assert app.selected["dataset"].astype(str).tolist() == ["mix", "mix"]
    assert app.selected["mode"].tolist() == ["direct", "direct"]
    said = app.controls()
    assert said.data["selected"] == 2 and said.data["filters"] == {"mode": "direct"}
    assert "Filters: mode: direct." in said.html
    shown = app.record_viewer()
    assert [s["mode"] for s in shown.data] == ["direct", "direct"]
    assert shown.html.count(" · mode direct · ") == 2 and "mode think" not in shown.html
    assert sum(len(t.x) for t in app.histogram().data if t.x is not None) > 0
    points = [int(x) for t in app.scatter().data if t.customdata is not None for x in t.customdata]
    assert sorted(points) == [5, 6]  # the lines of mix's two direct records
    both = Explorer(run, interactive=False, filters={"mode": ["think"], "dataset": "mix"})
    assert len(both.selected) == 4 and "Filters: dataset: mix; mode: think." in both.summary().html


def test_mode_checkboxes_narrow_the_selection_and_the_viewer_names_the_mode(run: Path) -> None:
    app = Explorer(run, interactive=True)
    controls, histogram = app.controls(), app.histogram()
    viewer = app.record_viewer()
    assert "<b>mode</b>" in _labels(controls)
    boxes = {b.description: b for b in _all(controls, widgets.Checkbox)}
    assert {"direct", "think"} <= set(boxes) and boxes["direct"].value and boxes["think"].value
    assert {t.name for t in histogram.data} == {"mix", "plain"}
    boxes["think"].value = False
    assert app.filters["mode"] == ["direct"] and len(app.selected) == 2
    assert {t.name for t in histogram.data} == {"mix"}  # redrawn: plain's records have no mode
    assert any("Filters: mode: direct." in label for label in _labels(controls))
    app.open("mix", 6)
    assert "mix · line 6 · sample 5 · mode direct</h4>" in viewer.value
    app.open("plain", 1)  # a record without a mode: none named
    assert "· mode" not in viewer.value and "filtered out" in viewer.value
    next(b for b in _all(controls, widgets.Button) if b.description == "Reset filters").click()
    assert app.filters == {} and len(app.selected) == 9 and boxes["think"].value


def test_a_run_without_modes_has_no_mode_list(tmp_path: Path) -> None:
    app = Explorer(write_mixed_run(tmp_path / "out", modes=False), interactive=True)
    controls = app.controls()
    assert app.modes == [] and "<b>mode</b>" not in _labels(controls)
    assert {b.description for b in _all(controls, widgets.Checkbox)} == {"plain", "stop"}
    app.open("plain", 1)
    assert "· mode" not in app.record_viewer().value
