"""A supervised simulator: restarted when it dies or when asked to, given up after its limit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from workbench.errors import LaunchError
from workbench.server.launch import server_command
from workbench.server.supervise import SupervisedServer

pytestmark = pytest.mark.integration


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.given_up: list[str] = []

    def __call__(self, kind: str, message: str, figures: Mapping[str, Any]) -> None:
        self.seen.append((kind, message, dict(figures)))

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.seen]


def supervised(tmp_path: Path, events: Events, *, args: dict[str, Any] | None = None,
               **kwargs: Any) -> SupervisedServer:
    def argv(port: int) -> tuple[list[str], dict[str, str]]:
        return server_command("sim", port=port, args={"profile": "fast", **(args or {})},
                              python=sys.executable), {}

    async def no_wait(_: float) -> None:
        await asyncio.sleep(0)

    return SupervisedServer(argv, log_path=tmp_path / "server.log", on_event=events,
                            on_give_up=events.given_up.append, startup_timeout=60,
                            stop_grace=5, sleep=no_wait, **kwargs)


async def healthy(url: str) -> bool:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(url + "/health")).status_code == 200


async def until(predicate: Any, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_a_killed_server_is_restarted_on_the_same_port(tmp_path: Path) -> None:
    events = Events()

    async def go() -> None:
        server = supervised(tmp_path, events, max_restarts=2)
        await server.start()
        watcher = asyncio.ensure_future(server.supervise())
        try:
            first = server.process.pid
            os.killpg(first, signal.SIGKILL)
            await until(lambda: "restarted" in events.kinds)
            assert server.process.pid != first and await healthy(server.url)
            server.request_restart("stalled", "no token generated for 300 s")
            await until(lambda: events.kinds.count("restarted") == 2)
            assert await healthy(server.url)
        finally:
            await server.close()
            await watcher
        assert server.process is None

    asyncio.run(go())
    assert events.kinds == ["started", "exited", "restarting", "started", "restarted",
                            "restarting", "started", "restarted"]
    exited = events.seen[1][1]
    assert exited.startswith("server killed by SIGKILL"), exited
    assert "restart 2 of 2" in events.seen[5][1] and "stalled" in events.seen[5][1]
    log = (tmp_path / "server.log").read_text()
    assert log.count("workbench: start ") == 3


def test_it_gives_up_after_its_restarts(tmp_path: Path) -> None:
    events = Events()

    async def go() -> None:
        server = supervised(tmp_path, events, max_restarts=1)
        await server.start()
        watcher = asyncio.ensure_future(server.supervise())
        try:
            for _ in range(2):
                os.killpg(server.process.pid, signal.SIGKILL)
                await until(lambda: events.kinds[-1] in ("restarted", "gave_up"))
                await asyncio.sleep(0.2)
            await asyncio.wait_for(watcher, 30)
        finally:
            await server.close()

    asyncio.run(go())
    assert events.kinds[-2:] == ["exited", "gave_up"]
    assert len(events.given_up) == 1
    assert events.given_up[0].startswith("server exited and 1 restarts were made (--max-restarts 1)")


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    events = Events()
    server = supervised(tmp_path, events, args={"mem_fraction_static": 1.5})
    with pytest.raises(LaunchError, match=r"before it was ready: .*--mem-fraction-static: expected a number"):
        asyncio.run(server.start())
    assert events.kinds == []
