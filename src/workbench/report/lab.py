"""``workbench explore RUN``: JupyterLab on the run's own copy of the explore notebook.

The copy is ``RUN/explore.ipynb``, made from the package's ``explore`` notebook when missing
(never overwritten: it is the user's from then on; the package's notebook is only read). Its
parameters cell points at the run (``run_dir = "."``) and at the tokenizer named in the
run's ``run.json``, when one exists. JupyterLab runs as a process group on 127.0.0.1 with a
fresh token, its log in ``RUN/explore-lab.log``; the URL printed opens the notebook directly.

Scheduling reports from Lab. With ``jupyter-scheduler`` installed (the notebooks extra), the
Lab started here lets a report notebook be scheduled ("Create a notebook job", once or on a
cron schedule) with its parameters (run_dir, sweep_dir, tokenizer, ...). A scheduled job is
executed as ``workbench report`` executes it (:class:`ReportExecutionManager`): the notebook
as it is in the folder, ``params/NAME.yaml`` of the Lab's folder when present, the job's
parameters on top (each read as a YAML scalar, as ``-p`` reads it: ``outputs/try`` and
``"outputs/try"`` are the same string; relative paths are taken from the Lab's folder). The
rendering lands beside the others, with its provenance, the ``NAME-latest`` link and a row
in ``index.html``; the job's own outputs (the executed notebook, the HTML) are copies of it.

Where Lab is rooted, and where the scheduled renderings go (:func:`lab_layout`):

    run inside a job folder        the job folder (``workbench init``: ``notebooks/`` and
    (an ancestor holding           ``params/``), whose ``notebooks/`` are the report notebooks;
    notebooks/ and params/)        renderings in ``JOB/outputs/reports`` (where ``workbench
                                   report`` writes when run from there)
    any other run                  the run folder; copies of the report notebooks are made in
                                   ``RUN/notebooks/`` (their ``run_dir`` set to ``..``, never
                                   overwritten); renderings in ``RUN/reports``
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import ReportError
from workbench.report.parameters import DEMO_REPORTS, notebook_path, parse_overrides, resolve_paths
from workbench.report.render import run_report
from workbench.rundir.run import RunInfo, load_run
from workbench.server.launch import ServerProcess, find_free_port

__all__ = ["NOTEBOOK", "REPORTS_ENV", "Lab", "LabLayout", "explorer_notebook",
           "job_parameters", "lab_layout", "report_notebooks", "scheduler_installed", "start_lab"]

NOTEBOOK = "explore.ipynb"
LOG = "explore-lab.log"
REPORTS_ENV = "WORKBENCH_REPORTS_DIR"  # where Lab's scheduled reports are written
SCHEDULED_REPORTS = (*DEMO_REPORTS, "throughput_tuning")


def _run_tokenizer(run: RunInfo) -> str | None:
    """The first dataset tokenizer of run.json that exists on this machine."""
    for ds in run.datasets:
        path = ds.settings.get("tokenizer")
        if isinstance(path, str) and (run.out / path).is_dir():
            return str((run.out / path).resolve())
    return None


def set_parameters(source: str, values: dict[str, Any]) -> str:
    """A parameters cell with the literal of each named assignment replaced (the comment and
    annotation kept); names the cell does not assign are left out."""
    lines = source.splitlines()
    for name, value in values.items():
        pattern = re.compile(rf"^({re.escape(name)}\s*(?::[^=]+)?=\s*)(.*?)(\s+#.*)?$")
        for i, line in enumerate(lines):
            match = pattern.match(line)
            if match:
                literal = json.dumps(value) if isinstance(value, str) else repr(value)
                lines[i] = f"{match.group(1)}{literal}{match.group(3) or ''}"
                break
    return "\n".join(lines)


def explorer_notebook(run_dir: str | Path, source: str | Path | None = None) -> tuple[Path, bool]:
    """RUN/explore.ipynb, created from `source` (the package's explore notebook) when
    missing; returns (path, created). InputError when run_dir is not a run."""
    import nbformat

    run = load_run(run_dir)
    target = run.out / NOTEBOOK
    if target.exists():
        return target, False
    nb = nbformat.read(Path(source) if source else notebook_path("explore"), as_version=4)
    values = {"run_dir": ".", "tokenizer": _run_tokenizer(run)}
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = set_parameters(cell.source, values)
    nbformat.write(nb, target)
    return target, True


def _job_folder(path: Path) -> Path | None:
    """The nearest folder at or above path made like ``workbench init``'s (notebooks/ with
    a notebook in it, and params/), or None."""
    for folder in (path, *path.parents):
        if (folder / "params").is_dir() and any((folder / "notebooks").glob("*.ipynb")):
            return folder
    return None


@dataclass(frozen=True, slots=True)
class LabLayout:
    """Where Lab is rooted and where its scheduled reports are written."""

    root: Path
    reports: Path


def lab_layout(folder: str | Path) -> LabLayout:
    """The job folder holding `folder` (its outputs/reports), else `folder` (its reports/)."""
    path = Path(folder).resolve()
    job = _job_folder(path)
    if job is not None:
        return LabLayout(job, job / "outputs" / "reports")
    return LabLayout(path, path / "reports")


def report_notebooks(run_dir: str | Path, names: tuple[str, ...] = SCHEDULED_REPORTS) -> list[Path]:
    """Copies of the package's report notebooks in RUN/notebooks/, their ``run_dir`` set to
    the run (``..``); those that exist are left alone. The copies made."""
    import nbformat

    folder = Path(run_dir) / "notebooks"
    made = []
    for name in names:
        target = folder / f"{name}.ipynb"
        if target.exists():
            continue
        nb = nbformat.read(notebook_path(name), as_version=4)
        for cell in nb.cells:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                cell.source = set_parameters(cell.source, {"run_dir": ".."})
        folder.mkdir(exist_ok=True)
        nbformat.write(nb, target)
        made.append(target)
    return made


def scheduler_installed() -> bool:
    """Whether jupyter-scheduler (JupyterLab's job scheduler) is importable."""
    return importlib.util.find_spec("jupyter_scheduler") is not None


@dataclass
class Lab:
    """A running JupyterLab: its process group, URL and token."""

    server: ServerProcess
    url: str
    token: str

    def wait(self) -> int:
        """Block until JupyterLab exits; its exit code."""
        assert self.server.process is not None
        return self.server.process.wait()

    def stop(self) -> None:
        self.server.stop()


def start_lab(folder: str | Path, notebook: str = NOTEBOOK, *, port: int | None = None,
              timeout: float = 120.0) -> Lab:
    """Start JupyterLab on `folder` (the job folder holding it, when there is one: see
    :func:`lab_layout`), with jupyter-scheduler's jobs executed by
    :class:`ReportExecutionManager` when it is installed; the URL opens `notebook` (in
    `folder`). Waits until Lab answers; LaunchError otherwise."""
    given = Path(folder).resolve()
    layout = lab_layout(given)
    if layout.root == given and scheduler_installed():
        report_notebooks(given)
    port = port or find_free_port()
    token = secrets.token_hex(24)
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.root_dir={layout.root}",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}"]
    if scheduler_installed():
        argv.append(f"--Scheduler.execution_manager_class={__name__}.ReportExecutionManager")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # containers often run as root; Lab refuses without it
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess(argv, url=base, log_path=given / LOG, health_path=f"/api/status?token={token}",
                           env={REPORTS_ENV: str(layout.reports)})
    server.start()
    try:
        server.wait_ready(timeout=timeout, interval=0.25)
    except BaseException:
        server.stop()
        raise
    path = (given / notebook).relative_to(layout.root).as_posix()
    return Lab(server, f"{base}/lab/tree/{path}?token={token}", token)


