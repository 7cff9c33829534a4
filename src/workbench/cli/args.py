"""What the command line's values must be: argument types, the parser, shared options.

Each type raises argparse's ArgumentTypeError, so a bad value is one usage line naming the
verb's --help (`Parser`). `server_url` and `check_out_dir` check a value before a verb starts.
`add_decontaminate` is the benchmark options generate, validate and export share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from workbench.cli.exits import EXIT_INPUT

__all__ = [
    "Parser",
    "VerbParser",
    "add_decontaminate",
    "check_out_dir",
    "concurrency",
    "csv",
    "fraction_or_off",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "seconds_or_off",
    "server_url",
    "share",
]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {value}")
    return value


def concurrency(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto") from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def seconds_or_off(text: str) -> float:
    """A number of seconds, 0 for off."""
    if text.strip() in ("0", "0.0"):
        return 0.0
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 0 (off)") from None


def fraction_or_off(text: str) -> float:
    """A fraction in (0, 1), 0 for off."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction below 1, or 0 (off), got {text}")
    return value


def share(text: str) -> float:
    """A share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share above 0 and at most 1, got {text}")
    return value


def check_out_dir(path: Path) -> None:
    """ConfigError when --out is a file or lies under one (before anything is written)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        from workbench.errors import ConfigError

        raise ConfigError("--out", f"{existing} is a file, not a directory")


def server_url(text: str) -> str:
    """--server as the client needs it; each fix is said on stderr (never with the URL's
    credentials or query). ConfigError when the URL holds credentials and an API key is set
    in the environment too."""
    from workbench.server.client import api_key_from_env, check_server_auth, server_base_url

    url, notices = server_base_url(text)
    check_server_auth(url, api_key_from_env())
    for notice in notices:
        print(f"workbench: note: {notice}", file=sys.stderr, flush=True)
    return url


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, naming the verb's --help; no abbreviated
    options (``--dataset`` is not taken for ``--datasets``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"workbench: error: {message} (see: {self.prog} --help)\n")


class VerbParser(Parser):
    """A verb's parser: an option it does not know is its own error, naming its --help (left
    to the root parser, the line would name ``workbench --help``)."""

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())



def add_decontaminate(p: argparse.ArgumentParser, what: str | None = None) -> None:
    """--decontaminate FILE,... | --no-decontaminate (default None: the run's benchmarks,
    run.json), --benchmark-field, --ngram (None: the run's, else 13)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--decontaminate", type=csv, metavar="FILE,...",
                       help=what or "comma-separated benchmark files (JSONL or Parquet) to look "
                                    "for in the prompts and replies: an n-gram of normalised "
                                    "words in common flags a record (default: the ones generate "
                                    "was given, run.json)")
    group.add_argument("--no-decontaminate", dest="decontaminate", action="store_const", const=(),
                       help="look for no benchmark, not even the run's")
    p.add_argument("--benchmark-field", metavar="FIELD",
                   help="the benchmark files' prompt field (default: the run's, else the first "
                        "of prompt, question, problem, instruction, input, text, turns)")
    p.add_argument("--ngram", type=positive_int,
                   help="words in a benchmark n-gram (default: the run's, else 13, the usual rule)")
