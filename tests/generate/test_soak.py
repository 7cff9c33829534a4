"""A short run of bench/soak.py: SIGKILLs, a server restart, faults, torn lines, then a full run."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from conftest import ROOT, write_manifest

from workbench.config import load_manifest
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.rundir.records import read_sample_ids
from workbench.server.client import SGLangClient


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_short_soak_loses_and_repeats_nothing(tmp_path: Path) -> None:
    soak = load_soak()
    config = soak.SoakConfig(cycles=5, samples=240, seed=11, restarts=1, torn_rate=1.0,
                             kill_after=(0.8, 2.5), work=tmp_path)
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
    """A MockTransport handler that refuses connections between two moments."""

    def __init__(self, down_from: float, down_for: float) -> None:
        self.down_from, self.down_for = down_from, down_for
        self.started: float | None = None
        self.generate_calls = 0

    def down(self) -> bool:
        if self.started is None:
            return False
        elapsed = time.monotonic() - self.started
        return self.down_from <= elapsed < self.down_from + self.down_for

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "m"})
        self.started = self.started or time.monotonic()
        if self.down():
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

    return asyncio.run(go()), events


def test_an_outage_pauses_requests_and_spends_no_attempts(tmp_path: Path) -> None:
    server = FlakyServer(down_from=0.1, down_for=1.5)
    summary, events = run_against(server, tmp_path)
    progress = summary.datasets["d"]
    assert not summary.interrupted and progress.done == 300 and progress.failed_ids == 0
    assert progress.errors <= 16, "only the requests in flight when the server went away fail"
    assert any("requests paused" in e for e in events) and any("requests resume" in e for e in events)


def test_a_server_gone_for_good_stops_the_run_after_the_wait(tmp_path: Path) -> None:
    server = FlakyServer(down_from=0.1, down_for=3600)
    started = time.monotonic()
    summary, events = run_against(server, tmp_path, server_wait=1.0)
    progress = summary.datasets["d"]
    assert summary.interrupted and 0 < progress.done < 300 and progress.failed_ids == 0
    assert time.monotonic() - started < 15
    assert any("stopping" in e for e in events)
    records = read_sample_ids(tmp_path / "out" / "d" / "raw_responses.jsonl")[0]
    assert len(records) == progress.done
