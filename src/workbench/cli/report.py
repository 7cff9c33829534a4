"""`workbench report` (once, `--every`, `--rerun`, `--index`) and `workbench explore`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from workbench.cli.args import positive_int
from workbench.cli.exits import err

__all__ = ["add_explore", "add_report"]


def add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="execute a report notebook into an HTML report",
                       description="Execute the report notebook NAME with papermill and export it "
                                   "to HTML (code hidden, plotly.js inlined: opens offline); "
                                   "index.html in its folder lists every rendering. With --every, check "
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
                        "(default: beside the run the report reads, RUN/reports, or "
                        "JOB/outputs/reports in a job folder; outputs/reports for a sweep)")
    p.add_argument("--every", type=_interval, metavar="INTERVAL",
                   help="keep checking at this interval (30s, 10m, 1h, 1h30m) and render when "
                        "the inputs changed since the last rendering; Ctrl-C stops (exit 130)")
    p.add_argument("--until", choices=("done",),
                   help="with --every: stop once the run is finished (exit 0)")
    p.add_argument("--keep", type=positive_int, metavar="N",
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
    from workbench.report.render import run_report

    if args.index is not None:
        return _index_report(args)
    if (args.rerun is None) == (args.name is None):
        raise ConfigError("NAME", "give a report NAME, --rerun REPORT_DIR or --index DIR (one)")
    if args.until is not None and args.every is None:
        raise ConfigError("--until", "goes with --every")
    if args.rerun is not None:
        return _rerun_report(args)
    params = args.params if args.params is not None else default_params(Path(args.name).stem)
    if args.params is None and params is not None:
        print(f"parameters: {params}", file=sys.stderr, flush=True)
    overrides = parse_overrides(args.overrides)
    try:
        if args.out is None:
            args.out = _reports_of_run(args.name, params, overrides)
            print(f"reports folder: {args.out} (--out to choose another)", file=sys.stderr,
                  flush=True)
        if args.every is not None:
            return _watch_report(args, params, overrides)
        result = run_report(args.name, params, overrides, args.out)
    except ReportError as exc:
        err(str(exc))
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


def _reports_of_run(name: str, params: Path | None, overrides: dict[str, Any]) -> Path:
    """Where a report goes without --out: beside the run it reads, as in `workbench demo` and
    in the Lab of `workbench explore` (RUN/reports, or JOB/outputs/reports for a run inside
    a job folder); a report of a sweep alone, into outputs/reports as `workbench tune`'s."""
    from workbench.report.lab import lab_layout
    from workbench.report.render import DEFAULT_OUT, plan_report

    run_dir = plan_report(name, params, overrides).parameters.get("run_dir")
    if not isinstance(run_dir, str) or not run_dir:
        return DEFAULT_OUT
    return _shown(lab_layout(run_dir).reports)


def _shown(path: Path) -> Path:
    """path relative to the working folder when it is inside it (shorter to read)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


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
        err(str(exc))
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


def add_explore(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explore", help="JupyterLab on a run's own explorer notebook",
                       description="Open JupyterLab on RUN/explore.ipynb (made from the package's "
                                   "explore notebook when missing) and print its URL; Ctrl-C stops it.")
    p.add_argument("out", type=Path, metavar="RUN", help="run directory (the --out of generate)")
    p.add_argument("--port", type=positive_int, help="port on 127.0.0.1 (default: a free one)")
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
    except KeyboardInterrupt:  # Ctrl-C is how explore is meant to end: not an error
        print("explore stopped (Ctrl-C): JupyterLab closed", file=sys.stderr, flush=True)
        return 0
    finally:
        lab.stop()
