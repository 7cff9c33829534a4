"""How fast `workbench stats` reads a run directory, and what an incremental refresh costs.

    python bench/stats.py [--size-gb 1.0] [--datasets 10] [--repeat 2]

The run directory (ten datasets of records shaped like Kimi-K2.5 replies, see common.py; an
errors.jsonl and a short pre-tokenized prompts.jsonl each; run.json) is generated once and
cached in bench/data/. Figures, with the files in the page cache:

    full scan        StatsCollector(OUT).refresh() in this process, in MB/s of the whole tree,
                     against json.loads per line over the same files (target >= 5x)
    process          the whole `workbench stats OUT --json` command, interpreter start-up and
                     imports included, its MB/s, ratio to the baseline and peak RSS
    refresh          a refresh when nothing changed (target < 20 ms for the ten datasets), and
                     after 1, 4 and 16 MB were appended to one file (median of three appends;
                     time proportional to the new bytes, not to the file size)
    memory           peak RSS of this process after the full scans (a few hundred MB at most)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import DATA_DIR, MB, best_seconds, iter_records

from workbench.analyze.stats import StatsCollector
from workbench.rundir.records import ErrorRecord, PromptRecord, encode_line

BASELINE_TARGET = 5.0
IDLE_TARGET_MS = 20.0
PEAK_TARGET_MB = 400.0
APPENDS_MB = (1, 4, 16)
FILES = ("raw_responses.jsonl", "errors.jsonl", "prompts.jsonl")


# --- the tree --------------------------------------------------------------------------------


def write_dataset(folder: Path, size_bytes: int, seed: int) -> dict[str, float]:
    """Records until the raw file holds size_bytes, an error line every 50, short prompts."""
    folder.mkdir(parents=True, exist_ok=True)
    count, written, last_ts = 0, 0, 0.0
    with (
        open(folder / FILES[0], "wb", buffering=1 << 20) as raw,
        open(folder / FILES[1], "wb") as errors,
    ):
        for record in iter_records(seed=seed):
            if written >= size_bytes:
                break
            written += raw.write(encode_line(record))
            if count % 50 == 0:
                errors.write(
                    encode_line(
                        ErrorRecord(
                            record.sample_id, 1, "timeout", None, "timed out", record.ts - 1.0
                        )
                    )
                )
            count, last_ts = count + 1, record.ts
    prompts = count + count // 10  # the run is not finished: a tenth of the prompts is left
    with open(folder / FILES[2], "wb", buffering=1 << 20) as file:
        for sample_id in range(prompts):
            file.write(encode_line(PromptRecord(sample_id, input_ids=list(range(64)))))
    return {"records": count, "prompts": prompts, "last_ts": last_ts, "raw_bytes": written}


def build_tree(size_gb: float, datasets: int) -> tuple[Path, dict[str, dict[str, float]]]:
    """The cached run directory and, per dataset, its record count, last ts and raw size."""
    root = DATA_DIR / f"stats-tree-{size_gb:g}GB-{datasets}ds"
    layout_file = root / "layout.json"
    if not layout_file.exists():
        print(f"generating {root} (once) ...", flush=True)
        per_dataset = int(size_gb * 1000 * MB / datasets)
        layout = {
            f"D{k:02d}": write_dataset(root / f"D{k:02d}", per_dataset, seed=k)
            for k in range(datasets)
        }
        entries = {
            name: {"prompts": int(info["prompts"]), "max_samples": None, "max_tokens": None}
            for name, info in layout.items()
        }
        (root / "run.json").write_text(json.dumps({"updated": 0, "datasets": entries}))
        layout_file.write_text(json.dumps(layout))
    layout = json.loads(layout_file.read_text())
    for name, info in layout.items():  # undo appends left by an interrupted run
        raw = root / name / FILES[0]
        if raw.stat().st_size != info["raw_bytes"]:
            os.truncate(raw, int(info["raw_bytes"]))
    return root, layout


def tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*.jsonl"))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in tree_files(root))


# --- timed scans -----------------------------------------------------------------------------


def json_baseline(root: Path) -> int:
    """json.loads per line over every file of the tree."""
    lines = 0
    for path in tree_files(root):
        with open(path, "rb") as file:
            for text in file:
                json.loads(text)
                lines += 1
    return lines


def warm(root: Path) -> None:
    for path in tree_files(root):
        with open(path, "rb") as file:
            while file.read(8 << 20):
                pass


STATS_VIA_PYTHON = (
    "import sys; from workbench.analyze.stats import render_stats; "
    "sys.stdout.write(render_stats(sys.argv[1], as_json=True))"
)


def stats_command(root: Path) -> tuple[list[str], str]:
    """`workbench stats OUT --json`, or the same call through python -c if the verb is not there."""
    command = [sys.executable, "-m", "workbench", "stats", str(root), "--json"]
    probe = subprocess.run(command, capture_output=True, text=True)
    if probe.returncode == 0:
        json.loads(probe.stdout)
        return command, "python -m workbench stats OUT --json"
    return [
        sys.executable,
        "-c",
        STATS_VIA_PYTHON,
        str(root),
    ], "python -c render_stats(OUT) (no CLI verb)"


def process_seconds(command: list[str], repeat: int) -> tuple[float, float]:
    """Best wall time of the command, and the peak RSS (MB) of any child so far."""

    def run() -> None:
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout)["total"]["records"] > 0

    seconds = best_seconds(run, repeat)
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


# --- refreshes -------------------------------------------------------------------------------


def idle_refreshes(collector: StatsCollector, now: float, count: int = 50) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        collector.refresh(now)
        times.append((time.perf_counter() - start) * 1000)
    return times


def records_bytes(size_bytes: int, start_ts: float) -> bytes:
    """Fresh records (their own ids and times) totalling about size_bytes."""
    pieces, total = [], 0
    for record in iter_records(seed=99, start_ts=start_ts):
        if total >= size_bytes:
            break
        line = encode_line(record)
        pieces.append(line)
        total += len(line)
    return b"".join(pieces)


def append_refreshes(
    collector: StatsCollector, raw: Path, now: float, rounds: int = 3
) -> list[tuple[float, float]]:
    """(MB appended, median refresh ms of `rounds` appends) per size; records must grow."""
    results = []
    before = collector.refresh(now).total.records
    for megabytes in APPENDS_MB:
        data = records_bytes(megabytes * MB, now)
        times = []
        for _ in range(rounds):
            with open(raw, "ab") as file:
                file.write(data)
            start = time.perf_counter()
            after = collector.refresh(now).total.records
            times.append((time.perf_counter() - start) * 1000)
            assert after == before + data.count(b"\n"), (before, after)
            before = after
        results.append((len(data) / MB, statistics.median(times)))
    return results


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="tree size (default 1.0)")
    parser.add_argument("--datasets", type=int, default=10, help="datasets (default 10)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timed figure (default 2)")
    args = parser.parse_args(argv)

    root, layout = build_tree(args.size_gb, args.datasets)
    size = tree_bytes(root)
    warm(root)
    now = max(info["last_ts"] for info in layout.values()) + 1.0
    records = sum(int(info["records"]) for info in layout.values())
    print(f"tree: {root} ({size / MB:,.0f} MB, {args.datasets} datasets, {records:,} records)")

    command, label = stats_command(root)
    process, child_peak = process_seconds(command, args.repeat)
    startup = best_seconds(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 3)

    collector = StatsCollector(root)
    full = best_seconds(lambda: StatsCollector(root).refresh(now), args.repeat)
    scanned = collector.refresh(now).total
    assert scanned.records == records and scanned.errors == sum(
        (int(info["records"]) + 49) // 50 for info in layout.values()
    ), scanned
    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    baseline = best_seconds(lambda: json_baseline(root), 1)

    scan_rate, base_rate = size / MB / full, size / MB / baseline
    print(f"{'json.loads per line (baseline)':<44} {baseline:7.2f} s {base_rate:8.0f} MB/s")
    print(
        f"{'full scan, StatsCollector.refresh()':<44} {full:7.2f} s {scan_rate:8.0f} MB/s   "
        f"{scan_rate / base_rate:5.1f}x baseline  target >= {BASELINE_TARGET:g}x  "
        f"{verdict(scan_rate / base_rate >= BASELINE_TARGET)}"
    )
    print(
        f"{'whole process (see below)':<44} {process:7.2f} s {size / MB / process:8.0f} MB/s   "
        f"{baseline / process:5.1f}x baseline  (python start-up alone {startup * 1000:.0f} ms)"
    )
    print(f"    process: {label}")

    idle = idle_refreshes(collector, now)
    median = statistics.median(idle)
    print(
        f"{'refresh, nothing changed (50 runs)':<44} median {median:6.2f} ms, "
        f"max {max(idle):6.2f} ms   "
        f"target < {IDLE_TARGET_MS:g} ms  {verdict(median < IDLE_TARGET_MS)}"
    )
    raw = root / sorted(layout)[0] / FILES[0]
    file_mb = raw.stat().st_size / MB
    try:
        for megabytes, ms in append_refreshes(collector, raw, now):
            print(
                f"{f'refresh after {megabytes:.1f} MB appended':<44} {ms:8.1f} ms  "
                f"{megabytes / ms * 1000:6.0f} MB/s of new bytes (file {file_mb:,.0f} MB before)"
            )
    finally:
        os.truncate(raw, int(layout[sorted(layout)[0]]["raw_bytes"]))
    peak = max(own_peak, child_peak)
    print(
        f"{'peak RSS':<44} this process {own_peak:5.0f} MB, stats process {child_peak:5.0f} MB   "
        f"target < {PEAK_TARGET_MB:g} MB  {verdict(peak < PEAK_TARGET_MB)}"
    )


if __name__ == "__main__":
    main()
