"""The workbench against the peers a user would pick to read a run written elsewhere.

    python bench/peers.py [--size-mb 200] [--repeat 3] [--grow 0.01] [--sample 2000]
                          [--without-fast]

One dataset of bench/common.py's Kimi-K2.5-shaped records in the ``json.dumps`` layout (as a
seed's own raw_responses.jsonl, a colleague's run or an older version writes it), with
run.json, and no cache: what the workbench reads the first time. Contenders run alternated,
each after a second's pause (what the last one left running winds down), best of `--repeat`,
with the file in the page cache:

    stats, whole process   `workbench stats RUN --json` (its cache removed first) against a
                           process each of polars (scan_ndjson), DuckDB (read_json) and a
                           json.loads loop computing the same per-dataset counts: records,
                           completion tokens, finish reasons
    three id checks        over every output id, first read: ids out of the vocabulary, more
                           than one think-end id, a reply that stopped without one. The
                           workbench's scan with its quality figures off (bench/quality.py's
                           `quality_off`: what validate costs without them) against polars'
                           and DuckDB's list expressions, in this process
    full validate          `validate_run` with every rule and the quality figures, first read
    validate after grow    the same after `--grow` more records appended, its cache kept (the
                           peers read the whole file again: their time is the id checks')
    near-duplicate replies MinHash of 128 entries over 3-id shingles of every reply: the
                           workbench's `sketch.signatures` + `near_duplicates` against
                           datasketch's MinHash + MinHashLSH on `--sample` replies, scaled to
                           all of them

Every contender's counts are printed and must agree (the run fails loudly when one differs).
With `--without-fast` the workbench runs without its compiled loops (numpy's passes instead),
as it does where the ``fast`` extra (numba) is not installed.
Ratios are the workbench's speed over each peer's (above 1: the workbench is faster). Needs
the bench extra: `pip install -e .[bench]` (duckdb, polars, datasketch).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import DATA_DIR, records_file
from quality import quality_off

from workbench import sketch
from workbench.analyze import id_facts
from workbench.analyze.scan import scan_run
from workbench.analyze.validate import validate_run
from workbench.profiles import get_profile
from workbench.rundir import id_arrays
from workbench.rundir.layout import CACHE_DIR, RAW_FILE
from workbench.rundir.reader import iter_blocks
from workbench.sketch import compiled

PROFILE = get_profile("kimi-k2.5")
VOCAB, THINK_END = PROFILE.vocab_size, PROFILE.think_end
DATASET = "d"
COUNTS = ("records", "out_of_vocab", "stray_think_end", "unclosed")

STATS_SCRIPTS = {
    "polars": """
import json, sys, polars as pl
df = pl.scan_ndjson(sys.argv[1]).select("completion_tokens", "finish_reason").collect()
reasons = df.group_by("finish_reason").len()
print(json.dumps({"records": df.height, "completion_tokens": int(df["completion_tokens"].sum()),
                  "finish": {r: n for r, n in reasons.iter_rows()}}))
""",
    "duckdb": """
import json, sys, duckdb
rows = duckdb.sql(f\"\"\"SELECT finish_reason, count(*), sum(completion_tokens) FROM read_json(
    '{sys.argv[1]}', format='newline_delimited',
    columns={{'completion_tokens': 'BIGINT', 'finish_reason': 'VARCHAR'}}) GROUP BY 1\"\"\").fetchall()
print(json.dumps({"records": sum(r[1] for r in rows), "completion_tokens": int(sum(r[2] for r in rows)),
                  "finish": {r[0]: r[1] for r in rows}}))
""",
    "json.loads": """
import json, sys
records = tokens = 0
finish = {}
with open(sys.argv[1], "rb") as file:
    for line in file:
        rec = json.loads(line)
        records += 1
        tokens += rec["completion_tokens"]
        finish[rec["finish_reason"]] = finish.get(rec["finish_reason"], 0) + 1
