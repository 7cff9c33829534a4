"""`workbench explore` for real: JupyterLab on a small simulator run, driven in Chromium.

The test starts `workbench explore RUN --no-browser` (JupyterLab on a free port with a token),
opens the printed URL in Debian's Chromium through the `playwright` package (never a
downloaded browser) at 1400x900, runs all cells and, as a user would: sees the controls and
the first figure on one screen; unticks a dataset and sees every figure redraw; empties the
selection (an unknown sample id) and sees every figure keep its size, say so, and come back
whole when the filter is cleared; clicks a point and sees it ringed and its record open in
view, beside the figures; filters that record out and is told; resets the filters; saves;
and checks that the package's notebooks were not written. JupyterLab's process group is
always stopped. With $WORKBENCH_SCREENSHOTS set, screenshots of each step land there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium_path, stop_like_ctrl_c
from conftest import EXAMPLES, ROOT, generate_run, wait_until
from playwright import sync_api as playwright  # the test extra installs it

from workbench.analyze.explore import record_detail
from workbench.server.launch import ServerProcess, find_free_port

pytestmark = pytest.mark.integration

TIMEOUT_MS = 240_000  # a cold kernel and first imports on two busy cores


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    return generate_run(tmp_path_factory.mktemp("explore-run"), [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 30, "chat_template_kwargs": {"thinking": True}},
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 30, "sampling": {"max_new_tokens": 120}},  # the simulator's replies run
    ], shared_sim)  # 50-250 ids: a cap of 120 leaves both finished and truncated replies, whatever the order


@pytest.fixture
def lab(run: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`workbench explore` started in its own process group; its URL."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")  # the venv's kernel and extensions
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench", "explore", str(run), "--no-browser", "--port", str(find_free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        assert lines[0].startswith("created ") and lines[0].strip().endswith("explore.ipynb"), lines
        url = lines[2].strip()
        assert url.startswith("http://127.0.0.1:") and "token=" in url, (lines, process.stderr)
        yield url, process
    finally:
        stop_like_ctrl_c(process)


PLOTS = "document.querySelectorAll('.jp-Notebook .js-plotly-plot')"


def _trace_names(page: Any, index: int) -> list[str]:
    return page.evaluate(f"""() => {{
        const plot = {PLOTS}[{index}];
        return plot && plot.data ? plot.data.map(t => t.name) : [];
    }}""")


def _figures(page: Any) -> list[dict[str, Any]]:
    """Each figure's height on screen, its traces (name, point count) and its visible notes."""
    return page.evaluate(f"""() => [...{PLOTS}].map(plot => ({{
        height: Math.round(plot.getBoundingClientRect().height),
        traces: (plot.data || []).map(t => [t.name || '', (t.x || []).length]),
        notes: [...plot.querySelectorAll('.annotation-text')].map(n => n.textContent),
    }}))""")


def _page_state(page: Any) -> dict[str, Any]:
    """What the notebook shows, for a failure's message: each figure's traces and the text of
    every error or stderr output."""
    return {"figures": _figures(page), "errors": page.evaluate("""() => [...document.querySelectorAll(
        '.jp-Notebook .jp-OutputArea-output[data-mime-type*="stderr"], .jp-Notebook .jp-OutputArea-output[data-mime-type*="error"]')]
        .map(n => n.textContent.slice(0, 2000))""")}


def _wait_for_figures(page: Any, expected: list[dict[str, Any]]) -> None:
    """Until the figures are drawn as `expected` (a _figures result): heights, traces, notes."""
    drawn: list[Any] = []

    def as_expected() -> bool:
        drawn[:] = _figures(page)
        return drawn == expected

    wait_until(as_expected, TIMEOUT_MS / 1000, lambda: f"the figures drawn as {expected}, not {drawn}",
               interval=0.25)


def _shoot(page: Any, name: str) -> None:
    """A 1400x900 screenshot into $WORKBENCH_SCREENSHOTS, when set (to look at the explorer)."""
    folder = os.environ.get("WORKBENCH_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"explore-{name}.png"))


def _in_view(page: Any, locator: Any) -> bool:
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] >= 0 and box["y"] + min(box["height"], 200) <= height


