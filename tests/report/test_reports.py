"""Reports end to end: a simulator run with planted problems, each notebook executed once with
papermill, values read back from the executed notebooks, HTML opened in headless Chromium."""

from __future__ import annotations

import ast
import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml
from browser import open_page
from conftest import EXAMPLES, ROOT, generate_run, workbench

from workbench.analyze.explore import filter_records, record_frame
from workbench.analyze.stats_text import render_stats
from workbench.errors import ConfigError, InputError, ReportError
from workbench.report import provenance
from workbench.report.parameters import (
    REPORTS,
    load_parameters,
    notebook_parameters,
    parse_overrides,
)
from workbench.report.render import SOCKET_PATH_MAX, cell_data, run_report, socket_folder
from workbench.rundir.records import Record, encode_line
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.integration

PLANTED = "<script>window.__pwned=1</script>"
PLANTED_ID = 1293  # a prompt word the simulated replies never use; decodes to PLANTED
THINK_END, IM_END = 163607, 163586
LATE = 12  # records appended after the run, all without a think-end id
NOTEBOOKS = ROOT / "notebooks"
FIGURES = {"token_distribution": 10, "format_validation": 3, "explore": 3}  # unscored: no NLL figure
EMPTY = {"token_distribution": 3}  # figures without traces: the run has no turns: each dataset


# --- the run ---------------------------------------------------------------------------------


def _tokenizer(folder: Path) -> Path:
    """The example tokenizer, with id PLANTED_ID decoding to PLANTED."""
    shutil.copytree(EXAMPLES / "tokenizer", folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    word = next(k for k, v in vocab.items() if v == PLANTED_ID)
    vocab[PLANTED] = vocab.pop(word)
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def _record(sample_id: Any, ids: list[int], ts: float) -> Record:
    return Record(sample_id=sample_id, output_ids=ids, prompt_tokens=40, completion_tokens=len(ids),
                  cached_tokens=0, finish_reason="stop", matched_stop=IM_END, e2e_latency=0.5, ts=ts)


def _plant(raw: Path) -> None:
    """After the run: the planted record, LATE replies without a think-end id, a bad line."""
    last = max(json.loads(line)["ts"] for line in raw.read_text().splitlines())
    lines = [encode_line(_record(PLANTED, [120, 121, PLANTED_ID, 122, IM_END], last + 5))]
    lines += [encode_line(_record(f"late-{i}", [130 + i] * (40 + i) + [IM_END], last + 60 + i))
              for i in range(LATE)]
    raw.write_bytes(raw.read_bytes() + b"".join(lines) + b"{not json\n")


@pytest.fixture(scope="session")
def run(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> dict[str, Any]:
    """A small simulator run (two datasets) with planted problems, and a tokenizer."""
    base = tmp_path_factory.mktemp("report-run")
    generate_run(base, [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 60, "chat_template_kwargs": {"thinking": True}},
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 60, "max_tokens": 6000},
    ], shared_sim)
    _plant(base / "out" / "chat" / "raw_responses.jsonl")
    return {"out": base / "out", "tokenizer": _tokenizer(base / "tokenizer"), "now": time.time(),
            "base": base}


def _params(folder: Path, name: str, values: dict[str, Any]) -> Path:
    """A parameter file with relative paths (resolved against its folder)."""
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(values))
    return path


@pytest.fixture(scope="session")
def reports(run: dict[str, Any]) -> dict[str, Any]:
    """Each report executed once: name -> ReportResult."""
    base: Path = run["base"]
    params = {
        "token_distribution": ({"run_dir": "out", "sample_size": 500}, {"now": run["now"]}),
        "format_validation": ({"run_dir": "out", "tokenizer": "tokenizer"}, {"now": run["now"]}),
        "explore": ({"run_dir": "out", "tokenizer": "tokenizer"},
                    {"dataset": "chat", "finish_reason": "stop", "unclosed": True, "samples_shown": 20}),
    }
    return {name: run_report(name, _params(base, name, file_values), overrides, base / "reports")
            for name, (file_values, overrides) in params.items()}


