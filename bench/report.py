"""What `workbench stats` and each report cost on a big run, and what the scan cache saves.

    python bench/report.py [--size-mb 200] [--datasets 4] [--grow 0.01] [--repeat 2]
                           [--workers N] [--reports token_distribution,format_validation,explore]

The run (records shaped like Kimi-K2.5 replies, see common.py; per dataset a prompts.jsonl
of as many ids as each record's prompt_tokens and an errors.jsonl; run.json) is generated
once into bench/data/, twice: as the workbench writes (compact) and as ``json.dumps`` writes
with its default separators. Figures, with the files in the page cache, side by side; every
time is the best of --repeat runs (the machine may be shared):

    stats      StatsCollector's full scan (what `workbench stats` does) over every file of
               the run in MB/s, over a json.loads loop (target >= 5x on both formattings)
               and over a raw read (the fraction of a raw read reached); per second of wall
               time and per second of CPU time (verdicts on CPU)
    validate   validate_run without the cache: every output id checked (worker processes)
    reports    each report on a tiny run and on the big run (scan cache removed first): its
               data cost (big minus tiny) over validate's data cost (target <= 1.5); then
               the same report after --grow more records were appended (the first report's
               cache kept): its data cost over the first's (target <= 0.2). Costs in wall
               time and in CPU time (this process and its children: kernels, workers), which
               other work on a shared machine does not inflate; the verdicts use CPU. The
               report time and its notebook/HTML split are what `workbench report` prints.
    memory     peak RSS of a scan (and record frame) of half the datasets and of all of
               them: flat means far below the 2x of the data
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec
from common import DATA_DIR, MB, STYLES, best_seconds, iter_records

from workbench.analyze.stats import StatsCollector
from workbench.analyze.validate import validate_run
from workbench.report.parameters import REPORTS
from workbench.report.render import run_report
from workbench.rundir.layout import CACHE_DIR
from workbench.rundir.records import ErrorRecord, PromptRecord

STATS_TARGET = 5.0
REPORT_TARGET = 1.5
GROWN_TARGET = 0.2
FILES = ("raw_responses.jsonl", "errors.jsonl", "prompts.jsonl")


# --- runs ------------------------------------------------------------------------------------


def write_dataset(folder: Path, size_bytes: int, seed: int, style: str) -> int:
    """Records until the raw file holds size_bytes, their prompts, an error every 50."""
    encode = STYLES[style]
    folder.mkdir(parents=True, exist_ok=True)
    count = written = 0
    with (
        open(folder / FILES[0], "wb", buffering=1 << 20) as raw,
        open(folder / FILES[1], "wb") as errors,
        open(folder / FILES[2], "wb", buffering=1 << 20) as prompts,
    ):
        for record in iter_records(seed=seed):
            if written >= size_bytes:
                break
            written += raw.write(encode(record))
            ids = list(range(100, 100 + record.prompt_tokens))
            prompts.write(encode(PromptRecord(record.sample_id, input_ids=ids)))  # type: ignore[arg-type]
            if count % 50 == 0:
                failed = ErrorRecord(record.sample_id, 1, "timeout", None, "timed out", record.ts)
                errors.write(encode(failed))  # type: ignore[arg-type]
            count += 1
    return count


def build_run(size_mb: float, datasets: int, style: str) -> Path:
    """The cached run (raw files cut back to their built size, no scan cache left)."""
    root = DATA_DIR / f"report-run-{size_mb:g}MB-{datasets}ds-{style}"
    sizes_file = root / "sizes.json"
    if not sizes_file.exists():
        print(f"generating {root} (once) ...", flush=True)
        names = [f"D{k:02d}" for k in range(datasets)]
        for k, name in enumerate(names):
            write_dataset(root / name, int(size_mb * MB / datasets), k, style)
        entries = {name: {"chat_template_kwargs": {"thinking": True}} for name in names}
        (root / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                                   "datasets": entries}))
        sizes = {name: (root / name / FILES[0]).stat().st_size for name in names}
        sizes_file.write_text(json.dumps(sizes))
    restore(root)
    return root


def restore(root: Path) -> None:
    """Undo appends and drop the scan caches."""
    for name, size in json.loads((root / "sizes.json").read_text()).items():
        raw = root / name / FILES[0]
        if raw.stat().st_size != size:
            os.truncate(raw, size)
    drop_caches(root)


def tiny_run(folder: Path) -> Path:
    """Two datasets of 30 records: what a report costs without data."""
    for k in range(2):
        write_dataset(folder / f"D{k:02d}", 30 * 4000, k, "compact")
    entries = {f"D{k:02d}": {"chat_template_kwargs": {"thinking": True}} for k in range(2)}
    (folder / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                                 "datasets": entries}))
    return folder


def grow(root: Path, share: float) -> int:
    """Append share more records (new sample ids, later times) to every dataset."""
    added = 0
    for name in json.loads((root / "sizes.json").read_text()):
        raw = root / name / FILES[0]
        count = max(1, round(share * _lines(raw)))
        records = zip(range(count), iter_records(seed=1000, start_ts=2e9), strict=False)
        with open(raw, "ab") as file:
            file.writelines(
                STYLES["compact"](msgspec.structs.replace(record, sample_id=10_000_000 + index))
                for index, record in records)
        added += count
    return added


def _lines(path: Path) -> int:
    with open(path, "rb") as file:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(8 << 20), b""))


def run_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*.jsonl"))


def run_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in run_files(root)) / MB


# --- timing ----------------------------------------------------------------------------------


def raw_read(root: Path) -> None:
    for path in run_files(root):
        with open(path, "rb") as file:
            while data := file.read(8 << 20):
                data.count(b"\n")


def json_loop(root: Path) -> None:
    for path in run_files(root):
        with open(path, "rb") as file:
            for text in file:
                json.loads(text)


def stats_scan(root: Path) -> None:
    """A full scan, as on a run no report has read yet (no scan or prompts cached)."""
    drop_caches(root)
    StatsCollector(root).refresh()


def drop_caches(root: Path) -> None:
    for folder in root.glob(f"*/{CACHE_DIR}"):
        shutil.rmtree(folder, ignore_errors=True)


def stats_rates(root: Path, repeat: int) -> dict[str, float]:
    """MB per second of wall time, and per second of CPU time, of each way to read the run."""
    raw_read(root)  # into the page cache
    size = run_mb(root)
    rates = {}
    for label, action in (("raw read", raw_read), ("json.loads loop", json_loop),
                          ("stats scan", stats_scan)):
        rates[label] = size / best_seconds(lambda f=action: f(root), repeat)
        rates[f"{label} (CPU)"] = size / cpu_cost(lambda f=action: f(root), repeat)
    return rates


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (report kernels, their workers,
    validation workers): unlike wall time, not inflated by other work on a shared machine."""
    return sum(getattr(resource.getrusage(who), field)
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))


