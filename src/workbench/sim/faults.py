"""Injected faults for /generate: server errors, dropped connections, hangs, aborts.

One seeded draw per request, in arrival order, picks at most one fault:
`error` answers HTTP 500 or 503 with SGLang's JSON error body, `drop` closes the connection
without a reply, `hang` never answers (until the client leaves or an hour passes), and `abort`
aborts as SGLang does: HTTP 503 with its error body, or, streamed, a final chunk whose
`finish_reason.type` is "abort".
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import httpx
from starlette.types import Receive

__all__ = [
    "HANG_SECONDS",
    "ConnectionDropped",
    "Fault",
    "FaultPlan",
    "TimedFaults",
    "TruncationPlan",
    "close_connection",
    "drop_connection",
    "hang",
]

HANG_SECONDS = 3600.0

Fault = Literal["error", "drop", "hang", "abort"]


class ConnectionDropped(httpx.RemoteProtocolError):
    """Raised in-process (no socket to close) so an ASGI client sees what a socket client sees."""

    def __init__(self) -> None:
        super().__init__("Server disconnected without sending a response.")


class FaultPlan:
    """Seeded fault draws with the configured rates (each in [0, 1], together at most 1)."""

    def __init__(self, *, error: float, drop: float, hang: float, abort: float, seed: int) -> None:
        rates: tuple[tuple[float, Fault], ...] = (
            (error, "error"),
            (drop, "drop"),
            (hang, "hang"),
            (abort, "abort"),
        )
        self._bands: list[tuple[float, Fault]] = []
        edge = 0.0
        for rate, fault in rates:
            if rate > 0:
                edge += rate
                self._bands.append((edge, fault))
        self._rng = random.Random(seed)

    @property
    def enabled(self) -> bool:
        return bool(self._bands)

    def draw(self) -> Fault | None:
        """The fault of the next request, if any."""
        if not self._bands:
            return None
        point = self._rng.random()
        return next((fault for edge, fault in self._bands if point < edge), None)

    def error_status(self) -> int:
        """The HTTP status of an injected server error: 500 or 503."""
        return self._rng.choice((500, 503))


class TruncationPlan:
    """Seeded draws of the prompts whose tokens are silently cut (`rate` in [0, 1])."""

    def __init__(self, *, rate: float, seed: int) -> None:
        self.rate = rate
        # A stream of its own: turning this fault on leaves the other faults' draws as they were.
        self._rng = random.Random(f"truncate:{seed}")

    def cut(self, input_ids: list[int]) -> list[int] | None:
        """The ids kept of the next prompt (its first half) when the draw picks it, else None.
        Prompts of fewer than 2 tokens are never cut and take no draw."""
        if self.rate <= 0 or len(input_ids) < 2:
            return None
        if self._rng.random() >= self.rate:
            return None
        return input_ids[: len(input_ids) // 2]


class TimedFaults:
    """The faults that start at a moment of server time: stall, decay, exit.

    Server time is the wall-clock time since creation times `speed` (the engine's steps take
    their model time over `speed` of wall-clock time). `None` turns a fault off; a stall with
    `stall_for=None` lasts for good.
    """

    def __init__(
        self,
        *,
        speed: float = 1.0,
        stall_after: float | None = None,
        stall_for: float | None = None,
        decay_after: float | None = None,
        decay_factor: float = 1.0,
        exit_after: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.speed = speed
        self.stall_after = stall_after
        self.stall_for = stall_for
        self.decay_after = decay_after
        self.decay_factor = decay_factor
        self.exit_after = exit_after
        self._clock = clock
        self.started = clock()

    def server_seconds(self) -> float:
        """Server time since creation."""
        return (self._clock() - self.started) * self.speed

    def stall_left(self) -> float:
        """Wall-clock seconds until the stall ends: 0 when not stalled, inf for a lasting one."""
        if self.stall_after is None:
            return 0.0
        now = self.server_seconds()
        if now < self.stall_after:
            return 0.0
        if self.stall_for is None:
            return math.inf
        return max(0.0, self.stall_after + self.stall_for - now) / self.speed

    def stalled(self) -> bool:
        return self.stall_left() > 0

    async def until_running(
        self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        """Return once no stall holds the scheduler (never, in a lasting stall)."""
        while (left := self.stall_left()) > 0:
            await sleep(min(left, HANG_SECONDS))

    def step_factor(self) -> float:
        """How many times longer a step takes now: `decay_factor` from `decay_after` on."""
        if self.decay_after is not None and self.server_seconds() >= self.decay_after:
            return self.decay_factor
        return 1.0

    def exit_in(self) -> float | None:
        """Wall-clock seconds until the process exits (0 when due), None without that fault."""
        if self.exit_after is None:
            return None
        return max(0.0, self.exit_after - self.server_seconds()) / self.speed


async def drop_connection(receive: Receive) -> None:
    """Close the client's connection without a response (ConnectionDropped in-process)."""
    if not await close_connection(receive):
        raise ConnectionDropped()


async def close_connection(receive: Receive) -> bool:
    """Close the connection behind `receive` so that nothing more is sent; False if none.

    Under uvicorn the request cycle behind `receive` holds the transport: closing it and
    letting the loop deliver `connection_lost` marks the cycle disconnected, so uvicorn sends
    nothing more and logs nothing. An in-process ASGI client has no transport.
    """
    cycle = getattr(receive, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        return False
    transport.close()
    for _ in range(100):
        if getattr(cycle, "disconnected", True):
            break
        await asyncio.sleep(0)
    return True


async def hang(receive: Receive, seconds: float = HANG_SECONDS) -> None:
    """Answer nothing until the client disconnects or `seconds` pass."""
    try:
        await asyncio.wait_for(_wait_for_disconnect(receive), timeout=seconds)
    except TimeoutError:
        return


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