# --- values the notebooks produce ------------------------------------------------------------


TIMED = ("tokens_per_s", "requests_per_s", "eta_s", "recent")  # depend on when stats are taken


def _untimed(stats: dict[str, Any]) -> dict[str, Any]:
    every = {**stats["datasets"], "total": stats["total"]}
    return {name: {k: v for k, v in ds.items() if k not in TIMED} for name, ds in every.items()}


def test_summary_table_equals_stats_json(run: dict[str, Any], reports: dict[str, Any]) -> None:
    summary = cell_data(reports["token_distribution"].notebook_path, "summary")
    assert summary == json.loads(render_stats(run["out"], as_json=True, now=run["now"]))
    printed = workbench("stats", str(run["out"]), "--json")
    assert printed.returncode == 0, printed.stderr
    assert _untimed(summary) == _untimed(json.loads(printed.stdout))
    assert summary["datasets"]["chat"]["records"] == 60 + 1 + LATE
    assert summary["datasets"]["chat"]["bad_lines"] == 1


def test_budget_table_projects_from_the_stats(reports: dict[str, Any]) -> None:
    rows = {row["dataset"]: row for row in cell_data(reports["token_distribution"].notebook_path, "budget")}
    assert set(rows) == {"chat", "ids", "total"}
    assert rows["ids"]["max_tokens"] == 6000 and rows["chat"]["max_tokens"] is None
    assert rows["total"]["completion_tokens"] == rows["chat"]["completion_tokens"] + rows["ids"]["completion_tokens"]
    for row in rows.values():
        assert row["remaining_tokens"] == 0 or not row["finished"]


def test_validation_table_equals_validate_json(run: dict[str, Any], reports: dict[str, Any]) -> None:
    executed = reports["format_validation"].notebook_path
    validation = cell_data(executed, "validation")
    printed = workbench("validate", str(run["out"]), "--json")
    assert printed.returncode == 0, printed.stderr
    assert validation == json.loads(printed.stdout)
    assert validation["ok"] is False  # the planted bad line is a parse_error
    chat = {f["rule"]: f for f in validation["datasets"]["chat"]["findings"]}
    assert chat["parse_error"]["severity"] == "error"
    assert chat["reasoning_unclosed"]["count"] == 1 + LATE
    table = cell_data(executed, "findings")
    expected = {(name, f["rule"], f["count"]) for name, ds in validation["datasets"].items()
                for f in ds["findings"]}
    assert {(r["dataset"], r["rule"], r["count"]) for r in table if r["rule"]} == expected


def test_examples_show_decoded_text_escaped(reports: dict[str, Any]) -> None:
    examples = cell_data(reports["format_validation"].notebook_path, "examples")
    planted = [e for e in examples if e["sample_id"] == PLANTED]
    assert {e["rule"] for e in planted} >= {"reasoning_unclosed", "orphan_response"}
    assert any(PLANTED in e["excerpt"] for e in planted)
    text = reports["format_validation"].html_path.read_text()
    assert html.escape(PLANTED) in text and PLANTED not in text


def test_explore_selection_and_samples(run: dict[str, Any], reports: dict[str, Any]) -> None:
    executed = reports["explore"].notebook_path
    frame = record_frame(run["out"])
    expected = filter_records(frame, dataset="chat", finish_reason="stop", unclosed=True)
    selection = cell_data(executed, "selection")
    assert selection["selected"] == len(expected) == 1 + LATE
    assert selection["records"] == len(frame)
    samples = cell_data(executed, "samples")
    assert len(samples) == 1 + LATE and all(s["decoded"] for s in samples)
    planted = next(s for s in samples if s["sample_id"] == PLANTED)
    assert PLANTED in planted["reasoning"] and planted["answer"] == ""
    text = reports["explore"].html_path.read_text()
    assert html.escape(PLANTED) in text and PLANTED not in text


