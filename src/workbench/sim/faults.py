"""Injected faults for /generate: server errors, dropped connections, hangs, aborts.

One seeded draw per request, in arrival order, picks at most one fault:
`error` answers HTTP 500 or 503 with SGLang's JSON error body, `drop` closes the connection
without a reply, `hang` never answers (until the client leaves or an hour passes), and `abort`
aborts as SGLang does: HTTP 503 with its error body, or, streamed, a final chunk whose
`finish_reason.type` is "abort".
"""

from __future__ import annotations

import asyncio
import random
from typing import Literal

import httpx
from starlette.types import Receive

__all__ = [
    "HANG_SECONDS",
    "ConnectionDropped",
    "Fault",
    "FaultPlan",
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
