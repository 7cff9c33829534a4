"""Many servers through the real sglang-router: shares, a server killed mid-run, the monitor.

The router is started with the flags of params/router.example.yaml, so the documented set-up
is the tested one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import EXAMPLES, ROOT, jsonl, wait_until, workbench, write_manifest

from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess, find_free_port, to_flags
from workbench.watch.monitor import Monitor
from workbench.watch.render import render_frame

EXAMPLE = ROOT / "params" / "router.example.yaml"
REQUESTS = "sglang:num_requests_total"


def router_argv(workers: list[str], port: int, **overrides: Any) -> list[str]:
    """The router command of params/router.example.yaml, on local ports, for these workers."""
    flags = yaml.safe_load(EXAMPLE.read_text())["router"]
    flags.update(host="127.0.0.1", port=port, prometheus_port=find_free_port(), **overrides)
    return [sys.executable, "-m", "sglang_router.launch_router", *to_flags(flags),
            "--worker-urls", *workers]


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    routers: list[ServerProcess] = []

    def start(workers: list[str], **overrides: Any) -> ServerProcess:
        port = find_free_port()
        router = ServerProcess(router_argv(workers, port, **overrides), url=f"http://127.0.0.1:{port}",
                               log_path=tmp_path / f"router-{len(routers)}.log")
        routers.append(router)
        router.start()
        router.wait_ready(60)
        return router

    yield start
    for router in routers:
        router.stop()


def counter(url: str, name: str = REQUESTS) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in {url}/metrics")


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def healthy_workers(router: str) -> dict[str, bool]:
    listed = httpx.get(router + "/workers", timeout=10).json()["workers"]
    return {w["url"]: w["is_healthy"] for w in listed}


def test_the_example_names_only_flags_the_router_knows() -> None:
    flags = yaml.safe_load(EXAMPLE.read_text())["router"]
    done = subprocess.run([sys.executable, "-m", "sglang_router.launch_router", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for flag in to_flags(flags)[::2]:
        assert flag in done.stdout, flag
    assert flags["host"] == "127.0.0.1" and flags["max_concurrent_requests"] == -1


@pytest.mark.integration
def test_three_servers_share_a_run_and_one_dies_without_losing_a_sample(
        tmp_path: Path, start_sim: Callable[..., ServerProcess],
        start_router: Callable[..., ServerProcess]) -> None:
    sims = [start_sim(speed=0.1) for _ in range(3)]
    router = start_router([s.url for s in sims], health_check_interval_secs=1, health_failure_threshold=1)
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    out = tmp_path / "out"
    raw = out / "ids" / "raw_responses.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest), "--server", router.url,
         "--out", str(out), "--concurrency", "48", "--max-attempts", "8", "--progress-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: lines_in(raw) >= 60, 300, "a fifth of the records")
        victim = sims[2]
        counted_at = lines_in(raw)
        served_by_victim = counter(victim.url)
        assert victim.pid is not None
        os.killpg(victim.pid, signal.SIGKILL)
        killed_at = lines_in(raw)
        time.sleep(0.5)  # the records of the victim's last replies are written by now
        window = lines_in(raw) - counted_at  # records written between its count and its death
        _stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr + (tmp_path / "router-0.log").read_text()[-3000:]
    assert killed_at < 300, "the server should die mid-run"
    expected = {p["sample_id"] for p in jsonl(out / "ids" / "prompts.jsonl")}
    ids, duplicates = read_sample_ids(raw)
    assert len(expected) == 300 and ids == expected and duplicates == []
    rows, problems = read_rows(raw)
    assert len(rows) == 300 and problems == []
    survivors = [counter(s.url) for s in sims[:2]]
    shares = [*survivors, served_by_victim]
    assert all(share >= 10 for share in shares), shares
    assert sum(shares) >= 300 - window  # a reply the victim sent after its count is not in it
    wait_until(lambda: healthy_workers(router.url).get(victim.url) is False, 120,
               "the router to drop the server")
    frame = workbench("monitor", str(out), "--once", "--server", router.url)
    assert frame.returncode == 1, frame.stderr  # --once exits 1 when it raised an alert
    assert f"router {router.url}: 3 workers (2 healthy)" in frame.stdout
    for sim in sims[:2]:
        assert f"worker {sim.url}: healthy" in frame.stdout and "running" in frame.stdout
    assert f"ALERT server: worker {victim.url} marked unhealthy" in frame.stdout


@pytest.mark.integration
def test_one_hung_worker_behind_the_router_is_told(
        tmp_path: Path, start_sim: Callable[..., ServerProcess],
        start_router: Callable[..., ServerProcess]) -> None:
    """One server's scheduler hangs for good (its /health still answers, so the router keeps
    it) while the other works: the summed tokens move, the watchdog names the hung one."""
    working = start_sim(speed=0.2)
    hung = start_sim(speed=0.2, fault_stall_after=2.0)  # 10 s of wall-clock time: mid-run
    router = start_router([working.url, hung.url])
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    out = tmp_path / "out"

    def stalled() -> list[dict[str, Any]]:
        run = out / "run.json"
        events = json.loads(run.read_text()).get("events", []) if run.exists() else []
        return [e for e in events if e["kind"] == "stalled"]

    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest),
             "--server", router.url, "--out", str(out), "--concurrency", "16",
             "--stall-timeout", "5", "--progress-interval", "1"],
            stdout=subprocess.PIPE, stderr=stderr_file, text=True)
    try:
        wait_until(lambda: bool(stalled()), 120, "the hung worker to be told")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping: letting in-flight" in err.read_text(), 30,
                   "the first signal to be taken")
        proc.send_signal(signal.SIGTERM)  # stop now: the hung requests are cut
        stdout, _ = proc.communicate(timeout=30)
        stderr = err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    [event] = stalled()
    assert event["worker"] == hung.url
    assert event["message"].startswith(f"worker {hung.url} stalled: no token generated for ")
    assert event["message"] in stdout.splitlines()
    assert counter(working.url) > counter(hung.url) > 0  # both served; the working one goes on
    assert re.search(r"^cost: \d+s x 2 GPUs = ", stdout, re.MULTILINE), stdout  # tp 1 x 2 workers
    ids, duplicates = read_sample_ids(out / "ids" / "raw_responses.jsonl")
    assert ids and duplicates == []


@pytest.mark.integration
@pytest.mark.parametrize("metrics", [True, False])
def test_auto_concurrency_steers_on_the_workers_behind_the_router(
        metrics: bool, tmp_path: Path, start_sim: Callable[..., ServerProcess],
        start_router: Callable[..., ServerProcess]) -> None:
    """The router has no /metrics of its own: auto reads each worker's, or says it cannot."""
    sims = [start_sim(speed=0.5, enable_metrics=metrics) for _ in range(2)]
    router = start_router([s.url for s in sims])
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids"}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--server", router.url, "--out", str(out),
                     "--concurrency", "auto", "--progress-interval", "1")
    assert done.returncode == 0, done.stderr
    ids, duplicates = read_sample_ids(out / "ids" / "raw_responses.jsonl")
    assert len(ids) == 300 and duplicates == []
    record = json.loads((out / "run.json").read_text())["concurrency"]
    assert record["setting"] == "auto" and record["history"]
    if metrics:
        assert record["mode"] == "metrics"
        assert "steering on the servers' /metrics" in done.stdout
        assert all(counter(s.url) >= 30 for s in sims)  # both workers were kept busy
    else:
        assert record["mode"] == "throughput"
        assert "/metrics is off" in done.stdout