def test_html_is_offline_with_code_hidden(reports: dict[str, Any]) -> None:
    for name, result in reports.items():
        text = result.html_path.read_text()
        assert re.search(r"<script[^>]*\bsrc\s*=", text) is None, name
        assert len(re.findall(r"\* plotly\.js v\d", text)) == 1, name  # inlined, once
        assert "setup_notebook" not in text and 'class="jp-InputPrompt' not in text, name  # code hidden
        assert result.html_path.parent.name.startswith(f"{name}-")
        assert result.notebook_path.parent == result.html_path.parent


# --- the HTML in a browser -------------------------------------------------------------------


@pytest.mark.parametrize("name", REPORTS)
def test_report_renders_in_chromium(name: str, reports: dict[str, Any], tmp_path: Path) -> None:
    shots = Path(os.environ.get("WORKBENCH_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    page = open_page(reports[name].html_path, screenshot=shots / f"{name}.png", evaluate={
        "graphs": "document.querySelectorAll('.plotly-graph-div').length",
        "drawn": "[...document.querySelectorAll('.plotly-graph-div')]"
                 ".filter(d => d.querySelector('svg.main-svg') && d.querySelector('g.trace')).length",
        "pwned": "typeof window.__pwned",
        "text": "document.body.innerText",
        "scripts": "[...document.scripts].filter(s => s.src).length",
    })
    assert page.errors == []
    assert page.values["graphs"] == FIGURES[name]
    assert page.values["drawn"] == FIGURES[name] - EMPTY.get(name, 0)
    assert page.values["pwned"] == "undefined" and page.values["scripts"] == 0
    if name != "token_distribution":
        assert PLANTED in page.values["text"]  # shown as text, not run
    else:
        assert "Sent subset against the whole dataset" in page.values["text"]
        assert "KS D" in page.values["text"]
    assert page.screenshot is not None and page.screenshot.stat().st_size > 50_000


TRACES = ("[...document.querySelectorAll('.plotly-graph-div')].flatMap(d => d.data"
          ".map(t => [t.name, t.marker ? (t.marker.symbol || null) : null]))")


def test_token_distribution_names_the_markers_it_draws(reports: dict[str, Any]) -> None:
    page = open_page(reports["token_distribution"].html_path,
                     evaluate={"traces": TRACES, "text": "document.body.innerText"})
    text = " ".join(page.values["text"].split())
    keys = {name: symbol for name, symbol in page.values["traces"] if symbol}
    assert "open diamonds are replies without a think-end id" in text
    assert keys["no think-end id"] == "diamond-open"  # the LATE replies have none
    assert "crosses are truncated replies" in text and "crosses are replies without" not in text
    assert keys.get("truncated (finish length)", "x") == "x"


def test_a_dataset_stopped_by_its_budget_says_budget_reached(run: dict[str, Any],
                                                            reports: dict[str, Any]) -> None:
    """"ids" (max_tokens 6000) stops before its 60 prompts, a little under its budget: the
    runner sends no request whose reply might not fit (run.json's budget_reached)."""
    assert json.loads((run["out"] / "run.json").read_text())["datasets"]["ids"]["budget_reached"] is True
    result = reports["token_distribution"]
    rows = {row["dataset"]: row for row in cell_data(result.notebook_path, "budget")}
    assert rows["ids"]["state"] == "budget reached" and rows["ids"]["remaining_tokens"] == 0
    assert rows["ids"]["records"] < 60
    assert rows["total"]["state"] == "done" and rows["total"]["remaining_tokens"] == 0  # chat is done too
    page = open_page(result.html_path, evaluate={"rows": "[...document.querySelectorAll('tr')]"
                                                         ".map(r => r.innerText.split('\\t'))"})
    table_rows = page.values["rows"]
    done = f"{rows['ids']['records']}/60"
    progress = next(cells for cells in table_rows if cells[0] == "ids" and done in cells)
    budget = next(cells for cells in table_rows if cells[0] == "ids" and done.replace("/", " / ") in cells)
    assert progress[-1] == "budget reached"  # the summary's state / ETA column, not an ETA
    assert budget[-3:] == ["budget reached", "0", "-"]  # state, tokens left, projected time
    total = [cells for cells in table_rows if cells[0] == "total"]
    assert total[1][-1] == "done" and total[2][-3:] == ["done", "0", "-"]  # as its rows say


