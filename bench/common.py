"""Realistic raw_responses.jsonl content for benchmarks, generated once and cached.

Records are shaped like Kimi-K2.5 thinking-mode replies: completion lengths drawn from a
lognormal around 1,000 tokens (cut at ``max_new_tokens``, then finish_reason "length"),
reasoning ids, the think-end id, an answer and the end id, ids spread over the whole
163,840-token vocabulary. Files land in bench/data/ (git-ignored), named by size and seed.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np

from workbench.profiles import get_profile
from workbench.rundir.records import Record, encode_line

DATA_DIR = Path(__file__).resolve().parent / "data"
MB = 1_000_000

_PROFILE = get_profile("kimi-k2.5")


def iter_records(
    *,
    seed: int = 0,
    median_completion: int = 1000,
    max_new_tokens: int = 16384,
    start_ts: float = 1.75e9,
) -> Iterator[Record]:
    """An endless, deterministic stream of flat records with sample ids 0, 1, 2, ..."""
    rng = np.random.default_rng(seed)
    ts = start_ts
    sample_id = 0
    while True:
        record = _record(rng, sample_id, median_completion, max_new_tokens, ts)
        yield record
        sample_id += 1
        ts += record.e2e_latency / 150  # about 150 requests in flight


def _record(
    rng: np.random.Generator, sample_id: int, median: int, max_new_tokens: int, ts: float
) -> Record:
    wanted = max(2, round(rng.lognormal(math.log(median), 0.7)))
    completion = min(wanted, max_new_tokens)
    stopped = wanted <= max_new_tokens
    prompt = max(16, round(rng.lognormal(math.log(1000), 0.5)))
    cached = int(rng.integers(0, prompt)) // 16 * 16 if rng.random() < 0.3 else 0
    return Record(
        sample_id=sample_id,
        output_ids=_output_ids(rng, completion, stopped),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        finish_reason="stop" if stopped else "length",
        matched_stop=_PROFILE.end_ids[0] if stopped else None,
        e2e_latency=round(completion / rng.uniform(5.0, 12.0), 3),
        ts=round(ts, 3),
    )


def _output_ids(rng: np.random.Generator, count: int, stopped: bool) -> list[int]:
    """Reasoning ids, the think-end id at about 70%, answer ids, and the end id if stopped."""
    ids = rng.integers(0, _PROFILE.vocab_size, size=count)
    if _PROFILE.think_end is not None:
        ids[int(count * 0.7)] = _PROFILE.think_end
    if stopped:
        ids[-1] = _PROFILE.end_ids[0]
    listed: list[int] = ids.tolist()
    return listed


def best_seconds(
    action: Callable[[], object], repeat: int = 1, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The least time, by clock, that one of repeat calls of action took."""
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        action()
        best = min(best, clock() - start)
    return best


def dumps_line(record: Record) -> bytes:
    """A record the way most Python writers write one: ``json.dumps`` default separators."""
    return json.dumps(msgspec.to_builtins(record)).encode() + b"\n"


STYLES: dict[str, Callable[[Record], bytes]] = {"compact": encode_line, "dumps": dumps_line}


def write_records(path: Path, size_bytes: int, *, seed: int = 0, style: str = "compact") -> int:
    """Write records to path until it holds at least size_bytes; return how many.

    style: "compact" (the workbench's writer) or "dumps" (``json.dumps`` defaults).
    """
    encode = STYLES[style]
    count = 0
    written = 0
    with open(path, "wb", buffering=1 << 20) as file:
        for record in iter_records(seed=seed):
            if written >= size_bytes:
                break
            written += file.write(encode(record))
            count += 1
    return count


def records_file(size_mb: float, *, seed: int = 0, style: str = "compact") -> Path:
    """A cached file of about size_mb megabytes of records, generated on first use."""
    suffix = "" if style == "compact" else f"-{style}"
    path = DATA_DIR / f"raw_responses-{size_mb:g}MB-seed{seed}{suffix}.jsonl"
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        write_records(partial, int(size_mb * MB), seed=seed, style=style)
        os.replace(partial, path)
    return path
