"""OUT/index.html: every rendering listed (grouped by report, newest first), failed ones
too, with links that work; checked in headless Chromium, offline (no script, no network)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from browser import open_page
from conftest import EXAMPLES, generate_run, workbench

from workbench.errors import ReportError
from workbench.report import index
from workbench.report.render import run_report
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.integration

ROWS = """JSON.stringify([...document.querySelectorAll('table.renderings')].map(t => ({
  report: t.dataset.report,
  rows: [...t.querySelectorAll('tr.ok, tr.failed')].map(r => ({
    state: r.className, cells: [...r.cells].map(c => c.innerText.trim()),
    links: [...r.querySelectorAll('a')].map(a => a.href)}))})))"""


def _broken_notebook(folder: Path) -> Path:
    """A report notebook whose second cell raises."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('run_dir = None  # the run')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell('raise ValueError("planted failure")')]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "broken.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> dict[str, object]:
    base = tmp_path_factory.mktemp("index")
    run = generate_run(base, [{"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"),
                               "input": "messages", "max_samples": 16}], shared_sim)
    out = base / "reports"
    values = {"run_dir": str(run), "sample_size": 100}
    first = run_report("token_distribution", None, values, out)
    raw = run / "chat" / "raw_responses.jsonl"
    raw.write_bytes(raw.read_bytes() + raw.read_bytes().splitlines(keepends=True)[0])  # it grew
    second = run_report("token_distribution", None, values, out)
    validation = run_report("format_validation", None, {"run_dir": str(run),
                                                       "tokenizer": str(EXAMPLES / "tokenizer")}, out)
    _broken_notebook(base / "nb")
    with pytest.raises(ReportError, match="planted failure"):
        run_report("broken", None, {"run_dir": str(run)}, out, notebooks=base / "nb")
    return {"out": out, "run": run, "first": first, "second": second, "validation": validation}


def test_the_index_lists_every_rendering(reports: dict[str, object]) -> None:
    out = reports["out"]
    assert isinstance(out, Path)
    found = index.renderings(out)
    assert [r.name for r in found] == ["broken", "format_validation", "token_distribution",
                                       "token_distribution"]
    broken = found[0]
    assert not broken.ok and broken.html is None and broken.notebook is not None
    assert "planted failure" in (broken.error or "")
    changed = [r.inputs_changed for r in found if r.name == "token_distribution"]
    assert changed == [True, None]  # the second saw the run grow; the first had none before


def test_index_in_chromium_with_working_links(reports: dict[str, object], tmp_path: Path) -> None:
    out = reports["out"]
    assert isinstance(out, Path)
    page = open_page(out / "index.html", evaluate={"groups": ROWS, "scripts":
                     "document.scripts.length", "title": "document.title"},
                     screenshot=tmp_path / "index.png")
    assert not page.errors, page.errors
    assert page.values["scripts"] == 0  # static: opens offline
    groups = json.loads(page.values["groups"])
    assert [g["report"] for g in groups] == ["broken", "format_validation", "token_distribution"]
    rows = {g["report"]: g["rows"] for g in groups}
    assert len(rows["token_distribution"]) == 2
    newer, older = rows["token_distribution"]
    assert newer["cells"][0] > older["cells"][0] and "latest" in newer["cells"][0]  # newest first
    assert newer["cells"][2] == "changed" and older["cells"][2] == "first"
    assert newer["cells"][3] == "0"
    assert newer["cells"][1] == str(Path(str(reports["run"])).resolve())
    assert rows["broken"][0]["state"] == "failed" and "planted failure" in rows["broken"][0]["cells"][3]
    assert len(rows["broken"][0]["links"]) == 1  # the executed notebook; no HTML
    links = [link for group in groups for row in group["rows"] for link in row["links"]]
    assert len(links) == 2 + 2 + 2 + 1
    for link in links:  # each resolved by the browser to a file that is there
        path = Path(unquote(urlparse(link).path))
        assert path.is_file() and path.is_relative_to(out.resolve()), link
    report = open_page(Path(unquote(urlparse(rows["token_distribution"][0]["links"][0]).path)),
                       evaluate={"plots": "document.querySelectorAll('.plotly-graph-div').length"})
    assert report.values["plots"] > 0 and not report.exceptions


def test_cli_index_rebuilds_the_page(reports: dict[str, object], tmp_path: Path) -> None:
    out = reports["out"]
    assert isinstance(out, Path)
    (out / "index.html").unlink()
    done = workbench("report", "--index", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / "index.html") and "4 renderings" in done.stderr
    assert (out / "index.html").read_text().count('<tr class="') == 4
    empty = tmp_path / "none"
    empty.mkdir()
    assert workbench("report", "--index", str(empty)).returncode == 0
    assert "No renderings yet." in (empty / "index.html").read_text()
    missing = workbench("report", "--index", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr


def test_a_finished_sweep_renders_its_report_into_the_index(tmp_path: Path) -> None:
    """`workbench tune` renders throughput_tuning into outputs/reports (its index lists it),
    before its summary; `--no-report` does not; an interrupted sweep would not either."""
    params = tmp_path / "tuning.yaml"
    params.write_text(json.dumps({  # one quick point of the simulator (JSON is YAML)
        "server": {"launcher": "sim", "startup_timeout": 30, "stop_grace": 5,
                   "sim": {"profile": "dense-8b-1x24gb", "speed": 3.0}},
        "grid": {"configs": [{"name": "only", "args": {"mem_fraction_static": 0.85}}]},
        "load": {"concurrency": [4], "warmup_requests": 2, "duration": 3, "max_new_tokens": 256,
                 "prompts": {"count": 40, "input_len": [100, 200]}, "sample_interval": 0.5},
        "projection": {"remaining_tokens": 10_000_000}, "fidelity": {"prompts": 0}}))
    sweep = tmp_path / "sweep"
    done = workbench("tune", "--params", str(params), "--out", str(sweep), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    reports = tmp_path / "outputs" / "reports"
    found = index.renderings(reports)
    assert [r.name for r in found] == ["throughput_tuning"] and found[0].ok
    assert found[0].run == str(sweep.resolve()) and found[0].html is not None
    lines = done.stdout.strip().splitlines()
    said = next(line for line in lines if line.startswith("report: "))
    assert said == f"report: {found[0].html.resolve()} (index: outputs/reports/index.html)"
    assert lines[-1] == f"results: {sweep / 'results.csv'}"  # the summary stays last
    assert "throughput_tuning" in (reports / "index.html").read_text()

    again = workbench("tune", "--params", str(params), "--out", str(sweep), "--resume", "--no-report",
                      cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not any(line.startswith("report: ") for line in again.stdout.splitlines())
    assert len(index.renderings(reports)) == 1
