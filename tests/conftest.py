"""Shared fixtures: simulators on real sockets, the `workbench` command as a subprocess, and
bounded waits on events.

Tests wait on events (a line written, a port open, a counter moved, a process gone), never on
a pause, and never assert how long something took. `wait_until` is that wait: it polls a real
condition and fails loudly, naming it, after a timeout that only bounds a broken run (make it
generous: a loaded machine is slow, not wrong).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from workbench.demo import start_simulator
from workbench.server.launch import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def anyio_backend() -> str:
    """The event loop of the async tests (pytest's anyio plugin): asyncio, as the workbench."""
    return "asyncio"


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start simulators (fast profile, metrics on) on free ports; all are stopped afterwards."""
    servers: list[ServerProcess] = []

    def start(**args: Any) -> ServerProcess:
        flags = {"profile": "fast", "enable_metrics": True, "random_seed": 0, **args}
        server = start_simulator(tmp_path / f"sim-{len(servers)}.log", flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def workbench(*args: str, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `python -m workbench ARGS` and capture its output."""
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def write_manifest(folder: Path, datasets: list[dict[str, Any]], **top: Any) -> Path:
    """A dataset manifest (JSON is valid YAML) with the example tokenizer by default."""
    body = {"model_profile": "kimi-k2.5", "tokenizer": str(EXAMPLES / "tokenizer"),
            "sampling": {"temperature": 0.0, "max_new_tokens": 256}, "datasets": datasets, **top}
    path = folder / "datasets.yaml"
    path.write_text(json.dumps(body, indent=1))
    return path


def generate_run(base: Path, datasets: list[dict[str, Any]]) -> Path:
    """BASE/out: the datasets generated on a simulator (fast profile, seed 0) that is then stopped."""
    manifest = write_manifest(base, datasets)
    server = start_simulator(base / "sim.log", {"profile": "fast", "random_seed": 0})
    try:
        done = workbench("generate", "--datasets", str(manifest), "--server", server.url,
                         "--out", str(base / "out"), "--progress-interval", "30")
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    return base / "out"


BENCH = EXAMPLES / "benchmarks" / "tiny_bench.jsonl"
QUOTED = ("some recent order sends a special service after that current city. The company "
          "includes a bad team now.")  # tiny_bench's tb-3, in words the example tokenizer knows


def text_prompts(folder: Path, count: int) -> Path:
    """Text prompts of words the example tokenizer knows; every fourth quotes tiny_bench."""
    rng = random.Random(11)
    words = QUOTED.replace(".", "").split()
    path = folder / "texts.jsonl"
    with open(path, "w") as out:
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(30))
            out.write(json.dumps({"sample_id": i, "text": f"{QUOTED} {text}" if i % 4 == 0
                                  else text}) + "\n")
    return path


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_until(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> None:
    """Return once `predicate()` is true; AssertionError naming `what` after `timeout` seconds
    (`what` may be a function: told as it is then, e.g. with the last state the predicate saw)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            told = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {told}")
        time.sleep(interval)


async def wait_until_async(predicate: Callable[[], Awaitable[object]], timeout: float, what: str,
                           interval: float = 0.02) -> None:
    """`wait_until` in an async test: `predicate` is awaited, the event loop keeps running."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await anyio.sleep(interval)
