"""`workbench report` where its files go and when they cannot be written: beside the run it
reads when no --out is given (one index per run, whatever the working folder), one line and
exit 74 for a folder it cannot write, and no SIGINT into a report's kernel on its way out
(the kernel's `KeyboardInterrupt caught in kernel` line)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import one_error_line, workbench

from workbench.cli.exits import EXIT_STORAGE
from workbench.errors import StorageError
from workbench.report import index, render


def _run(folder: Path) -> Path:
    """A run folder `workbench report` accepts (run.json, no dataset yet)."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    return folder


def test_an_out_under_a_file_is_one_storage_line(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub" / "out"
    done = workbench("report", "token_distribution", "-p", f"run_dir={run}", "--out", str(out))
    line = one_error_line(done.stderr, ignore="parameters:")
    assert done.returncode == EXIT_STORAGE
    assert f"{out}: cannot write: Not a directory" in line


def test_an_index_on_a_full_disk_names_it_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(StorageError, match=r"index\.html: cannot write: No space left on device"):
        index.write_index(tmp_path)
    assert list(tmp_path.iterdir()) == []
    done = workbench("report", "--index", str(tmp_path))
    line = one_error_line(done.stderr, ignore="parameters:")
    assert done.returncode == EXIT_STORAGE
    assert line.startswith(f"workbench: error: {tmp_path / 'index.html'}: cannot write: No space")
    assert "free)" in line


def test_without_out_the_report_goes_beside_its_run(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tmp_path / "runs" / "job1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seen: list[Path] = []

    def fake_run_report(name: str, params: Any, overrides: Any, out_dir: Path) -> Any:
        seen.append(Path(out_dir))
        raise render.ReportError("stopped here: no kernel in this test")

    monkeypatch.setattr(render, "run_report", fake_run_report)
    done = workbench("report", "token_distribution", "-p", f"run_dir={run}", cwd=elsewhere)
    assert done.returncode == 1 and "stopped here" in done.stderr
    assert seen == [run / "reports"]
    assert f"reports folder: {run / 'reports'}" in done.stderr
    assert list(elsewhere.iterdir()) == []  # no ./outputs/reports of its own


def test_a_report_kernel_is_not_interrupted_on_its_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.manager import AsyncKernelManager

    interrupts: list[bool] = []

    async def interrupt(self: Any) -> None:
        interrupts.append(self.shutting_down)

    monkeypatch.setattr(AsyncKernelManager, "_async_interrupt_kernel", interrupt)
    manager = render._kernel_manager_class()()
    manager.shutting_down = True
    asyncio.run(manager._async_interrupt_kernel())
    manager.shutting_down = False  # a cell past its timeout is still interrupted
    asyncio.run(manager._async_interrupt_kernel())
    assert interrupts == [False]
