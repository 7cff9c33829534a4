"""Build and run a server command (SGLang or the simulator) as its own process group.

One mapping of parameter names (`mem_fraction_static`) to flags (`--mem-fraction-static`)
serves both launchers: `python -m sglang.launch_server --model-path M --port P <flags>` or
`python -m workbench.sim --port P <flags>` (the module behind `workbench sim`). Flags the
simulator does not know (`--trust-remote-code`, ...) are set aside by `split_sim_args`.

A server runs in its own session, so its process group holds it and every process it
starts; its output goes to a log file. Readiness is a 200 from `/health_generate` (falling
back to `/health` when that path is missing); an exit before that is a LaunchError whose
message carries the exit status and the log's out-of-memory line (or its last line).
A server is stopped by signalling its process group, never by name: SIGTERM, SIGKILL after
a grace period, then a wait until no process of the group is left. On Linux the server also
gets SIGTERM when the process that started it dies (`die_with_parent`), so a killed sweep
leaves no server behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import IO, Any, Literal, Self

import httpx

from workbench.errors import LaunchError
from workbench.sim.config import add_sim_arguments

__all__ = [
    "HEALTH_PATHS",
    "Launcher",
    "ServerProcess",
    "command_line",
    "describe_exit",
    "find_free_port",
    "group_members",
    "log_failure_reason",
    "port_is_free",
    "server_command",
    "sim_flag_names",
    "split_sim_args",
    "to_flags",
    "url_host",
]

Launcher = Literal["sglang", "sim"]
HEALTH_PATHS = ("/health_generate", "/health")
OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "not enough memory",
    "cudaerrormemoryallocation",
    "failed to allocate memory",
)
LOG_TAIL_BYTES = 64 << 10
# `ValueError: ...`, `torch.OutOfMemoryError: ...`, `RuntimeError` (a traceback's last line)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::|$)")
_CLEANUP_LINE = re.compile(r"kill_process_tree|KeyboardInterrupt|SystemExit")
_PR_SET_PDEATHSIG = 1


def to_flags(args: Mapping[str, Any]) -> list[str]:
    """`{"mem_fraction_static": 0.88, "enable_metrics": True}` -> SGLang command-line flags.

    True gives a bare flag, False and None are left out, lists repeat their values.
    """
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            flags.append(flag)
        elif isinstance(value, (list, tuple)):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_command(
    launcher: Launcher,
    *,
    port: int,
    host: str = "127.0.0.1",
    model_path: str | None = None,
    args: Mapping[str, Any] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argv that starts a server: `python -m sglang.launch_server` or the simulator."""
    module = "sglang.launch_server" if launcher == "sglang" else "workbench.sim"
    argv = [python, "-m", module, "--host", host, "--port", str(port)]
    if model_path:
        argv += ["--model-path", model_path]
    return argv + to_flags(args or {})


@cache
def sim_flag_names() -> frozenset[str]:
    """Every parameter name the simulator accepts (`mem_fraction_static`, `speed`, ...)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    add_sim_arguments(parser)
    return frozenset(
        option[2:].replace("-", "_")
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    )


def split_sim_args(args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the arguments the simulator accepts, the names of those it does not)."""
    known = sim_flag_names()
    kept = {name: value for name, value in args.items() if name in known}
    return kept, [name for name in args if name not in known]


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The argv as one shell line, prefixed by its extra environment (`A=1 python -m ...`)."""
    prefix = [f"{key}={shlex.quote(value)}" for key, value in (env or {}).items()]
    return " ".join([*prefix, *(shlex.quote(part) for part in argv)])


def url_host(host: str) -> str:
    """The host part of a URL reaching a server bound to `host` (a wildcard: localhost)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGTERM the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None

    def hook() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return hook


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group; [] once it is gone.

    Reads /proc where there is one; elsewhere reports the group as one unknown member
    while `killpg(pgid, 0)` succeeds.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and _in_group(entry / "stat", pgid):
            members.append(int(entry.name))
    return members


def _in_group(stat_path: Path, pgid: int) -> bool:
    try:
        stat = stat_path.read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp ...
    return len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_failure_reason(text: str) -> str:
    """Why a server died, from its log: the last out-of-memory line, else the last Python
    exception line (`ValueError: ...`), else the last line.

    A dying SGLang logs its error, then its clean-up (`kill_process_tree called ...`) and
    tracebacks of its other processes, so the last line is rarely the reason.
    """
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if any(marker in line.lower() for marker in OOM_MARKERS):
            said = "out of memory" in line.lower()  # not "out of memory: ... out of memory"
            return line[:200] if said else f"out of memory: {line[:200]}"
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line) and not _CLEANUP_LINE.search(line):
            return line[:200]
    return lines[-1][:200] if lines else "empty log"


