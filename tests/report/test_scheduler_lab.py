"""Reports scheduled from JupyterLab with jupyter-scheduler, for real.

`workbench explore RUN` starts Lab with the scheduler extension; in Chromium the report
notebook shows the extension's "Create a notebook job" button, whose form opens on it. A job is
then created through the extension's REST API (``POST /scheduler/jobs``, as the form does)
with parameters, and runs once; the rendering is found beside the others (RUN/reports),
with the given parameters, its provenance and a row in index.html, and the job's own outputs
are copies of it. A second Lab on a `workbench init` job folder schedules the job folder's
notebook on a run inside it; its rendering lands in JOB/outputs/reports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jupyter_scheduler  # noqa: F401  (the test extra installs it: a missing one fails, never skips)
import pytest
import yaml
from browser import chromium_path, open_page, stop_like_ctrl_c
from conftest import EXAMPLES, generate_run, wait_until
from playwright import sync_api as playwright  # the test extra installs it

from workbench.jobfolder import init_job_folder
from workbench.report import index
from workbench.report.lab import job_parameters, lab_layout, start_lab
from workbench.server.launch import ServerProcess, find_free_port

pytestmark = pytest.mark.integration

TIMEOUT_MS = 240_000


def _lab_env(folder: Path) -> dict[str, str]:
    """Jupyter's folders (the scheduler's database and staging area among them) in `folder`."""
    return {"JUPYTER_CONFIG_DIR": str(folder / "config"), "JUPYTER_DATA_DIR": str(folder / "data"),
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(folder / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces"),
            "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    return generate_run(tmp_path_factory.mktemp("scheduled-run"), [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 20}], shared_sim)


@pytest.fixture
def explore_lab(run: Path, tmp_path: Path) -> Iterator[str]:
    """`workbench explore RUN` in its own process group; its URL."""
    env = {**os.environ, **_lab_env(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "workbench", "explore", str(run), "--no-browser", "--port", str(find_free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
        url = lines[2].strip()
        assert url.startswith("http://127.0.0.1:") and "token=" in url, lines
        yield url
    finally:
        stop_like_ctrl_c(process)


def _api(url: str) -> tuple[str, dict[str, str]]:
    base, token = url.split("/lab/")[0], url.split("token=")[1]
    return base, {"Authorization": f"token {token}"}


def _run_job(url: str, notebook: str, parameters: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    """Create a job through jupyter-scheduler's REST API and wait until it ended."""
    base, headers = _api(url)
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        environments = client.get("/scheduler/runtime_environments").raise_for_status().json()
        created = client.post("/scheduler/jobs", json={
            "name": "scheduled report", "input_uri": notebook, "parameters": parameters,
            "runtime_environment_name": environments[0]["name"], "output_formats": ["ipynb", "html"],
        }).raise_for_status().json()
        job: dict[str, Any] = {}

        def ended() -> bool:
            job.update(client.get(f"/scheduler/jobs/{created['job_id']}").raise_for_status().json())
            return job["status"] in ("COMPLETED", "FAILED")  # STOPPED: also its state before it starts

        wait_until(ended, timeout, lambda: f"the job to end (last seen: {job})", interval=0.5)
        return job


def _staged(job_id: str, data_dir: Path, kind: str) -> Path:
    found = list((data_dir / "scheduler_staging_area" / job_id).glob(f"*.{kind}"))
    assert len(found) == 1, found
    return found[0]


def test_the_scheduler_in_lab_renders_a_report_with_the_job_parameters(
        run: Path, explore_lab: str, tmp_path: Path) -> None:
    url = explore_lab
    notebook_url = url.replace("/lab/tree/explore.ipynb", "/lab/tree/notebooks/token_distribution.ipynb")
    assert (run / "notebooks" / "token_distribution.ipynb").is_file()  # made for scheduling
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(notebook_url)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            button = page.locator('[data-command="scheduling:create-from-notebook"]').first
            button.click()  # the extension's form, on this notebook
            page.get_by_text("Create Job").first.wait_for()
            named = "input[value='token_distribution.ipynb'], input[value='token_distribution']"
            page.locator(named).first.wait_for()  # the form fills in after its title shows
        except Exception:
            page.screenshot(path=str(tmp_path / "scheduler-lab-failure.png"), full_page=True)
            raise
        finally:
            browser.close()

    job = _run_job(url, "notebooks/token_distribution.ipynb", {"sample_size": "123", "bins": "17"})
    assert job["status"] == "COMPLETED", job.get("status_message")
    done = index.renderings(run / "reports", "token_distribution")
    assert len(done) == 1 and done[0].ok and done[0].run == str(run.resolve())
    params = yaml.safe_load((done[0].folder / "params.yaml").read_text())
    assert params["sample_size"] == 123 and params["bins"] == 17 and params["run_dir"] == str(run.resolve())
    assert (run / "reports" / "token_distribution-latest").resolve() == done[0].folder
    page = open_page(run / "reports" / "index.html",
                     evaluate={"links": "[...document.querySelectorAll('a')].map(a => a.href)"})
    assert len(page.values["links"]) == 2 and not page.errors
    staged_html = _staged(job["job_id"], tmp_path / "data", "html")  # the job's own output
    assert staged_html.read_bytes() == (done[0].folder / "token_distribution.html").read_bytes()


