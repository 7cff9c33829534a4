"""The `workbench` command: a thin shell over the functions the notebooks call too.

Expected failures (bad input, an unreachable server, a server that will not start) print
one line `workbench: error: ...` and exit 2, never a traceback. Imports are lazy so that a
quick verb does not pay for the whole stack: no module here imports a stage at module level,
each verb imports its own inside its functions.

Here: `main` (errors, SIGTERM, a closed stdout) and `build_parser`. The verbs, by stage:

    args       argument types, the parser, the options several verbs share
    exits      the exit codes and the one error line
    start      sim, init, demo
    generate   generate
    read       stats, monitor, validate, score, export
    report     report, explore
    tune       tune, tune fit
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from workbench.cli.args import Parser, VerbParser
from workbench.cli.exits import EXIT_INPUT, EXIT_SIGPIPE, EXIT_SIGTERM, EXIT_STORAGE, err
from workbench.cli.generate import add_generate
from workbench.cli.read import add_export, add_monitor, add_score, add_stats, add_validate
from workbench.cli.report import add_explore, add_report
from workbench.cli.start import add_demo, add_init, add_sim
from workbench.cli.tune import add_tune

__all__ = ["build_parser", "main"]

# Verbs that stop gracefully on SIGTERM by their own handlers (a run, a sweep, a server) or
# that only wait on a child (explore): main leaves their SIGTERM alone.
OWN_SIGTERM_VERBS = frozenset({"generate", "demo", "sim", "tune", "explore"})


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
    add_sim, add_generate, add_stats, add_validate, add_score, add_monitor, add_export,
    add_report, add_explore, add_tune, add_init, add_demo,
)


def build_parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = Parser(
        prog="workbench", description="Generate, watch, report on and tune EAGLE-3 data jobs on SGLang.")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub: argparse._SubParsersAction[Any] = parser.add_subparsers(
        dest="command", required=True, metavar="VERB", parser_class=VerbParser)
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
    from workbench.rundir.storage import DISK_ERRNOS, storage_error

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed stdout fails here, not in the interpreter's last flush
        return code
    except (InputError, LaunchError) as exc:
        err(str(exc))
        return EXIT_INPUT
    except ServerError as exc:  # unreachable, or answering in a way no run can use
        err(_server_message(exc))
        return EXIT_INPUT
    except StorageError as exc:  # a full disk, an I/O error, a read-only file system
        err(str(exc))
        return EXIT_STORAGE
    except OSError as exc:  # a write no verb turned into a StorageError: still one line
        if exc.errno not in DISK_ERRNOS:
            raise
        err(str(storage_error(exc.filename or "a file", exc)))
        return EXIT_STORAGE
    except KeyboardInterrupt:
        err("interrupted")
        return 130
