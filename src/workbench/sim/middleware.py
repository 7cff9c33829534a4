"""ASGI middleware of the simulator: quiet shutdown, in-flight count, API key, faults."""

from __future__ import annotations

import asyncio
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.sim.faults import close_connection, drop_connection, hang
from workbench.sim.metrics import SimMetrics
from workbench.sim.protocol import error_body, json_response
from workbench.sim.server import SimServer

__all__ = [
    "FAULT_SCOPE_KEY",
    "ApiKeyMiddleware",
    "FaultMiddleware",
    "InflightMiddleware",
    "QuietShutdownMiddleware",
]

FAULT_SCOPE_KEY = "workbench.sim.fault"


class QuietShutdownMiddleware:
    """Drops connections still open when the server cancels them at shutdown, without a trace.

    uvicorn cancels requests that outlive the shutdown grace period and would log each one as
    an exception and answer 500; a stopped server closes its connections instead.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if scope["type"] != "http" or not await close_connection(receive):
                raise


class InflightMiddleware:
    """Counts /generate HTTP requests in flight at the ASGI level (drops and hangs included)."""

    def __init__(self, app: ASGIApp, metrics: SimMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        self.metrics.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            self.metrics.request_ended()


class ApiKeyMiddleware:
    """Answers 401 unless `Authorization: Bearer KEY` (the /health paths are open)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._open(scope) and not self._authorized(scope):
            await json_response({"error": "Unauthorized"}, 401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _open(scope: Scope) -> bool:
        path: str = scope["path"]
        return scope["type"] != "http" or path.startswith("/health")

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False


class FaultMiddleware:
    """Draws a fault per /generate request; errors, drops and hangs never reach the handler."""

    def __init__(self, app: ASGIApp, server: SimServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        fault = self.server.faults.draw()
        if fault == "error":
            status = self.server.faults.error_status()
            body = error_body(f"Injected fault: HTTP {status}")
            await json_response(body, status)(scope, receive, send)
        elif fault == "drop":
            await drop_connection(receive)
        elif fault == "hang":
            await hang(receive)
        else:
            scope[FAULT_SCOPE_KEY] = fault
            await self.app(scope, receive, send)