def _accept_kernel(page: Any) -> None:
    """A fresh Lab may ask which kernel to start (the notebook's, preselected): accept."""
    try:
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=20_000)
    except playwright.TimeoutError:
        pass  # no dialog: the notebook's kernel started by itself


def _run_all(page: Any) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _click_a_point(page: Any) -> None:
    """Hover then click the point of the first scatter plot farthest inside its plot area
    (plotly picks the point under the mouse from the hover)."""
    page.locator(".jp-Notebook .js-plotly-plot").first.scroll_into_view_if_needed()
    x, y = page.evaluate(f"""() => {{
        const plot = {PLOTS}[0], area = plot.querySelector('.nsewdrag').getBoundingClientRect();
        const inside = p => Math.min(p[0] - area.left, area.right - p[0], p[1] - area.top, area.bottom - p[1]);
        const points = [...plot.querySelectorAll('.scatterlayer .trace .points path')].map(path => {{
            const r = path.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }});
        return points.reduce((best, p) => inside(p) > inside(best) ? p : best);
    }}""")
    page.mouse.move(x - 5, y - 5)
    page.mouse.move(x, y)
    page.mouse.click(x, y)


def _type_sample_id(page: Any, text: str) -> None:
    box = page.locator(".jp-Notebook .widget-text input[placeholder='a sample id']")
    box.fill(text)
    box.press("Enter")


def _wait_for_points(page: Any, names: list[str]) -> None:
    """Until the first figure draws exactly these datasets' points (besides legend keys)."""
    page.wait_for_function(f"""() => {{
        const plot = {PLOTS}[0];
        const drawn = plot && plot.data ? plot.data.filter(t => t.customdata && t.customdata.length)
                                                   .map(t => t.name) : [];
        const wanted = {json.dumps(names)};
        return wanted.every(n => drawn.includes(n)) && drawn.every(n => wanted.includes(n));
    }}""")


