"""The `workbench` command's exit codes and its one error line.

    0    done
    1    the verb's own failure, for example prompts that failed all their attempts, a report
         that did not render, an error finding under `validate --strict`
    2    EXIT_INPUT: bad input or usage, an unreachable server, a server that will not start
    74   EXIT_STORAGE: a file could not be written (full disk, I/O error, read-only)
    130  Ctrl-C
    141  EXIT_SIGPIPE: stdout's reader went away (`workbench stats OUT | head -1`)
    143  EXIT_SIGTERM: a verb without handlers of its own, stopped through its cleanups
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_INPUT", "EXIT_SIGPIPE", "EXIT_SIGTERM", "EXIT_STORAGE", "err"]

EXIT_INPUT = 2
EXIT_STORAGE = 74  # sysexits' EX_IOERR: a file could not be written (full disk, I/O error)
EXIT_SIGPIPE = 141  # 128 + SIGPIPE (13): what a shell reports of a tool SIGPIPE killed
EXIT_SIGTERM = 143  # 128 + SIGTERM (15)


def err(message: str) -> None:
    print(f"workbench: error: {message}", file=sys.stderr, flush=True)
