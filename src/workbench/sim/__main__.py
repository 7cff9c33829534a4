"""`python -m workbench.sim [flags]`: run the simulator."""

from __future__ import annotations

import argparse

from workbench.errors import InputError
from workbench.sim.app import serve
from workbench.sim.config import add_sim_arguments, config_from_args


def main(argv: list[str] | None = None) -> None:
    """Parse the flags and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m workbench.sim", description="SGLang-compatible simulator"
    )
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except InputError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    serve(config)


if __name__ == "__main__":
    main()
