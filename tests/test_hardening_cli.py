"""The command when the disk says no, when a flag is mistyped, and when it stops as meant:
one line naming the file the user asked for and exit 74 (never a traceback, never a temp
file's name); a usage line pointing at the verb's own --help; no abbreviated options; Ctrl-C
as explore's normal end; no GPU-hours for a CPU server."""

from __future__ import annotations

import argparse
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import make_record, one_error_line, workbench, write_records

from workbench.cli import build_parser
from workbench.cli.exits import EXIT_STORAGE
from workbench.generate.progress import RunSummary
from workbench.generate.views import cost_line
from workbench.rundir.files import temp_path


def plant_run(out: Path) -> Path:
    """A finished run of one dataset of two records, written directly."""
    write_records(out / "ds", [make_record(i, [300, 301]) for i in range(2)])
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": {"ds": {"input": "input_ids"}}}))
    return out


def _raise(code: int) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code), str(args[0]) if args else None)
    return fail


# --- files that cannot be written: one line, the file asked for, exit 74 ----------------------


def test_init_under_a_file_is_one_storage_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    done = workbench("init", str(tmp_path / "file" / "sub" / "job"))
    line = one_error_line(done.stderr)
    assert done.returncode == EXIT_STORAGE
    assert f"{tmp_path / 'file' / 'sub' / 'job'}: cannot write: Not a directory" in line


def test_init_on_a_full_disk_says_the_free_space(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "write_bytes", _raise(errno.ENOSPC))
    done = workbench("init", str(tmp_path / "job"))
    line = one_error_line(done.stderr)
    assert done.returncode == EXIT_STORAGE
    assert str(tmp_path / "job") in line and "No space left on device (" in line and "free)" in line


def test_export_whose_temp_file_cannot_be_made_names_the_target(tmp_path: Path) -> None:
    run = plant_run(tmp_path / "run")
    target = tmp_path / "out.jsonl"
    temp_path(target).mkdir()  # the temp file cannot be opened: as a read-only folder would say
    done = workbench("export", str(run), "--to", str(target))
    line = one_error_line(done.stderr)
    assert done.returncode == EXIT_STORAGE
    assert line.startswith(f"workbench: error: {target}: cannot write: ") and ".tmp" not in line


def test_export_on_a_read_only_file_system_names_the_target(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run = plant_run(tmp_path / "run")
    target = tmp_path / "out.jsonl"
    monkeypatch.setattr(os, "replace", _raise(errno.EROFS))
    done = workbench("export", str(run), "--to", str(target))
    line = one_error_line(done.stderr)
    assert done.returncode == EXIT_STORAGE
    assert f"{target}: cannot write: Read-only file system" in line and ".tmp" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temp file left


# --- usage mistakes -----------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "verb"), [
    (["generate", "--datasets", "d.yaml", "--out", "o", "--server", "http://127.0.0.1:9",
      "--bogus"], "generate"),
    (["export", "OUT", "--to", "x.jsonl", "--bogus"], "export"),
    (["stats", "OUT", "--bogus"], "stats"),
])
def test_a_mistyped_flag_points_at_the_verbs_help(argv: list[str], verb: str) -> None:
    done = workbench(*argv)
    line = one_error_line(done.stderr)
    assert done.returncode == 2
    assert line.endswith(f"unrecognized arguments: --bogus (see: workbench {verb} --help)")


def test_an_abbreviated_option_is_not_taken_for_the_whole(tmp_path: Path) -> None:
    done = workbench("generate", "--dataset", str(tmp_path / "nowhere.yaml"), "--out",
                     str(tmp_path / "out"), "--server", "http://127.0.0.1:9")
    line = one_error_line(done.stderr)
    assert done.returncode == 2 and "(see: workbench generate --help)" in line
    assert "nowhere.yaml" not in line  # not read as --datasets


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_parser_takes_abbreviations() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 10 and not [p.prog for p in parsers if p.allow_abbrev]


# --- noise ----------------------------------------------------------------------------------------


class _InterruptedLab:
    url = "http://127.0.0.1:1/lab?token=x"
    stopped = False

    def wait(self) -> int:
        raise KeyboardInterrupt

    def stop(self) -> None:
        _InterruptedLab.stopped = True


def test_ctrl_c_is_explores_normal_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.report import lab

    monkeypatch.setattr(lab, "explorer_notebook", lambda out: (tmp_path / "explore.ipynb", False))
    monkeypatch.setattr(lab, "start_lab", lambda *args, **kwargs: _InterruptedLab())
    done = workbench("explore", str(tmp_path), "--no-browser")
    assert done.returncode == 0, done.stderr
    assert "explore stopped" in done.stderr and "error" not in done.stderr
    assert _InterruptedLab.stopped


def test_a_cpu_server_costs_hours_not_gpu_hours() -> None:
    summary = RunSummary({}, interrupted=False, wall_seconds=7200.0, retries=0, gpus=0)
    line = cost_line(summary)
    assert line == "cost: 2.0h on CPU this session; nothing left" and "GPU" not in line
    args = build_parser().parse_args(["generate", "--datasets", "d.yaml", "--out", "o",
                                      "--server", "http://127.0.0.1:9", "--gpus", "0"])
    assert args.gpus == 0


@pytest.mark.anyio
async def test_a_cpu_server_costs_cpu_hours_not_gpu_hours() -> None:
    from workbench.generate.session import serving_gpus

    assert await serving_gpus(None, {"device": "cpu", "tp_size": 1}) == 0  # type: ignore[arg-type]
    assert await serving_gpus(None, {"device": "cuda", "tp_size": 2}) == 2  # type: ignore[arg-type]
