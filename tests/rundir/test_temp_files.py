"""Temp files a killed writer left (``.<name>.<pid>.tmp``) go at the next write of the same
target, when their process is gone; a live process's temp file is never touched."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.export.exporter import export_run
from workbench.rundir.files import write_atomic
from workbench.rundir.records import PromptRecord, Record, encode_line


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a process that runs until the test ends (it waits on its stdin)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    yield child.pid
    assert child.stdin is not None
    child.stdin.close()
    child.wait()


def test_the_next_write_removes_a_dead_writers_temp_file(tmp_path: Path, dead_pid: int,
                                                         live_pid: int) -> None:
    target = tmp_path / "run.json"
    stale = tmp_path / f".run.json.{dead_pid}.tmp"
    live = tmp_path / f".run.json.{live_pid}.tmp"
    others = [tmp_path / f".run.json.x.{dead_pid}.tmp", tmp_path / f".other.{dead_pid}.tmp",
              tmp_path / ".run.json.notapid.tmp"]
    for path in (stale, live, *others):
        path.write_bytes(b"half a file")
    write_atomic(target, b"{}")
    assert target.read_bytes() == b"{}"
    assert not stale.exists() and live.exists() and all(p.exists() for p in others)


def test_an_export_removes_a_dead_exports_temp_file(tmp_path: Path, dead_pid: int,
                                                    live_pid: int) -> None:
    run = tmp_path / "run"
    (run / "ds").mkdir(parents=True)
    record = Record(sample_id=1, output_ids=[300, 163586], prompt_tokens=2, completion_tokens=2,
                    cached_tokens=0, finish_reason="stop", matched_stop=163586, e2e_latency=1.0,
                    ts=1.75e9)
    (run / "ds" / "raw_responses.jsonl").write_bytes(encode_line(record))
    (run / "ds" / "prompts.jsonl").write_bytes(encode_line(PromptRecord(1, [1, 2])))
    (run / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": {"ds": {"input": "input_ids"}}}))
    stale = tmp_path / f".train.jsonl.{dead_pid}.tmp"
    live = tmp_path / f".train.jsonl.{live_pid}.tmp"
    stale.write_bytes(b"x" * 1000)
    live.write_bytes(b"y")
    assert export_run(run, tmp_path / "train.jsonl").rows == 1
    assert not stale.exists() and live.read_bytes() == b"y"
