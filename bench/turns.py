"""Turns benchmark: does regenerating conversations turn by turn keep the pipeline full?

On the simulator, a ``turns: each`` run of N conversations of T user turns (every turn waits
for the one before it) against a single-turn run that sends the same requests: the prompts
the turns run sent (its prompts.jsonl, every turn's ids) as an ``input_ids`` dataset, so the
requests, their prompt lengths and (the simulator's outputs depend on the prompt and the
seed) their reply lengths are the same. Prints each run's output tok/s over the time its
requests ran and the ratio turns / single-turn.

Target: ratio >= 0.9. What a turns run cannot hide is its tail: once no conversation is left
to start, the last ones' remaining turns run one after the other in a thinning batch (about
one chain of turns x reply time), a fixed cost a short job shows and a long one does not
(measured here: 400 conversations at concurrency 150, 0.90; 1,500, 0.97).

    python bench/turns.py [--conversations 200] [--turns 4] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from workbench.config import load_manifest
from workbench.demo import start_simulator
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.resources import data_dir
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient

WORDS = ["the", "city", "sends", "a", "special", "service", "after", "that", "current", "order", "the", "company", "includes", "a", "bad", "team", "now"]


def write_conversations(folder: Path, count: int, turns: int) -> Path:
    rng = random.Random(3)
    path = folder / "chats.jsonl"
    with open(path, "w") as out:
        for i in range(count):
            messages = [{"role": "system", "content": "you are kind"}]
            for _ in range(turns):
                messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=20))})
                messages.append({"role": "assistant", "content": "an answer"})
            out.write(json.dumps({"sample_id": i, "messages": messages}) + "\n")
    return path


def write_manifest(folder: Path, name: str, dataset: str, max_new_tokens: int) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({
        "model_profile": "kimi-k2.5", "tokenizer": str(data_dir("examples") / "tokenizer"),
        "sampling": {"temperature": 1.0, "max_new_tokens": max_new_tokens},
        "datasets": [{"name": name, "order": "file", **json.loads(dataset)}]}))
    return path


async def run(url: str, manifest: Path, out: Path, concurrency: int) -> float:
    options = GenerateOptions(concurrency=concurrency, long_concurrency=concurrency,
                              progress_interval=3600, resume=False)
    async with SGLangClient(url) as client:
        start = time.perf_counter()
        await run_generation(load_manifest(manifest), client, out, options)
        return time.perf_counter() - start


def output_rate(raw: Path) -> tuple[int, int, float]:
    """(records, completion tokens, tok/s from the first request's start to the last record)."""
    rows, _ = read_rows(raw)
    starts = [r.ts - r.e2e_latency for r in rows if r.ts is not None and r.e2e_latency is not None]
    ends = [r.ts for r in rows if r.ts is not None]
    tokens = sum(r.completion_tokens or 0 for r in rows)
    return len(rows), tokens, tokens / (max(ends) - min(starts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = start_simulator(folder / "sim.log", {"profile": "fast", "random_seed": 0})
        try:
            chats = write_conversations(folder, args.conversations, args.turns)
            each = write_manifest(folder, "each", json.dumps(
                {"path": str(chats), "input": "messages", "turns": "each"}), args.max_new_tokens)
            asyncio.run(run(server.url, each, folder / "out-each", args.concurrency))
            sent = folder / "out-each" / "each" / "prompts.jsonl"
            flat = folder / "flat.jsonl"
            flat.write_text("".join(
                json.dumps({"sample_id": i, "input_ids": json.loads(line)["input_ids"]}) + "\n"
                for i, line in enumerate(sent.read_text().splitlines())))
            single = write_manifest(folder, "single", json.dumps(
                {"path": str(flat), "input": "input_ids"}), args.max_new_tokens)
            asyncio.run(run(server.url, single, folder / "out-single", args.concurrency))
        finally:
            server.stop()
        n_each, tok_each, rate_each = output_rate(folder / "out-each" / "each" / "raw_responses.jsonl")
        n_single, tok_single, rate_single = output_rate(
            folder / "out-single" / "single" / "raw_responses.jsonl")
    print(f"turns: each   {n_each} requests ({args.conversations} conversations x {args.turns} "
          f"turns), {tok_each} tokens, {rate_each:.0f} output tok/s")
    print(f"single-turn   {n_single} requests, {tok_single} tokens, {rate_single:.0f} output tok/s")
    ratio = rate_each / rate_single
    print(f"ratio turns / single-turn: {ratio:.2f} (target >= 0.9: {'PASS' if ratio >= 0.9 else 'MISS'})")
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
