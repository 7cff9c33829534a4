"""What `workbench generate` says: bars readable at 80 columns, the resume line first, the
stop line with the dropped requests and the command that resumes, and exit codes that
scripts can trust (1 when prompts failed after all their attempts)."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import EXAMPLES, wait_until, workbench, write_manifest
from rich.console import Console

from workbench.cli.generate import generate_exit_code, resume_command
from workbench.generate.progress import DatasetProgress, RunSummary
from workbench.generate.views import RichView, cost_line, resume_line, summary_lines
from workbench.server.launch import ServerProcess


def progress(name: str, target: int, done: int, **more: int) -> DatasetProgress:
    p = DatasetProgress(name=name, target=target, done=done, **more)
    p.started = time.perf_counter() - 100.0
    return p


def fake_runner(*items: DatasetProgress) -> SimpleNamespace:
    return SimpleNamespace(progress=lambda: list(items))


@pytest.mark.parametrize("width", [80, 160])
def test_bars_stay_readable(width: int) -> None:
    console = Console(file=io.StringIO(), width=width, height=width * 3 // 10, force_terminal=True,
                      color_system=None)  # 80x24, 160x48
    view = RichView(Path("out"), console)
    items = [progress("B1_glaive", 10000, 201, done_this_run=1, tokens_this_run=23800, errors=3),
             progress("B3_pretok", 300, 300, done_this_run=300, tokens_this_run=600)]
    items[1].finished = time.perf_counter()
    now = time.time()  # the records' times: 23,800 tokens in the 100 s since the first; 598 in 100 s
    items[0].times.extend([now - 100, now], [0, 23800])
    items[1].times.extend([now - 100 + i * 100 / 299 for i in range(300)], [2] * 300)
    view.start(fake_runner(*items))
    view.stop()
    console.print(view.progress.get_renderable())
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", console.file.getvalue())  # type: ignore[attr-defined]
    assert text.splitlines()[0] == "resuming out: 501/10,300 done, 9,799 to send"
    line = next(line for line in text.splitlines()[1:] if line.startswith("B1_glaive"))
    assert "…" not in text and len(line) <= width
    assert re.search(r"201/10000 +3 err 238 tok/s ETA \d", line), line
    bar = re.search(r"B1_glaive (.+) 201/10000", line)
    assert bar is not None and len(bar.group(1)) >= 10  # a bar, not three characters
    assert re.search(r"B3_pretok .* 300/300 +0 err 6 tok/s done", text)


def test_no_resume_line_on_a_fresh_run() -> None:
    assert resume_line(Path("o"), [progress("a", 10, 0)]) is None
    assert resume_line(Path("o"), [progress("a", 300, 208), progress("b", 500, 0)]) == (
        "resuming o: 208/800 done, 592 to send")


def summary(interrupted: bool, failed: int = 0, dropped: int = 0) -> RunSummary:
    p = progress("a", 10, 10 - failed, failed_ids=failed)
    p.failed_samples = [f"s{i}" for i in range(failed)]
    return RunSummary({"a": p}, interrupted, 3.0, 0, dropped=dropped)


def test_exit_codes_and_summary_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["workbench", "generate", "--out", "o dir", "--no-resume"])
    assert generate_exit_code(summary(False)) == 0
    assert generate_exit_code(summary(False, failed=2)) == 1
    assert generate_exit_code(summary(True, failed=2)) == 130
    command = resume_command()
    assert summary_lines(summary(False, failed=2), Path("o"), command)[-2:] == [
        "failed after all attempts: a: 2 prompts (sample_id s0, s1; see o/a/errors.jsonl)",
        "rerun the same command to retry the failed prompts"]
    assert "(sample_id s0, s1, s2, s3, s4, ...;" in summary_lines(summary(False, failed=7), Path("o"), command)[-2]
    assert summary_lines(summary(True, dropped=7), Path("o"), command)[-1] == (
        "stopped: 7 prompts unfinished, in flight or waiting for a retry (sent again on resume); "
        "to resume, run: workbench generate --out 'o dir'")


def test_the_cost_line_gives_gpu_hours_spent_and_left() -> None:
    now = time.time()
    running = progress("a", 1000, 200, completion_tokens=20_000)  # 800 left x 100 tokens
    running.times.extend([now - 100, now], [0, 20_000])  # 200 tok/s
    done = progress("b", 300, 300, completion_tokens=900)
    done.finished = time.perf_counter()
    budget = progress("c", 5000, 10, completion_tokens=5000, max_tokens=6000)  # 1,000 left
    budget.times.extend([now - 100, now], [0, 5000])  # 50 tok/s
    run = RunSummary({p.name: p for p in (running, done, budget)}, True, 7200.0, 0, gpus=8)
    assert run.time_left(now) == (pytest.approx(81_000), pytest.approx(324))
    assert cost_line(run, now) == ("cost: 2.0h x 8 GPUs = 16.0 GPU-hours this session; left: "
                                   "5.4m for 81,000 tokens at 250 tok/s = 0.72 GPU-hours")
    run.gpus = None
    assert cost_line(run, now) == (
        "cost: 2.0h this session; left: 5.4m for 81,000 tokens at 250 tok/s (GPU count unknown: "
        "/server_info has no tp_size; give --gpus N)")
    finished = RunSummary({"b": done}, False, 30.0, 0, gpus=1)
    assert cost_line(finished) == "cost: 30s x 1 GPU = 0.01 GPU-hours this session; nothing left"
    waiting = RunSummary({"a": progress("a", 10, 0)}, True, 5.0, 0, gpus=2)
    assert cost_line(waiting).endswith("; time left unknown (no output rate yet)")


@pytest.mark.integration
def test_failed_prompts_exit_1_and_are_named(tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    server = start_sim(fault_error_rate=0.5, fault_seed=1)
    manifest = write_manifest(tmp_path, [{"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"),
                                          "input": "input_ids", "max_samples": 20}])
    done = workbench("generate", "--datasets", str(manifest), "--server", server.url,
                     "--out", str(tmp_path / "out"), "--max-attempts", "1")
    assert done.returncode == 1, done.stderr
    assert re.search(r"^cost: \d+s x 1 GPU = 0\.\d\d GPU-hours this session; nothing left$",
                     done.stdout, re.MULTILINE), done.stdout  # the simulator's /server_info: tp_size 1
    match = re.search(r"failed after all attempts: ids: (\d+) prompts \(sample_id ([^;]+); see (.*)\)", done.stdout)
    assert match, done.stdout
    failing = {json.loads(line)["sample_id"] for line in Path(match.group(3)).read_text().splitlines()}
    written = {json.loads(line)["sample_id"] for line in
               (tmp_path / "out" / "ids" / "raw_responses.jsonl").read_text().splitlines()}
    assert len(failing - written) == int(match.group(1)) > 0
    assert {int(i) for i in match.group(2).rstrip(", .").split(", ")} <= failing - written


@pytest.mark.integration
def test_stop_then_resume_say_so(tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    server = start_sim(speed=0.3)
    manifest = write_manifest(tmp_path, [{"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"),
                                          "input": "input_ids"}])
    out = tmp_path / "out"
    argv = ["generate", "--datasets", str(manifest), "--server", server.url, "--out", str(out),
            "--concurrency", "16", "--grace-period", "0.01"]
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    raw = out / "ids" / "raw_responses.jsonl"
    try:  # interrupted mid-run, once five records are written
        wait_until(lambda: raw.exists() and raw.read_bytes().count(b"\n") >= 5, 300,
                   f"five records in {raw}")
    except AssertionError:
        proc.kill()
        raise
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    stop = stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"stopped: (\d+) prompts unfinished, in flight or waiting for a retry "
                         r"\(sent again on resume\); to resume, run: workbench generate .*", stop)
    assert match and int(match.group(1)) > 0, stop
    written = raw.read_bytes().count(b"\n")
    again = workbench(*argv)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == f"resuming {out}: {written}/300 done, {300 - written} to send"