print(json.dumps({"records": records, "completion_tokens": tokens, "finish": finish}))
""",
}


def peers_run(size_mb: float) -> Path:
    """RUN/d/raw_responses.jsonl (json.dumps layout) and run.json, made once."""
    out = DATA_DIR / f"peers-{size_mb:g}MB"
    raw = out / DATASET / RAW_FILE
    if not raw.exists():
        raw.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(records_file(size_mb, style="dumps"), raw)
        (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                                  "datasets": {DATASET: {}}}))
    return out


def no_cache(run: Path) -> None:
    shutil.rmtree(run / DATASET / CACHE_DIR, ignore_errors=True)
    shutil.rmtree(run / CACHE_DIR, ignore_errors=True)


# --- per-dataset stats, whole process -----------------------------------------------------


def workbench_stats(run: Path) -> dict[str, Any]:
    no_cache(run)
    done = subprocess.run([sys.executable, "-m", "workbench", "stats", str(run), "--json"],
                          capture_output=True, text=True, check=True)
    total = json.loads(done.stdout)["total"]
    return {"records": total["records"], "completion_tokens": total["completion_tokens"]}


def peer_stats(name: str, path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", STATS_SCRIPTS[name], str(path)],
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    return {"records": found["records"], "completion_tokens": found["completion_tokens"]}


# --- the three id checks ------------------------------------------------------------------


def workbench_checks(run: Path) -> dict[str, int]:
    with quality_off():
        scan = scan_run(run, cache=False)
    counts = scan.files[DATASET].tally.counts
    return {"records": scan.files[DATASET].records, "out_of_vocab": counts.get("id_out_of_vocab", 0),
            "stray_think_end": counts.get("stray_think_end", 0),
            "unclosed": counts.get("reasoning_unclosed", 0)}


def polars_checks(path: Path) -> dict[str, int]:
    import polars as pl

    ids = pl.col("output_ids")
    found = pl.scan_ndjson(path).select(
        pl.len().alias("records"),
        ids.list.eval((pl.element() < 0) | (pl.element() >= VOCAB)).list.any().sum()
        .alias("out_of_vocab"),
        (ids.list.count_matches(THINK_END) > 1).sum().alias("stray_think_end"),
        ((ids.list.count_matches(THINK_END) == 0)
         & pl.col("finish_reason").is_in(["stop"])).sum().alias("unclosed"),
    ).collect()
    return {name: int(found[name][0]) for name in COUNTS}


def duckdb_checks(path: Path) -> dict[str, int]:
    import duckdb

    row = duckdb.sql(f"""
        SELECT count(*),
               count(*) FILTER (len(list_filter(output_ids, lambda x: x < 0 OR x >= {VOCAB})) > 0),
               count(*) FILTER (len(list_filter(output_ids, lambda x: x = {THINK_END})) > 1),
               count(*) FILTER (len(list_filter(output_ids, lambda x: x = {THINK_END})) = 0
                                AND finish_reason = 'stop')
        FROM read_json('{path}', format='newline_delimited',
                       columns={{'output_ids': 'BIGINT[]', 'finish_reason': 'VARCHAR'}})
    """).fetchall()[0]
    return dict(zip(COUNTS, map(int, row), strict=True))


# --- near-duplicate replies ---------------------------------------------------------------


def reply_ids(path: Path) -> list[np.ndarray]:
    return [np.asarray(row.output_ids or [], dtype=np.int64)
            for block in iter_blocks(path, with_output_ids=True) for row in block.rows]


def workbench_near(replies: list[np.ndarray]) -> int:
    lengths = np.array([len(r) for r in replies], dtype=np.int64)
    ends = np.cumsum(lengths)
    flat = np.concatenate(replies)
    sigs = sketch.signatures(flat, ends - lengths, sketch.clipped(ends - lengths, ends))
    return int((sketch.near_duplicates(sigs.astype(np.uint16)) >= 0).sum())


def datasketch_near(replies: list[np.ndarray]) -> int:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=sketch.DEFAULT_THRESHOLD, num_perm=sketch.DEFAULT_NUM_PERM)
    found = 0
    for index, ids in enumerate(replies):
        minhash = MinHash(num_perm=sketch.DEFAULT_NUM_PERM)
        minhash.update_batch([ids[i:i + 3].tobytes() for i in range(len(ids) - 2)])
        found += bool(lsh.query(minhash))
        lsh.insert(str(index), minhash)
    return found


# --- driver -------------------------------------------------------------------------------


SETTLE_SECONDS = 1.0  # a pause before each contender: what the last one left running winds down


def race(contenders: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any]]:
    """Best time and result of each contender, alternated round after round, each after a
    pause: polars' idle threads spin and DuckDB's allocator purges for a while after a query,
    which on two cores took a third more of the next contender's time (measured)."""
    best: dict[str, tuple[float, Any]] = {}
    for _ in range(repeat):
        for name, action in contenders.items():
            time.sleep(SETTLE_SECONDS)
            start = time.perf_counter()
            result = action()
            took = time.perf_counter() - start
            if name not in best or took < best[name][0]:
                best[name] = (took, result)
    return best


