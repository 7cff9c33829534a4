"""How fast the explorer answers a control change on a 100k-record run, against reading the run.

    python bench/explorer.py [--records 100000] [--repeat 5]

The run (two datasets of bench/common.py's records, with short replies so that the files
stay small; cached in bench/data/) is loaded once by an interactive Explorer with its widgets
built (controls, two scatter FigureWidgets, the histogram). Figures: the baseline, what the
old notebook paid for every change (loading the run again: scan through the cache and the
record frame), then the median time of filtering alone and of `Explorer.update` (filter +
every figure redrawn) for each kind of change, and their ratio to the baseline. Target: an
update well under a second.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from common import DATA_DIR, iter_records

from workbench.analyze import explore
from workbench.analyze.scan import scan_run
from workbench.report.explorer import Explorer
from workbench.rundir.layout import RAW_FILE
from workbench.rundir.records import encode_line

DATASETS = ("alpha", "beta")


def bench_run(records: int) -> Path:
    """A cached run directory of `records` records split over DATASETS."""
    root = DATA_DIR / f"explorer-run-{records}"
    if (root / "run.json").exists():
        return root
    each = records // len(DATASETS)
    for seed, name in enumerate(DATASETS):
        (root / name).mkdir(parents=True, exist_ok=True)
        stream = iter_records(seed=seed, median_completion=40, max_new_tokens=200)
        with open(root / name / RAW_FILE, "wb", buffering=1 << 20) as file:
            file.writelines(encode_line(record) for record in itertools.islice(stream, each))
    manifest = {"model_profile": "kimi-k2.5", "datasets": {n: {"prompts": each} for n in DATASETS}}
    (root / "run.json").write_text(json.dumps(manifest))
    return root


def timed(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run = bench_run(args.records)
    size = sum(os.path.getsize(run / n / RAW_FILE) for n in DATASETS) / 1e6
    app = Explorer(run, tokenizer=None, interactive=True)
    app.controls(), app.scatter(), app.scatter("reasoning_tokens", "answer_tokens"), app.histogram()
    print(f"run: {len(app.records):,} records in {len(DATASETS)} datasets, {size:.0f} MB")
    reload = timed(lambda: explore.record_frame(scan_run(run)), args.repeat)
    print(f"baseline, reading the run again (cached scan + frame): {reload * 1000:8.1f} ms")
    changes = {
        "dataset": [{"dataset": ["alpha"]}, {"dataset": None}],
        "finish reason": [{"finish_reason": ["length"]}, {"finish_reason": None}],
        "completion range": [{"min_completion_tokens": 30, "max_completion_tokens": 120},
                             {"min_completion_tokens": None, "max_completion_tokens": None}],
        "prompt range": [{"min_prompt_tokens": 500}, {"min_prompt_tokens": None}],
        "validation rule": [{"rule": "truncated"}, {"rule": None}],
        "sample id": [{"sample_id": "4242"}, {"sample_id": None}],
    }
    filtering = timed(lambda: explore.filter_records(
        app.records, min_completion_tokens=30, max_completion_tokens=120, rule="truncated",
        findings=app.findings), args.repeat)
    print(f"filtering alone (range + rule)     {filtering * 1000:8.1f} ms   {filtering / reload:6.3f} of the baseline")
    worst = 0.0
    for label, steps in changes.items():
        cycle = itertools.cycle(steps)
        took = timed(lambda cycle=cycle: app.update(**next(cycle)), args.repeat * 2)
        worst = max(worst, took)
        print(f"update on {label:<17} {took * 1000:8.1f} ms   {took / reload:6.3f} of the baseline")
    verdict = "OK" if worst < 1.0 else "SLOW"
    print(f"slowest update {worst * 1000:.0f} ms ({worst / reload:.3f} of reading the run): {verdict}")


if __name__ == "__main__":
    main()
