"""What the data-quality checks add to `workbench validate`: first read and a grown run.

    python bench/quality.py [--size-mb 200] [--grow 0.01] [--repeat 1] [--workers N]

The run is bench/validate.py's (one dataset of bench/common.py's Kimi-K2.5-shaped records and
their prompts); `--size-mb 1250` is the real job's size (88k records). Three validations of the
same run, in this process's page cache, without the scan cache:

    validate alone     the scan with the quality figures switched off in this process (the
                       repeated-n-gram share, digest, MinHash signature and benchmark overlap
                       of each reply, and the duplicate and contamination comparisons), the
                       baseline: what validate cost before the checks
    + dedup, loops     validate as it is: degeneracy rules, exact and near duplicates
    + contamination    the same with --decontaminate examples/benchmarks/tiny_bench.jsonl,
                       replies read as words through the example tokenizer

then the same after `--grow` more records are appended to a copy of the run whose scan is
cached (only the new records are read; the comparisons run over the whole run). Their
prompts are in prompts.jsonl from the start, as generate writes it whole before it sends.
Targets: dedup + contamination + degeneracy at most 1.5x validate alone on the first read,
and a grown run at most 0.2x validate alone's first read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from common import MB, best_seconds, iter_records
from validate import DATASET, bench_run

import workbench.analyze.scan as scan_module
from workbench import sketch
from workbench.analyze.quality import Decontamination
from workbench.analyze.validate import validate_run
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE
from workbench.rundir.records import PromptRecord, encode_line
from workbench.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
BENCHMARK = ROOT / "examples" / "benchmarks" / "tiny_bench.jsonl"
TOKENIZER = ROOT / "examples" / "tokenizer"


@contextlib.contextmanager
def quality_off() -> Iterator[None]:
    """The scan without the quality figures and comparisons (zeros in their columns)."""
    saved = (sketch.repeat_share, scan_module.add_quality, scan_module.data_findings,
             scan_module.prompt_figures)

    def no_repeat(ids: Any, starts: Any, ends: Any, n: int = 10) -> np.ndarray:
        return np.zeros(len(starts), dtype=np.float32)

    def no_figures(columns: Any, ids: Any, starts: Any, ends: Any, repeat: list[float],
                   special: list[int], decontaminate: Any) -> None:
        count = len(starts)
        columns.repeat_share.extend(repeat)
        columns.special_ids.extend(special)
        columns.digest.extend([0] * count)
        columns.signature.extend([b""] * count)
        columns.overlap.extend([0] * count)

    def no_findings(run: Any, *args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        return {ds.name: [] for ds in run.datasets}

    sketch.repeat_share = no_repeat  # type: ignore[assignment]
    scan_module.add_quality = no_figures  # type: ignore[assignment]
    scan_module.data_findings = no_findings  # type: ignore[assignment]
    scan_module.prompt_figures = lambda *args, **kwargs: {}  # type: ignore[assignment]
    try:
        yield
    finally:
        (sketch.repeat_share, scan_module.add_quality, scan_module.data_findings,
         scan_module.prompt_figures) = saved


def grown_records(run: Path, share: float) -> list[Any]:
    """`share` more records (new sample ids) for the run."""
    with open(run / DATASET / RAW_FILE, "rb") as file:
        existing = sum(1 for _ in file)
    records = iter_records(seed=7)
    grown = [next(records) for _ in range(max(1, int(existing * share)))]
    for record in grown:
        record.sample_id = existing + int(record.sample_id)
    return grown


def add_prompts(run: Path, records: list[Any]) -> None:
    """The records' prompts appended to prompts.jsonl."""
    with open(run / DATASET / PROMPTS_FILE, "ab") as out:
        out.writelines(encode_line(PromptRecord(sample_id=r.sample_id,
                                                input_ids=[7, 8, 9, int(r.sample_id)]))
                       for r in records)


def add_records(run: Path, records: list[Any]) -> None:
    """The records appended to raw_responses.jsonl."""
    with open(run / DATASET / RAW_FILE, "ab") as out:
        out.writelines(encode_line(record) for record in records)


def timed_growth(run: Path, share: float, action: Callable[[Path], object]) -> float:
    """Seconds of `action` on a copy of the run grown by `share` more records, its scan
    cached before. As on a real job, prompts.jsonl holds their prompts from the start
    (generate writes it whole before it sends anything): only the replies grow."""
    with tempfile.TemporaryDirectory(dir=run.parent) as folder:
        copy = Path(folder) / "run"
        shutil.copytree(run, copy)
        records = grown_records(copy, share)
        add_prompts(copy, records)
        action(copy)  # cached
        add_records(copy, records)
        return best_seconds(lambda: action(copy), 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="records file size (200)")
    parser.add_argument("--grow", type=float, default=0.01, help="share of records appended (0.01)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (1)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (CPU count)")
    args = parser.parse_args(argv)

    run = bench_run(args.size_mb)
    megabytes = (run / DATASET / RAW_FILE).stat().st_size / MB
    benchmarks = Decontamination.load([BENCHMARK], tokenizer=load_tokenizer(TOKENIZER))
    report = validate_run(run, workers=args.workers, cache=False)  # warms the page cache
    print(f"run: {run} ({megabytes:.0f} MB, {report.datasets[DATASET].records:,} records, "
          f"{os.cpu_count()} CPUs)")
    print("findings: " + ", ".join(f"{f.rule} {f.count}" for f in report.datasets[DATASET].findings))

    def check(decontaminate: Decontamination | None = None, cache: bool = False) -> Callable[[Path], object]:
        return lambda path: validate_run(path, workers=args.workers, cache=cache,
                                         decontaminate=decontaminate)

    with quality_off():
        alone = best_seconds(lambda: check()(run), args.repeat)
        alone_grown = timed_growth(run, args.grow, check(cache=True))
    dedup = best_seconds(lambda: check()(run), args.repeat)
    dedup_grown = timed_growth(run, args.grow, check(cache=True))
    both = best_seconds(lambda: check(benchmarks)(run), args.repeat)
    both_grown = timed_growth(run, args.grow, check(benchmarks, cache=True))

    rows = [("validate alone", alone, alone_grown), ("+ dedup, loops", dedup, dedup_grown),
            ("+ contamination", both, both_grown)]
    print(f"{'':<18} {'first read':>12} {'x alone':>8} {'grown ' + format(args.grow, '.0%'):>12} "
          f"{'x alone first':>14}")
    for label, first, grown in rows:
        print(f"{label:<18} {first:>11.2f}s {first / alone:>8.2f} {grown:>11.2f}s {grown / alone:>14.2f}")
    first_ok, grown_ok = both / alone <= 1.5, both_grown / alone <= 0.2
    print(f"target: first read <= 1.5x validate alone: {both / alone:.2f}x "
          f"{'PASS' if first_ok else 'MISS'}; grown run <= 0.2x: {both_grown / alone:.2f}x "
          f"{'PASS' if grown_ok else 'MISS'}")
    sys.exit(0)


if __name__ == "__main__":
    main()
