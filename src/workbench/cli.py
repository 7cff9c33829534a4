"""The `workbench` command: a thin shell over the functions the notebooks call too.

Expected failures (bad input, an unreachable server, a server that will not start) print
one line `workbench: error: ...` and exit 2, never a traceback. Imports are lazy so that a
quick verb does not pay for the whole stack.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from workbench.generate.progress import RunSummary

__all__ = ["build_parser", "main"]

EXIT_INPUT = 2
EXIT_STORAGE = 74  # sysexits' EX_IOERR: a file could not be written (full disk, I/O error)
EXIT_SIGPIPE = 141  # 128 + SIGPIPE (13): what a shell reports of a tool SIGPIPE killed
EXIT_SIGTERM = 143  # 128 + SIGTERM (15)
# Verbs that stop gracefully on SIGTERM by their own handlers (a run, a sweep, a server) or
# that only wait on a child (explore): main leaves their SIGTERM alone.
OWN_SIGTERM_VERBS = frozenset({"generate", "demo", "sim", "tune", "explore"})


def _err(message: str) -> None:
    print(f"workbench: error: {message}", file=sys.stderr, flush=True)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {value}")
    return value


def _concurrency(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _seconds_or_off(text: str) -> float:
    """A number of seconds, 0 for off."""
    if text.strip() in ("0", "0.0"):
        return 0.0
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 0 (off)") from None


def _fraction_or_off(text: str) -> float:
    """A fraction in (0, 1), 0 for off."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction below 1, or 0 (off), got {text}")
    return value


def _share(text: str) -> float:
    """A share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share above 0 and at most 1, got {text}")
    return value


def _check_out_dir(path: Path) -> None:
    """ConfigError when --out is a file or lies under one (before anything is written)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        from workbench.errors import ConfigError

        raise ConfigError("--out", f"{existing} is a file, not a directory")


def _server_url(text: str) -> str:
    """--server as the client needs it; each fix is said on stderr (never with the URL's
    credentials or query). ConfigError when the URL holds credentials and an API key is set
    in the environment too."""
    from workbench.server.client import api_key_from_env, check_server_auth, server_base_url

    url, notices = server_base_url(text)
    check_server_auth(url, api_key_from_env())
    for notice in notices:
        print(f"workbench: note: {notice}", file=sys.stderr, flush=True)
    return url


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, naming the verb's --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"workbench: error: {message} (see: {self.prog} --help)\n")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


# --------------------------------------------------------------------------- sim
def _add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from workbench.sim.config import add_sim_arguments

    parser = sub.add_parser("sim", help="run the SGLang-compatible simulator",
                            description="Serve SGLang's HTTP API from a simulated GPU server.")
    add_sim_arguments(parser)
    parser.set_defaults(func=_cmd_sim)


def _cmd_sim(args: argparse.Namespace) -> int:
    from workbench.sim.app import serve
    from workbench.sim.config import config_from_args

    config = config_from_args(args)
    _check_address_free(config.host, config.port)
    serve(config)
    return 0


def _check_address_free(host: str, port: int) -> None:
    """ConfigError naming the address when it cannot be bound (port 0 picks a free one)."""
    import socket

    from workbench.errors import ConfigError

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError("--port", f"cannot listen on {host}:{port}: {reason}") from None