def test_explorer_in_jupyterlab(run: Path, lab: tuple[str, subprocess.Popen[str]]) -> None:
    url, process = lab
    before = _digests(ROOT / "notebooks")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            _accept_kernel(page)
            _run_all(page)
            page.locator(".jp-Notebook .js-plotly-plot").nth(2).wait_for()
            reset = page.locator(".jp-Notebook button", has_text="Reset filters")
            reset.wait_for()
            wait_until(lambda: {"chat", "ids"} <= set(_trace_names(page, 0)), TIMEOUT_MS / 1000,
                       lambda: f"both datasets drawn in the first figure: {_page_state(page)}",
                       interval=0.5)

            # the controls and the first figure fit on one 1400x900 screen
            page.locator(".jp-Notebook .widget-checkbox", has_text="chat").first.scroll_into_view_if_needed()
            page.evaluate("""() => document.querySelector('.jp-Notebook .widget-checkbox')
                                   .closest('.jp-Cell').scrollIntoView({block: 'start'})""")
            page.wait_for_timeout(500)
            _shoot(page, "1-controls-and-first-figure")
            first = page.locator(".jp-Notebook .js-plotly-plot").first
            assert _in_view(page, reset) and _in_view(page, first.locator(".main-svg").first)
            assert page.evaluate(f"""() => [...{PLOTS}].every(p => p.querySelector('.main-svg')
                .getBoundingClientRect().right <= p.closest('.wb-explorer-board > .widget-vbox')
                .getBoundingClientRect().right + 1)""")  # each figure fits its column, beside the viewer

            # a control (a checkbox, no Ctrl-click) changes every figure in place
            page.locator(".jp-Notebook .widget-checkbox", has_text="chat").locator("input").first.uncheck()
            page.wait_for_function(f"""() => [0, 2].every(i => {{
                const plot = {PLOTS}[i];
                const names = plot && plot.data ? plot.data.map(t => t.name) : [];
                return names.includes('ids') && !names.some(n => n && n.startsWith('chat'));
            }})""")  # redrawn in place: the same plots, now without the other dataset
            notebook = page.locator(".jp-Notebook")
            wait_until(lambda: "of 60 records selected" in notebook.inner_text(), TIMEOUT_MS / 1000,
                       lambda: f"the count of the selection: {notebook.inner_text()[-2000:]}",
                       interval=0.25)  # the summary may redraw after the figures
            assert "Filters: dataset: ids." in notebook.inner_text()  # in plain words
            shown = _figures(page)

            # a dataset whose points are all truncated keeps its legend entry
            page.locator(".jp-Notebook .widget-checkbox", has_text="stop").locator("input").first.uncheck()
            page.wait_for_function(f"""() => {PLOTS}[0].data.some(t => t.name === 'ids'
                && t.showlegend !== false && t.x.length === 1 && t.x[0] === null)""")  # no circle left
            legend = page.evaluate(f"() => [...{PLOTS}[0].querySelectorAll('.legend .traces text')]"
                                   ".map(t => t.textContent)")
            assert "ids" in legend and "truncated (finish length)" in legend, legend
            page.locator(".jp-Notebook .widget-checkbox", has_text="stop").locator("input").first.check()
            _wait_for_figures(page, shown)

            # an empty selection keeps every figure's size, says so, and is undone when cleared
            _type_sample_id(page, "no-such-id")
            page.wait_for_function(f"() => [...{PLOTS}].every(p => p.data && p.data.length === 0)")
            page.wait_for_timeout(500)
            _shoot(page, "2-empty-selection")
            empty = _figures(page)
            assert [f["height"] for f in empty] == [f["height"] for f in shown]
            assert all(f["notes"] == ["no records match the filters"] for f in empty), empty
            assert "not found" in notebook.locator(".wb-record-missing").inner_text()  # the typed id
            _type_sample_id(page, "")
            _wait_for_figures(page, shown)  # heights, traces, points and notes all back

            # a click rings its point and opens the record beside the figures, in view
            _click_a_point(page)
            card = notebook.locator(".wb-record")
            card.wait_for()
            page.wait_for_function(f"""() => {{
                const ring = {PLOTS}[0].data.at(-1);
                return ring.meta === 'opened record' && ring.x[0] !== null;
            }}""")
            _shoot(page, "3-clicked-point")
            assert _in_view(page, card.locator("h4"))
            title = card.locator("h4").inner_text()
            dataset, line = title.split(" · ")[0], int(title.split(" · ")[1].removeprefix("line "))
            assert dataset == "ids"
            expected = record_detail(run, dataset, line, tokenizer=EXAMPLES / "tokenizer")
            assert card.locator(".wb-record-answer").inner_text() == (expected.answer or "(empty)")
            assert card.locator(".wb-record-prompt").inner_text() == expected.prompt
            assert "<|im_user|>" in expected.prompt  # special tokens are shown
            if expected.matched_stop is not None:  # a finished reply (the point may be a cut one)
                assert "<|im_end|>" in expected.answer
                assert "matched stop <|im_end|>" in card.locator(".wb-facts").inner_text()  # the stop by name

            # a filter that drops the shown record says so; Reset clears every filter
            page.locator(".jp-Notebook .widget-checkbox", has_text="ids").locator("input").first.uncheck()
            page.locator(".jp-Notebook .widget-checkbox", has_text="chat").locator("input").first.check()
            card.locator(".wb-notice").wait_for()
            assert "filtered out by the current filters" in card.locator(".wb-notice").inner_text()
            _shoot(page, "4-record-filtered-out")
            reset.click()
            _wait_for_points(page, ["chat", "ids"])
            page.wait_for_function("() => !document.querySelector('.jp-Notebook .wb-record .wb-notice')")
            assert "Filters: none" in notebook.inner_text()

            page.keyboard.press("Control+s")
            page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')")
        except Exception:
            page.screenshot(path=str(run.parent / "explore-lab-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    saved = json.loads((run / "explore.ipynb").read_text())
    outputs = [o for cell in saved["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert outputs, "the run's notebook was saved with its outputs"
    assert _digests(ROOT / "notebooks") == before  # the package's notebooks are never written
    assert process.poll() is None  # Lab still serves until stopped
