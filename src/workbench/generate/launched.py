"""A generation run's own server (`workbench generate --launch SERVER.yaml`).

The parameter file's `server` section (the tuning parameters' one: launcher, model path,
args, env, python, startup timeout, stop grace) gives the command; metrics are always on
(the watchdog reads them). The server runs under a
:class:`~workbench.server.supervise.SupervisedServer`: restarted when it exits, and when the
run's watchdog says it stalled or degraded. Its starts, exits and restarts are the run's
events (said, and kept in run.json's `events` beside the watchdog's); its output goes to
`OUT/server.log`. When it gives up, the run stops as if interrupted (resumable), saying why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.rundir.layout import SERVER_LOG
from workbench.server.spec import ConfigPlan, ServerParams, config_command
from workbench.server.supervise import SupervisedServer

if TYPE_CHECKING:
    from workbench.generate.dispatch import Runner
    from workbench.generate.watchdog import Detection

__all__ = ["SERVER_LOG", "LaunchSettings", "LaunchedServer", "launched_server"]

RESTART_KINDS = ("stalled", "degraded")


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """The server to start and how often it may be restarted."""

    server: ServerParams
    max_restarts: int = 3
    backoff: float = 10.0  # seconds before the first restart, doubling after each


class LaunchedServer:
    """The supervised server of one run: its URL, and the run it reports to."""

    def __init__(self, settings: LaunchSettings, out: Path, say: Callable[[str], None]) -> None:
        server = settings.server
        plan = ConfigPlan("launch", {"enable_metrics": True, **server.args}, dict(server.env))

        def argv_for_port(port: int) -> tuple[list[str], dict[str, str]]:
            command = config_command(server, plan, port)
            return command.argv, command.env

        self.say = say
        self.runner: Runner | None = None
        self._early: list[dict[str, Any]] = []  # events before the run opened
        self.supervised = SupervisedServer(
            argv_for_port, log_path=out / SERVER_LOG, on_event=self._event,
            on_give_up=self._give_up, host=server.host, port=server.port,
            health_paths=list(server.health_paths), startup_timeout=server.startup_timeout,
            stop_grace=server.stop_grace, max_restarts=settings.max_restarts,
            backoff=settings.backoff)

    @property
    def url(self) -> str:
        return self.supervised.url

    def attach(self, runner: Runner) -> None:
        """Report to `runner` from now on (the events so far go to it first)."""
        self.runner = runner
        for event in self._early:
            runner.add_event(event, said=True)
        self._early.clear()

    def on_watchdog(self, detection: Detection) -> None:
        """A stalled or degraded server is restarted."""
        if detection.kind in RESTART_KINDS:
            self.supervised.request_restart(detection.kind, detection.message)

    def _event(self, kind: str, message: str, figures: Mapping[str, Any]) -> None:
        event = {"ts": round(time.time(), 3), "kind": f"server_{kind}", "message": message,
                 **figures}
        if self.runner is not None:
            self.runner.add_event(event)
            if kind == "restarted":
                self.runner.server_back()
                if self.runner.watchdog is not None:
                    self.runner.watchdog.reset()  # a new process: judged from its own start
        else:
            self._early.append(event)
            self.say(message)

    def _give_up(self, message: str) -> None:
        if self.runner is not None:
            self.runner.request_stop()
            self.runner.request_stop()  # nothing in flight can finish without a server


@asynccontextmanager
async def launched_server(settings: LaunchSettings, out: Path,
                          say: Callable[[str], None]) -> AsyncIterator[LaunchedServer]:
    """Start the server (LaunchError when it does not become healthy), supervise it while
    the block runs, stop it after."""
    launched = LaunchedServer(settings, out, say)
    say(f"starting the server: {launched.supervised.command} (log {out / SERVER_LOG})")
    await launched.supervised.start()
    watching = asyncio.create_task(launched.supervised.supervise())
    try:
        yield launched
    finally:
        await launched.supervised.close()
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
