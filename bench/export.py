"""How fast `workbench export` writes training rows from a large run, in rows per second.

    python bench/export.py [--size-mb 200] [--repeat 1]

The run is bench/validate.py's (bench/common.py's realistic records plus prompts of the
records' prompt lengths, cached in bench/data/). Each figure is the best of ``--repeat``
exports with the files in the page cache: tokens to JSONL, tokens to Parquet, tokens shuffled,
tokens with the reasoning filters, and `--for specforge` (rows plus the manifest), printed
with its ratio to plain tokens -> JSONL measured here. Outputs are written to bench/data/ and
removed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import DATA_DIR, MB
from validate import DATASET, bench_run

from workbench.export.exporter import export_run
from workbench.export.options import ExportOptions, ExportSummary
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE


def timed(run: Path, target: Path, options: ExportOptions, repeat: int) -> tuple[float, ExportSummary]:
    best, summary = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        summary = export_run(run, target, options)
        best = min(best, time.perf_counter() - start)
    assert summary is not None
    return best, summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="records file size (200)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (1)")
    args = parser.parse_args(argv)

    run = bench_run(args.size_mb)
    folder = run / DATASET
    megabytes = ((folder / RAW_FILE).stat().st_size + (folder / PROMPTS_FILE).stat().st_size) / MB
    print(f"run: {run} ({megabytes:.1f} MB of records and prompts)")
    cases = {
        "tokens -> JSONL": ("export.jsonl", ExportOptions()),
        "tokens -> Parquet": ("export.parquet", ExportOptions()),
        "tokens -> JSONL, shuffled": ("export.jsonl", ExportOptions(shuffle=True, seed=1)),
        "tokens -> JSONL, reasoning filters": ("export.jsonl", ExportOptions(
            drop=("truncated", "reasoning_unclosed", "empty_answer"))),
        "--for specforge (rows + manifest)": ("export.jsonl", ExportOptions(trainer="specforge")),
    }
    rates: dict[str, float] = {}
    for label, (name, options) in cases.items():
        target = DATA_DIR / name
        seconds, summary = timed(run, target, options, args.repeat)
        size = target.stat().st_size / MB
        target.unlink()
        target.with_name(target.name + ".manifest.json").unlink(missing_ok=True)
        rates[label] = summary.rows / seconds
        print(f"{label:<36} {rates[label]:8,.0f} rows/s  {megabytes / seconds:6.0f} MB/s in"
              f"  ({summary.rows:,} rows, {size:,.0f} MB out, {seconds:.1f}s)")
    ratio = rates["--for specforge (rows + manifest)"] / rates["tokens -> JSONL"]
    print(f"--for specforge / tokens -> JSONL: {ratio:.2f}")


if __name__ == "__main__":
    main()
