"""Simulator pace: output tokens per second it sustains, streaming and not, against a baseline.

Starts `workbench sim --speed S` (fast enough that the simulator's own CPU is the limit) from
this checkout's sources and from a baseline revision's (extracted with `git archive`), sends
the same N greedy prompts at concurrency C to each over aiohttp, streaming and not, and prints
the generated tokens per second of each and the ratio current / baseline (target: >= 0.90).
The replies' `completion_tokens` are summed, so both sides count the same outputs. Rounds
alternate baseline and current (the machine is shared; its load drifts) and the best round
of each counts.

    python bench/sim_pace.py [--baseline REV] [--rounds 3] [--requests 400] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"ready on (http://\S+)")


def extract(revision: str, into: Path) -> Path:
    """The baseline revision's src/ folder."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "src"], check=True,
                             capture_output=True).stdout
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


@contextmanager
def simulator(src: Path, speed: float) -> Iterator[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, "-m", "workbench", "sim", "--port", "0", "--speed", str(speed)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        match = READY.search(process.stdout.readline())
        if not match:
            raise SystemExit("the simulator did not start")
        yield match.group(1)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def payload(index: int, stream: bool) -> dict[str, object]:
    ids = [100 + (index * 7919 + step * 31) % 7000 for step in range(200)]
    return {"input_ids": ids, "stream": stream,
            "sampling_params": {"max_new_tokens": 256, "temperature": 0.0}}


async def one(session: aiohttp.ClientSession, url: str, index: int, stream: bool) -> int:
    async with session.post(f"{url}/generate", json=payload(index, stream)) as response:
        if not stream:
            return int((await response.json())["meta_info"]["completion_tokens"])
        last = b""
        async for line in response.content:
            if line.startswith(b"data: {"):
                last = line
        return int(json.loads(last[6:])["meta_info"]["completion_tokens"])


async def load(url: str, requests: int, concurrency: int, stream: bool) -> float:
    """Generated tokens per second over the whole load."""
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def bounded(index: int) -> int:
            async with gate:
                return await one(session, url, index, stream)

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(bounded(index) for index in range(requests))))
        return tokens / (time.perf_counter() - started)


def measure(src: Path, args: argparse.Namespace) -> dict[str, float]:
    with simulator(src, args.speed) as url:
        asyncio.run(load(url, 20, 20, False))  # warm up
        return {
            mode: asyncio.run(load(url, args.requests, args.concurrency, mode == "stream"))
            for mode in ("no stream", "stream")
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git revision of the baseline")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--speed", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    baseline: dict[str, float] = {}
    current: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        baseline_src = extract(args.baseline, Path(folder))
        for _ in range(args.rounds):
            for best, src in ((baseline, baseline_src), (current, ROOT / "src")):
                for mode, rate in measure(src, args).items():
                    best[mode] = max(best.get(mode, 0.0), rate)
    print(f"{args.requests} requests, 200 prompt + up to 256 output tokens, "
          f"{args.concurrency} in flight, --speed {args.speed:g}, best of {args.rounds} rounds")
    for mode in ("no stream", "stream"):
        ratio = current[mode] / baseline[mode]
        print(f"{mode:10} baseline {baseline[mode]:9.0f} tok/s  current {current[mode]:9.0f} "
              f"tok/s  ratio {ratio:.2f} (target >= 0.90)")


if __name__ == "__main__":
    main()
