"""What the data-quality checks add to `workbench validate`: first read and a grown run.

    python bench/quality.py [--size-mb 200] [--grow 0.01] [--repeat 1] [--workers N]

The run is bench/validate.py's (one dataset of bench/common.py's Kimi-K2.5-shaped records and
their prompts); `--size-mb 1250` is the real job's size (88k records). First, what generate
spends keeping the figures as it writes (the replies' store, from ids in memory as the writer
has them; the prompts' figures, read from prompts.jsonl as generate's thread reads them).
Then three validations of the same run, in this process's page cache, without the scan cache:

    validate alone     the scan with the quality figures switched off in this process (the
                       repeated-n-gram share, digest, MinHash signature and benchmark overlap
                       of each reply, and the duplicate and contamination comparisons), the
                       baseline: what validate cost before the checks
    + dedup, loops     validate as it is: degeneracy rules, exact and near duplicates
    + contamination    the same with --decontaminate examples/benchmarks/tiny_bench.jsonl,
                       replies read as words through the example tokenizer

each on a first read with nothing kept (a run from elsewhere, or other settings) and as
generate leaves the run (its kept figures taken); then the same after `--grow` more records
are appended to a copy of the run whose scan is cached (only the new records are read; the
comparisons run over the whole run). Their prompts are in prompts.jsonl from the start, as
generate writes it whole before it sends. Targets: dedup + contamination + degeneracy at most
1.5x validate alone on the first read, and a grown run at most 0.2x validate alone's first
read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from common import MB, best_seconds, iter_records
from validate import DATASET, bench_run

import workbench.analyze.rules as rules_module
import workbench.analyze.scan as scan_module
from workbench import sketch
from workbench.analyze.quality import Decontamination
from workbench.analyze.validate import validate_run
from workbench.profiles import get_profile
from workbench.rundir.figures import FigureAppender, ReplyFigures, prompt_rows
from workbench.rundir.layout import CACHE_DIR, PROMPTS_FILE, RAW_FILE
from workbench.rundir.reader import iter_blocks
from workbench.rundir.records import PromptRecord, encode_line
from workbench.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
BENCHMARK = ROOT / "examples" / "benchmarks" / "tiny_bench.jsonl"
TOKENIZER = ROOT / "examples" / "tokenizer"
THINK_END = get_profile("kimi-k2.5").think_end  # the bench run's replies think


@contextlib.contextmanager
def quality_off() -> Iterator[None]:
    """The scan without the quality figures and comparisons (zeros in their columns)."""
    saved = (rules_module.reply_figures, scan_module.add_quality, scan_module.data_findings,
             scan_module.prompt_figures)

    def no_figures(ids: Any, starts: Any, *args: Any, **kwargs: Any) -> ReplyFigures:
        count = len(starts)
        return ReplyFigures(np.zeros(count, dtype=np.uint64), np.zeros(count),
                            np.zeros((count, 1), dtype=np.uint16))

    def no_columns(columns: Any, ids: Any, starts: Any, ends: Any, figures: ReplyFigures,
                   special: list[int], *args: Any) -> None:
        count = len(starts)
        columns.repeat_share.extend([0.0] * count)
        columns.special_ids.extend(special)
        columns.digest.extend([0] * count)
        columns.signature.extend([b""] * count)
        columns.overlap.extend([0] * count)

    def no_findings(run: Any, *args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        return {ds.name: [] for ds in run.datasets}

    rules_module.reply_figures = no_figures  # type: ignore[assignment]
    scan_module.add_quality = no_columns  # type: ignore[assignment]
    scan_module.data_findings = no_findings  # type: ignore[assignment]
    scan_module.prompt_figures = lambda *args, **kwargs: {}  # type: ignore[assignment]
    try:
        yield
    finally:
        (rules_module.reply_figures, scan_module.add_quality, scan_module.data_findings,
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


def add_records(run: Path, records: list[Any], decontaminate: Decontamination | None) -> None:
    """The records appended to raw_responses.jsonl, and their figures to the stores, as
    generate writes them."""
    with open(run / DATASET / RAW_FILE, "ab") as out:
        out.writelines(encode_line(record) for record in records)
    keep_reply_figures(run, [record.output_ids for record in records], decontaminate)


def keep_reply_figures(run: Path, replies: Iterable[list[int] | None],
                       decontaminate: Decontamination | None) -> None:
    """What generate does as it writes each record: its figures appended to the stores."""
    appender = FigureAppender(run / DATASET, THINK_END, sketch.DEFAULT_REPEAT_NGRAM,
                              decontaminate=decontaminate)
    for ids in replies:
        appender.add(ids)
    appender.close()


def kept_by_generate(run: Path, decontaminate: Decontamination | None) -> tuple[float, float, int]:
    """The run's figures (and overlaps with `decontaminate`'s benchmarks) kept as generate
    keeps them, from scratch: (seconds for the replies', for the prompts', records). The
    replies' are timed on ids already in memory, as generate has them."""
    for kept in (run / DATASET / CACHE_DIR).glob("*"):
        if kept.name.startswith(("reply-", "prompt-")):
            kept.unlink()
    replies = [row.output_ids for block in iter_blocks(str(run / DATASET / RAW_FILE),
                                                       with_output_ids=True)
               for row in block.rows]
    replies_seconds = best_seconds(lambda: keep_reply_figures(run, replies, decontaminate), 1)
    prompts_seconds = best_seconds(
        lambda: prompt_rows(run / DATASET / PROMPTS_FILE, decontaminate), 1)
    return replies_seconds, prompts_seconds, len(replies)


