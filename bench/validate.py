"""How fast `workbench validate` checks every output id of a run, in MB of records per second.

    python bench/validate.py [--size-mb 200] [--repeat 3] [--workers N]

The run is one dataset of bench/common.py's realistic Kimi-K2.5 records (cached in
bench/data/, with a matching prompts.jsonl). Figures are the best of ``--repeat`` runs with the
files in the page cache: the reader alone (reader.iter_blocks with output ids, the floor any
validation pays: as arrays, what validation reads, and as lists, what the export reads),
validation in this process, and validation with worker processes (the default), all without
the scan cache; then a validation of the unchanged run through the cache. Target: worker
processes at least 150 MB/s.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from common import DATA_DIR, MB, best_seconds, records_file

from workbench.analyze.scan import SCAN_BLOCK_BYTES
from workbench.analyze.validate import validate_run
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE
from workbench.rundir.reader import iter_blocks, read_rows
from workbench.rundir.records import PromptRecord, encode_line

TARGET_MB_S = 150.0
DATASET = "bench"


def bench_run(size_mb: float, *, seed: int = 0) -> Path:
    """A cached run directory: run.json and one dataset of records with their prompts."""
    out = DATA_DIR / f"run-{size_mb:g}MB-seed{seed}"
    folder = out / DATASET
    if (folder / PROMPTS_FILE).exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / RAW_FILE
    if not raw.exists():
        try:
            os.link(records_file(size_mb, seed=seed), raw)
        except OSError:
            raw.symlink_to(records_file(size_mb, seed=seed))
    _write_prompts(raw, folder / PROMPTS_FILE, seed)
    manifest = {"model_profile": "kimi-k2.5",
                "datasets": {DATASET: {"input": "input_ids", "chat_template_kwargs": {}}}}
    (out / "run.json").write_text(json.dumps(manifest))
    return out


def _write_prompts(raw: Path, path: Path, seed: int) -> None:
    """One prompt per record, as many ids as the record's prompt_tokens."""
    rows, _ = read_rows(raw)
    rng = np.random.default_rng(seed + 1)
    partial = path.with_suffix(".partial")
    with open(partial, "wb", buffering=1 << 20) as file:
        for row in rows:
            ids = rng.integers(100, 160000, size=row.prompt_tokens or 16).tolist()
            file.write(encode_line(PromptRecord(sample_id=row.sample_id or 0, input_ids=ids)))
    os.replace(partial, path)


def read_only(run: Path, *, arrays: bool = True) -> None:
    """Every block of the records with their output ids: in one array per block (what the
    scan reads), or as lists (what the export reads)."""
    for _ in iter_blocks(run / DATASET / RAW_FILE, with_output_ids=not arrays, id_arrays=arrays,
                         block_bytes=SCAN_BLOCK_BYTES):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="records file size (200)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (3)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (CPU count)")
    args = parser.parse_args(argv)

    run = bench_run(args.size_mb)
    raw = run / DATASET / RAW_FILE
    megabytes = raw.stat().st_size / MB
    report = validate_run(run, workers=1, cache=False)  # also warms the page cache
    records = report.datasets[DATASET].records
    print(f"run: {run} ({megabytes:.1f} MB of records, {records:,} records, "
          f"{os.cpu_count()} CPUs)")
    rules = ", ".join(f"{f.rule} {f.count}" for f in report.datasets[DATASET].findings)
    print(f"findings: {rules or 'none'}")

    figures = {
        "reader only (output ids as arrays)": lambda: read_only(run),
        "reader only (output ids as lists)": lambda: read_only(run, arrays=False),
        "validate_run, in this process": lambda: validate_run(run, workers=1, cache=False),
        "validate_run, worker processes": lambda: validate_run(
            run, workers=args.workers, cache=False),
        "validate_run, cached (nothing new)": lambda: validate_run(run, workers=args.workers),
    }
    rates = {}
    for label, action in figures.items():
        rates[label] = megabytes / best_seconds(action, args.repeat)
        print(f"{label:<44} {rates[label]:8.0f} MB/s")
    rate = rates["validate_run, worker processes"]
    verdict = "PASS" if rate >= TARGET_MB_S else "MISS"
    print(f"{'validation (worker processes)':<44} {rate:8.0f} MB/s   "
          f"target >= {TARGET_MB_S:g}   {verdict}")


if __name__ == "__main__":
    main()
