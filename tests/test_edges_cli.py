"""Edges of the command as a process: secrets in --server, a closed stdout, SIGTERM, and the
in-process seam every other test runs the command through, held to what the process prints.

Each runs `python -m workbench` for real: one `workbench: error:` line (or none) and never a
traceback, whatever the pipe, the signal or the URL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    EXAMPLES,
    one_error_line,
    wait_until,
    workbench,
    workbench_process,
    write_manifest,
)

from workbench.rundir.records import PromptRecord, Record, encode_line
from workbench.server.launch import find_free_port

SECRET = "tok-5b2f-SECRET"
PASSWORD = "pw-81c0-SECRET"
NO_KEY_ENV = {k: v for k, v in os.environ.items()
              if k not in ("WORKBENCH_API_KEY", "SGLANG_API_KEY")}


def plant_run(out: Path, datasets: int, records: int = 1, output_len: int = 2) -> Path:
    """A finished run of `datasets` datasets of `records` records each, written directly."""
    entries: dict[str, Any] = {}
    for d in range(datasets):
        name = f"dataset_{d:04d}"
        folder = out / name
        folder.mkdir(parents=True)
        ids = [300 + (i % 1000) for i in range(output_len)]
        lines = (Record(sample_id=i, output_ids=ids, prompt_tokens=3, completion_tokens=len(ids),
                        cached_tokens=0, finish_reason="stop", matched_stop=None,
                        e2e_latency=1.0, ts=1.75e9) for i in range(records))
        (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, lines)))
        (folder / "prompts.jsonl").write_bytes(
            b"".join(encode_line(PromptRecord(i, [1, 2, 3])) for i in range(records)))
        entries[name] = {"input": "input_ids"}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": entries}))
    return out


# --- 1, 2: credentials and a query string in --server ----------------------------------------


def test_credentials_with_an_api_key_in_the_environment_are_one_line(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    server = f"http://user:{PASSWORD}@127.0.0.1:{find_free_port()}"
    done = workbench_process("generate", "--datasets", str(manifest), "--server", server,
                     "--out", str(tmp_path / "out"), env={**NO_KEY_ENV, "SGLANG_API_KEY": "k-1"})
    line = one_error_line(done.stderr)
    assert done.returncode == 2 and "--server: " in line and "SGLANG_API_KEY" in line
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("server", [
    f"http://user:{PASSWORD}@127.0.0.1:{{port}}",
    f"127.0.0.1:{{port}}/v1?token={SECRET}",
    f"http://user:{PASSWORD}@127.0.0.1:{{port}}/generate?token={SECRET}",
])
def test_an_unreachable_server_is_named_without_its_secrets(tmp_path: Path, server: str) -> None:
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    port = find_free_port()
    done = workbench_process("generate", "--datasets", str(manifest), "--server", server.format(port=port),
                     "--out", str(tmp_path / "out"), env=NO_KEY_ENV)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("workbench: note: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(errors) == 1 and f"cannot reach the server at http://127.0.0.1:{port}" in errors[0]
    assert SECRET not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr


def test_monitor_shows_no_secret_of_its_server_url(tmp_path: Path) -> None:
    run = plant_run(tmp_path / "run", datasets=1)
    server = f"http://user:{PASSWORD}@127.0.0.1:{find_free_port()}?token={SECRET}"
    done = workbench_process("monitor", str(run), "--once", "--server", server, env=NO_KEY_ENV)
    assert "UNREACHABLE" in done.stdout and "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr


def test_monitor_shows_no_secret_of_the_url_an_edited_run_json_holds(tmp_path: Path) -> None:
    run = plant_run(tmp_path / "run", datasets=1)
    manifest = json.loads((run / "run.json").read_text())
    manifest["server_url"] = f"http://user:{PASSWORD}@gpu:30000/?token={SECRET}"
    (run / "run.json").write_text(json.dumps(manifest))
    done = workbench_process("monitor", str(run), "--once", env=NO_KEY_ENV)
    assert "the run used http://gpu:30000/)" in done.stdout, done.stdout + done.stderr
    assert SECRET not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr


# --- the in-process seam the other tests use -------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["stats", "{run}"], ["stats", "{run}", "--json"], ["validate", "{run}", "--json"],
    ["validate", "{missing}"], ["export", "{run}", "--to", "{missing}/x.csv"],
    ["stats", "{run}", "--bogus"], ["--version"], ["report", "no_such_report"],
], ids=["stats", "stats-json", "validate-json", "not-a-run", "bad-target", "bad-flag",
        "version", "bad-report"])
def test_in_process_runs_print_and_exit_as_the_process_does(
        tmp_path: Path, argv: list[str]) -> None:
    """conftest.workbench (the command's `main` in the test's process) gives the very stdout,
    stderr and exit code of `python -m workbench`, errors included."""
    run = plant_run(tmp_path / "run", datasets=2, records=3)
    args = [a.format(run=run, missing=tmp_path / "missing") for a in argv]
    inside, process = workbench(*args, env=NO_KEY_ENV), workbench_process(*args, env=NO_KEY_ENV)
    assert (inside.returncode, inside.stdout, inside.stderr) == (
        process.returncode, process.stdout, process.stderr)
    assert process.stdout or process.stderr


# --- 3: a closed stdout ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 150 datasets: stats and validate print far more than a 4 KiB pipe holds."""
    return plant_run(tmp_path_factory.mktemp("wide") / "run", datasets=150)


@pytest.mark.parametrize("verb", [["stats"], ["validate"], ["stats", "--json"]])
def test_a_closed_stdout_ends_quietly_with_141(wide_run: Path, verb: list[str]) -> None:
    """`workbench stats OUT | head -1`: the reader goes after one line; the writer blocks on
    the full pipe (4 KiB) until then, so its next write meets the closed end."""
    child = subprocess.Popen([sys.executable, "-m", "workbench", verb[0], str(wide_run), *verb[1:]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, pipesize=4096)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline()
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141 and stderr == ""


# --- 7: SIGTERM ------------------------------------------------------------------------------


def test_an_export_stopped_by_sigterm_leaves_no_temp_file(tmp_path: Path) -> None:
    """The export's temp file is made a FIFO before the export opens it: the export then writes
    only as fast as the test reads, so it is provably mid-write when SIGTERM comes."""
    run = plant_run(tmp_path / "run", datasets=2, records=200, output_len=2000)  # ~8 MB of rows
    target = tmp_path / "train.jsonl"
    argv = [sys.executable, "-m", "workbench", "export", str(run), "--to", str(target)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fifo = tmp_path / f".train.jsonl.{child.pid}.tmp"
    os.mkfifo(fifo)  # the child is still importing: its temp file is not there yet
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    received: list[bytes] = []

    def read_some() -> bool:
        assert child.poll() is None, child.communicate()
        try:
            received.append(os.read(reader, 1 << 16))
        except BlockingIOError:  # the export has the file open, nothing written yet
            return False
        return bool(received[-1])

    def drained() -> bool:
        try:
            return os.read(reader, 1 << 20) == b""  # end of file: the export closed it
        except BlockingIOError:
            return False

    try:
        wait_until(read_some, 120, "the export writing rows into its temp file")
        child.send_signal(signal.SIGTERM)
        wait_until(drained, 120, "the export closing its temp file")
    finally:
        os.close(reader)
    _stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 143 and "Traceback" not in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temp file, no target