def timed_growth(run: Path, share: float, action: Callable[[Path], object],
                 decontaminate: Decontamination | None = None) -> float:
    """Seconds of `action` on a copy of the run grown by `share` more records, its scan
    cached before. As on a real job, prompts.jsonl holds their prompts from the start
    (generate writes it whole before it sends anything): only the replies grow."""
    with tempfile.TemporaryDirectory(dir=run.parent) as folder:
        copy = Path(folder) / "run"
        shutil.copytree(run, copy)
        records = grown_records(copy, share)
        add_prompts(copy, records)
        action(copy)  # cached
        add_records(copy, records, decontaminate)
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
    report = validate_run(run, workers=args.workers, cache=False, figures=False)  # page cache
    print(f"run: {run} ({megabytes:.0f} MB, {report.datasets[DATASET].records:,} records, "
          f"{os.cpu_count()} CPUs)")
    print("findings: " + ", ".join(f"{f.rule} {f.count}" for f in report.datasets[DATASET].findings))
    for label, given in (("", None), (" and overlaps", benchmarks)):
        replies_seconds, prompts_seconds, records = kept_by_generate(run, given)
        print(f"kept by generate, figures{label}: replies {replies_seconds:.2f} s "
              f"({replies_seconds / records * 1e6:.0f} us a record, in the writer's thread), "
              f"prompts {prompts_seconds:.2f} s (a thread, once prompts.jsonl is written)")

    def check(decontaminate: Decontamination | None = None, cache: bool = False,
              figures: bool = False) -> Callable[[Path], object]:
        return lambda path: validate_run(path, workers=args.workers, cache=cache,
                                         decontaminate=decontaminate, figures=figures)

    def first(decontaminate: Decontamination | None, figures: bool) -> float:
        return best_seconds(lambda: check(decontaminate, figures=figures)(run), args.repeat)

    with quality_off():
        alone = first(None, False)
        alone_grown = timed_growth(run, args.grow, check(cache=True, figures=True))
    rows = [("validate alone", alone, alone, alone_grown)]
    for label, decontaminate in (("+ dedup, loops", None), ("+ contamination", benchmarks)):
        rows.append((label, first(decontaminate, False), first(decontaminate, True),
                     timed_growth(run, args.grow, check(decontaminate, cache=True, figures=True),
                                  decontaminate)))
    print(f"{'':<18} {'first read':>11} {'x alone':>8} {'kept':>8} {'x alone':>8} "
          f"{'grown ' + format(args.grow, '.0%'):>9} {'x alone':>8}")
    for label, cold, kept, grown in rows:
        print(f"{label:<18} {cold:>10.2f}s {cold / alone:>8.2f} {kept:>7.2f}s {kept / alone:>8.2f} "
              f"{grown:>8.2f}s {grown / alone:>8.2f}")
    print("(first read: nothing kept; kept: the figures generate kept as it wrote; grown: "
          "the scan cached, then more records)")
    _, cold, kept, grown = rows[-1]
    for label, ratio, goal in (("first read, nothing kept", cold / alone, 1.5),
                               ("first read as generate leaves the run", kept / alone, 1.5),
                               ("grown run", grown / alone, 0.2)):
        print(f"target {label} <= {goal}x validate alone: {ratio:.2f}x "
              f"{'PASS' if ratio <= goal else 'MISS'}")
    sys.exit(0)


if __name__ == "__main__":
    main()