# --- jupyter-scheduler ------------------------------------------------------------------------


def job_parameters(given: Mapping[str, str], root: Path) -> dict[str, Any]:
    """A scheduled job's parameters (strings, as Lab's form gives them) read as ``-p`` reads
    them, the relative paths taken from `root`."""
    values = parse_overrides([f"{key}={value}" for key, value in given.items()])
    return resolve_paths(values, root)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _scheduled_notebook(root: Path, staged: Path) -> Path:
    """The notebook a job was made from: the file of that name under `root` (notebooks/
    first) with the staged copy's bytes, else the first of that name, else the copy."""
    found = [p for p in (root / "notebooks" / staged.name, root / staged.name) if p.is_file()]
    found += sorted(p for p in root.rglob(staged.name) if p.is_file() and p not in found
                    and ".ipynb_checkpoints" not in p.parts)
    same = [p for p in found if _digest(p) == _digest(staged)]
    return (same or found or [staged])[0]


def _render_job(root: Path, staged: Path, given: Mapping[str, str], reports: Path) -> Any:
    """Render the scheduled notebook as ``workbench report`` would (a ReportResult)."""
    notebook = _scheduled_notebook(root, staged)
    name = notebook.stem
    params = root / "params" / f"{name}.yaml"
    return run_report(name, params if params.is_file() else None, job_parameters(given, root),
                      reports, notebooks=notebook.parent)


def _staged_outputs(staging: Mapping[str, str], formats: list[str], executed: Path | None,
                    html: Path | None) -> None:
    """The job's own outputs (what Lab's job list offers): copies of the rendering's."""
    sources = {"ipynb": executed, "html": html}
    for kind in formats:
        source = sources.get(kind)
        if source is not None and source.is_file() and kind in staging:
            shutil.copyfile(source, staging[kind])


@functools.cache
def _execution_manager_class() -> type:
    from jupyter_scheduler.executors import DefaultExecutionManager  # in Lab's processes only

    class ReportExecutionManager(DefaultExecutionManager):  # type: ignore[misc]
        """jupyter-scheduler's jobs executed as workbench reports (see the module docstring)."""

        def execute(self) -> None:
            job = self.model
            root = Path(self.root_dir).resolve()
            reports = Path(os.environ.get(REPORTS_ENV) or lab_layout(root).reports)
            formats = list(job.output_formats or [])
            try:
                result = _render_job(root, Path(self.staging_paths["input"]), job.parameters or {},
                                     reports)
            except ReportError as exc:
                executed = re.search(r"executed notebook: (.+)\)$", str(exc))
                _staged_outputs(self.staging_paths, formats,
                                Path(executed[1]) if executed else None, None)
                raise
            _staged_outputs(self.staging_paths, formats, result.notebook_path, result.html_path)

    ReportExecutionManager.__module__ = __name__
    ReportExecutionManager.__qualname__ = "ReportExecutionManager"
    return ReportExecutionManager


def __getattr__(name: str) -> Any:
    """``ReportExecutionManager``, made on first use: jupyter-scheduler is imported only
    by the Lab processes that run its jobs."""
    if name == "ReportExecutionManager":
        return _execution_manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