def test_a_failed_scheduled_job_is_listed_failed(run: Path, explore_lab: str) -> None:
    before = len(index.renderings(run / "reports"))
    job = _run_job(explore_lab, "notebooks/token_distribution.ipynb", {"bins": "not a number"})
    assert job["status"] == "FAILED" and "bins" in (job.get("status_message") or ""), job
    assert len(index.renderings(run / "reports")) == before  # bad parameters: nothing rendered


def test_a_job_folder_lab_schedules_its_own_notebooks(run: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    job_folder = tmp_path / "job"
    init_job_folder(job_folder)
    shutil.copytree(run, job_folder / "outputs" / "try")
    layout = lab_layout(job_folder / "outputs" / "try")
    assert layout.root == job_folder.resolve() and layout.reports == job_folder.resolve() / "outputs" / "reports"
    for key, value in _lab_env(tmp_path / "jupyter").items():
        monkeypatch.setenv(key, value)
    lab = start_lab(job_folder / "outputs" / "try", port=find_free_port())
    try:
        assert "/lab/tree/outputs/try/explore.ipynb?token=" in lab.url  # rooted at the job folder
        job = _run_job(lab.url, "notebooks/token_distribution.ipynb",
                       {"run_dir": "outputs/try", "sample_size": "50"})
    finally:
        lab.stop()
    assert job["status"] == "COMPLETED", job.get("status_message")
    done = index.renderings(layout.reports, "token_distribution")
    assert len(done) == 1 and done[0].run == str((job_folder / "outputs" / "try").resolve())
    assert (layout.reports / "index.html").is_file()


def test_job_parameters_read_like_dash_p(tmp_path: Path) -> None:
    values = job_parameters({"run_dir": "outputs/try", "tokenizer": '"/abs/tok"', "bins": "20",
                             "log_axis": "true", "model_profile": "None"}, tmp_path)
    assert values == {"run_dir": str(tmp_path / "outputs" / "try"), "tokenizer": "/abs/tok", "bins": 20,
                      "log_axis": True, "model_profile": None}


def test_a_job_definition_on_a_schedule_renders_on_its_own(run: Path, explore_lab: str) -> None:
    """A job definition with a cron schedule (every minute) made through the REST API: its
    first job runs without being asked, and its rendering carries the definition's parameters."""
    base, headers = _api(explore_lab)
    before = {r.folder for r in index.renderings(run / "reports")}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        environments = client.get("/scheduler/runtime_environments").raise_for_status().json()
        created = client.post("/scheduler/job_definitions", json={
            "name": "hourly token distribution", "input_uri": "notebooks/token_distribution.ipynb",
            "parameters": {"sample_size": "77"}, "schedule": "* * * * *", "timezone": "UTC",
            "runtime_environment_name": environments[0]["name"], "output_formats": ["html"],
        }).raise_for_status().json()
        definition = created["job_definition_id"]
        jobs: list[dict[str, Any]] = []

        def one_ended() -> bool:
            jobs[:] = client.get("/scheduler/jobs", params={"job_definition_id": definition}
                                 ).raise_for_status().json()["jobs"]
            return any(job["status"] in ("COMPLETED", "FAILED") for job in jobs)

        try:
            wait_until(one_ended, 240, lambda: f"a job of the definition to end (seen: {jobs})", interval=1)
        finally:
            client.patch(f"/scheduler/job_definitions/{definition}", json={"active": False})
    assert next(job["status"] for job in jobs if job["status"] in ("COMPLETED", "FAILED")) == "COMPLETED", [job.get("status_message") for job in jobs]
    new = [r for r in index.renderings(run / "reports") if r.folder not in before]
    assert len(new) >= 1 and all(r.ok for r in new)
    params = yaml.safe_load((new[-1].folder / "params.yaml").read_text())
    assert params["sample_size"] == 77 and params["run_dir"] == str(run.resolve())
