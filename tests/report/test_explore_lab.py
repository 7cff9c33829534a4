"""`workbench explore` for real: JupyterLab on a small simulator run, driven in Chromium.

The test starts `workbench explore RUN --no-browser` (JupyterLab on a free port with a token),
opens the printed URL in Debian's Chromium through the `playwright` package (never a
downloaded browser), runs all cells, changes a control and sees a figure redraw, clicks a
point and reads the record it opens, saves, and checks that the package's notebooks were not
written. JupyterLab's process group is always stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium_path
from conftest import EXAMPLES, ROOT, generate_run
from playwright import sync_api as playwright  # the test extra installs it

from workbench.analyze.explore import record_detail
from workbench.server.launch import find_free_port, group_members

pytestmark = pytest.mark.integration

TIMEOUT_MS = 240_000  # a cold kernel and first imports on two busy cores


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_run(tmp_path_factory.mktemp("explore-run"), [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 30, "chat_template_kwargs": {"thinking": True}},
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 30},
    ])


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
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # like Ctrl-C: the verb stops Lab's group
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for pid in group_members(process.pid):
            os.kill(pid, signal.SIGKILL)


def _trace_names(page: Any, index: int) -> list[str]:
    return page.evaluate(f"""() => {{
        const plot = document.querySelectorAll('.jp-Notebook .js-plotly-plot')[{index}];
        return plot && plot.data ? plot.data.map(t => t.name) : [];
    }}""")


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
    """Hover then click the first marker of the first scatter plot (plotly picks the point
    under the mouse from the hover)."""
    plot = page.locator(".jp-Notebook .js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    box = plot.locator(".scatterlayer .trace .points path").first.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x - 5, y - 5)
    page.mouse.move(x, y)
    page.mouse.click(x, y)


def test_explorer_in_jupyterlab(run: Path, lab: tuple[str, subprocess.Popen[str]]) -> None:
    url, process = lab
    before = _digests(ROOT / "notebooks")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            _accept_kernel(page)
            _run_all(page)
            page.locator(".jp-Notebook .js-plotly-plot").nth(2).wait_for()
            page.locator(".jp-Notebook .widget-select-multiple select").first.wait_for()
            page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .js-plotly-plot')[0]"
                                   " && document.querySelectorAll('.jp-Notebook .js-plotly-plot')[0].data")
            assert {"chat", "ids"} <= set(_trace_names(page, 0))

            # a control changes every figure in place
            page.locator(".jp-Notebook .widget-select-multiple select").first.select_option(["ids"])
            page.wait_for_function("""() => [0, 2].every(i => {
                const plot = document.querySelectorAll('.jp-Notebook .js-plotly-plot')[i];
                const names = plot && plot.data ? plot.data.map(t => t.name) : [];
                return names.includes('ids') && !names.some(n => n.startsWith('chat'));
            })""")  # redrawn in place: the same plots, now without the other dataset
            assert "of 60 records selected" in page.locator(".jp-Notebook").inner_text()

            # a click on a point opens its record
            _click_a_point(page)
            card = page.locator(".jp-Notebook .wb-record")
            card.wait_for()
            title = card.locator("h4").inner_text()
            dataset, line = title.split(" · ")[0], int(title.split(" · ")[1].removeprefix("line "))
            assert dataset == "ids"
            expected = record_detail(run, dataset, line, tokenizer=EXAMPLES / "tokenizer")
            assert card.locator(".wb-record-answer").inner_text() == expected.answer
            assert card.locator(".wb-record-prompt").inner_text() == expected.prompt
            assert "<|im_end|>" in expected.answer  # special tokens are shown

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
