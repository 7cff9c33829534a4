"""Auto concurrency benchmark: how close `auto` gets to the best fixed concurrency.

The simulator's Kimi-K2.5 profile (kimi-k2.5-8xrtx6000), untuned (mem_fraction_static 0.80)
and tuned (0.88, bf16 KV, hierarchical cache 48 GB), each measured with the real runner at
fixed concurrencies and at `auto`; then one run whose server restarts mid-run from the
untuned to the tuned configuration. Throughput is the server's own: the generation-token
counter of /metrics over the measurement window, in model time (wall time x --speed), after
a warm-up. The queue bound printed is the largest `sglang:num_queue_reqs` sampled in the
window. Prompts: random token ids of 600-1,400 tokens (512 shared by groups of them),
`max_new_tokens` 2,048.

Prints, per phase, each fixed point's output tok/s, auto's, and auto / best fixed
(target >= 0.95), with auto's mean cap and largest queue; after the restart, auto / best in
each phase and whether any sample was lost or written twice (a short dataset run to the
end across the restart).

    python bench/autoconc.py [--speed 50] [--window 600] [--concurrency 16,64,256,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.config import load_manifest
from workbench.generate.dispatch import Runner
from workbench.generate.plan import GenerateOptions
from workbench.rundir.line_index import read_sample_ids
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess, find_free_port, server_command
from workbench.server.metrics import parse_metrics

PROFILE = "kimi-k2.5-8xrtx6000"
UNTUNED: dict[str, Any] = {"mem_fraction_static": 0.80}
TUNED: dict[str, Any] = {"mem_fraction_static": 0.88, "kv_cache_dtype": "bf16",
                         "enable_hierarchical_cache": True, "hicache_size": 48}


def write_prompts(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 150_000) for _ in range(512)] for _ in range(64)]
    with path.open("w") as fh:
        for i in range(count):
            body = [rng.randrange(1000, 150_000) for _ in range(rng.randint(600, 1400) - 512)]
            fh.write(json.dumps({"sample_id": i, "input_ids": prefixes[i % 64] + body}) + "\n")
    manifest = path.with_suffix(".yaml")
    manifest.write_text("model_profile: kimi-k2.5\nsampling: {max_new_tokens: 2048, temperature: 1.0, "
                        f"top_p: 0.95}}\ndatasets:\n  - {{name: load, path: {path}, input: input_ids}}\n")
    return manifest


def start(args: dict[str, Any], speed: float, log: Path, port: int | None = None) -> ServerProcess:
    port = port or find_free_port()
    argv = server_command("sim", port=port, args={"profile": PROFILE, "speed": speed,
                                                  "enable_metrics": True, **args},
                          python=__import__("sys").executable)
    server = ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log)
    server.start()
    server.wait_ready(120)
    return server


class Window:
    """Generation tokens and queue samples of a server over model time."""

    def __init__(self, client: SGLangClient, speed: float) -> None:
        self.client, self.speed = client, speed
        self.queue: list[float] = []
        self.caps: list[int] = []

    async def tokens(self) -> float:
        text = await self.client.metrics()
        return parse_metrics(text or "").generation_tokens or 0.0

    async def measure(self, runner: Runner, warmup: float, window: float) -> float:
        await asyncio.sleep(warmup / self.speed)
        before, t0 = await self.tokens(), time.perf_counter()
        end = t0 + window / self.speed
        while time.perf_counter() < end:
            snap = parse_metrics(await self.client.metrics() or "")
            self.queue.append(snap.queued or 0.0)
            self.caps.append(runner.concurrency)
            await asyncio.sleep(min(0.5, window / self.speed / 20))
        return (await self.tokens() - before) / ((time.perf_counter() - t0) * self.speed)


async def point(manifest: Path, out: Path, url: str, speed: float, concurrency: int | str,
                warmup: float, window: float, auto_interval: float) -> tuple[float, Window]:
    async with SGLangClient(url) as client:
        runner = Runner(load_manifest(manifest), client, out,
                        GenerateOptions(concurrency=concurrency, progress_interval=3600,
                                        long_threshold=100_000, auto_interval=auto_interval,
                                        grace_period=0.1, seed=0))
        runner.load()
        runner.open(await client.server_info(), {})
        run = asyncio.create_task(runner.run())
        meter = Window(client, speed)
        tok_s = await meter.measure(runner, warmup, window)
        runner.request_stop()
        runner.request_stop()
        await run
    return tok_s, meter


def phase(name: str, args: dict[str, Any], work: Path, manifest: Path,
          opts: argparse.Namespace) -> tuple[float, float]:
    """(auto / best fixed, best fixed tok/s) of one server configuration."""
    results: dict[str, float] = {}
    auto_meter = None
    for c in [*opts.concurrency, "auto"]:
        server = start(args, opts.speed, work / f"{name}-{c}.log")
        try:
            tok_s, meter = asyncio.run(point(manifest, work / f"{name}-{c}", server.url, opts.speed, c,
                                             opts.warmup, opts.window, opts.auto_interval))
        finally:
            server.stop()
        results[str(c)] = tok_s
        if c == "auto":
            auto_meter = meter
        print(f"  {name} concurrency {c}: {tok_s:,.0f} output tok/s, queue max {max(meter.queue or [0]):.0f}",
              flush=True)
    best = max(v for k, v in results.items() if k != "auto")
    assert auto_meter is not None
    caps = auto_meter.caps or [0]
    print(f"{name}: auto / best fixed = {results['auto'] / best:.3f} (target >= 0.95); auto's cap "
          f"mean {sum(caps) / len(caps):.0f}, queue max {max(auto_meter.queue or [0]):.0f}", flush=True)
    return results["auto"] / best, best


async def restarted(manifest: Path, work: Path, opts: argparse.Namespace) -> tuple[float, float, bool]:
    """Auto across a restart from untuned to tuned: throughput in each phase, and whether the
    dataset (run to the end) holds every sample exactly once."""
    port = find_free_port()
    first = start(UNTUNED, opts.speed, work / "restart-a.log", port)
    out = work / "restart"
    try:
        async with SGLangClient(first.url) as client:
            runner = Runner(load_manifest(manifest), client, out,
                            GenerateOptions(concurrency="auto", progress_interval=3600,
                                            long_threshold=100_000, auto_interval=opts.auto_interval,
                                            seed=0, max_samples=opts.restart_samples))
            runner.load()
            runner.open(await client.server_info(), {})
            run = asyncio.create_task(runner.run())
            before = await Window(client, opts.speed).measure(runner, opts.warmup, opts.window)
            first.stop()
            second = start(TUNED, opts.speed, work / "restart-b.log", port)
            try:
                after = await Window(client, opts.speed).measure(runner, opts.warmup, opts.window)
                await run
            finally:
                second.stop()
    finally:
        first.stop()
    ids, duplicates = read_sample_ids(out / "load" / "raw_responses.jsonl")
    expected = {json.loads(line)["sample_id"] for line in (out / "load" / "prompts.jsonl").open()}
    whole = ids == expected and len(expected) == opts.restart_samples and not duplicates
    return before, after, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=50.0)
    parser.add_argument("--warmup", type=float, default=300.0, help="model seconds before the window")
    parser.add_argument("--window", type=float, default=600.0, help="model seconds measured")
    parser.add_argument("--concurrency", default="16,32,64,128,256,512,1024")
    parser.add_argument("--restart-samples", type=int, default=3000,
                        help="the restart run's dataset (enough to last both windows)")
    parser.add_argument("--auto-interval", type=float, default=0.5,
                        help="wall seconds between auto's readings of /metrics")
    opts = parser.parse_args()
    opts.concurrency = [int(c) for c in opts.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        manifest = write_prompts(work / "prompts.jsonl", 20_000)
        phases = {name: phase(name, args, work, manifest, opts)
                  for name, args in (("untuned", UNTUNED), ("tuned", TUNED))}
        before, after, whole = asyncio.run(restarted(manifest, work, opts))
    ratios = {name: ratio for name, (ratio, _) in phases.items()}
    ratios["restart, untuned phase"] = before / phases["untuned"][1]
    ratios["restart, tuned phase"] = after / phases["tuned"][1]
    print("auto / best fixed (target >= 0.95): " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    print(f"restart: every sample written exactly once: {whole}")


if __name__ == "__main__":
    main()
