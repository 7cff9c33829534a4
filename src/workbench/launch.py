"""Build and run a server command (SGLang or the simulator) as its own process group.

One mapping of parameter names (`mem_fraction_static`) to flags (`--mem-fraction-static`)
serves both launchers. A server is stopped by signalling its process group, never by name:
SIGTERM, then SIGKILL after a grace period, then wait until the port is free.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

import httpx

from workbench.errors import LaunchError

__all__ = ["Launcher", "ServerProcess", "find_free_port", "port_is_free", "server_command", "to_flags"]

Launcher = Literal["sglang", "sim"]
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "not enough memory")


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


class ServerProcess:
    """A server started in its own process group, with its log in a file.

    Use as a context manager, or call `start()`, `wait_ready()` and `stop()`.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        url: str,
        log_path: Path | str,
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
    ) -> None:
        self.argv = list(argv)
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.health_path = health_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        try:
            self.process = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {self.argv[0]}: {exc}") from None

    def wait_ready(self, timeout: float = 600.0, interval: float = 0.1) -> None:
        """Poll the health endpoint until it answers 200; raise LaunchError on exit or timeout."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                self._raise_if_exited()
                if self._healthy(client):
                    return
                time.sleep(interval)
        raise LaunchError(f"server at {self.url} not healthy after {timeout:.0f}s (log: {self.log_path})")

    def _healthy(self, client: httpx.Client) -> bool:
        try:
            return client.get(self.url + self.health_path).status_code == 200
        except httpx.HTTPError:
            return False

    def _raise_if_exited(self) -> None:
        assert self.process is not None, "start() first"
        code = self.process.poll()
        if code is not None:
            raise LaunchError(f"server exited with code {code} before it was ready: {self.failure_reason()}")

    def failure_reason(self) -> str:
        """A short reason read from the log: an out-of-memory line, else its last line."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        for line in reversed(lines):
            if any(marker in line.lower() for marker in OOM_MARKERS):
                return f"out of memory: {line.strip()[:200]}"
        return lines[-1].strip()[:200] if lines else "empty log"

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL after `grace` seconds; returns the exit code."""
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
        if self._log:
            self._log.close()
        return self.process.returncode

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
