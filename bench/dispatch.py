"""Dispatch benchmark: can the runner keep 150 or 512 requests in flight?

Starts the simulator in fixed-latency mode (every /generate answers after exactly L seconds),
runs a generation of N prompts through the real runner at concurrency C, and prints the
achieved request rate divided by the Little's-law bound C / L (over the time requests ran, from
the first one sent to the last record written; the whole call, set-up included, is printed too),
the client CPU per request,
and the simulator's peak in-flight gauge. The same load through httpx's default transport is
the baseline, measured in the same process.

Targets: ratio >= 0.95 at 150 (L = 1 s), >= 0.93 at 512 (L = 2 s), client CPU < 1 ms/request.

    python bench/dispatch.py [--rounds 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import load_manifest
from workbench.demo import start_simulator
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient, default_transport


@dataclass
class Result:
    transport: str
    concurrency: int
    latency: float
    requests: int
    wall: float
    window: float
    cpu: float
    peak: float

    @property
    def ratio(self) -> float:
        """Achieved rate while requests ran (first sent to last written) over C / L."""
        return (self.requests / self.window) / (self.concurrency / self.latency)

    @property
    def ratio_wall(self) -> float:
        """The same over the whole call, set-up (server probe, prompt loading) included."""
        return (self.requests / self.wall) / (self.concurrency / self.latency)

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.requests


def write_dataset(folder: Path, n: int) -> Path:
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"sample_id": i, "input_ids": [11, 12, 13, 14]}) + "\n"
                               for i in range(n)))
    manifest = folder / "datasets.yaml"
    manifest.write_text(
        "model_profile: kimi-k2.5\nsampling: {temperature: 0.0, max_new_tokens: 16}\n"
        "datasets:\n  - {name: bench, path: prompts.jsonl, input: input_ids}\n")
    return manifest


def active_window(raw: Path) -> float:
    """Seconds from the first request's start (ts - e2e_latency) to the last record written."""
    rows, _ = read_rows(raw)
    starts = [r.ts - r.e2e_latency for r in rows if r.ts is not None and r.e2e_latency is not None]
    ends = [r.ts for r in rows if r.ts is not None]
    return max(ends) - min(starts)


def peak_inflight(metrics: str) -> float:
    for family in text_string_to_metric_families(metrics):
        if family.name == "workbench_sim:peak_inflight_requests":
            return family.samples[0].value
    return float("nan")


async def one_run(url: str, manifest: Path, out: Path, concurrency: int,
                  transport: httpx.AsyncBaseTransport) -> tuple[int, float, float]:
    options = GenerateOptions(concurrency=concurrency, long_concurrency=concurrency,
                              progress_interval=3600, resume=False)
    async with SGLangClient(url, transport=transport) as client:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        summary = await run_generation(load_manifest(manifest), client, out, options)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return summary.datasets["bench"].done_this_run, wall, cpu


def measure(name: str, concurrency: int, latency: float, rounds: int, folder: Path) -> Result:
    n = concurrency * rounds
    manifest = write_dataset(folder, n)
    sim_args = {"fixed_latency": latency, "enable_metrics": True}
    server = start_simulator(folder / f"sim-{name}-{concurrency}.log", sim_args)
    try:
        transport = default_transport() if name == "httpx-aiohttp" else httpx.AsyncHTTPTransport()
        done, wall, cpu = asyncio.run(one_run(server.url, manifest, folder / "out", concurrency, transport))
        peak = peak_inflight(httpx.get(server.url + "/metrics").text)
    finally:
        server.stop()
    window = active_window(folder / "out" / "bench" / "raw_responses.jsonl")
    return Result(name, concurrency, latency, done, wall, window, cpu, peak)


def report(r: Result) -> None:
    print(f"{r.transport:>14} C={r.concurrency:<4} L={r.latency:.0f}s  {r.requests} req in {r.wall:5.2f}s  "
          f"rate/bound={r.ratio:.3f} (whole call {r.ratio_wall:.3f})  client CPU {r.cpu_ms:.2f} ms/req  sim peak in flight {r.peak:.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="requests per slot (N = C x rounds)")
    parser.add_argument("--quick", action="store_true", help="skip the httpx baseline")
    args = parser.parse_args()
    targets = {150: 0.95, 512: 0.93}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for concurrency, latency in ((150, 1.0), (512, 2.0)):
            rounds = max(2, args.rounds if concurrency == 150 else args.rounds // 2)
            ours = measure("httpx-aiohttp", concurrency, latency, rounds, Path(tmp))
            report(ours)
            if not args.quick:
                base = measure("httpx default", concurrency, latency, rounds, Path(tmp))
                report(base)
                print(f"{'':>14} aiohttp transport vs httpx default: {ours.ratio / base.ratio:.2f}x rate, "
                      f"{base.cpu_ms / ours.cpu_ms:.1f}x less CPU per request")
            hit = ours.ratio >= targets[concurrency] and ours.cpu_ms < 1.0
            ok &= hit
            print(f"{'':>14} target ratio >= {targets[concurrency]} and < 1 ms CPU: {'PASS' if hit else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
