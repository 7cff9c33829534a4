"""``workbench explore RUN``: JupyterLab on the run's own copy of the explore notebook.

The copy is ``RUN/explore.ipynb``, made from the package's ``explore`` notebook when missing
(never overwritten: it is the user's from then on; the package's notebook is only read). Its
parameters cell points at the run (``run_dir = "."``) and at the tokenizer named in the
run's ``run.json``, when one exists. JupyterLab runs as a process group on 127.0.0.1 with a
fresh token, rooted at the run folder, its log in ``RUN/explore-lab.log``; the URL printed
opens the notebook directly.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.report.parameters import notebook_path
from workbench.rundir.run import RunInfo, load_run
from workbench.server.launch import ServerProcess, find_free_port

__all__ = ["NOTEBOOK", "Lab", "explorer_notebook", "start_lab"]

NOTEBOOK = "explore.ipynb"
LOG = "explore-lab.log"


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
    """Start JupyterLab rooted at `folder`, wait until it answers; LaunchError otherwise."""
    root = Path(folder).resolve()
    port = port or find_free_port()
    token = secrets.token_hex(24)
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.root_dir={root}",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # containers often run as root; Lab refuses without it
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess(argv, url=base, log_path=root / LOG, health_path=f"/api/status?token={token}")
    server.start()
    try:
        server.wait_ready(timeout=timeout, interval=0.25)
    except BaseException:
        server.stop()
        raise
    return Lab(server, f"{base}/lab/tree/{notebook}?token={token}", token)
