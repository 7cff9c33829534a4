"""`workbench generate` against the simulator on real sockets (and sglang-router in front)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, jsonl, wait_until, workbench, write_manifest
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import load_manifest
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess, find_free_port

pytestmark = pytest.mark.integration

THINK, THINK_END, IM_END = 163606, 163607, 163586


def metric(url: str, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in {url}/metrics")


def three_modes(tmp_path: Path, n: int = 20) -> Path:
    return write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids", "max_samples": n},
        {"name": "texts", "path": str(EXAMPLES / "data/texts.jsonl"), "input": "text", "max_samples": n},
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages", "max_samples": n,
         "chat_template_kwargs": {"thinking": True}},
    ])


def test_three_input_modes_end_to_end(tmp_path: Path, shared_sim: ServerProcess) -> None:
    server = shared_sim
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(three_modes(tmp_path)), "--server", server.url,
                     "--out", str(out), "--progress-interval", "1")
    assert done.returncode == 0, done.stderr
    assert "run finished" in done.stdout
    for name in ("ids", "texts", "chat"):
        records = jsonl(out / name / "raw_responses.jsonl")
        prompts = {p["sample_id"]: p for p in jsonl(out / name / "prompts.jsonl")}
        assert len(records) == 20 and {r["sample_id"] for r in records} == set(prompts)
        for record in records:
            assert record["schema"] == 1 and record["completion_tokens"] > 0
            if record["finish_reason"] == "stop":
                assert record["output_ids"][-1] == IM_END and THINK_END in record["output_ids"]
            if "input_ids" in prompts[record["sample_id"]]:
                assert record["prompt_tokens"] == len(prompts[record["sample_id"]]["input_ids"])
    chat_prompts = jsonl(out / "chat" / "prompts.jsonl")
    assert all(p["input_ids"][-1] == THINK for p in chat_prompts)
    assert all("text" in p for p in jsonl(out / "texts" / "prompts.jsonl"))


@pytest.mark.parametrize(("concurrency", "latency"), [(150, 0.5), (512, 1.0)])
def test_in_flight_count_reaches_the_limit(tmp_path: Path, start_sim: Callable[..., ServerProcess],
                                           concurrency: int, latency: float) -> None:
    server = start_sim(fixed_latency=latency)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'{{"sample_id": {i}, "input_ids": [5, 6, 7]}}\n' for i in range(concurrency * 3)))
    manifest = load_manifest(write_manifest(tmp_path, [{"name": "d", "path": str(path), "input": "input_ids"}]))

    async def go() -> None:
        async with SGLangClient(server.url) as client:
            options = GenerateOptions(concurrency=concurrency, long_concurrency=concurrency, progress_interval=60)
            summary = await run_generation(manifest, client, tmp_path / "out", options)
            assert summary.datasets["d"].done == concurrency * 3

    asyncio.run(go())
    assert metric(server.url, "workbench_sim:peak_inflight_requests") == concurrency


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(path: Path, lines: int, proc: subprocess.Popen[Any], timeout: float = 300) -> None:
    """Return once `path` holds `lines` lines (the writer is mid-run); AssertionError if the
    process ends first or nothing comes within `timeout` seconds."""
    wait_until(lambda: lines_in(path) >= lines or proc.poll() is not None, timeout,
               f"{lines} lines in {path}")
    assert proc.poll() is None, f"the run ended (code {proc.returncode}) before {lines} lines"


def test_resume_after_sigkill_writes_every_sample_exactly_once(
        tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    server = start_sim(speed=0.2)
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest), "--server", server.url,
            "--out", str(out), "--concurrency", "64"]
    rng = random.Random(int(os.environ.get("WORKBENCH_TEST_SEED", "7")))
    raw = out / "ids" / "raw_responses.jsonl"
    written = []
    for _ in range(3):
        before = lines_in(raw)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:  # killed after a random number of new records: mid-run, whatever the machine's load
            wait_for_lines(raw, before + rng.randint(1, 40), proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        written.append(lines_in(raw))
    assert 0 < written[0] < 300, f"the first kill should land mid-run; lines after each kill: {written}"
    final = workbench(*argv[3:])
    assert final.returncode == 0, final.stderr
    expected = {p["sample_id"] for p in jsonl(out / "ids" / "prompts.jsonl")}
    ids, duplicates = read_sample_ids(out / "ids" / "raw_responses.jsonl")
    assert duplicates == [] and ids == expected
    rows, problems = read_rows(out / "ids" / "raw_responses.jsonl")
    assert len(rows) == len(expected) and problems == []


def test_faults_still_end_with_every_sample(tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    server = start_sim(fault_error_rate=0.1, fault_drop_rate=0.1, fault_seed=3)
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(three_modes(tmp_path, n=40)), "--server", server.url,
                     "--out", str(out), "--max-attempts", "8")
    assert done.returncode == 0, done.stderr
    kinds: Counter[str] = Counter()
    for name in ("ids", "texts", "chat"):
        assert len(read_sample_ids(out / name / "raw_responses.jsonl")[0]) == 40
        kinds.update(e["error_type"] for e in jsonl(out / name / "errors.jsonl"))
    assert kinds["server_error"] > 0 and kinds["connection"] > 0


def test_sigint_stops_gracefully(tmp_path: Path, shared_sim: ServerProcess) -> None:
    server = shared_sim
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest),
                             "--server", server.url, "--out", str(out), "--concurrency", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # interrupted once it has written a record: mid-run
        wait_for_lines(out / "ids" / "raw_responses.jsonl", 1, proc)
    except AssertionError:
        proc.kill()
        raise
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "stopping: letting in-flight requests finish" in stderr
    assert "run interrupted" in stdout
    rows, problems = read_rows(out / "ids" / "raw_responses.jsonl")
    assert 0 < len(rows) < 300 and problems == []


def test_unreachable_server_is_one_line_naming_the_url(tmp_path: Path) -> None:
    port = find_free_port()
    done = workbench("generate", "--datasets", str(three_modes(tmp_path)), "--server",
                     f"http://127.0.0.1:{port}", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_generation_through_sglang_router(tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    workers = [start_sim(), start_sim()]
    port = find_free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-port", str(find_free_port()), "--policy", "round_robin",
            "--worker-urls", *(w.url for w in workers)]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "router.log") as router:
        router.wait_ready(120)
        out = tmp_path / "out"
        done = workbench("generate", "--datasets", str(three_modes(tmp_path)), "--server", router.url,
                         "--out", str(out))
        assert done.returncode == 0, done.stderr + (tmp_path / "router.log").read_text()[-2000:]
    for name in ("ids", "texts", "chat"):
        ids, duplicates = read_sample_ids(out / name / "raw_responses.jsonl")
        assert len(ids) == 20 and duplicates == []
    served = [metric(w.url, "sglang:num_requests_total") for w in workers]
    assert all(count > 0 for count in served) and sum(served) >= 60
