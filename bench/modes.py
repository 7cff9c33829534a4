"""Modes benchmark: is the mix written the mix asked for, whole and under a budget?

On the simulator, the example function-calling chats (300, single turn) and tool-calling
conversations (120, ``turns: each``) are generated with two modes (``think`` 0.75,
``direct`` 0.25), whole and under ``max_tokens`` budgets that stop them part way. For each run
it prints the conversations written per mode against the weights times the conversations
written, and the largest gap; beside it, the gap a peer's draw would leave on the same
conversations: an independent coin per conversation (as the peers draw 75% thinking at
random), the median over 101 seeds.

Target: a gap below one conversation in every run (the draw is exact within one sample for
the whole dataset and for any prefix of its send order, so for any budget).

    python bench/modes.py [--budgets 3000,8000,20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from workbench.config import load_manifest
from workbench.demo import start_simulator
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.resources import data_dir
from workbench.server.client import SGLangClient

MODES = [{"name": "think", "weight": 0.75, "chat_template_kwargs": {"thinking": True}},
         {"name": "direct", "weight": 0.25, "chat_template_kwargs": {"thinking": False},
          "sampling": {"temperature": 0.6}}]
SHARE = {"think": 0.75, "direct": 0.25}


def write_manifest(folder: Path, budget: int | None) -> Path:
    examples = data_dir("examples")
    extra = {} if budget is None else {"max_tokens": budget}
    path = folder / "modes.yaml"
    path.write_text(json.dumps({
        "model_profile": "kimi-k2.5", "tokenizer": str(examples / "tokenizer"),
        "sampling": {"temperature": 1.0, "max_new_tokens": 256},
        "datasets": [
            {"name": "chats", "path": str(examples / "data" / "glaive_fc.jsonl"),
             "input": "messages", "modes": MODES, **extra},
            {"name": "turns", "path": str(examples / "data" / "tool_turns.jsonl"),
             "input": "messages", "turns": "each", "modes": MODES, **extra}]}))
    return path


async def generate(url: str, manifest: Path, out: Path) -> None:
    options = GenerateOptions(seed=11, concurrency=8, progress_interval=3600)
    async with SGLangClient(url) as client:
        await run_generation(load_manifest(manifest), client, out, options)


def written(out: Path, name: str) -> Counter[str]:
    """Conversations written per mode (a conversation's turns count once)."""
    seen: dict[object, str] = {}
    for line in (out / name / "raw_responses.jsonl").read_text().splitlines():
        record = json.loads(line)
        seen.setdefault(record["sample_id"], record["mode"])
    return Counter(seen.values())


def gap(counts: Counter[str]) -> float:
    total = sum(counts.values())
    return max(abs(counts[name] - share * total) for name, share in SHARE.items())


def coin_gap(total: int) -> float:
    """The median gap of independent seeded coins (0.75 think) over `total` conversations."""
    gaps = []
    for seed in range(101):
        rng = random.Random(seed)
        think = sum(rng.random() < SHARE["think"] for _ in range(total))
        gaps.append(abs(think - SHARE["think"] * total))
    return statistics.median(gaps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="3000,8000,20000",
                        help="max_tokens budgets to run besides the whole datasets")
    args = parser.parse_args()
    budgets: list[int | None] = [None, *(int(b) for b in args.budgets.split(","))]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = start_simulator(folder / "sim.log", {"profile": "fast", "random_seed": 0})
        try:
            print(f"{'run':>14} {'dataset':>7} {'think':>6} {'direct':>6} {'want think':>10} "
                  f"{'gap':>5} {'coin gap':>8}")
            for budget in budgets:
                run = folder / f"run-{budget or 'whole'}"
                run.mkdir()
                asyncio.run(generate(server.url, write_manifest(run, budget), run / "out"))
                for name in ("chats", "turns"):
                    counts = written(run / "out", name)
                    total = sum(counts.values())
                    worst = max(worst, gap(counts))
                    label = "whole" if budget is None else f"budget {budget}"
                    print(f"{label:>14} {name:>7} {counts['think']:>6} {counts['direct']:>6} "
                          f"{SHARE['think'] * total:>10.2f} {gap(counts):>5.2f} "
                          f"{coin_gap(total):>8.1f}")
        finally:
            server.stop()
    verdict = "PASS" if worst < 1 else "FAIL"
    print(f"largest gap {worst:.2f} conversations (target < 1): {verdict}")
    return 0 if worst < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
