"""How fast reader.py scans raw_responses.jsonl, against a json.loads baseline and a raw read.

    python bench/scan.py [--size-mb 200] [--repeat 3]

Every figure is the best of ``--repeat`` runs over the same cached records (bench/common.py),
in this process, with the file in the page cache, once as the workbench writes them (compact)
and once as ``json.dumps`` writes them (default separators, as most Python writers do).
Targets, on both: the fast scan (read_rows without output ids, what stats needs) at least 5x
the json.loads baseline and at least 0.7 of the raw read.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from common import MB, STYLES, records_file

from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import DEFAULT_BLOCK_BYTES, iter_blocks, read_rows

BASELINE_TARGET = 5.0
RAW_TARGET = 0.7
ROW_FIELDS = (
    "sample_id",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "matched_stop",
    "e2e_latency",
    "ts",
)


def raw_read(path: Path) -> int:
    """Read the bytes in the readers' block size and count newlines."""
    lines = 0
    with open(path, "rb") as file:
        while data := file.read(DEFAULT_BLOCK_BYTES):
            lines += data.count(b"\n")
    return lines


def json_baseline(path: Path) -> int:
    """json.loads per line, keeping the fields the fast scan keeps."""
    rows = []
    with open(path, "rb") as file:
        for text in file:
            record = json.loads(text)
            rows.append(tuple(record.get(name) for name in ROW_FIELDS))
    return len(rows)


def fast_scan(path: Path) -> int:
    rows, problems = read_rows(path)
    assert not problems, problems[:3]
    return len(rows)


def stream_with_ids(path: Path) -> int:
    """Blocks with output ids, each dropped once counted (how an export reads)."""
    return sum(len(block.rows) for block in iter_blocks(path, with_output_ids=True))


def scan_ids(path: Path) -> int:
    ids, repeats = read_sample_ids(path)
    assert not repeats, repeats[:3]
    return len(ids)


def best_seconds(scan: Callable[[Path], int], path: Path, repeat: int, lines: int) -> float:
    """The shortest of repeat timed scans; each must see every line."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        seen = scan(path)
        best = min(best, time.perf_counter() - start)
        assert seen == lines, f"{scan.__name__} saw {seen} of {lines} lines"
    return best


def verdict(value: float, target: float) -> str:
    return "PASS" if value >= target else "MISS"


def measure(path: Path, repeat: int) -> dict[str, float]:
    """MB/s of every scan over path."""
    megabytes = path.stat().st_size / MB
    lines = raw_read(path)  # also warms the page cache
    print(f"file: {path} ({megabytes:.1f} MB, {lines:,} lines)")
    scans: dict[str, Callable[[Path], int]] = {
        "raw read + count newlines": raw_read,
        "json.loads per line (baseline)": json_baseline,
        "read_rows, no output ids (fast scan)": fast_scan,
        "read_sample_ids": scan_ids,
        "iter_blocks with output ids (streamed)": stream_with_ids,
    }
    rates: dict[str, float] = {}
    for label, scan in scans.items():
        rates[label] = megabytes / best_seconds(scan, path, repeat, lines)
        print(f"  {label:<40} {rates[label]:8.0f} MB/s")
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="file size (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    args = parser.parse_args(argv)

    results = {style: measure(records_file(args.size_mb, style=style), args.repeat)
               for style in STYLES}
    print(f"{'':<34}" + "".join(f"{style:>12}" for style in results) + "   target")
    for label, key, target in (
        ("fast scan / json.loads baseline", "json.loads per line (baseline)", BASELINE_TARGET),
        ("fast scan / raw read", "raw read + count newlines", RAW_TARGET),
    ):
        ratios = [rates["read_rows, no output ids (fast scan)"] / rates[key]
                  for rates in results.values()]
        verdicts = " ".join(verdict(r, target) for r in ratios)
        print(f"{label:<34}" + "".join(f"{r:>11.2f}x" for r in ratios)
              + f"   >= {target:g}  {verdicts}")


if __name__ == "__main__":
    main()