# --- failures and parameters -----------------------------------------------------------------


def test_failing_cell_is_named(run: dict[str, Any], tmp_path: Path) -> None:
    empty = tmp_path / "empty-run"  # passes the up-front check (a run.json), fails in the notebook
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    with pytest.raises(ReportError) as caught:
        run_report("token_distribution", None, {"run_dir": str(empty)}, tmp_path)
    message = str(caught.value)
    assert "cell 2 (overview = explore.run_overview(" in message
    assert "DataError" in message and "no datasets in run.json" in message
    executed = next(tmp_path.glob("token_distribution-*/token_distribution.ipynb"))
    assert str(executed.resolve()) in message


def _notebook(folder: Path, *sources: str) -> Path:
    """A notebook of these code cells, the first tagged parameters."""
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    cells[0].metadata["tags"] = ["parameters"]
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, folder / "slow.ipynb")
    return folder


def test_a_cell_timeout_keeps_the_cells_that_ran(tmp_path: Path) -> None:
    notebooks = _notebook(tmp_path / "nb", "run_dir = None", "print('first cell ran')",
                          "import time\ntime.sleep(60)")
    with pytest.raises(ReportError, match=r"^slow: cell 2 \(import time\) execution failed: CellTimeoutError: "
                       r"A cell timed out .* after 3 seconds\. \(executed notebook: [^\n]*slow\.ipynb\)$"):
        run_report("slow", None, {}, tmp_path / "out", notebooks=notebooks, timeout=3)
    executed = nbformat.read(next((tmp_path / "out").glob("slow-*/slow.ipynb")), as_version=4)
    assert [o.get("text") for o in executed.cells[2].outputs] == ["first cell ran\n"]


