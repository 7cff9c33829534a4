"""The verbs that start from nothing: `sim` (the simulator), `init` (a job folder) and `demo`
(the whole pipeline on the simulator)."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli.args import check_out_dir
from workbench.cli.generate import generate_exit_code, generate_with_progress

__all__ = ["add_demo", "add_init", "add_sim"]


def add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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



def add_init(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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

    check_out_dir(args.out)
    datasets = args.datasets if args.datasets is not None else data_dir("params") / "datasets.demo.yaml"
    summary = run_demo(args.out, datasets=datasets, resume=not args.no_resume,
                       generate=generate_with_progress, say=lambda m: print(m, flush=True))
    return generate_exit_code(summary)