def cpu_cost(action: Callable[[], object], repeat: int = 1) -> float:
    """The least CPU time of repeat calls."""
    return best_seconds(action, repeat, cpu_seconds)


def report_cost(name: str, run: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one report."""
    start = cpu_seconds()
    wall = report_seconds(name, run, out)
    return wall, cpu_seconds() - start


def report_seconds(name: str, run: Path, out: Path) -> float:
    overrides = {"run_dir": str(run), "tokenizer": None} if name != "token_distribution" else {
        "run_dir": str(run)}
    result = run_report(name, None, overrides, out)
    print(f"    {name} on {run.name}: {result.seconds['total']:.1f}s "
          f"(notebook {result.seconds['notebook']:.1f}s, HTML {result.seconds['html']:.1f}s)",
          flush=True)
    return result.seconds["total"]


SCAN_MEMORY = """
import resource, sys
from workbench.analyze import explore
from workbench.analyze.validate import scan_run
scan = scan_run(sys.argv[1], only=sys.argv[2].split(","), cache=False)
explore.record_frame(scan)
usage = [resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(max(usage) / 1024)
"""


def peak_mb(root: Path, names: list[str]) -> float:
    done = subprocess.run([sys.executable, "-c", SCAN_MEMORY, str(root), ",".join(names)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


# --- printing --------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_stats(rates: dict[str, dict[str, float]]) -> None:
    """Wall and CPU rates per formatting; the verdicts use CPU time (see the docstring)."""
    styles = list(rates)
    print(f"{'workbench stats (full scan)':<38}" + "".join(f"{s:>12}" for s in styles)
          + "   target")
    for label in ("raw read", "json.loads loop", "stats scan"):
        for key in (label, f"{label} (CPU)"):
            print(f"  {key + ' MB/s':<36}" + "".join(f"{rates[s][key]:>12.0f}" for s in styles))
    for suffix in ("", " (CPU)"):
        ratios = [rates[s][f"stats scan{suffix}"] / rates[s][f"json.loads loop{suffix}"]
                  for s in styles]
        verdicts = " ".join(verdict(r >= STATS_TARGET) for r in ratios) if suffix else ""
        print(f"  {'stats / json.loads' + suffix:<36}" + "".join(f"{r:>11.2f}x" for r in ratios)
              + (f"   >= {STATS_TARGET:g}x  {verdicts}" if suffix else ""))
    for suffix in ("", " (CPU)"):
        fractions = [rates[s][f"stats scan{suffix}"] / rates[s][f"raw read{suffix}"]
                     for s in styles]
        print(f"  {'stats / raw read' + suffix:<36}" + "".join(f"{r:>12.2f}" for r in fractions))


def _least(costs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(wall for wall, _ in costs), min(cpu for _, cpu in costs)


def _minus(cost: tuple[float, float], base: tuple[float, float]) -> tuple[float, float]:
    return cost[0] - base[0], cost[1] - base[1]


def print_reports(rows: list[tuple[str, tuple[float, float], tuple[float, float], int]],
                  validate: tuple[float, float]) -> None:
    """Data costs (report minus the same report on the tiny run), wall and CPU, and ratios."""
    print(f"{'report data cost':<20}{'first':>16}{'/ validate':>16}{'grown':>16}{'/ first':>14}"
          f"   targets <= {REPORT_TARGET:g}, <= {GROWN_TARGET:g} (on CPU)")
    print(f"{'':<20}{'wall':>8}{'CPU':>8}{'wall':>8}{'CPU':>8}{'wall':>8}{'CPU':>8}"
          f"{'wall':>7}{'CPU':>7}")
    for name, first, second, added in rows:
        ratio = [first[i] / validate[i] for i in (0, 1)]
        grown = [second[i] / first[i] for i in (0, 1)]
        print(f"{name:<20}{first[0]:>7.1f}s{first[1]:>7.1f}s{ratio[0]:>7.2f}x{ratio[1]:>7.2f}x"
              f"{second[0]:>7.1f}s{second[1]:>7.1f}s{grown[0]:>7.2f}{grown[1]:>7.2f}"
              f"   {verdict(ratio[1] <= REPORT_TARGET)} {verdict(grown[1] <= GROWN_TARGET)}"
              f"   (+{added:,} records)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0,
                        help="raw_responses.jsonl bytes of the whole run (default 200)")
    parser.add_argument("--datasets", type=int, default=4, help="datasets (default 4)")
    parser.add_argument("--grow", type=float, default=0.01, help="share appended (default 0.01)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (default 2)")
    parser.add_argument("--workers", type=int, default=None, help="validation workers")
    parser.add_argument("--reports", default=",".join(REPORTS), help="reports to time")
    args = parser.parse_args(argv)

    runs = {style: build_run(args.size_mb, args.datasets, style) for style in STYLES}
    print_stats({style: stats_rates(root, args.repeat) for style, root in runs.items()})

    run = runs["compact"]
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        tiny, out = tiny_run(Path(scratch) / "tiny"), Path(scratch) / "reports"
        validate = [
            (best_seconds(lambda r=r: validate_run(r, workers=args.workers, cache=False), args.repeat),
             cpu_cost(lambda r=r: validate_run(r, workers=args.workers, cache=False), args.repeat))
            for r in (run, tiny)]
        validate_cost = (validate[0][0] - validate[1][0], validate[0][1] - validate[1][1])
        print(f"validate data cost: {validate_cost[0]:.1f}s wall, {validate_cost[1]:.1f}s CPU "
              f"({run_mb(run):.0f} MB run)")
        rows = []
        for name in filter(None, args.reports.split(",")):
            report_seconds(name, tiny, out)  # warms up
            base = _least([report_cost(name, tiny, out) for _ in range(args.repeat)])
            firsts, grown, added = [], [], 0
            for _ in range(args.repeat):
                restore(run)
                firsts.append(report_cost(name, run, out))
                added = grow(run, args.grow)
                grown.append(report_cost(name, run, out))
            restore(run)
            rows.append((name, _minus(_least(firsts), base), _minus(_least(grown), base), added))
    print_reports(rows, validate_cost)

    names = sorted(json.loads((run / "sizes.json").read_text()))
    half, whole = peak_mb(run, names[: len(names) // 2 or 1]), peak_mb(run, names)
    print(f"peak RSS of a scan: {half:.0f} MB for half the datasets, {whole:.0f} MB for all "
          f"({whole / half:.2f}x for {len(names) / (len(names) // 2 or 1):.0f}x the data)")


if __name__ == "__main__":
    main()
