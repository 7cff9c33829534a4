"""`workbench report NAME --every`: render only when the run grew, survive a failed rendering,
stop when the run is finished, prune with --keep. Time is injected: the loop's `sleep` is
where the test grows the run, so nothing waits for real intervals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import EXAMPLES, generate_run, workbench

from workbench.errors import ConfigError, ReportError
from workbench.report import index, provenance
from workbench.report.render import ReportResult, run_report
from workbench.report.schedule import Schedule, parse_interval, run_finished, watch_report
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.integration

RAW = "raw_responses.jsonl"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    """A finished simulator run of one dataset of 24 records."""
    return generate_run(tmp_path_factory.mktemp("schedule-run"), [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 24}], shared_sim)


class Growing:
    """A copy of the finished run holding only its first lines; `grow(n)` appends n more."""

    def __init__(self, full: Path, folder: Path, first: int) -> None:
        shutil.copytree(full, folder)
        self.out = folder
        self.lines = (full / "chat" / RAW).read_bytes().splitlines(keepends=True)
        self.written = first
        (folder / "chat" / RAW).write_bytes(b"".join(self.lines[:first]))

    def grow(self, count: int) -> None:
        more = self.lines[self.written:self.written + count]
        with (self.out / "chat" / RAW).open("ab") as file:
            file.write(b"".join(more))
        self.written += len(more)


class Clock:
    """Wall time that moves only when the loop sleeps; each sleep runs the next step."""

    def __init__(self, steps: list[Callable[[], None]]) -> None:
        self.now = 1_800_000_000.0
        self.steps = steps
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if not self.steps:
            raise AssertionError("the loop went on after the last step")
        self.steps.pop(0)()


def _params(folder: Path, run: Path) -> Path:
    path = folder / "td.yaml"
    path.write_text(json.dumps({"run_dir": str(run), "sample_size": 100}))
    return path


def test_intervals() -> None:
    assert parse_interval("2s") == 2 and parse_interval("30m") == 1800
    assert parse_interval("1h30m") == 5400 and parse_interval("1.5h") == 5400
    assert parse_interval("45") == 45
    for bad in ("", "0s", "-5", "10 minutes", "m", "5x", "1h 30m"):
        with pytest.raises(ConfigError, match="--every"):
            parse_interval(bad)


def test_renders_only_when_the_run_grew_and_stops_when_it_is_done(full_run: Path, tmp_path: Path) -> None:
    run = Growing(full_run, tmp_path / "run", first=10)
    out = tmp_path / "reports"
    assert not run_finished(run.out) and run_finished(full_run)
    clock = Clock([lambda: None, lambda: run.grow(6), lambda: None, lambda: run.grow(100)])
    said: list[str] = []
    schedule = Schedule("token_distribution", _params(tmp_path, run.out), {}, out, every=5.0, until="done")
    watch = watch_report(schedule, say=said.append, clock=clock, sleep=clock.sleep)

    assert watch.finished and watch.checks == 5 and not watch.failed
    assert clock.slept == [5.0] * 4 and not clock.steps  # stopped after the run was done
    done = index.renderings(out, "token_distribution")
    assert len(done) == 3 == len(watch.rendered)  # first check, after each growth; not in between
    assert [r.inputs_changed for r in reversed(done)] == [None, True, True]
    assert all(r.ok and r.cell_errors == 0 and r.run == str(run.out.resolve()) for r in done)
    unchanged = [line for line in said if line.startswith("inputs unchanged, next check at ")]
    assert len(unchanged) == 2, said
    assert said[-1] == f"run finished: {run.out.resolve()}"
    sizes = [next(e["bytes"] for e in provenance.read_manifest(r.folder)["inputs"] if e["path"].endswith(RAW))
             for r in reversed(done)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 3  # each rendering read a longer file
    assert (out / "index.html").is_file() and (out / "token_distribution-latest").resolve() == done[0].folder


def test_a_failed_rendering_does_not_end_the_loop(full_run: Path, tmp_path: Path) -> None:
    run = Growing(full_run, tmp_path / "run", first=12)
    out = tmp_path / "reports"
    calls: list[int] = []

    def flaky(schedule: Schedule) -> ReportResult:
        calls.append(1)
        if len(calls) == 1:
            raise ReportError("token_distribution: cell 3 (x = 1 / 0) raised ZeroDivisionError")
        return run_report(schedule.name, schedule.params_file, schedule.overrides, schedule.out_dir)

    params = _params(tmp_path, run.out)
    good = params.read_text()

    def restore_and_grow() -> None:
        params.write_text(good)
        run.grow(100)

    clock = Clock([lambda: None, lambda: params.write_text('{"bins": "many"}'), restore_and_grow])
    said: list[str] = []
    schedule = Schedule("token_distribution", params, {}, out, every=2.0, until="done", keep=1)
    watch = watch_report(schedule, say=said.append, clock=clock, sleep=clock.sleep, render=flaky)
    # check 1 fails; check 2 tries again (no finished rendering yet) and renders; the parameter
    # file is edited wrong: check 3 fails before rendering; fixed and the run grown to its end,
    # check 4 renders and stops
    assert len(calls) == 3 and len(watch.rendered) == 2 and len(watch.failed) == 2
    assert any(line.startswith("rendering failed: token_distribution: cell 3") for line in said)
    assert any(line.startswith("check failed: ") and "bins" in line for line in said), said
    assert said[-1] == f"run finished: {run.out.resolve()}"
    kept = index.renderings(out, "token_distribution")
    assert len(kept) == 1 and kept[0].folder == watch.rendered[-1].html_path.parent  # --keep 1
    assert any(line.startswith("removed ") for line in said)


def test_until_done_needs_a_run(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    schedule = Schedule("throughput_tuning", None, {"sweep_dir": str(sweep)}, tmp_path / "r",
                        every=1.0, until="done")
    with pytest.raises(ConfigError, match="--until"):
        watch_report(schedule, say=print, sleep=lambda s: None)


def test_keep_never_removes_the_latest(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    folders = []
    for k in range(4):
        folder = out / f"td-2026010{k + 1}-000000"
        folder.mkdir(parents=True)
        (folder / provenance.MANIFEST).write_text(json.dumps(
            {"report": "td", "started": 1000.0 + k, "finished": 1001.0 + k, "inputs": []}))
        folders.append(folder)
    (out / "td-latest").symlink_to(folders[0].name)  # the oldest, say after a manual relink
    removed = index.prune(out, "td", 2)
    assert sorted(removed) == [folders[1]]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [folders[0].name, folders[2].name, folders[3].name, "td-latest"])


def test_cli_every_prints_and_ctrl_c_exits_130(full_run: Path, tmp_path: Path) -> None:
    """The real command on a finished run: one rendering, then `inputs unchanged` lines
    every second, until SIGINT ends it with 130 and no traceback."""
    out = tmp_path / "reports"
    argv = [sys.executable, "-m", "workbench", "report", "token_distribution", "-p", f"run_dir={full_run}",
            "-p", "sample_size=100", "--out", str(out), "--every", "1s"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        while sum("inputs unchanged, next check at" in line for line in lines) < 2:
            line = process.stdout.readline()
            assert line, (lines, process.stderr.read() if process.stderr else "")
            lines.append(line)
        os.killpg(process.pid, signal.SIGINT)
        _, errors = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, errors
    assert "Traceback" not in errors and "stopped (Ctrl-C)" in errors
    assert any(line.split("] ", 1)[-1].startswith("rendered ") for line in lines), lines
    assert len(index.renderings(out, "token_distribution")) == 1


def test_cli_rejects_until_without_every(tmp_path: Path) -> None:
    done = workbench("report", "token_distribution", "--until", "done", "--out", str(tmp_path))
    assert done.returncode == 2 and "--until: goes with --every" in done.stderr
    bad = workbench("report", "token_distribution", "--every", "soon")
    assert bad.returncode == 2 and "--every" in bad.stderr
