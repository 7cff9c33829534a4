"""`auto` concurrency: the limiter, the decisions from readings and from throughput, and a run
on the simulator that steers from its /metrics (and says so in run.json)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from workbench.generate.concurrency import (
    QUEUE_MIN,
    AutoConcurrency,
    Limiter,
    ServerReading,
    read_servers,
)

pytestmark = pytest.mark.anyio


def reading(running: float, queued: float, url: str = "http://a", retracted: float | None = None) -> ServerReading:
    return ServerReading(url, running, queued, 0.5, retracted)


async def test_limiter_follows_a_changing_limit() -> None:
    limiter = Limiter(2)
    await limiter.acquire()
    await limiter.acquire()
    third = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert not third.done()
    limiter.set_limit(3)
    await asyncio.wait_for(third, 60)  # a bound on an event, not a duration
    limiter.set_limit(1)  # lowering: the holders finish, no one starts until under it
    fourth = asyncio.ensure_future(limiter.acquire())
    for _ in range(2):
        limiter.release()
        await asyncio.sleep(0)
        assert not fourth.done()
    limiter.release()
    await asyncio.wait_for(fourth, 60)
    assert limiter.in_use == 1


def test_an_empty_queue_grows_the_cap_while_it_is_used() -> None:
    auto = AutoConcurrency(limit=32)
    assert auto.on_readings([reading(30, 0)], in_use=32, at=1) == 48
    assert auto.on_readings([reading(47, 0)], in_use=20, at=2) == 48  # not used: no growth


def test_a_queued_server_gets_its_running_plus_a_bounded_queue() -> None:
    auto = AutoConcurrency(limit=400)
    limits = [auto.on_readings([reading(27, 300)], in_use=400, at=t) for t in range(12)]
    assert limits[-1] in (27 + 14, 27 + 14 + 1)  # 27 running, a queue of half of them (14)
    assert limits == sorted(limits, reverse=True)  # converges from above without jumps
    assert [t for t, _ in auto.history] == sorted(t for t, _ in auto.history)


def test_every_worker_behind_a_router_counts() -> None:
    auto = AutoConcurrency(limit=200)
    for t in range(15):
        limit = auto.on_readings([reading(100, 30, "http://a"), reading(100, 12, "http://b")],
                                 in_use=200, at=t)
    assert limit == 2 * (100 + 50)  # each: its running plus a queue of half of them
    grown = auto.on_readings([reading(100, 30, "http://a"), reading(60, 0, "http://b")],
                             in_use=300, at=20)
    assert grown > 300  # one worker starved


def test_retractions_and_errors_back_off_and_hold_growth() -> None:
    auto = AutoConcurrency(limit=100)
    auto.on_readings([reading(90, 10, retracted=0)], in_use=100, at=0)
    backed = auto.on_readings([reading(90, 10, retracted=20)], in_use=100, at=1)
    assert backed == 90 + QUEUE_MIN  # a short queue on top of what runs
    assert auto.on_readings([reading(60, 0, retracted=20)], in_use=backed, at=2) == backed  # held
    assert auto.on_error(at=3) < backed


def test_throughput_mode_climbs_then_settles_on_the_best_cap() -> None:
    auto = AutoConcurrency(limit=16)
    rate = {16: 100.0, 24: 150.0, 36: 200.0, 54: 201.0, 81: 199.0}
    caps = [auto.on_window(rate.get(auto.limit, 199.0), requests=50, at=t) for t in range(16)]
    assert auto.mode == "throughput"
    assert max(set(caps), key=caps.count) == 36  # mostly at the best, probing 54 now and then
    assert max(caps) == 54  # 54 was no better: 81 never tried
    assert auto.on_window(500.0, requests=3, at=17) == auto.limit  # too few requests: no move


async def test_read_servers_through_a_router_reads_each_worker() -> None:
    def metrics(running: int, queued: int) -> str:
        return (f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{model_name=\"m\"}} {running}\n"
                f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{model_name=\"m\"}} {queued}\n")

    def handler(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if host == "router" and path == "/metrics":
            return httpx.Response(404)
        if host == "router" and path == "/workers":
            return httpx.Response(200, json={"workers": [{"url": "http://w1"}, {"url": "http://w2"}]})
        if path == "/metrics":
            return httpx.Response(200, text=metrics(5 if host == "w1" else 7, 2))
        return httpx.Response(404)

    from workbench.server.client import SGLangClient

    transport = httpx.MockTransport(handler)
    async with SGLangClient("http://router", transport=transport) as client:
        workers = {}

        def worker(url: str) -> SGLangClient:
            return workers.setdefault(url, SGLangClient(url, transport=transport))

        found = await read_servers(client, worker)
        for w in workers.values():
            await w.aclose()
    assert found is not None and sorted(r.running for r in found) == [5, 7]


def _auto_run(tmp_path: Path, sim: dict[str, Any], dataset: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Generate the pretokenized examples with `auto` on a simulator: run.json's concurrency
    record and the runner's events."""
    from conftest import EXAMPLES, write_manifest

    from workbench.config import load_manifest
    from workbench.demo import start_simulator
    from workbench.generate.plan import GenerateOptions
    from workbench.generate.session import run_generation
    from workbench.server.client import SGLangClient

    server = start_simulator(tmp_path / "sim.log", {"profile": "fast", "speed": 4.0, **sim})
    try:
        manifest = load_manifest(write_manifest(tmp_path, [{
            "name": "ids", "path": str(EXAMPLES / "data" / "pretokenized.jsonl"), "input": "input_ids",
            **dataset}]))
        events: list[str] = []

        async def go() -> None:
            async with SGLangClient(server.url) as client:
                await run_generation(manifest, client, tmp_path / "out",
                                     GenerateOptions(auto_interval=0.2, progress_interval=0.5),
                                     on_event=events.append)
        asyncio.run(go())
    finally:
        server.stop()
    return json.loads((tmp_path / "out" / "run.json").read_text())["concurrency"], events


@pytest.mark.integration
def test_auto_steers_from_the_simulators_metrics(tmp_path: Path) -> None:
    record, events = _auto_run(tmp_path, {"enable_metrics": True, "max_running_requests": 8},
                               {"max_samples": 300})
    assert record["setting"] == "auto" and record["mode"] == "metrics"
    assert any("steering on the servers' /metrics" in e for e in events)
    caps = [cap for _, cap in record["history"]]
    assert len(caps) >= 2 and caps[0] == 32
    # 8 run, the rest queue: the cap heads for 8 plus a queue of 8 (first step: (32 + 16) / 2)
    assert min(caps[1:]) <= 24


@pytest.mark.integration
def test_without_metrics_auto_climbs_on_throughput(tmp_path: Path) -> None:
    record, events = _auto_run(tmp_path, {}, {})
    assert record["mode"] == "throughput"
    assert any("/metrics is off" in e for e in events)
    ids = [json.loads(line)["sample_id"] for line in (tmp_path / "out/ids/raw_responses.jsonl").open()]
    assert len(ids) == len(set(ids)) == 300


def test_a_dip_in_running_requests_does_not_pull_the_cap_down() -> None:
    """A KV-bound server runs fewer requests as they grow and refills when they finish: the
    cap follows the recent peak, so the queue can refill it."""
    auto = AutoConcurrency(limit=48)
    for t, running in enumerate([40, 40, 26, 22, 40, 24, 38, 23, 40, 25]):
        limit = auto.on_readings([reading(running, 20)], in_use=limit if t else 48, at=t)
    assert limit >= 40 + QUEUE_MIN