def test_the_executed_notebook_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not after every cell: each write serializes the whole notebook, plotly.js and all."""
    notebooks = _notebook(tmp_path / "nb", "run_dir = None", *(f"print({k})" for k in range(6)))
    writes: list[int] = []
    original = nbformat.writes
    monkeypatch.setattr(nbformat, "writes", lambda nb, *a, **k: writes.append(1) or original(nb, *a, **k))
    result = run_report("slow", None, {}, tmp_path / "out", notebooks=notebooks)
    assert len(writes) == 1
    executed = nbformat.read(result.notebook_path, as_version=4)
    assert [c.outputs[0]["text"] for c in executed.cells[2:]] == [f"{k}\n" for k in range(6)]


@pytest.mark.parametrize("depth", [1, 12])
def test_a_kernel_runs_however_deep_jupyters_runtime_folder_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """Local sockets where their paths fit, TCP on 127.0.0.1 where they would not (a socket's
    path holds about 100 bytes): a report runs either way."""
    top = Path(tempfile.mkdtemp(prefix="wb-rt-", dir="/tmp"))  # short, unlike tmp_path
    runtime = top.joinpath(*["runtime-folder"] * depth)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    notebooks = _notebook(tmp_path / "nb", "run_dir = None", "print('ran')")
    try:
        result = run_report("slow", None, {}, tmp_path / "out", notebooks=notebooks)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    executed = nbformat.read(result.notebook_path, as_version=4)
    assert executed.cells[2].outputs[0]["text"] == "ran\n"
    assert socket_folder() == (runtime if depth == 1 else None)
    assert len(os.fsencode(runtime)) > SOCKET_PATH_MAX or depth == 1


def test_missing_input_folders_fail_before_a_kernel_starts(run: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^tokenizer: directory not found: .*no-tokenizer$"):
        run_report("explore", None, {"run_dir": str(run["out"]), "tokenizer": str(tmp_path / "no-tokenizer")},
                   tmp_path / "out")
    with pytest.raises(InputError, match=r"no-run: not a run directory"):
        run_report("explore", None, {"run_dir": str(run["out"]), "compare_run_dir": str(tmp_path / "no-run")},
                   tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_or_mistyped_parameters_name_key_and_file(tmp_path: Path) -> None:
    notebook = NOTEBOOKS / "token_distribution.ipynb"
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+: colour: unknown key \(known: bins, log_axis, "):
        load_parameters(notebook, _params(tmp_path, "p", {"colour": "red"}))
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+: bins: expected int, got str"):
        load_parameters(notebook, _params(tmp_path, "p", {"bins": "many"}))
    with pytest.raises(ConfigError, match=r"^-p: colour: unknown parameter"):
        load_parameters(notebook, None, {"colour": "red"})
    with pytest.raises(ConfigError, match=r"^-p: log_axis: expected `bool \| null`, got `str`"):
        load_parameters(notebook, None, parse_overrides(["log_axis=maybe"]))
    with pytest.raises(ConfigError, match=r"no report named 'nope' \(known: explore, format_validation"):
        run_report("nope", None, {}, tmp_path)


def test_parameters_files_overrides_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = NOTEBOOKS / "format_validation.ipynb"
    (tmp_path / "params").mkdir()
    path = _params(tmp_path / "params", "p", {"run_dir": "../out", "excerpt_chars": 100})
    monkeypatch.chdir(tmp_path)
    values = load_parameters(notebook, path, parse_overrides(["tokenizer=tok", "model_profile=qwen3",
                                                               "now=12.5"]))
    assert values == {"run_dir": str(tmp_path / "out"), "excerpt_chars": 100,
                      "tokenizer": str(tmp_path / "tok"), "model_profile": "qwen3", "now": 12.5}
    assert parse_overrides(["a=true", "b=3", "c=null", "d=x/y", "e=", "f=None", "g=none"]) == {
        "a": True, "b": 3, "c": None, "d": "x/y", "e": "", "f": None, "g": "none"}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["novalue"])
    for given in ("decontaminate=[a.jsonl, b/c.jsonl]", "decontaminate=a.jsonl,b/c.jsonl"):
        values = load_parameters(notebook, None, parse_overrides([given]))  # a list parameter
        assert values == {"decontaminate": [str(tmp_path / "a.jsonl"), str(tmp_path / "b/c.jsonl")]}
    with pytest.raises(ConfigError, match="excerpt_chars"):
        load_parameters(notebook, None, parse_overrides(["excerpt_chars=1,2"]))
    with pytest.raises(ConfigError, match="expected a value or a list of values"):
        parse_overrides(["decontaminate={a: 1}"])


@pytest.mark.parametrize("name", REPORTS)
def test_demo_parameter_files_fit_their_notebooks(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # their outputs/ is the current folder's: where `workbench demo` writes
    values = load_parameters(NOTEBOOKS / f"{name}.ipynb", ROOT / "params" / f"{name}.demo.yaml")
    assert values["run_dir"] == str(tmp_path.resolve() / "outputs" / "demo")
    given = str(ROOT.resolve() / "outputs" / "demo")  # an absolute path, as given, stays
    values = load_parameters(NOTEBOOKS / f"{name}.ipynb", ROOT / "params" / f"{name}.demo.yaml",
                             {"run_dir": given})
    assert values["run_dir"] == given


@pytest.mark.parametrize("name", REPORTS)
def test_notebooks_are_committed_thin_and_clean(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"]
    assert notebook_parameters(NOTEBOOKS / f"{name}.ipynb")["run_dir"] == (str, "../outputs/demo")
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None
        tree = ast.parse(cell.source)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.Lambda)]


@pytest.fixture(autouse=True)
def _no_stray_outputs() -> Iterator[None]:
    before = set((ROOT / "notebooks").iterdir())
    yield
    assert set((ROOT / "notebooks").iterdir()) == before


def test_reports_say_how_long_they_took(reports: dict[str, Any]) -> None:
    for result in reports.values():
        seconds = result.seconds
        assert set(seconds) == {"notebook", "html", "total"} and min(seconds.values()) > 0
        assert seconds["total"] >= seconds["notebook"] + seconds["html"]


def test_jupyter_imports_skip_the_iri_grammar_and_still_validate_notebooks() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from workbench.report.render import fast_jupyter_imports, notebooks_dir\n"
        "fast_jupyter_imports()\n"
        "import nbformat\n"
        "assert 'rfc3987_syntax' not in sys.modules\n"
        "nb = nbformat.read(notebooks_dir() / 'explore.ipynb', as_version=4)\n"
        "nbformat.validate(nb)\n"
        "nb.cells[0].pop('source')\n"
        "try:\n"
        "    nbformat.validate(nb)\n"
        "except nbformat.ValidationError:\n"
        "    print('invalid caught')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "invalid caught", done.stderr


# --- reproducible reports --------------------------------------------------------------------


def _figures(notebook: Path) -> list[Any]:
    nb = nbformat.read(notebook, as_version=4)
    return [out["data"]["application/vnd.plotly.v1+json"] for cell in nb.cells
            for out in cell.get("outputs", []) if "application/vnd.plotly.v1+json" in out.get("data", {})]


def test_report_folder_records_parameters_versions_and_inputs(run: dict[str, Any], reports: dict[str, Any]) -> None:
    folder = reports["format_validation"].notebook_path.parent
    params = yaml.safe_load((folder / "params.yaml").read_text())
    assert set(params) == set(notebook_parameters(NOTEBOOKS / "format_validation.ipynb"))
    assert params["run_dir"] == str(run["out"].resolve()) and params["now"] == run["now"]
    assert params["tokenizer"] == str(run["tokenizer"].resolve()) and params["excerpt_chars"] == 400
    manifest = json.loads((folder / "report.json").read_text())
    assert manifest["report"] == "format_validation" and manifest["versions"]["plotly"]
    assert {"python", "workbench", "pandas", "papermill"} <= set(manifest["versions"])
    inputs = {Path(entry["path"]): entry for entry in manifest["inputs"]}
    raw = (run["out"] / "chat" / "raw_responses.jsonl").resolve()
    assert inputs[raw]["bytes"] == raw.stat().st_size
    assert inputs[raw]["content_hash"] == provenance.content_hash(raw)[1]  # tested in test_provenance
    tokenizer = (run["tokenizer"] / "tokenizer.json").resolve()
    assert inputs[tokenizer]["sha256"] == hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    assert (run["out"] / "run.json").resolve() in inputs and (run["tokenizer"] / "tokenizer.json").resolve() in inputs
    explore_params = yaml.safe_load((reports["explore"].notebook_path.parent / "params.yaml").read_text())
    assert explore_params["interactive"] is False  # a report is static


def test_rerun_reproduces_the_figures_of_an_unchanged_run(reports: dict[str, Any], tmp_path: Path) -> None:
    first = reports["token_distribution"]
    again = workbench("report", "--rerun", str(first.notebook_path.parent), "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "inputs unchanged since" in again.stdout
    executed = Path(again.stdout.strip().splitlines()[-1]).with_suffix(".ipynb")
    assert executed.parent.parent == tmp_path and executed.is_file()
    assert _figures(executed) == _figures(first.notebook_path) and len(_figures(executed)) == FIGURES["token_distribution"]
    assert cell_data(executed, "summary") == cell_data(first.notebook_path, "summary")


def test_rerun_says_which_inputs_changed(tmp_path: Path) -> None:
    from workbench.report import provenance

    same, grown, edited, gone = (tmp_path / f"{n}.jsonl" for n in ("same", "grown", "edited", "gone"))
    for path in (same, grown, edited, gone):
        path.write_text('{"a": 1}\n')
    files = [("run_dir", p) for p in (same, grown, edited, gone)]
    provenance.write_manifest(tmp_path, "r", same, files, 0.0)
    grown.write_text('{"a": 1}\n{"a": 2}\n')
    edited.write_text('{"a": 3}\n')
    gone.unlink()
    new = tmp_path / "new.jsonl"
    new.write_text("{}\n")
    manifest = provenance.read_manifest(tmp_path)
    changes = {Path(c.path).stem: c.state for c in provenance.compare_inputs(manifest, [*files, ("run_dir", new)])}
    assert changes == {"same": "unchanged", "grown": "grew", "edited": "changed", "gone": "missing", "new": "new"}
    missing = workbench("report", "--rerun", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "not a report folder" in missing.stderr
    assert missing.stderr.count("\n") == 1
