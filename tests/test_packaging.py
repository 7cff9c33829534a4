"""What the package carries and how a user's own folder uses it: packaged notebooks and
parameter files, `workbench report` defaults, `workbench init` job folders, `latest` links."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT, workbench

from workbench.config import load_manifest
from workbench.jobfolder import init_job_folder, job_files
from workbench.report.parameters import REPORTS, default_params, load_parameters, notebooks_dir
from workbench.report.render import link_latest
from workbench.resources import data_dir, report_names


def test_carried_folders_hold_the_repositorys_files() -> None:
    for kind in ("notebooks", "params", "examples"):
        carried = sorted(p.relative_to(data_dir(kind)) for p in data_dir(kind).rglob("*") if p.is_file())
        in_repo = sorted(p.relative_to(ROOT / kind) for p in (ROOT / kind).rglob("*") if p.is_file())
        assert carried == in_repo
    assert set(REPORTS) <= set(report_names())


def test_report_defaults_to_the_packaged_demo_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_params("token_distribution") == data_dir("params") / "token_distribution.demo.yaml"
    assert default_params("nope") is None
    values = load_parameters(notebooks_dir() / "format_validation.ipynb", default_params("format_validation"))
    assert values["run_dir"] == str(tmp_path.resolve() / "outputs" / "demo")  # not inside the package
    assert values["tokenizer"] == str((data_dir("examples") / "tokenizer").resolve())


def test_report_mistakes_are_one_line_with_a_hint(tmp_path: Path) -> None:
    wrong = workbench("report", "tokens", cwd=tmp_path)
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines()[-1] == (
        "workbench: error: NAME: no report named 'tokens' "
        "(known: explore, format_validation, throughput_tuning, token_distribution)")
    as_path = workbench("report", "notebooks/token_distribution.ipynb", cwd=tmp_path)
    assert as_path.returncode == 2
    assert "no such notebook file (or give a report name: explore," in as_path.stderr
    no_run = workbench("report", "token_distribution", cwd=tmp_path)
    assert no_run.returncode == 2
    assert no_run.stderr.splitlines()[-1].endswith(
        "not a run directory (no such directory) (run `workbench demo` first, or pass -p run_dir=OUT)")
    given = workbench("report", "token_distribution", "-p", f"run_dir={tmp_path / 'none'}", cwd=tmp_path)
    assert given.returncode == 2
    assert given.stderr.splitlines()[-1] == f"workbench: error: {tmp_path / 'none'}: not a run directory (no such directory)"


def test_init_writes_a_job_folder_that_the_verbs_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = init_job_folder(tmp_path / "job")
    names = {str(p.relative_to(tmp_path / "job")) for p in written}
    assert {"README.md", "params/datasets.yaml", "params/tuning.yaml", "params/router.yaml",
            "notebooks/token_distribution.ipynb"} <= names
    job = tmp_path / "job"
    text = (job / "params" / "datasets.yaml").read_text()
    assert text.count("#") > 10 and "kimi-k25" not in text  # commented, renamed to the job's files
    assert yaml.safe_load(text)["model_profile"] == "kimi-k2.5"
    dry = workbench("tune", "--params", str(job / "params" / "tuning.yaml"), "--dry-run")
    assert dry.returncode == 0 and "sglang.launch_server" in dry.stdout
    monkeypatch.chdir(job)
    for name in REPORTS:
        assert default_params(name) == Path("params") / f"{name}.yaml"
        values = load_parameters(Path("notebooks") / f"{name}.ipynb", default_params(name))
        assert values.get("run_dir") in (None, str(job.resolve() / "outputs" / "job"))
    before = (job / "params" / "datasets.yaml").read_text()
    again = workbench("init", str(job))
    assert again.returncode == 2 and "nothing written" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert (job / "params" / "datasets.yaml").read_text() == before


def test_init_writes_the_examples_and_a_manifest_to_try_them(tmp_path: Path) -> None:
    job = tmp_path / "job"
    written = {p.relative_to(job) for p in init_job_folder(job)}
    examples = data_dir("examples")
    carried = {Path("examples") / p.relative_to(examples) for p in examples.rglob("*") if p.is_file()}
    assert carried and carried <= written and Path("params/datasets.try.yaml") in written
    for path in carried:
        assert (job / path).read_bytes() == (examples / path.relative_to("examples")).read_bytes()
    manifest = load_manifest(job / "params" / "datasets.try.yaml")
    assert [ds.name for ds in manifest.datasets] == ["B1_glaive", "B2_code", "B3_pretok",
                                                     "B4_tool_turns"]
    paths = [Path(ds.path) for ds in manifest.datasets] + [Path(manifest.tokenizer or "")]
    assert all(path.exists() and path.is_relative_to(job.resolve()) for path in paths)
    readme = (job / "README.md").read_text()
    assert readme.index("## Try it now on the simulator") < readme.index("## The real job")
    assert "--datasets params/datasets.try.yaml" in readme and "-p run_dir=outputs/try" in readme
    for f in job_files(job):  # nothing that only makes sense in the workbench's own checkout
        if f.path.suffix in (".md", ".yaml", ".ipynb"):
            text = f.data.decode()
            for word in ("make ", "scripts/", "src/", "tests/", ".demo.yaml", "kimi-k25.yaml", "outputs/demo"):
                assert word not in text, (f.path, word)
    again = workbench("init", str(job))
    assert again.returncode == 2 and "nothing written" in again.stderr


def test_latest_link_follows_the_newest_report(tmp_path: Path) -> None:
    first, second = tmp_path / "td-20260101-000000", tmp_path / "td-20260101-000100"
    first.mkdir()
    second.mkdir()
    link = link_latest(first, "td")
    assert link == tmp_path / "td-latest" and link.resolve() == first.resolve()
    link_latest(second, "td")
    assert (tmp_path / "td-latest").resolve() == second.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["td-20260101-000000", "td-20260101-000100", "td-latest"]


def test_precommit_strips_what_lab_saves_into_notebooks() -> None:
    import re

    import nbformat
    from nbstripout import strip_output

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (hook,) = [h for repo in config["repos"] for h in repo["hooks"] if h["id"] == "nbstripout"]
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        assert re.search(hook["files"], str(notebook.relative_to(ROOT)))
    nb = nbformat.read(ROOT / "notebooks" / "token_distribution.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for count, cell in enumerate(code, 1):  # what a Lab session leaves behind
        cell.execution_count = count
        cell.outputs = [nbformat.v4.new_output("display_data", {"text/html": "<script>" + "x" * 10**6})]
    stripped = strip_output(nb, keep_output=False, keep_count=False, keep_id=True)
    assert all(cell.outputs == [] and cell.execution_count is None for cell in stripped.cells
               if cell.cell_type == "code")
    assert any("parameters" in cell.metadata.get("tags", []) for cell in stripped.cells)
