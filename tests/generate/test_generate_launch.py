"""`workbench generate --launch SERVER.yaml`: the run starts its own simulator and restarts it
when it dies or stalls; every sample is written once, the restarts are run.json events."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, jsonl, workbench
from conftest import write_manifest as write_dataset_manifest

pytestmark = pytest.mark.integration

N = 40


def server_file(folder: Path, **faults: Any) -> Path:
    path = folder / "server.yaml"
    path.write_text(json.dumps({"server": {
        "launcher": "sim", "startup_timeout": 60, "stop_grace": 5,
        "sim": {"profile": "dense-8b-1x24gb", "args": {"random_seed": 0, **faults}}}}))
    return path


def run_launched(tmp_path: Path, server: Path, *extra: str) -> tuple[Any, Path]:
    manifest = write_dataset_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": N}], sampling={"temperature": 0.0, "max_new_tokens": 128})
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--launch", str(server),
                     "--out", str(out), "--concurrency", "8", "--progress-interval", "1",
                     "--restart-backoff", "0.2", "--max-restarts", "8", *extra)
    return done, out


def assert_each_sample_once(out: Path) -> None:
    records = Counter(r["sample_id"] for r in jsonl(out / "ids/raw_responses.jsonl"))
    prompts = {p["sample_id"] for p in jsonl(out / "ids/prompts.jsonl")}
    assert len(prompts) == N and set(records) == prompts
    assert max(records.values()) == 1


def events(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "run.json").read_text())["events"]


def test_a_server_that_dies_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    # each life of the server is 10 s: a cohort of 8 replies takes about 3 s here, and a loaded
    # machine (4 s lives) finished none after the first restart, so --max-restarts ran out
    done, out = run_launched(tmp_path, server_file(tmp_path, fault_exit_after=10.0))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_each_sample_once(out)
    kinds = [e["kind"] for e in events(out)]
    assert kinds[0] == "server_started" and "server_exited" in kinds
    assert kinds.count("server_restarted") >= 1
    exited = next(e for e in events(out) if e["kind"] == "server_exited")
    assert exited["message"].startswith("server exited with code 1: ")
    assert "Injected fault" in exited["message"]
    log = (out / "server.log").read_text()
    assert log.count("workbench: start ") == kinds.count("server_started")
    assert "restarting the server (exited; restart 1 of 8" in done.stdout + done.stderr
    said = (done.stdout + done.stderr).splitlines()
    assert sum(line.startswith("server ready at ") for line in said) == kinds.count(
        "server_started")  # each start said once


def test_a_stalled_server_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    # a non-streamed request shows progress every 50 tokens (about 1 s here, more after a long
    # prefill): a 1 s timeout would call a working server stalled, so it is 4 s
    done, out = run_launched(tmp_path, server_file(tmp_path, fault_stall_after=8.0),
                             "--stall-timeout", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_each_sample_once(out)
    seen = events(out)
    kinds = [e["kind"] for e in seen]
    stalled = kinds.index("stalled")
    assert kinds[stalled + 1] == "server_restarting" and "server_restarted" in kinds[stalled:]
    assert seen[stalled + 1]["reason"] == "stalled"


def test_a_server_that_cannot_start_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("server:\n  launcher: sim\n  args: {mem_fraction_static: 1.5}\n"
                    "  startup_timeout: 60\n")
    done, out = run_launched(tmp_path, path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "before it was ready" in last and "--mem-fraction-static" in last
    assert not (out / "ids" / "raw_responses.jsonl").exists()


def test_launch_and_server_are_exclusive(tmp_path: Path) -> None:
    done = workbench("generate", "--datasets", "x.yaml", "--server", "http://h:1",
                     "--launch", "s.yaml", "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_a_server_that_stalls_again_after_each_restart_is_given_up(tmp_path: Path) -> None:
    # stalls 1 s after each start, before the resent requests progress: each restart is judged
    # afresh (a stalled-again server is told again), and after --max-restarts the run stops
    done, out = run_launched(tmp_path, server_file(tmp_path, fault_stall_after=1.0),
                             "--stall-timeout", "1", "--max-restarts", "2")
    assert done.returncode == 130, done.stdout[-3000:] + done.stderr[-3000:]
    kinds = [e["kind"] for e in events(out)]
    assert kinds.count("server_restarted") == 2 and kinds[-1] == "server_gave_up"
    assert kinds.count("stalled") == 3
    assert "to resume, run: workbench generate" in done.stdout