@pytest.mark.integration
def test_a_generation_through_the_router_with_an_api_key(
        tmp_path: Path, start_sim: Callable[..., ServerProcess],
        start_router: Callable[..., ServerProcess]) -> None:
    key = "router-key-5b1e"
    sims = [start_sim(api_key=key) for _ in range(2)]
    router = start_router([s.url for s in sims], api_key=key)
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 40}])
    out = tmp_path / "out"
    env = {**os.environ, "WORKBENCH_API_KEY": key}
    done = workbench("generate", "--datasets", str(manifest), "--server", router.url, "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert len(read_sample_ids(out / "ids" / "raw_responses.jsonl")[0]) == 40
    refused = workbench("generate", "--datasets", str(manifest), "--server", router.url,
                        "--out", str(tmp_path / "other"), env={k: v for k, v in env.items()
                                                               if k not in ("WORKBENCH_API_KEY", "SGLANG_API_KEY")})
    assert refused.returncode == 2 and "not authorised" in refused.stderr
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    assert key not in logs


# --- the router's worker list, without sockets ------------------------------------------------

WORKERS = {"workers": [
    {"url": "http://gpu1:30000", "is_healthy": True, "load": 7, "model_id": "m"},
    {"url": "http://gpu2:30000", "is_healthy": False, "load": 0},
], "total": 2}
WORKER_METRICS = (
    "sglang:num_running_reqs 12\nsglang:num_queue_reqs 3\nsglang:token_usage 0.5\n"
    "sglang:gen_throughput 640\n"
)


def fake_cluster(request: httpx.Request) -> httpx.Response:
    host, path = request.url.host, request.url.path
    if host == "router" and path == "/workers":
        return httpx.Response(200, json=WORKERS)
    if host == "old-router" and path == "/list_workers":
        return httpx.Response(200, json={"urls": ["http://gpu1:30000"]})
    if host == "gpu1" and path == "/metrics":
        return httpx.Response(200, text=WORKER_METRICS)
    if host == "gpu2":
        raise httpx.ConnectError("refused")
    return httpx.Response(404, json={"error": {"message": "Not Found"}})


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_client_reads_both_worker_list_shapes(anyio_backend: str) -> None:
    transport = httpx.MockTransport(fake_cluster)
    async with SGLangClient("http://router", transport=transport) as client:
        assert await client.workers() == [
            {"url": "http://gpu1:30000", "healthy": True, "load": 7},
            {"url": "http://gpu2:30000", "healthy": False, "load": 0}]
    async with SGLangClient("http://old-router", transport=transport) as client:
        assert await client.workers() == [{"url": "http://gpu1:30000", "healthy": None, "load": None}]
    async with SGLangClient("http://gpu1:30000", transport=transport) as client:
        assert await client.workers() is None


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_monitor_shows_each_worker_behind_a_router(tmp_path: Path, anyio_backend: str) -> None:
    transport = httpx.MockTransport(fake_cluster)
    monitor = Monitor(tmp_path, client=SGLangClient("http://router", transport=transport),
                      worker_client=lambda url: SGLangClient(url, transport=transport))
    try:
        frame = render_frame(await monitor.poll())
    finally:
        await monitor.aclose()
    assert "router http://router: 2 workers (1 healthy)" in frame
    assert ("worker http://gpu1:30000: healthy, load 7, 12 running, 3 queued, token usage 50%, "
            "gen 640 tok/s (last logged)") in frame
    assert "worker http://gpu2:30000: UNHEALTHY, load 0, metrics: connection failed" in frame
    assert "ALERT server: worker http://gpu2:30000 marked unhealthy by the router http://router" in frame
