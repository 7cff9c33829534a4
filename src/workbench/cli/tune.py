"""`workbench tune`: a sweep of server configurations, and `workbench tune fit`."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli.args import csv, positive_float

__all__ = ["add_tune"]


def add_tune(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--configs", type=csv, default=(), metavar="A,B,...",
                   help="configurations to fit on (default: every one with an ok point); the "
                        "others are held out")
    p.add_argument("--predict", action="store_true",
                   help="then replay the held-out configurations on the simulator with the "
                        "profile and compare (fit.csv beside the profile)")
    p.add_argument("--speed", type=positive_float, default=None,
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
