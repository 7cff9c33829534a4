"""The package as users get it: the wheel built from a copy of the checkout, installed
(not editable) into a fresh venv, run from an empty folder outside the checkout.

The venv reaches the test environment's installed dependencies through a .pth line (and
their Jupyter data files through JUPYTER_PATH), so the check needs no network beyond the
build backend; the workbench itself comes only from
the wheel (PYTHONPATH is cleared and the test environment's editable hook is not run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT

_PATTERNS = shutil.ignore_patterns(".git", ".venv*", "outputs", "build", "dist", "*.egg-info",
                                   "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache",
                                   ".mypy_cache", ".numba-cache")


def _ignored(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: caches, builds, every virtual environment (the peers' own hold
    gigabytes) and the benchmarks' generated data."""
    ignored = set(_PATTERNS(folder, names))
    return ignored | {"data"} if Path(folder) == ROOT / "bench" else ignored


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build_wheel(tmp_path: Path, env: dict[str, str]) -> Path:
    source = tmp_path / "clone"
    shutil.copytree(ROOT, source, ignore=_ignored)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
         "-w", str(tmp_path / "dist"), str(source)], tmp_path, env)
    (wheel,) = (tmp_path / "dist").glob("workbench-*.whl")
    return wheel


def fresh_venv(tmp_path: Path, wheel: Path, env: dict[str, str]) -> Path:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  tmp_path, env).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "test-dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", "-q", str(wheel)], tmp_path, env)
    return venv


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_wheel_runs_demo_and_report_from_an_empty_folder(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # the data files (nbconvert's templates) that installing the dependencies into the venv
    # would have put under its share/jupyter
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    venv = fresh_venv(tmp_path, build_wheel(tmp_path, env), env)
    empty = tmp_path / "empty"
    empty.mkdir()
    where = run([str(venv / "bin" / "python"), "-c", "import workbench; print(workbench.__file__)"], empty, env)
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the wheel's copy, not the checkout's
    workbench = str(venv / "bin" / "workbench")

    demo = run([workbench, "demo"], empty, env, timeout=1500)
    assert (empty / "outputs" / "demo" / "run.json").is_file(), demo.stdout[-2000:]
    assert (empty / "outputs" / "demo" / "reports" / "token_distribution-latest" / "token_distribution.html").is_file()

    report = run([workbench, "report", "format_validation"], empty, env)
    html = Path(report.stdout.strip().splitlines()[-1])
    assert html.is_file() and html.is_relative_to(empty / "outputs" / "demo" / "reports")  # the run's
    assert "parameters: " in report.stderr and str(venv) in report.stderr  # the packaged demo parameters

    init = run([workbench, "init", "job"], empty, env)
    assert (empty / "job" / "notebooks" / "token_distribution.ipynb").is_file(), init.stdout
