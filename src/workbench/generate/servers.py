"""The servers behind a run's client: the outage gate, the workers behind a router, their
readings.

- Outage: a connection failure closes the run's gate (:func:`server_gate`) and pauses every
  request until the server answers ``/health`` again (a restart, a crash); it says so when
  the pause starts, every minute while it lasts and when it ends. After ``server_wait``
  seconds without an answer the run stops as if interrupted. (The requests an outage cut
  do not spend their attempts: :mod:`workbench.generate.attempts`.)
- Readings: :meth:`Workers.read` reads every server's ``/metrics`` (through an
  sglang-router, each worker's: a client per worker, made once and closed with
  :meth:`Workers.aclose`), one reading for auto concurrency and the watchdog alike: it is
  offered to the watchdog (:mod:`workbench.generate.watchdog`), which reads on its own only
  when auto concurrency did not read lately.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.generate.concurrency import ServerReading, read_servers
from workbench.generate.gate import Gate, Notes
from workbench.generate.watchdog import Watchdog
from workbench.server.client import SGLangClient, api_key_from_env, redact_url
from workbench.text import format_duration

__all__ = ["Workers", "server_gate"]


def server_gate(client: SGLangClient, say: Callable[[str], None], wait_limit: float,
                give_up: Callable[[], None]) -> Gate:
    """Open while the server answers; closed by a connection failure until `/health` answers
    (polled from every 0.5 s to every 10 s); after `wait_limit` seconds the run stops."""
    url = redact_url(client.base_url)
    notes = Notes(
        paused=lambda: f"server unreachable at {url}: requests paused until it answers /health",
        still=lambda waited: f"server still unreachable after {format_duration(waited)}",
        back=lambda waited: (f"server answers again after {format_duration(waited)}: "
                             "requests resume"),
        given_up=lambda waited: (f"server unreachable for {format_duration(waited)}: "
                                 "stopping (resume later)"),
    )
    return Gate(client.health, notes, say, wait_limit, give_up)


class Workers:
    """The servers a run's `client` reaches (module docstring); `watchdog`, when set, is
    offered every reading."""

    def __init__(self, client: SGLangClient) -> None:
        self.client = client
        self.watchdog: Watchdog | None = None
        self._workers: dict[str, SGLangClient] = {}

    async def read(self) -> list[ServerReading] | None:
        """Every server's gauges now (None when no server has metrics)."""
        readings = await read_servers(self.client, self._worker_client)
        if self.watchdog is not None:
            self.watchdog.offer(readings)  # one scrape for auto concurrency and the watchdog
        return readings

    async def aclose(self) -> None:
        """Close the workers' clients."""
        for worker in self._workers.values():
            await worker.aclose()

    def _worker_client(self, url: str) -> SGLangClient:
        if url not in self._workers:
            self._workers[url] = SGLangClient(url, api_key=api_key_from_env(), timeout=10.0)
        return self._workers[url]