# --------------------------------------------------------------------------- generate
def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--only", type=_csv, default=(), help="comma-separated dataset names")
    p.add_argument("--concurrency", type=_concurrency, default=None, metavar="auto|N",
                   help="requests in flight: auto (steered from the server's /metrics; the "
                        "default unless the manifest sets concurrency) or a fixed cap N")
    p.add_argument("--long-concurrency", type=_positive_int, default=16,
                   help="requests in flight with long prompts (16)")
    p.add_argument("--long-threshold", type=_positive_int, default=4096,
                   help="prompt tokens above which a prompt is long (4096)")
    p.add_argument("--max-samples", type=_positive_int, help="prompts per dataset at most")
    p.add_argument("--max-tokens-per-dataset", type=_positive_int,
                   help="completion-token budget per dataset")
    p.add_argument("--max-new-tokens", type=_positive_int, help="override sampling.max_new_tokens")
    p.add_argument("--max-attempts", type=_positive_int, default=5, help="attempts per prompt (5)")
    p.add_argument("--no-resume", action="store_true",
                   help="start over (existing outputs are moved aside, never deleted)")
    p.add_argument("--force", action="store_true",
                   help="resume even though the model or sampling parameters changed")
    p.add_argument("--progress-interval", type=_positive_float,
                   help="seconds between progress lines (5), or bar updates on a terminal (1)")
    p.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after Ctrl-C (30)")
    p.add_argument("--request-timeout", type=_positive_float, default=3600.0, metavar="SECONDS",
                   help="seconds a whole reply may take, from the request's start, before the "
                        "attempt counts as failed, is aborted on the server and retried (3600)")
    p.add_argument("--server-wait", type=_positive_float, default=3600.0, metavar="SECONDS",
                   help="while the server cannot be reached, requests wait for it; stop the run "
                        "after this long (3600)")
    p.add_argument("--disk-wait", type=_positive_float, default=1800.0, metavar="SECONDS",
                   help="while a write fails (disk full, I/O error), sending pauses and replies "
                        "are held; stop the run after this long (1800)")
    p.add_argument("--stall-timeout", type=_seconds_or_off, default=300.0, metavar="SECONDS",
                   help="say (and note in run.json) when the server generates no token for this "
                        "long while requests are in flight (tokens are seen every 50 of a "
                        "request, after its prefill: keep it well above that); 0: off (300)")
    p.add_argument("--degrade-fraction", type=_fraction_or_off, default=0.25, metavar="F",
                   help="say (and note in run.json) when the server's token throughput falls "
                        "below F of its best with its KV cache full and requests retracted; "
                        "0: off (0.25)")
    p.add_argument("--gpus", type=_positive_int, metavar="N",
                   help="the GPUs serving the run, for the GPU-hours of the closing summary "
                        "(default: the server's tp x pp x dp from /server_info; through a "
                        "router, the first worker's times the workers)")
    p.add_argument("--max-restarts", type=_non_negative_int, default=3, metavar="N",
                   help="--launch: restarts of the server before the run stops (3)")
    p.add_argument("--restart-backoff", type=_positive_float, default=10.0, metavar="SECONDS",
                   help="--launch: wait before the first restart, doubling after each (10)")
    _add_decontaminate(p, "keep each record's overlap with these benchmark files (JSONL or "
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
        benchmark_field=args.benchmark_field, ngram=args.ngram,
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    from workbench.config import load_manifest

    _check_out_dir(args.out)
    manifest = load_manifest(args.datasets)
    from workbench.generate.launched import LaunchSettings
    from workbench.generate.watchdog import WatchdogSettings
    from workbench.server.spec import load_server_params

    launch = None if args.launch is None else LaunchSettings(
        load_server_params(args.launch), max_restarts=args.max_restarts,
        backoff=args.restart_backoff)
    server = _server_url(args.server) if args.server is not None else None
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


# --------------------------------------------------------------------------- stats, monitor
def _add_stats(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stats", help="per-dataset statistics of a run directory",
                       description="Token counts, finish reasons, throughput and ETA per dataset.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=_cmd_stats)


def _cmd_stats(args: argparse.Namespace) -> int:
    from workbench.analyze.stats_text import render_stats

    print(render_stats(args.out, as_json=args.json))
    return 0


def _add_monitor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

    server = _server_url(args.server) if args.server else None
    return run_monitor(args.out, server=server, interval=args.interval, once=args.once)


# --------------------------------------------------------------------------- validate, export
def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("validate", help="check a run's records against the format rules",
                       description="Validate every record of a run; findings per dataset and rule.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--model-profile", help="model profile (default: the run's, else kimi-k2.5)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a finding is an error")
    p.add_argument("--only", type=_csv, default=(), help="comma-separated dataset names")
    p.add_argument("--workers", type=_positive_int, help="worker processes (default: CPU count)")
    _add_decontaminate(p)
    p.add_argument("--tokenizer", help="tokenizer directory that reads the run's ids as words "
                                       "for --decontaminate (default: the run manifest's)")
    p.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer run its own code")
    _add_near_threshold(p)
    p.set_defaults(func=_cmd_validate)


def _add_near_threshold(p: argparse.ArgumentParser) -> None:
    p.add_argument("--near-threshold", type=_share, default=0.5,
                   help="estimated Jaccard similarity from which replies are near duplicates "
                        "(0.5; prompts: 0.9)")


def _add_decontaminate(p: argparse.ArgumentParser, what: str | None = None) -> None:
    """--decontaminate FILE,... | --no-decontaminate (default None: the run's benchmarks,
    run.json), --benchmark-field, --ngram (None: the run's, else 13)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--decontaminate", type=_csv, metavar="FILE,...",
                       help=what or "comma-separated benchmark files (JSONL or Parquet) to look "
                                    "for in the prompts and replies: an n-gram of normalised "
                                    "words in common flags a record (default: the ones generate "
                                    "was given, run.json)")
    group.add_argument("--no-decontaminate", dest="decontaminate", action="store_const", const=(),
                       help="look for no benchmark, not even the run's")
    p.add_argument("--benchmark-field", metavar="FIELD",
                   help="the benchmark files' prompt field (default: the run's, else the first "
                        "of prompt, question, problem, instruction, input, text, turns)")
    p.add_argument("--ngram", type=_positive_int,
                   help="words in a benchmark n-gram (default: the run's, else 13, the usual rule)")


def _cmd_validate(args: argparse.Namespace) -> int:
    import msgspec

    from workbench.analyze.quality import run_benchmarks
    from workbench.analyze.rules import Thresholds
    from workbench.analyze.validate import exit_code, format_report, validate_run
    from workbench.rundir.run import load_run

    benchmarks = run_benchmarks(load_run(args.out, args.only), args.decontaminate,
                                field=args.benchmark_field, ngram=args.ngram,
                                tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code)
    for note in benchmarks.notes:
        print(f"workbench: note: {note}", file=sys.stderr)
    decontaminate = benchmarks.decontaminate
    thresholds = Thresholds(near_duplicate_threshold=args.near_threshold)
    report = validate_run(args.out, model_profile=args.model_profile, only=args.only,
                          workers=args.workers, thresholds=thresholds, decontaminate=decontaminate)
    print(msgspec.json.encode(report.to_builtins()).decode() if args.json else format_report(report))
    return exit_code(report, strict=args.strict)


def _add_score(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("score", help="score a run's replies by the target model's own likelihood",
                       description="Send every finished record back to the server to be scored "
                                   "without generating; per record the mean NLL of the reply "
                                   "and the mean top-K entropy go to RUN/<dataset>/scores.jsonl. "
                                   "Incremental: records already scored are skipped.")
    p.add_argument("out", type=Path, metavar="RUN", help="run directory (the --out of generate)")
    p.add_argument("--server", required=True, help="SGLang server or sglang-router URL")
    p.add_argument("--only", type=_csv, default=(), help="comma-separated dataset names")
    p.add_argument("--concurrency", type=_positive_int, default=32, help="requests in flight (32)")
    p.add_argument("--top-k", type=_positive_int, default=20,
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

    server = _server_url(args.server)
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

def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write training rows (token ids + loss mask) from a run",
                       description="Export a run as token ids with a loss mask, or as conversations.")
    p.add_argument("out", type=Path, help="run directory (the --out of generate)")
    p.add_argument("--to", required=True, type=Path, help="output file: .jsonl or .parquet")
    p.add_argument("--format", choices=("tokens", "conversations"), default="tokens",
                   help="tokens (exact ids, default) or conversations (decoded text)")
    p.add_argument("--only", type=_csv, default=(), help="comma-separated dataset names")
    p.add_argument("--drop-truncated", action="store_true", help="leave out records cut at max_new_tokens")
    p.add_argument("--drop", type=_csv, default=(),
                   help="leave out records failing these rules, e.g. reasoning_unclosed,repetition; "
                        "duplicate, near_duplicate (replies equal or nearly equal to an earlier "
                        "one) and contaminated (with --decontaminate) look across the run")
    _add_decontaminate(p)
    _add_near_threshold(p)
    p.add_argument("--limit", type=_positive_int, help="rows per dataset at most")
    p.add_argument("--shuffle", action="store_true", help="mix the rows of all datasets")
    p.add_argument("--seed", type=int, default=0, help="shuffle and sampling seed (0)")
    p.add_argument("--model-profile", help="model profile (default: the run's, else kimi-k2.5)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the run manifest's)")
    p.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer run its own code")
    p.add_argument("--for", dest="trainer", choices=("specforge", "speculators"),
                   help="write what that trainer reads (JSONL input_ids + loss_mask), a manifest "
                        "beside it, and print its command line")
    p.add_argument("--max-length", type=_positive_int,
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
    options = ExportOptions(format=args.format, only=args.only, drop=drop, limit=args.limit,
                            shuffle=args.shuffle, seed=args.seed, model_profile=args.model_profile,
                            tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code,
                            trainer=args.trainer, max_length=args.max_length,
                            reasoning=args.reasoning, keep_truncated=args.keep_truncated,
                            decontaminate=args.decontaminate,
                            benchmark_field=args.benchmark_field, ngram=args.ngram,
                            near_threshold=args.near_threshold)
    print(format_summary(export_run(args.out, args.to, options)))
    return 0


# --------------------------------------------------------------------------- report
def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="execute a report notebook into an HTML report",
                       description="Execute the report notebook NAME with papermill and export it "
                                   "to HTML (code hidden, plotly.js inlined: opens offline); "
                                   "OUT/index.html lists every rendering. With --every, check "
                                   "again at each interval and render only when the report's "
                                   "inputs changed.")
    p.add_argument("name", metavar="NAME", nargs="?",
                   help="token_distribution, format_validation, throughput_tuning or explore "
                        "(./notebooks/NAME.ipynb when it exists, else the packaged one)")
    p.add_argument("--rerun", type=Path, metavar="REPORT_DIR",
                   help="run a report folder's notebook again with its params.yaml (into a new "
                        "folder beside it, or --out) and say whether its inputs changed since")
    p.add_argument("--index", type=Path, metavar="DIR",
                   help="only write DIR/index.html, the list of the renderings in DIR")
    p.add_argument("--params", type=Path,
                   help="parameter file (YAML; default ./params/NAME.yaml when it exists, else "
                        "the packaged demo parameters of NAME)")
    p.add_argument("-p", "--param", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one parameter (a YAML scalar); repeatable")
    p.add_argument("--out", type=Path,
                   help="folder for NAME-<timestamp>/, the NAME-latest link and index.html "
                        "(outputs/reports)")
    p.add_argument("--every", type=_interval, metavar="INTERVAL",
                   help="keep checking at this interval (30s, 10m, 1h, 1h30m) and render when "
                        "the inputs changed since the last rendering; Ctrl-C stops (exit 130)")
    p.add_argument("--until", choices=("done",),
                   help="with --every: stop once the run is finished (exit 0)")
    p.add_argument("--keep", type=_positive_int, metavar="N",
                   help="after each rendering, remove this report's renderings but the newest "
                        "N (never the one NAME-latest points at)")
    p.set_defaults(func=_cmd_report)


def _interval(text: str) -> float:
    from workbench.errors import ConfigError
    from workbench.report.schedule import parse_interval

    try:
        return parse_interval(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError, InputError, ReportError
    from workbench.report.parameters import default_params, parse_overrides
    from workbench.report.render import DEFAULT_OUT, run_report

    if args.index is not None:
        return _index_report(args)
    if (args.rerun is None) == (args.name is None):
        raise ConfigError("NAME", "give a report NAME, --rerun REPORT_DIR or --index DIR (one)")
    if args.until is not None and args.every is None:
        raise ConfigError("--until", "goes with --every")
    if args.rerun is not None:
        return _rerun_report(args)
    args.out = args.out or DEFAULT_OUT
    params = args.params if args.params is not None else default_params(Path(args.name).stem)
    if args.params is None and params is not None:
        print(f"parameters: {params}", file=sys.stderr, flush=True)
    overrides = parse_overrides(args.overrides)
    try:
        if args.every is not None:
            return _watch_report(args, params, overrides)
        result = run_report(args.name, params, overrides, args.out)
    except ReportError as exc:
        _err(str(exc))
        return 1
    except InputError as exc:
        if args.params is None and "not a run directory" in str(exc) and "run_dir" not in overrides:
            raise InputError(f"{exc} (run `workbench demo` first, or pass -p run_dir=OUT)") from None
        raise
    if args.keep is not None:
        _prune(args.out, args.name, args.keep)
    print(f"executed notebook: {result.notebook_path}")
    print(result.html_path)
    took = result.seconds
    print(f"report time: {took['total']:.1f}s (notebook {took['notebook']:.1f}s, "
          f"HTML {took['html']:.1f}s); index: {args.out / 'index.html'}", file=sys.stderr)
    return 0


def _prune(out: Path, name: str, keep: int) -> None:
    from workbench.report.index import prune, write_index

    for folder in prune(out, name, keep):
        print(f"removed {folder}", file=sys.stderr)
    write_index(out)


def _index_report(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError
    from workbench.report.index import renderings, write_index

    if args.name is not None or args.rerun is not None or args.every is not None:
        raise ConfigError("--index", "takes only the reports folder: no NAME, --rerun or --every")
    if not args.index.is_dir():
        raise ConfigError("--index", f"{args.index}: no such folder")
    path = write_index(args.index)
    print(f"{len(renderings(args.index))} renderings", file=sys.stderr)
    print(path)
    return 0


def _watch_report(args: argparse.Namespace, params: Path | None, overrides: dict[str, Any]) -> int:
    """`--every`: the schedule's lines on stdout, each with the time; Ctrl-C ends it with
    130 (128 + SIGINT, as an interrupted `workbench tune`: a script can tell a stopped
    schedule from one that ended with its run, 0)."""
    import time

    from workbench.report.schedule import Schedule, Watch, watch_report

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    schedule = Schedule(args.name, params, overrides, args.out, every=args.every,
                        until=args.until, keep=args.keep)
    watch = Watch()
    try:
        watch = watch_report(schedule, say=say)
    except KeyboardInterrupt:
        print(f"stopped (Ctrl-C); index: {args.out / 'index.html'}", file=sys.stderr, flush=True)
        return 130
    print(f"{watch.checks} checks, {len(watch.rendered)} renderings, {len(watch.failed)} failed; "
          f"index: {args.out / 'index.html'}", flush=True)
    return 0


def _rerun_report(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError, ReportError
    from workbench.report.render import rerun_report

    if args.params is not None or args.overrides:
        raise ConfigError("--rerun", "takes the report's own params.yaml: no --params or -p")
    if args.every is not None or args.keep is not None:
        raise ConfigError("--rerun", "runs once: no --every or --keep")
    try:
        result, changes = rerun_report(args.rerun, args.out)
    except ReportError as exc:
        _err(str(exc))
        return 1
    changed = [c for c in changes if c.state != "unchanged"]
    if changed:
        print(f"inputs changed since {args.rerun}:")
        for change in changed:
            print(f"  {change.line()}")
    else:
        print(f"inputs unchanged since {args.rerun} ({len(changes)} files)")
    print(f"executed notebook: {result.notebook_path}")
    print(result.html_path)
    return 0


# --------------------------------------------------------------------------- explore
def _add_explore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explore", help="JupyterLab on a run's own explorer notebook",
                       description="Open JupyterLab on RUN/explore.ipynb (made from the package's "
                                   "explore notebook when missing) and print its URL; Ctrl-C stops it.")
    p.add_argument("out", type=Path, metavar="RUN", help="run directory (the --out of generate)")
    p.add_argument("--port", type=_positive_int, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--no-browser", action="store_true", help="only print the URL")
    p.set_defaults(func=_cmd_explore)


def _cmd_explore(args: argparse.Namespace) -> int:
    from workbench.report.lab import explorer_notebook, start_lab
    from workbench.server.launch import port_is_free

    if args.port is not None and not port_is_free(args.port):
        from workbench.errors import ConfigError

        raise ConfigError("--port", f"port {args.port} on 127.0.0.1 is in use")
    notebook, created = explorer_notebook(args.out)
    print(f"{'created' if created else 'using'} {notebook}", flush=True)
    print("starting JupyterLab ...", flush=True)
    lab = start_lab(args.out, notebook.name, port=args.port)
    print(lab.url, flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(lab.url)
    try:
        return lab.wait()
    finally:
        lab.stop()


# --------------------------------------------------------------------------- tune
def _add_tune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tune", help="sweep server configurations under load, recommend one",
                       description="Launch the server (SGLang or the simulator) for each configuration, "
                                   "measure throughput and latency at each concurrency, recommend the "
                                   "best configuration and project the job's time. "
                                   "`workbench tune fit SWEEP_DIR` fits a simulator profile to a sweep.")
    p.add_argument("--params", type=Path, help="tuning parameters (params/tuning.sim.yaml); required")
    p.add_argument("--out", type=Path, help="output directory (default: outputs/tuning/<params name>)")
    p.add_argument("--dry-run", action="store_true", help="print the server commands and exit")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out, skipping its finished points")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter, e.g. --set server.launcher=sim (repeatable)")
    p.add_argument("--no-report", action="store_true",
                   help="do not render the throughput_tuning report of a finished sweep (by default "
                        "it goes to outputs/reports and its index.html)")
    p.set_defaults(func=_cmd_tune, tune_parser=p)
    verbs = p.add_subparsers(dest="tune_command", metavar="{fit}")
    _add_tune_fit(verbs)


def _add_tune_fit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fit", help="fit a simulator profile to a measured sweep",
                       description="Fit the simulator's step-time constants, memory and output "
                                   "lengths to a sweep's measured points (workbench.tune.fit) and "
                                   "write a profile for `workbench sim --profile FILE.yaml`.")
    p.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", help="a `workbench tune` --out")
    p.add_argument("--out", type=Path, required=True, metavar="PROFILE.yaml",
                   help="the profile file to write (.yaml or .yml)")
    p.add_argument("--configs", type=_csv, default=(), metavar="A,B,...",
                   help="configurations to fit on (default: every one with an ok point); the "
                        "others are held out")
    p.add_argument("--predict", action="store_true",
                   help="then replay the held-out configurations on the simulator with the "
                        "profile and compare (fit.csv beside the profile)")
    p.add_argument("--speed", type=_positive_float, default=None,
                   help="simulator speed of the replay (default: about 2,500 tok/s of wall clock)")
    p.set_defaults(func=_cmd_tune_fit)


def _cmd_tune(args: argparse.Namespace) -> int:
    from workbench.tune import run_sweep_cli

    if args.params is None:
        args.tune_parser.error("the following arguments are required: --params")
    from workbench.report.render import DEFAULT_OUT

    return run_sweep_cli(args.params, args.out, dry_run=args.dry_run, resume=args.resume,
                         overrides=args.overrides, say=lambda m: print(m, flush=True),
                         report_dir=None if args.no_report else DEFAULT_OUT)


def _cmd_tune_fit(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError
    from workbench.sim.profiles import is_profile_path
    from workbench.tune.fit import (
        FIT_FILE,
        fit_profile,
        format_fit,
        format_predictions,
        predict,
        write_profile,
    )

    if not is_profile_path(str(args.out)):
        raise ConfigError("--out", f"a profile file ends in .yaml or .yml, got {args.out}")
    profile, report = fit_profile(args.sweep_dir, args.configs or None)
    print(format_fit(report))
    print(f"wrote {write_profile(profile, report, args.out)}", flush=True)
    if args.predict:
        rows = predict(args.sweep_dir, args.out, fitted=report.configs, speed=args.speed,
                       say=lambda m: print(m, flush=True))
        print(format_predictions(rows))
        print(f"wrote {args.out.parent / FIT_FILE}")
    return 0


# --------------------------------------------------------------------------- init, demo
def _add_init(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("init", help="a job folder: parameter files and report notebooks",
                       description="Write a job folder for your own work: commented parameter files "
                                   "(datasets, tuning sweep, router, reports), the report notebooks "
                                   "and a README with the commands. Nothing is overwritten.")
    p.add_argument("dir", type=Path, metavar="DIR", help="the job folder (created when missing)")
    p.set_defaults(func=_cmd_init)


def _cmd_init(args: argparse.Namespace) -> int:
    from workbench.jobfolder import init_job_folder

    written = init_job_folder(args.dir)
    for path in written:
        print(f"wrote {path}")
    print(f"next: cd {args.dir} and edit params/datasets.yaml (README.md has the commands)")
    return 0


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="the whole pipeline on the simulator",
                       description="Start the simulator, generate the example datasets, report.")
    p.add_argument("--out", type=Path, default=Path("outputs/demo"), help="output directory")
    p.add_argument("--datasets", type=Path,
                   help="dataset manifest (default: the packaged params/datasets.demo.yaml)")
    p.add_argument("--no-resume", action="store_true", help="start the demo run over")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.demo import run_demo
    from workbench.resources import data_dir

    _check_out_dir(args.out)
    datasets = args.datasets if args.datasets is not None else data_dir("params") / "datasets.demo.yaml"
    summary = run_demo(args.out, datasets=datasets, resume=not args.no_resume,
                       generate=generate_with_progress, say=lambda m: print(m, flush=True))
    return generate_exit_code(summary)


# --------------------------------------------------------------------------- main
def _server_message(exc: Exception) -> str:
    """The error on one line, naming the URL when the message does not already, with a hint
    where the URL is probably wrong (a 404 on the info paths); no URL in it shows credentials
    or a query string."""
    from workbench.server.client import redact_url, redact_urls_in

    message = redact_urls_in(" ".join(str(exc).split()))
    url = getattr(exc, "url", None)
    url = redact_url(url) if url else None
    message = f"{url}: {message}" if url and url not in message else message
    if url and getattr(exc, "http_status", None) == 404:
        message += _not_found_hint(url)
    return message


def _not_found_hint(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    base = parts.path.rsplit("/", 1)[0]
    if base:
        return (f" (no SGLang server at {parts.scheme}://{parts.netloc}{base}: the URL should "
                f"probably be {parts.scheme}://{parts.netloc})")
    return f" (is {parts.scheme}://{parts.netloc} an SGLang server or sglang-router?)"


COMMANDS: Sequence[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = (
    _add_sim, _add_generate, _add_stats, _add_validate, _add_score, _add_monitor, _add_export,
    _add_report, _add_explore, _add_tune, _add_init, _add_demo,
)


def build_parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = _Parser(
        prog="workbench", description="Generate, watch, report on and tune EAGLE-3 data jobs on SGLang.")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub: argparse._SubParsersAction[Any] = parser.add_subparsers(
        dest="command", required=True, metavar="VERB")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the verb of argv; its exit code. A closed stdout ends quietly with 141; SIGTERM
    ends a verb without handlers of its own through its cleanups, with 143."""
    try:
        args = _parse(argv)
        with _sigterm_exits(args.command not in OWN_SIGTERM_VERBS):
            return _run(args)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        return _stdout_closed()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """argv parsed; what --help and --version print is flushed here, where a closed stdout
    is caught, before they exit."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        sys.stdout.flush()
        raise


@contextlib.contextmanager
def _sigterm_exits(enabled: bool) -> Iterator[None]:
    """While inside (when enabled, in the main thread), SIGTERM raises SystemExit(143) where
    the program is, so `finally` blocks run (temp files removed); a second SIGTERM kills."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> NoReturn:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(EXIT_SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll says POLLERR); True where
    poll cannot tell."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def _stdout_closed() -> int:
    """stdout's reader is gone (``workbench stats OUT | head -1``): devnull goes onto stdout so
    the interpreter's last flush does not fail again (the Python docs' note on SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_SIGPIPE


def _run(args: argparse.Namespace) -> int:
    """The verb's exit code; expected failures print one line and give 2 (74: a file could
    not be written; 130: Ctrl-C)."""
    from workbench.errors import InputError, LaunchError, ServerError, StorageError

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed stdout fails here, not in the interpreter's last flush
        return code
    except (InputError, LaunchError) as exc:
        _err(str(exc))
        return EXIT_INPUT
    except ServerError as exc:  # unreachable, or answering in a way no run can use
        _err(_server_message(exc))
        return EXIT_INPUT
    except StorageError as exc:  # a full disk, an I/O error, a read-only file system
        _err(str(exc))
        return EXIT_STORAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
