"""A short run of bench/soak.py: SIGKILLs, a server restart, faults, torn lines, then a full run;
and outages of a fake server, started and ended by request counts rather than moments."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from conftest import ROOT, wait_until, write_manifest

from workbench.config import load_manifest
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.rundir.line_index import read_sample_ids
from workbench.server.client import SGLangClient


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


def records_in(out: Path) -> int:
    return sum(raw.read_bytes().count(b"\n") for raw in out.glob("*/raw_responses.jsonl"))


def wait_for_records(out: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    wait_until(lambda: records_in(out) >= count or proc.poll() is not None, 300,
               f"{count} records in {out}")


def cycle_on_records(index: int, argv: list[str], work: Path, sim: Any, restart: bool,
                     rng: random.Random, kill_after: tuple[float, float]) -> bool:
    """bench/soak.py's cycle with its moments replaced by events: the server restarts once the
    run has written a record, and the run is SIGKILLed once it has written 1 to 30 more, so
    every kill lands mid-run whatever the machine's speed. Returns whether it was running."""
    out = Path(argv[argv.index("--out") + 1])
    with (work / "logs" / f"cycle-{index:02d}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            if restart:
                wait_for_records(out, records_in(out) + 1, proc)
                sim.restart()
            wait_for_records(out, records_in(out) + rng.randint(1, 30), proc)
            running = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return running


@pytest.mark.integration
def test_short_soak_loses_and_repeats_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    soak = load_soak()
    monkeypatch.setattr(soak, "_cycle", cycle_on_records)
    config = soak.SoakConfig(cycles=5, samples=240, seed=11, restarts=1, torn_rate=1.0, work=tmp_path,
                             disk_cycles=0)  # full disks: test_nothing_lost, event by event
    said: list[str] = []
    result = soak.run_soak(config, say=said.append)
    figures = soak.format_figures(result)
    assert result.ok, figures + "\n" + "\n".join(said)
    assert result.cycles == result.survived == 5 and result.kills >= 3 and result.restarts == 1
    assert result.expected == result.written == 280 and result.duplicates == result.lost == 0
    assert result.torn_injected >= 1 and result.torn_repaired >= result.torn_injected
    kinds = set(result.failed_attempts)
    assert {"connection", "server_error"} <= kinds, figures
    assert "cycles survived      5/5" in figures and "verdict              PASS" in figures


# --- an outage pauses the run instead of spending every prompt's attempts ----------------------


class FlakyServer:
    """A MockTransport handler that refuses connections once it has taken `down_after` /generate
    requests, until `down_for` /health probes have been refused."""

    def __init__(self, down_after: int, down_for: int) -> None:
        self.down_after, self.down_for = down_after, down_for
        self.generate_calls = 0  # taken (and answered)
        self.refused_probes = 0

    def down(self) -> bool:
        return self.generate_calls >= self.down_after and self.refused_probes < self.down_for

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "m"})
        if self.down():
            self.refused_probes += request.url.path == "/health"
            raise httpx.ConnectError("Connect call failed")
        if request.url.path == "/health":
            return httpx.Response(200)
        self.generate_calls += 1
        await asyncio.sleep(0.01)
        body = json.loads(request.content)
        return httpx.Response(200, json={"output_ids": [1, 2, 3], "meta_info": {
            "prompt_tokens": len(body["input_ids"]), "completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 163586}}})


def run_against(server: FlakyServer, tmp_path: Path, **options: Any) -> tuple[Any, list[str]]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"sample_id": i, "input_ids": [5, 6, i % 50]}) + "\n" for i in range(300)))
    manifest = load_manifest(write_manifest(tmp_path, [{"name": "d", "path": str(prompts), "input": "input_ids"}]))
    events: list[str] = []

    async def go() -> Any:
        async with SGLangClient("http://gpu:30000", transport=httpx.MockTransport(server)) as client:
            opts = GenerateOptions(concurrency=16, max_attempts=3, backoff_base=0.02, backoff_cap=0.1,
                                   progress_interval=60, **options)
            return await run_generation(manifest, client, tmp_path / "out", opts, on_event=events.append)

    return asyncio.run(asyncio.wait_for(go(), timeout=300)), events


def test_an_outage_pauses_requests_and_spends_no_attempts(tmp_path: Path) -> None:
    server = FlakyServer(down_after=40, down_for=2)
    summary, events = run_against(server, tmp_path)
    progress = summary.datasets["d"]
    assert not summary.interrupted and progress.done == 300 and progress.failed_ids == 0
    assert 0 < progress.errors <= 16, "only the requests in flight when the server went away fail"
    assert server.refused_probes == 2 and server.generate_calls == 300
    assert any("requests paused" in e for e in events) and any("requests resume" in e for e in events)


def test_a_server_gone_for_good_stops_the_run_after_the_wait(tmp_path: Path) -> None:
    server = FlakyServer(down_after=40, down_for=10**9)
    summary, events = run_against(server, tmp_path, server_wait=1.0)
    progress = summary.datasets["d"]
    assert summary.interrupted and progress.done == server.generate_calls == 40
    assert progress.failed_ids == 0
    assert any("stopping (resume later)" in e for e in events)
    records = read_sample_ids(tmp_path / "out" / "d" / "raw_responses.jsonl")[0]
    assert len(records) == progress.done