def report(title: str, results: dict[str, tuple[float, Any]], ours: str = "workbench") -> None:
    mine = results[ours][0]
    print(f"\n{title}")
    for name, (took, found) in results.items():
        ratio = "" if name == ours else f"  workbench {took / mine:5.2f}x its speed"
        print(f"  {name:<12} {took:8.2f} s{ratio}   {found}")
    answers = {json.dumps(found, sort_keys=True) for _, found in results.values()}
    if len(answers) > 1:
        raise SystemExit(f"{title}: the contenders disagree: {answers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grow", type=float, default=0.01)
    parser.add_argument("--sample", type=int, default=2000, help="replies datasketch hashes")
    parser.add_argument("--without-fast", action="store_true",
                        help="the compiled loops off: what a user without the fast extra gets")
    args = parser.parse_args()
    if args.without_fast:
        for module in (id_arrays, compiled, id_facts):
            module._kernel = lambda: None  # type: ignore[attr-defined]
    run = peers_run(args.size_mb)
    raw = run / DATASET / RAW_FILE
    print(f"run: {run} ({raw.stat().st_size / 1e6:,.0f} MB, json.dumps layout, no cache)")

    report("per-dataset stats, whole process", race({
        "workbench": lambda: workbench_stats(run),
        **{name: (lambda name=name: peer_stats(name, raw)) for name in STATS_SCRIPTS},
    }, args.repeat))
    checks = race({"workbench": lambda: workbench_checks(run), "polars": lambda: polars_checks(raw),
                   "duckdb": lambda: duckdb_checks(raw)}, args.repeat)
    report("three id checks over every id, first read", checks)

    full = race({"workbench": lambda: validate_run(run, cache=False)}, args.repeat)["workbench"][0]
    bare = checks["workbench"][0]
    print(f"\nfull validate, first read: {full:.2f} s ({full / bare:.2f}x the bare scan; "
          f"DuckDB's id checks {checks['duckdb'][0]:.2f} s)")
    grown = run.parent / f"{run.name}-grown"
    shutil.rmtree(grown, ignore_errors=True)
    shutil.copytree(run, grown)
    validate_run(grown)
    lines = raw.read_bytes().splitlines(keepends=True)
    with open(grown / DATASET / RAW_FILE, "ab") as file:
        file.writelines(lines[:max(1, int(len(lines) * args.grow))])
    start = time.perf_counter()
    validate_run(grown)
    print(f"validate after a {args.grow:.0%} append (cache kept): {time.perf_counter() - start:.2f} s"
          " (the peers read the whole file again)")
    shutil.rmtree(grown, ignore_errors=True)

    replies = reply_ids(raw)
    sample = replies[:args.sample]
    ours = race({"workbench": lambda: workbench_near(replies)}, args.repeat)["workbench"][0]
    theirs = race({"datasketch": lambda: datasketch_near(sample)}, 1)["datasketch"][0]
    scaled = theirs * len(replies) / len(sample)
    print(f"\nnear-duplicate replies (MinHash 128, 3-id shingles) of {len(replies):,} replies: "
          f"workbench {ours:.2f} s; datasketch {theirs:.2f} s on {len(sample):,}, about "
          f"{scaled:.0f} s for all ({scaled / ours:.0f}x)")


if __name__ == "__main__":
    main()
