"""The explorer: filters, per-record findings, text search, one record in full, the widgets
bound to one selection (without a browser; tests/test_explore_lab.py drives the real thing),
and the run's own notebook that `workbench explore` makes."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import nbformat
import pandas as pd
import pytest
from conftest import ROOT, workbench
from test_plots import IM_END, SCRIPT, write_run

from workbench.analyze import explore
from workbench.errors import ConfigError, InputError
from workbench.report import plots
from workbench.report.explorer import Explorer
from workbench.report.lab import explorer_notebook, set_parameters
from workbench.report.parameters import load_parameters, notebook_parameters


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "out")


@pytest.fixture
def frame(run: Path) -> pd.DataFrame:
    return explore.record_frame(run)


def test_ranges_datasets_reasons_and_sample_ids(frame: pd.DataFrame) -> None:
    assert len(explore.filter_records(frame, dataset=["a", "b"])) == 9
    assert len(explore.filter_records(frame, finish_reason=["stop", "length"])) == 9
    b = explore.filter_records(frame, dataset="b", min_completion_tokens=3, max_completion_tokens=4)
    assert b["completion_tokens"].tolist() == [3, 4]
    prompts = explore.filter_records(frame, min_prompt_tokens=200, max_prompt_tokens=400)
    assert prompts["prompt_tokens"].tolist() == [200, 300, 400]
    assert explore.filter_records(frame, sample_id="3")["dataset"].tolist() == ["b"]  # ids as text
    assert explore.filter_records(frame, sample_id=SCRIPT)["line"].tolist() == [4]
    with pytest.raises(ConfigError, match="rule: filtering by rule needs"):
        explore.filter_records(frame, rule="truncated")


def test_record_findings_and_rule_filter(run: Path, frame: pd.DataFrame) -> None:
    findings = explore.record_findings(run)
    rules = set(zip(findings["dataset"], findings["line"], findings["rule"], strict=True))
    assert ("a", 2, "truncated") in rules and ("a", 3, "reasoning_unclosed") in rules
    assert not (findings["dataset"] == "b").any()
    cut = explore.filter_records(frame, rule="truncated", findings=findings)
    assert cut[["dataset", "line"]].values.tolist() == [["a", 2]]
    assert explore.filter_records(frame, rule="truncated", dataset="b", findings=findings).empty


def test_search_in_replies_with_a_cache_and_a_limit(run: Path, frame: pd.DataFrame) -> None:
    cache: dict[tuple[str, int], str] = {}
    found, searched = explore.search_replies(run, frame, "</think>", cache=cache)
    assert searched == 9 and found[["dataset", "line"]].values.tolist() == [["a", 1], ["a", 4]]
    assert len(cache) == 9 and cache[("a", 1)] == "1 2 3 </think> 4 5 <end>"
    found, searched = explore.search_replies(run, frame, "</THINK>", limit=2, cache=cache)
    assert searched == 2 and found["line"].tolist() == [1]  # case-insensitive, first 2 rows only


def test_record_detail_has_prompt_reasoning_answer_and_findings(run: Path) -> None:
    detail = explore.record_detail(run, "a", 1)
    assert (detail.prompt, detail.reasoning, detail.answer) == ("1 2", "1 2 3 </think>", "4 5 <end>")
    assert (detail.finish_reason, detail.matched_stop, detail.completion_tokens) == ("stop", IM_END, 7)
    assert detail.findings == () and not detail.decoded
    cut = explore.record_detail(run, "a", 2)
    assert [rule for rule, _ in cut.findings] == ["truncated"]
    orphan = explore.record_detail(run, "a", 4)
    assert orphan.prompt is None and orphan.sample_id == SCRIPT  # no prompt was written for it
    with pytest.raises(ConfigError, match="no readable record at line 99"):
        explore.record_detail(run, "a", 99)
    with pytest.raises(ConfigError, match="unknown dataset 'c'"):
        explore.record_detail(run, "c", 1)


def test_static_explorer_is_the_parameters_selection(run: Path) -> None:
    app = Explorer(run, interactive=False, filters={"dataset": "a", "finish_reason": "stop"})
    assert app.selected["line"].tolist() == [1, 3, 4]
    assert app.controls().data == {"selected": 3, "records": 9,
                                   "filters": {"dataset": "a", "finish_reason": "stop"}}
    scatter = app.scatter()
    assert [b.label for b in scatter.layout.updatemenus[0].buttons] == ["all datasets", "a"]
    shown = app.record_viewer().data
    assert [s["line"] for s in shown] == [1, 3, 4]
    with pytest.raises(ConfigError, match="colour: unknown filter"):
        Explorer(run, interactive=False, filters={"colour": "red"})


def _all(root: Any, kind: type) -> list[Any]:
    """The widgets of `kind` under root, in order."""
    found = [root] if isinstance(root, kind) else []
    for child in getattr(root, "children", ()):
        found += _all(child, kind)
    return found


def _control(root: Any, kind: type, description: str) -> Any:
    return next(w for w in _all(root, kind) if w.description == description)


def _click(trace: Any, line: int) -> None:
    index = [int(at) for at in trace.customdata].index(line)
    trace._dispatch_on_click(type("Points", (), {"point_inds": [index]})(), None)


def test_widgets_redraw_in_place_and_open_records(run: Path) -> None:
    app = Explorer(run, interactive=True, compare_run_dir=run)
    controls, scatter, histogram = app.controls(), app.scatter(), app.histogram()
    board = app.board(scatter, histogram)
    viewer = app.record_viewer()
    assert viewer in _all(board, widgets.HTML) and scatter in board.children[1].children  # side by side
    assert {t.name for t in scatter.data} >= {"a", "b", "a (out)", "b (out)"}
    tick_a = _control(controls, widgets.Checkbox, "a")
    assert tick_a.value and _control(controls, widgets.Checkbox, "b").value
    tick_a.value = False  # as a user unticks a dataset: no Ctrl-click
    assert app.filters["dataset"] == ["b"] and len(app.selected) == 5
    assert {t.name for t in scatter.data} >= {"b", "b (out)"} and "a" not in {t.name for t in scatter.data}
    assert {t.name for t in histogram.data} == {"b", "b (out)"}
    status = next(w for w in _all(controls, widgets.HTML) if "records selected" in w.value)
    assert "5</b> of 9 records selected" in status.value and "Filters: dataset: b." in status.value
    rule = _control(controls, widgets.Dropdown, "validation rule")
    assert rule.label == "any record" and ("truncated (1 record)", "truncated") in rule.options
    rule.value = "truncated"  # only in dataset a, which is not picked
    assert app.filters["rule"] == "truncated" and app.selected.empty
    assert "No record matches these filters" in status.value
    rule.value = ""
    assert "rule" not in app.filters and len(app.selected) == 5
    sample_box = _control(controls, widgets.Text, "sample id")
    sample_box.value = "2"  # a sample id opens its record
    assert "b · line 3 · sample 2" in viewer.value and "9 9 9 &lt;end&gt;" in viewer.value
    assert "&lt;end&gt; (163586)" in viewer.value  # the matched stop by name
    assert len(app.selected) == 1
    sample_box.value = ""
    point = next(t for t in scatter.data if t.name == "b" and t.showlegend is not False)
    _click(point, 1)
    assert "b · line 1 · sample 0" in viewer.value
    ring = scatter.data[-1]
    assert ring.meta == "opened record" and (ring.x[0], ring.y[0]) == (100, 2)  # b line 1: 100 prompt, 2 tokens
    theirs = next(t for t in scatter.data if t.name == "b (out)")
    assert theirs.meta == "compared run" and not theirs._click_callbacks  # not this run's records
    tick_b = _control(controls, widgets.Checkbox, "b")
    tick_b.value = False  # nothing ticked: no dataset filter, and the list says so
    assert "dataset" not in app.filters and any("none ticked: all" in w.value for w in _all(controls, widgets.HTML))
    _control(controls, widgets.Button, "Reset filters").click()
    assert app.filters == {} and len(app.selected) == 9 and tick_a.value and tick_b.value


def test_empty_selection_keeps_the_size_and_is_undone(run: Path) -> None:
    app = Explorer(run, interactive=True)
    scatter, histogram = app.scatter(), app.histogram()
    before = [(t.name, tuple(t.x)) for t in scatter.data]
    sent: list[dict[str, Any]] = []
    scatter._send_relayout_msg = lambda data, source_view_id=None: sent.append(data)
    app.update(dataset="b", rule="truncated")  # no record of b was cut
    for fig in (scatter, histogram):
        note = next(a for a in fig.layout.annotations if a.name == "wb-empty")
        assert not fig.data and fig.layout.height == plots.HEIGHT
        assert note.visible and note.text == "no records match the filters" and fig.layout.xaxis.visible is False
    app.update(dataset=None, rule=None)
    assert [(t.name, tuple(t.x)) for t in scatter.data] == before
    for fig in (scatter, histogram):
        note = next(a for a in fig.layout.annotations if a.name == "wb-empty")
        assert fig.layout.height == plots.HEIGHT and note.visible is False and fig.layout.xaxis.visible
    restored = sent[-1]  # plotly.js merges a relayout: every key the empty state changed is sent back
    assert restored["height"] == plots.HEIGHT and restored["xaxis"]["visible"] is True
    assert [a["visible"] for a in restored["annotations"] if a.get("name") == "wb-empty"] == [False]


def test_the_record_viewer_says_how_the_record_stands(run: Path) -> None:
    app = Explorer(run, interactive=True)
    viewer = app.record_viewer()
    assert "Click a point" in viewer.value
    app.open("a", 1)
    assert app.record_state("a", 1) == "selected" and "wb-notice" not in viewer.value
    app.update(dataset="b")  # the shown record is dropped by a filter
    assert app.record_state("a", 1) == "filtered out"
    assert "filtered out by the current filters" in viewer.value and "a · line 1 · sample 0" in viewer.value
    app.update(dataset=None)
    assert "wb-notice" not in viewer.value and "a · line 1" in viewer.value
    app.update(sample_id="no-such-id")
    assert "Sample id no-such-id: not found" in viewer.value and "a · line 1" not in viewer.value
    assert app.record_state("a", 99) == "not found"
    app.update(sample_id="")
    assert "not found" not in viewer.value and "Click a point" in viewer.value  # said no longer
    app.update(sample_id=None, dataset="b")
    app.update(sample_id="1")  # sample 1 is a's line 2 and b's line 2: the selected one opens
    assert "b · line 2 · sample 1" in viewer.value and "wb-notice" not in viewer.value
    app.update(dataset="a", finish_reason="stop")  # a's line 2 (id 1) was cut: filtered out
    app.update(sample_id="1")
    assert app.selected.empty and "a · line 2 · sample 1" in viewer.value
    assert "filtered out by the current filters" in viewer.value


def test_the_filter_line_is_plain_words(run: Path) -> None:
    frame = explore.record_frame(run)
    line = plots.selection_view(frame.iloc[:2], frame, {
        "dataset": ["B2_code"], "finish_reason": ["stop", "length"], "min_completion_tokens": 10,
        "max_prompt_tokens": 2000, "min_prompt_tokens": 5, "search": "wait", "truncated": True},
        searched=(5000, 9000)).html
    assert ("Filters: dataset: B2_code; finish reason: stop, length; completion tokens: at least 10; "
            "prompt tokens: 5 to 2,000; truncated replies only (finish length); "
            "reply contains &quot;wait&quot; (searched the first 5,000 of 9,000 records).") in line
    said = line.split("Filters:")[1].split("</p>")[0]
    assert "[" not in said and "=" not in said and "'" not in said  # no Python reprs
    app = Explorer(run, interactive=False, filters={"dataset": "a", "rule": "truncated", "search": "zzz"})
    said = app.summary().html
    assert "dataset: a; failing rule: truncated; reply contains &quot;zzz&quot;." in said
    app = Explorer(run, interactive=False, filters={"rule": "truncated", "dataset": "b", "search": "x"})
    assert "first 0" not in app.summary().html and "searched" not in app.summary().html  # nothing to search
    assert "Filters: none (every record)" in Explorer(run, interactive=False).summary().html


def test_the_explorer_scatter_keeps_its_legend_and_counts_from_zero(run: Path) -> None:
    cut = explore.filter_records(explore.record_frame(run), truncated=True)  # a's line 2 only
    fig = plots.explore_scatter(cut, x="reasoning_tokens", y="answer_tokens", menu=False)
    legend = [t for t in fig.data if t.legendgroup == "a" and t.showlegend]
    assert len(legend) == 1 and list(legend[0].x) == [None]  # plotly.js drops traces without points
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.range[1] > 0  # answers all 0: not -1 to 1
    assert fig.layout.yaxis.dtick == 1 and fig.layout.height == plots.HEIGHT
    empty = plots.explore_scatter(cut.iloc[:0])
    assert empty.layout.height == plots.HEIGHT and empty.layout.annotations[0].text == "no records match the filters"


def test_the_runs_notebook_points_at_the_run_and_the_package_notebook_is_untouched(
        run: Path, tmp_path: Path) -> None:
    source = ROOT / "notebooks" / "explore.ipynb"
    before = source.read_bytes()
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    manifest = json.loads((run / "run.json").read_text())
    manifest["datasets"]["a"]["tokenizer"] = str(tokenizer)
    (run / "run.json").write_text(json.dumps(manifest))
    path, created = explorer_notebook(run)
    assert created and path == run / "explore.ipynb" and source.read_bytes() == before
    parameters = notebook_parameters(path)
    assert parameters["run_dir"][1] == "." and parameters["tokenizer"][1] == str(tokenizer)
    path.write_text(path.read_text().replace("sample_size = 2000", "sample_size = 7"))
    assert explorer_notebook(run) == (path, False)  # the user's copy is kept as it is
    assert notebook_parameters(path)["sample_size"][1] == 7
    with pytest.raises(InputError, match="not a run directory"):
        explorer_notebook(tmp_path / "tok")


def test_set_parameters_keeps_annotations_and_comments() -> None:
    cell = 'run_dir = "../x"  # the run\ntokenizer: Optional[str] = None  # ids\nseed = 0'
    assert set_parameters(cell, {"run_dir": ".", "tokenizer": "/t", "absent": 1}).splitlines() == [
        'run_dir = "."  # the run', 'tokenizer: Optional[str] = "/t"  # ids', "seed = 0"]
    nb = nbformat.read(ROOT / "notebooks" / "explore.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in nb.cells)  # committed with outputs cleared


def test_explore_verb_bad_input_is_one_line(run: Path, tmp_path: Path) -> None:
    missing = workbench("explore", str(tmp_path / "nowhere"), "--no-browser")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("workbench: error: ") and "nowhere" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = workbench("explore", str(run), "--no-browser", "--port", str(busy.getsockname()[1]))
    assert taken.returncode == 2 and "--port: port" in taken.stderr and "in use" in taken.stderr
    assert not (run / "explore.ipynb").exists()  # nothing written before the port was checked


def test_sample_id_zero_and_cleared_filters(run: Path) -> None:
    app = Explorer(run, interactive=False, filters={"sample_id": 0, "dataset": "a", "unclosed": False})
    assert app.filters == {"sample_id": 0, "dataset": "a"} and app.selected["line"].tolist() == [1]
    assert len(app.update(sample_id=None, dataset=[])) == 9 and app.filters == {}


def test_compare_run_dir_is_a_path_relative_to_the_parameter_file(tmp_path: Path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("compare_run_dir: ../other\n")
    values = load_parameters(ROOT / "notebooks" / "explore.ipynb", params)
    assert values == {"compare_run_dir": str((tmp_path / ".." / "other").resolve())}
