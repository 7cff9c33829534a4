"""A server the workbench starts, watches and restarts (`workbench generate --launch`).

:class:`SupervisedServer` starts the server command of a parameter file's `server` section on
one port (kept across restarts, so clients keep their URL), waits until it is healthy, and
then watches it: when the process exits (a crash, an OOM kill) or when it is told the server
stalled or degraded (:meth:`SupervisedServer.request_restart`, from the progress watchdog),
it stops the process group (SIGTERM, SIGKILL after the grace period: a hung scheduler does
not answer SIGTERM) and starts the same command again, after a backoff that doubles from
`backoff` seconds up to `MAX_BACKOFF`. At most `max_restarts` restarts: after that, or when
a restart does not become healthy, `on_give_up` is called and the server stays down.

Requests in flight when the server goes away fail with connection errors; the generation
runner holds them at its outage gate until `/health` answers again and sends them again
without spending their attempts, so each sample is still written once.

Every start, exit and restart is an event (`on_event(kind, message, figures)`): `started`,
`exited`, `restarting`, `restarted`, `gave_up`. The server's output is appended to one log
file, each start under a header line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workbench.errors import LaunchError
from workbench.server.launch import ServerProcess, command_line, find_free_port, url_host
from workbench.server.spec import redact, redact_argv

__all__ = ["MAX_BACKOFF", "EventSink", "SupervisedServer"]

MAX_BACKOFF = 300.0
POLL_INTERVAL = 1.0

EventSink = Callable[[str, str, Mapping[str, Any]], None]


class SupervisedServer:
    """One server process, restarted on exit or on request (module docstring)."""

    def __init__(
        self,
        argv_for_port: Callable[[int], tuple[list[str], dict[str, str]]],
        *,
        log_path: Path,
        on_event: EventSink,
        on_give_up: Callable[[str], None],
        host: str = "127.0.0.1",
        port: int = 0,
        health_paths: list[str] | None = None,
        startup_timeout: float = 600.0,
        stop_grace: float = 30.0,
        max_restarts: int = 3,
        backoff: float = 10.0,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.port = port or find_free_port(host)
        self.host = host
        self.url = f"http://{url_host(host)}:{self.port}"
        self.argv, self.env = argv_for_port(self.port)
        self.log_path = log_path
        self.on_event = on_event
        self.on_give_up = on_give_up
        self.health_paths = health_paths or ["/health"]
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.sleep = sleep
        self.restarts = 0
        self.gave_up: str | None = None
        self.process: ServerProcess | None = None
        self._restart: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._closing = False

    @property
    def command(self) -> str:
        """The command as one line, secrets as `***`."""
        return command_line(redact_argv(self.argv), redact(self.env))

    # --- starting and stopping ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the server and wait until it is healthy (LaunchError with its reason)."""
        self._write_header(f"start {self.restarts + 1}: {self.command}")
        process = ServerProcess(self.argv, url=self.url, log_path=self.log_path, env=self.env,
                                health_path=self.health_paths)
        self.process = process
        began = time.monotonic()
        process.start()
        try:
            await process.wait_ready_async(self.startup_timeout)
        except BaseException:
            await asyncio.to_thread(process.stop, self.stop_grace)
            raise
        self.on_event("started", f"server ready at {self.url} after "
                      f"{time.monotonic() - began:.0f} s (pid {process.pid})",
                      {"pid": process.pid, "restarts": self.restarts})

    async def close(self) -> None:
        """Stop watching and stop the server."""
        self._closing = True
        await self._stop_process()

    async def _stop_process(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        await asyncio.to_thread(process.stop, self.stop_grace)
        with contextlib.suppress(LaunchError):
            await asyncio.to_thread(process.wait_port_free, self.port, self.host)

    def _write_header(self, text: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n===== {stamp} workbench: {text}\n")

    # --- watching -----------------------------------------------------------------------------------

    def request_restart(self, kind: str, message: str) -> None:
        """Restart the server because of `kind` (`stalled`, `degraded`) seen as `message`."""
        if not self._closing and self.gave_up is None:
            self._restart.put_nowait((kind, message))

    async def supervise(self) -> None:
        """Watch the server until closed: restart it when it exits or is asked to; returns
        when it gave up."""
        while not self._closing and self.gave_up is None:
            reason = await self._next_problem()
            if reason is None or self._closing:
                return
            await self._restart_for(*reason)

    async def _next_problem(self) -> tuple[str, str] | None:
        while not self._closing:
            process = self.process
            exited = process.exit_reason() if process is not None else "server not running"
            if exited is not None:
                self.on_event("exited", exited, {"pid": process.pid if process else None})
                return "exited", exited
            try:
                return await asyncio.wait_for(self._restart.get(), POLL_INTERVAL)
            except TimeoutError:
                continue
        return None

    async def _restart_for(self, kind: str, message: str) -> None:
        while True:
            if self.restarts >= self.max_restarts:
                self._give_up(f"server {kind} and {self.restarts} restarts were made "
                              f"(--max-restarts {self.max_restarts}): {message}")
                return
            delay = min(self.backoff * 2 ** self.restarts, MAX_BACKOFF)
            self.restarts += 1
            self.on_event("restarting", f"restarting the server ({kind}; restart "
                          f"{self.restarts} of {self.max_restarts}, in {delay:.0f} s): {message}",
                          {"reason": kind, "restart": self.restarts, "delay_s": delay})
            await self._stop_process()
            await self.sleep(delay)
            if self._closing:
                return
            try:
                await self.start()
            except LaunchError as exc:
                kind, message = "failed to start", str(exc)
                continue
            self._drain_requests()
            self.on_event("restarted", f"server restarted ({self.restarts} of "
                          f"{self.max_restarts})", {"restart": self.restarts})
            return

    def _drain_requests(self) -> None:
        """Requests made while restarting concern the old process."""
        while not self._restart.empty():
            self._restart.get_nowait()

    def _give_up(self, message: str) -> None:
        self.gave_up = message
        self.on_event("gave_up", message, {"restarts": self.restarts})
        self.on_give_up(message)
