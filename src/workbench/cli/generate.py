"""`workbench generate`: its options, a run with a progress view, and the run's exit code.

`generate_with_progress` and `generate_exit_code` serve `workbench demo` too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.cli.args import (
    add_decontaminate,
    check_out_dir,
    concurrency,
    csv,
    fraction_or_off,
    non_negative_int,
    positive_float,
    positive_int,
    seconds_or_off,
    server_url,
)
from workbench.cli.exits import EXIT_STORAGE

if TYPE_CHECKING:
    from workbench.generate.progress import RunSummary

__all__ = ["add_generate", "generate_exit_code", "generate_with_progress", "resume_command"]


def add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="send a dataset manifest's prompts to a server",
                       description="Generate responses for every dataset of a manifest; resumable.")
    p.add_argument("--datasets", required=True, type=Path, help="dataset manifest YAML")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="SGLang server or sglang-router URL")
    where.add_argument("--launch", type=Path, metavar="SERVER.yaml",
                       help="start the server of this file's `server` section (the tuning "
                            "parameters' one) and supervise it: restarted when it dies, "
                            "stalls or degrades; its log is OUT/server.log")
    p.add_argument("--out", required=True, type=Path, help="output directory of the run")
    p.add_argument("--only", type=csv, default=(), help="comma-separated dataset names")
    p.add_argument("--concurrency", type=concurrency, default=None, metavar="auto|N",
                   help="requests in flight: auto (steered from the server's /metrics; the "
                        "default unless the manifest sets concurrency) or a fixed cap N")
    p.add_argument("--long-concurrency", type=positive_int, default=16,
                   help="requests in flight with long prompts (16)")
    p.add_argument("--long-threshold", type=positive_int, default=4096,
                   help="prompt tokens above which a prompt is long (4096)")
    p.add_argument("--max-samples", type=positive_int, help="prompts per dataset at most")
    p.add_argument("--max-tokens-per-dataset", type=positive_int,
                   help="completion-token budget per dataset")
    p.add_argument("--max-new-tokens", type=positive_int, help="override sampling.max_new_tokens")
    p.add_argument("--seed", type=non_negative_int,
                   help="the seed of a new run's send order and mode draw (a resume keeps its "
                        "run's; default: a fresh one, kept in run.json as order_seed)")
    p.add_argument("--max-attempts", type=positive_int, default=5, help="attempts per prompt (5)")
    p.add_argument("--no-resume", action="store_true",
                   help="start over (existing outputs are moved aside, never deleted)")
    p.add_argument("--force", action="store_true",
                   help="resume even though the model or sampling parameters changed")
    p.add_argument("--progress-interval", type=positive_float,
                   help="seconds between progress lines (5), or bar updates on a terminal (1)")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after Ctrl-C (30)")
    p.add_argument("--request-timeout", type=positive_float, default=3600.0, metavar="SECONDS",
                   help="seconds a whole reply may take, from the request's start, before the "
                        "attempt counts as failed, is aborted on the server and retried (3600)")
    p.add_argument("--server-wait", type=positive_float, default=3600.0, metavar="SECONDS",
                   help="while the server cannot be reached, requests wait for it; stop the run "
                        "after this long (3600)")
    p.add_argument("--disk-wait", type=positive_float, default=1800.0, metavar="SECONDS",
                   help="while a write fails (disk full, I/O error), sending pauses and replies "
                        "are held; stop the run after this long (1800)")
    p.add_argument("--stall-timeout", type=seconds_or_off, default=300.0, metavar="SECONDS",
                   help="say (and note in run.json) when the server generates no token for this "
                        "long while requests are in flight (tokens are seen every 50 of a "
                        "request, after its prefill: keep it well above that); 0: off (300)")
    p.add_argument("--degrade-fraction", type=fraction_or_off, default=0.25, metavar="F",
                   help="say (and note in run.json) when the server's token throughput falls "
                        "below F of its best with its KV cache full and requests retracted; "
                        "0: off (0.25)")
    p.add_argument("--gpus", type=non_negative_int, metavar="N",
                   help="the GPUs serving the run, for the GPU-hours of the closing summary "
                        "(default: the server's tp x pp x dp from /server_info; through a "
                        "router, the first worker's times the workers); 0 for a CPU server: "
                        "hours, no GPU-hours")
    p.add_argument("--max-restarts", type=non_negative_int, default=3, metavar="N",
                   help="--launch: restarts of the server before the run stops (3)")
    p.add_argument("--restart-backoff", type=positive_float, default=10.0, metavar="SECONDS",
                   help="--launch: wait before the first restart, doubling after each (10)")
    add_decontaminate(p, "keep each record's overlap with these benchmark files (JSONL or "
                          "Parquet) as it is written; run.json names them, so validate, "
                          "reports and export look for them too (default: on resume, the "
                          "run's)")
    p.set_defaults(func=_cmd_generate)


def _progress_interval(given: float | None) -> float:
    """Seconds between progress updates: as given, else 1 for bars on a terminal, 5 for lines."""
    if given is not None:
        return given
    return 1.0 if sys.stdout.isatty() else 5.0


def _options_from_args(args: argparse.Namespace) -> Any:
    from workbench.generate.plan import GenerateOptions

    return GenerateOptions(
        concurrency=args.concurrency, long_concurrency=args.long_concurrency,
        long_threshold=args.long_threshold, only=args.only, max_samples=args.max_samples,
        max_tokens_per_dataset=args.max_tokens_per_dataset, max_new_tokens=args.max_new_tokens,
        resume=not args.no_resume, force=args.force, max_attempts=args.max_attempts,
        progress_interval=_progress_interval(args.progress_interval), grace_period=args.grace_period,
        request_timeout=args.request_timeout, preflight=True, server_wait=args.server_wait,
        disk_wait=args.disk_wait, gpus=args.gpus, decontaminate=args.decontaminate,
        benchmark_field=args.benchmark_field, ngram=args.ngram, seed=args.seed,
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    from workbench.config import load_manifest

    check_out_dir(args.out)
    manifest = load_manifest(args.datasets)
    from workbench.rundir.layout import check_dataset_names

    check_dataset_names(manifest)  # before any server is started for it (--launch)
    from workbench.generate.launched import LaunchSettings
    from workbench.generate.watchdog import WatchdogSettings
    from workbench.server.spec import load_server_params

    launch = None if args.launch is None else LaunchSettings(
        load_server_params(args.launch), max_restarts=args.max_restarts,
        backoff=args.restart_backoff)
    server = server_url(args.server) if args.server is not None else None
    watchdog = WatchdogSettings(stall_seconds=args.stall_timeout,
                                degrade_fraction=args.degrade_fraction)
    summary = generate_with_progress(manifest, server, args.out, _options_from_args(args),
                                     watchdog=watchdog, launch=launch)
    return generate_exit_code(summary)


def generate_exit_code(summary: RunSummary) -> int:
    """74 (EX_IOERR) when a failed write stopped the run or left lines unwritten, 130 when
    stopped, 1 when prompts failed after all their attempts, else 0."""
    if summary.storage_error is not None or summary.unwritten:
        return EXIT_STORAGE
    if summary.interrupted:
        return 130
    return 1 if summary.failed else 0


def generate_with_progress(manifest: Any, server: str | None, out: Path, options: Any,
                           watchdog: Any = None, launch: Any = None) -> RunSummary:
    """Run a generation with signal handling, a progress view (bars on a terminal, lines
    otherwise), the watchdog's settings (None: its defaults), the server to launch (None:
    `server` is its URL) and a closing summary."""
    from rich.console import Console

    from workbench.generate.session import run_with_view
    from workbench.generate.views import LineView, RichView, summary_lines

    view = RichView(out, Console()) if sys.stdout.isatty() else LineView(out, _say)
    summary = run_with_view(manifest, server, out, options, view,
                            lambda message: print(message, file=sys.stderr, flush=True), watchdog,
                            launch)
    for line in summary_lines(summary, out, resume_command()):
        _say(line)
    return summary


def _say(message: str) -> None:
    print(message, flush=True)


def resume_command() -> str:
    """This very command, as a resume runs it (without --no-resume)."""
    import shlex

    return shlex.join(["workbench", *(a for a in sys.argv[1:] if a != "--no-resume")])