def describe_exit(code: int) -> str:
    """`exited with code 1` or `killed by SIGKILL`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class ServerProcess:
    """A server started in its own process group, with its log in a file.

    Use as a context manager, or call `start()`, `wait_ready()` (or `await
    wait_ready_async()`) and `stop()`. `health_path` is one path or several tried in order
    (a 404 moves on to the next).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        url: str,
        log_path: Path | str,
        env: Mapping[str, str] | None = None,
        health_path: str | Sequence[str] = "/health",
        die_with_parent: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.health_paths = [health_path] if isinstance(health_path, str) else list(health_path)
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._health_index = 0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def pgid(self) -> int | None:
        """The server's process group (its own pid: it leads a new session)."""
        return self.pid

    @property
    def health_path(self) -> str:
        return self.health_paths[self._health_index]

    @property
    def returncode(self) -> int | None:
        """The exit status once the server has exited, else None."""
        return self.process.poll() if self.process else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        hook = _die_with_parent() if self.die_with_parent else None
        try:
            self.process = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
                preexec_fn=hook,  # noqa: PLW1509 - one prctl call, no Python state touched
            )
        except OSError as exc:
            self._log.close()
            raise LaunchError(f"cannot start {self.argv[0]}: {exc}") from None

    # --- readiness ---------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 600.0, interval: float = 0.1) -> None:
        """Poll the health endpoint until it answers 200; raise LaunchError on exit or timeout."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                self._raise_if_exited()
                if self._answered(self._get(client)):
                    return
                time.sleep(interval)
        self._raise_timeout(timeout)

    async def wait_ready_async(self, timeout: float = 600.0, interval: float = 0.1) -> None:
        """`wait_ready` without blocking the event loop (it can be cancelled at any await)."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                self._raise_if_exited()
                try:
                    status = (await client.get(self.url + self.health_path)).status_code
                except httpx.HTTPError:
                    status = None
                if self._answered(status):
                    return
                await asyncio.sleep(interval)
        self._raise_timeout(timeout)

    def _get(self, client: httpx.Client) -> int | None:
        try:
            return client.get(self.url + self.health_path).status_code
        except httpx.HTTPError:
            return None

    def _answered(self, status: int | None) -> bool:
        """True on 200; a 404 moves on to the next health path."""
        if status == 404 and self._health_index + 1 < len(self.health_paths):
            self._health_index += 1
        return status == 200

    def _raise_if_exited(self) -> None:
        assert self.process is not None, "start() first"
        code = self.process.poll()
        if code is not None:
            raise LaunchError(
                f"server {describe_exit(code)} before it was ready: {self.failure_reason()}"
            )

    def _raise_timeout(self, timeout: float) -> None:
        raise LaunchError(
            f"server at {self.url} not healthy after {timeout:.0f}s (log: {self.log_path})"
        )

    # --- the log -------------------------------------------------------------------------------

    def log_size(self) -> int:
        """Bytes in the log so far (an offset for `read_log`)."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def read_log(self, start: int = 0, end: int | None = None) -> bytes:
        """The log's bytes from `start` to `end` (default: its current end)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except OSError:
            return b""

    def failure_reason(self) -> str:
        """A short reason read from the log's tail (see `log_failure_reason`)."""
        start = max(0, self.log_size() - LOG_TAIL_BYTES)
        return log_failure_reason(self.read_log(start).decode("utf-8", "replace"))

    def exit_reason(self) -> str | None:
        """`exited with code 1: <reason from the log>` once the server has exited, else None."""
        code = self.returncode
        return None if code is None else f"server {describe_exit(code)}: {self.failure_reason()}"

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, grace: float = 10.0, group_timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `grace` seconds, wait until the group is
        gone (at most `group_timeout` seconds); returns the server's exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
        self._signal_group(signal.SIGKILL)  # stragglers left in the group
        self.wait_group_gone(group_timeout)
        if self._log:
            self._log.close()
        return self.process.returncode

    def group_alive(self) -> bool:
        """True while a (non-zombie) process of the server's group is left."""
        return self.pgid is not None and bool(group_members(self.pgid))

    def wait_group_gone(self, timeout: float = 10.0, zombie_grace: float = 2.0) -> bool:
        """Wait until `killpg(pgid, 0)` finds no process; False if live ones remain after
        `timeout`. Zombies left to the init process (which reaps them) are waited for at
        most `zombie_grace` seconds: they hold no port and no memory."""
        if self.pgid is None:
            return True
        deadline = time.monotonic() + timeout
        zombies_since: float | None = None
        while _group_exists(self.pgid):
            now = time.monotonic()
            if self.group_alive():
                zombies_since = None
                if now > deadline:
                    return False
                self._signal_group(signal.SIGKILL)
            else:
                zombies_since = zombies_since or now
                if now - zombies_since > zombie_grace:
                    return True
            time.sleep(0.05)
        return True

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait_port_free(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not port_is_free(port, host):
            if time.monotonic() > deadline:
                raise LaunchError(f"port {port} still busy {timeout:.0f}s after the server stopped")
            time.sleep(0.1)
