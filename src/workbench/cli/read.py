"""The verbs that read a run: `stats`, `monitor`, `validate`, `score` and `export`.

    stats      per-dataset statistics (analyze.stats_text)
    monitor    the live dashboard (watch.monitor)
    validate   the format rules, duplicates, benchmarks (analyze.validate)
    score      each reply's likelihood under the target (analyze.score)
    export     training rows (export.exporter)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workbench.cli.args import add_decontaminate, csv, positive_int, server_url, share

__all__ = ["add_export", "add_monitor", "add_score", "add_stats", "add_validate"]


def add_stats(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stats", help="per-dataset statistics of a run directory",
                       description="Token counts, finish reasons, throughput and ETA per dataset.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=_cmd_stats)


def _cmd_stats(args: argparse.Namespace) -> int:
    from workbench.analyze.stats_text import render_stats

    print(render_stats(args.out, as_json=args.json))
    return 0


def add_monitor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("monitor", help="live dashboard of a run directory, with alerts",
                       description="Live per-dataset dashboard and ALERT lines; --once prints one frame.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--server", help="server URL to show running/queued requests and token usage")
    p.add_argument("--interval", type=float, default=None,
                   help="seconds between frames (2 on a terminal; without one, --once unless given)")
    p.add_argument("--once", action="store_true", help="print one plain-text frame and exit")
    p.set_defaults(func=_cmd_monitor)


def _cmd_monitor(args: argparse.Namespace) -> int:
    from workbench.watch.monitor import run_monitor

    server = server_url(args.server) if args.server else None
    return run_monitor(args.out, server=server, interval=args.interval, once=args.once)



def add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a run's records against the format rules",
                       description="Validate every record of a run; findings per dataset and rule.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--model-profile", help="model profile (default: the run's, else kimi-k2.5)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a finding is an error")
    p.add_argument("--only", type=csv, default=(), help="comma-separated dataset names")
    p.add_argument("--workers", type=positive_int, help="worker processes (default: CPU count)")
    add_decontaminate(p)
    p.add_argument("--tokenizer", help="tokenizer directory that reads the run's ids as words "
                                       "for --decontaminate (default: the run manifest's)")
    p.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer run its own code")
    _add_near_threshold(p)
    p.set_defaults(func=_cmd_validate)


def _add_near_threshold(p: argparse.ArgumentParser) -> None:
    p.add_argument("--near-threshold", type=share, default=0.5,
                   help="estimated Jaccard similarity from which replies are near duplicates "
                        "(0.5; prompts: 0.55, on what their template leaves)")
    p.add_argument("--template-share", type=share, default=0.5,
                   help="a prompt shingle held by this share of a dataset's first 1,000 "
                        "prompts is its template, left out before prompts are compared (0.5)")



def _cmd_validate(args: argparse.Namespace) -> int:
    import msgspec

    from workbench.analyze.quality import run_benchmarks
    from workbench.analyze.rules import Thresholds
    from workbench.analyze.validate import (
        benchmark_notes,
        exit_code,
        format_report,
        validate_run,
    )
    from workbench.rundir.run import load_run

    benchmarks = run_benchmarks(load_run(args.out, args.only), args.decontaminate,
                                field=args.benchmark_field, ngram=args.ngram,
                                tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code)
    if args.json:  # the text says how the benchmarks were chosen; JSON keeps stdout for data
        for note in benchmark_notes(benchmarks):
            print(f"workbench: note: {note}", file=sys.stderr)
    decontaminate = benchmarks.decontaminate
    thresholds = Thresholds(near_duplicate_threshold=args.near_threshold,
                            template_share=args.template_share)
    report = validate_run(args.out, model_profile=args.model_profile, only=args.only,
                          workers=args.workers, thresholds=thresholds, decontaminate=decontaminate)
    print(msgspec.json.encode(report.to_builtins()).decode() if args.json
          else format_report(report, benchmarks))
    return exit_code(report, strict=args.strict)


def add_score(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("score", help="score a run's replies by the target model's own likelihood",
                       description="Send every finished record back to the server to be scored "
                                   "without generating; per record the mean NLL of the reply "
                                   "and the mean top-K entropy go to RUN/<dataset>/scores.jsonl. "
                                   "Incremental: records already scored are skipped.")
    p.add_argument("out", type=Path, metavar="RUN", help="run directory (the --out of generate)")
    p.add_argument("--server", required=True, help="SGLang server or sglang-router URL")
    p.add_argument("--only", type=csv, default=(), help="comma-separated dataset names")
    p.add_argument("--concurrency", type=positive_int, default=32, help="requests in flight (32)")
    p.add_argument("--top-k", type=positive_int, default=20,
                   help="top logprobs per position for the entropy estimate (20)")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding the API key (default: WORKBENCH_API_KEY, "
                        "else SGLANG_API_KEY)")
    p.set_defaults(func=_cmd_score)


def _cmd_score(args: argparse.Namespace) -> int:
    from rich.console import Console

    from workbench.analyze.score import format_summary, progress_view, score_run
    from workbench.errors import ConfigError
    from workbench.server.client import api_key_from_env, check_server_auth

    server = server_url(args.server)
    api_key = api_key_from_env()
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ConfigError("--api-key-env", f"{args.api_key_env} is not set")
        check_server_auth(server, api_key)
    with progress_view(Console(stderr=True)) as on_progress:
        summary = score_run(args.out, server, only=args.only, concurrency=args.concurrency,
                            top_k=args.top_k, api_key=api_key, on_progress=on_progress)
    print(format_summary(summary))
    return 1 if summary.failed else 0


def add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write training rows (token ids + loss mask) from a run",
                       description="Export a run as token ids with a loss mask, or as conversations.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--to", required=True, type=Path, help="output file: .jsonl or .parquet")
    p.add_argument("--format", choices=("tokens", "conversations"), default="tokens",
                   help="tokens (exact ids, default) or conversations (decoded text)")
    p.add_argument("--only", type=csv, default=(), help="comma-separated dataset names")
    p.add_argument("--only-mode", type=csv, action="extend", default=[], metavar="NAME[,NAME]",
                   help="keep the records of these modes only (datasets that mix modes; "
                        "repeatable)")
    p.add_argument("--drop-truncated", action="store_true", help="leave out records cut at max_new_tokens")
    p.add_argument("--drop", type=csv, default=(),
                   help="leave out records failing these rules, e.g. reasoning_unclosed,repetition; "
                        "duplicate, near_duplicate (replies equal or nearly equal to an earlier "
                        "one) and contaminated (with --decontaminate) look across the run")
    add_decontaminate(p)
    _add_near_threshold(p)
    p.add_argument("--limit", type=positive_int, help="rows per dataset at most")
    p.add_argument("--shuffle", action="store_true", help="mix the rows of all datasets")
    p.add_argument("--seed", type=int, default=0, help="shuffle and sampling seed (0)")
    p.add_argument("--model-profile", help="model profile (default: the run's, else kimi-k2.5)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the run manifest's)")
    p.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer run its own code")
    p.add_argument("--for", dest="trainer", choices=("specforge", "speculators"),
                   help="write what that trainer reads (JSONL input_ids + loss_mask), a manifest "
                        "beside it, and print its command line")
    p.add_argument("--max-length", type=positive_int,
                   help="with --for: the trainer's max_length; prints the rows it would cut")
    p.add_argument("--reasoning", choices=("auto", "field", "inline"), default="auto",
                   help="conversations: reasoning as reasoning_content (field), in content "
                        "between the model's think tags (inline), or per row whichever the chat "
                        "template renders back to the generated ids (auto, default)")
    p.add_argument("--keep-truncated", action="store_true",
                   help="conversations: keep replies cut at max_new_tokens (dropped by default)")
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from workbench.export.exporter import export_run, format_summary
    from workbench.export.options import ExportOptions

    drop = (("truncated",) if args.drop_truncated else ()) + args.drop
    options = ExportOptions(format=args.format, only=args.only,
                            only_mode=tuple(args.only_mode), drop=drop, limit=args.limit,
                            shuffle=args.shuffle, seed=args.seed, model_profile=args.model_profile,
                            tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code,
                            trainer=args.trainer, max_length=args.max_length,
                            reasoning=args.reasoning, keep_truncated=args.keep_truncated,
                            decontaminate=args.decontaminate,
                            benchmark_field=args.benchmark_field, ngram=args.ngram,
                            near_threshold=args.near_threshold,
                            template_share=args.template_share)
    print(format_summary(export_run(args.out, args.to, options)))
    return 0
