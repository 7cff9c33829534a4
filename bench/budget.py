"""Budget benchmark: how far a token budget overshoots, and how fair the subset it keeps is.

Runs the real runner against the simulator (fast profile, `--speed`) twice:

1. Overshoot: the demo manifest (params/datasets.demo.yaml) as `make demo` runs it; for
   every dataset with a token budget, prints (tokens past the budget) / budget and the
   share of the budget kept, with the projection as it is and, as the baseline, as it
   was (one pseudo request for the tail not seen yet and a margin of two standard
   deviations only). Target: at most 0.02.
2. Bias: a file of 5,000 token-id prompts sorted by length (lognormal around 600 tokens)
   with a budget of 20% of the tokens the whole file would produce (its prompts times the
   mean completion of a random 500 of them), sent in file order (the baseline) and in seeded
   random order; prints the sent subset's mean prompt length / the file's. Target: within
   0.95-1.05 in random order (file order: far below).

    python bench/budget.py [--speed 4] [--seeds 3] [--demo-speed 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from workbench.config import load_manifest
from workbench.demo import DEMO_SIM_ARGS, start_simulator
from workbench.generate import budget
from workbench.generate.plan import GenerateOptions
from workbench.generate.progress import RunSummary
from workbench.generate.session import run_generation
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient

ROOT = Path(__file__).resolve().parent.parent


def simulate(manifest_path: Path, out: Path, speed: float, seed: int, **options: object) -> RunSummary:
    server = start_simulator(out.parent / f"{out.name}.sim.log",
                             {"profile": "fast", "speed": speed, "enable_metrics": True,
                              "random_seed": seed})
    try:
        async def go() -> RunSummary:
            async with SGLangClient(server.url) as client:
                opts = GenerateOptions(progress_interval=3600, seed=seed, **options)  # type: ignore[arg-type]
                return await run_generation(load_manifest(manifest_path), client, out, opts)
        return asyncio.run(go())
    finally:
        server.stop()


def overshoot(work: Path, speed: float, seed: int, rule: str) -> list[tuple[float, float]]:
    """(overshoot, share kept) of each budget of the demo run with `seed`."""
    summary = simulate(ROOT / "params" / "datasets.demo.yaml", work / f"demo-{rule}-{seed}", speed, seed)
    ratios = []
    for p in summary.datasets.values():
        if p.max_tokens:
            ratios.append((p.overshoot / p.max_tokens, p.completion_tokens / p.max_tokens))
            print(f"  {rule} seed {seed} {p.name}: {p.completion_tokens:,} tokens for a budget of "
                  f"{p.max_tokens:,}: overshoot {ratios[-1][0]:.3f}")
    return ratios


@contextlib.contextmanager
def former_rule() -> Iterator[None]:
    """The projection as it was: one pseudo request for the unseen tail, 2 sd of margin."""
    saved = budget.TAIL_PRIOR, budget.ALPHA
    budget.TAIL_PRIOR, budget.ALPHA = 1, 1.0  # ALPHA 1: no room kept for the count at the cap
    try:
        yield
    finally:
        budget.TAIL_PRIOR, budget.ALPHA = saved


def overshoots(work: Path, speed: float, seeds: int) -> None:
    for rule in ("now", "former"):
        with former_rule() if rule == "former" else contextlib.nullcontext():
            runs = [r for seed in range(seeds) for r in overshoot(work, speed, seed, rule)]
        over = [o for o, _ in runs]
        kept = [k for _, k in runs]
        print(f"{rule}: overshoot / budget max {max(over):.3f}, past 0.02 in {sum(o > 0.02 for o in over)} "
              f"of {len(over)}; share kept mean {statistics.fmean(kept):.3f}, min {min(kept):.3f}"
              + (" (target: overshoot <= 0.02)" if rule == "now" else " (baseline)"))


def sorted_dataset(work: Path, count: int = 5000) -> tuple[Path, float]:
    rng = random.Random(0)
    lengths = sorted(min(4000, max(16, round(rng.lognormvariate(math.log(600), 0.6))))
                     for _ in range(count))
    rows = [{"sample_id": i, "input_ids": [rng.randrange(1000, 100_000) for _ in range(n)]}
            for i, n in enumerate(lengths)]
    path = work / "sorted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, statistics.fmean(len(r["input_ids"]) for r in rows)


def bias(work: Path, speed: float, seed: int, data: Path, file_mean: float, budget: int) -> dict[str, float]:
    ratios = {}
    for order in ("file", "random"):
        manifest = work / f"bias-{order}-{seed}.yaml"
        manifest.write_text(
            "model_profile: kimi-k2.5\nsampling: {max_new_tokens: 1024}\ndatasets:\n"
            f"  - {{name: sorted, path: {data}, input: input_ids, max_tokens: {budget}, "
            f"order: {order}}}\n")
        out = work / f"bias-{order}-{seed}"
        simulate(manifest, out, speed, seed, long_threshold=100_000)
        rows, _ = read_rows(out / "sorted" / "raw_responses.jsonl")
        ratios[order] = statistics.fmean(r.prompt_tokens for r in rows) / file_mean
        print(f"  seed {seed} order {order}: {len(rows)} prompts sent, mean prompt length "
              f"{ratios[order] * file_mean:,.0f} / file {file_mean:,.0f} = {ratios[order]:.3f}")
    return ratios


def whole_file_tokens(work: Path, speed: float, data: Path, rows: int = 5000) -> int:
    manifest = work / "whole.yaml"
    manifest.write_text("model_profile: kimi-k2.5\nsampling: {max_new_tokens: 1024}\ndatasets:\n"
                        f"  - {{name: sorted, path: {data}, input: input_ids}}\n")
    summary = simulate(manifest, work / "whole", speed, 0, long_threshold=100_000, max_samples=500)
    p = summary.datasets["sorted"]
    return round(p.completion_tokens / p.done * rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=4.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--demo-speed", type=float, default=DEMO_SIM_ARGS["speed"],
                        help="the simulator's speed for the overshoot runs (the demo's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("overshoot on the demo datasets (tokens past the budget / budget):")
        overshoots(work, args.demo_speed, args.seeds)
        data, file_mean = sorted_dataset(work)
        total = whole_file_tokens(work, args.speed, data)
        budget = total // 5
        print(f"bias: a file sorted by prompt length, 20% budget ({budget:,} of {total:,} tokens):")
        runs = [bias(work, args.speed, seed, data, file_mean, budget) for seed in range(args.seeds)]
    for order in ("file", "random"):
        values = [r[order] for r in runs]
        print(f"mean prompt length sent / file, order {order}: "
              f"{min(values):.3f} .. {max(values):.3f}" + (" (target 0.95 .. 1.05)" if order == "random" else " (baseline)"))


if __name__ == "__main__":
    main()
