"""A pause of the whole run while something it needs is gone: the server, or the disk.

A :class:`Gate` is open while things work. A failure closes it: every request waits at it,
and one prober tries `recovered` at once (silent when that works: a single dropped
connection), then says the pause has started and tries again with a growing interval (from
`first_delay` to 10 s), saying every minute that it goes on. When `recovered` works it says
so and opens; after `wait_limit` seconds it says so, calls `give_up` (the run stops) and
opens. What is said comes from the gate's :class:`Notes`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Gate", "Notes"]

MAX_DELAY = 10.0
NOTE_EVERY = 60.0


@dataclass(frozen=True, slots=True)
class Notes:
    """The lines a gate says: when the pause starts, while it lasts (every minute, with the
    seconds waited), when it ends, and when it gives up."""

    paused: Callable[[], str]
    still: Callable[[float], str]
    back: Callable[[float], str]
    given_up: Callable[[float], str]


class Gate:
    """Open while things work; closed by a failure until `recovered` (module docstring)."""

    def __init__(self, recovered: Callable[[], Awaitable[bool]], notes: Notes,
                 say: Callable[[str], None], wait_limit: float, give_up: Callable[[], None], *,
                 first_delay: float = 0.5, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.recovered = recovered
        self.notes = notes
        self.say = say
        self.wait_limit = wait_limit
        self.give_up = give_up
        self.first_delay = first_delay
        self.clock = clock
        self.sleep = sleep
        self._open = asyncio.Event()
        self._open.set()
        self._prober: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait(self) -> None:
        """Return once the gate is open."""
        await self._open.wait()

    def close(self) -> None:
        """A failure: close the gate and start probing (nothing when it is closed already)."""
        if self._open.is_set():
            self._open.clear()
            self._prober = asyncio.create_task(self._probe())

    def release(self) -> None:
        """Let every waiter go (the run is stopping) and stop probing."""
        self._open.set()
        if self._prober is not None:
            self._prober.cancel()

    async def stopped(self) -> None:
        """Until the prober, if any, has ended (after :meth:`release`)."""
        if self._prober is not None:
            await asyncio.gather(self._prober, return_exceptions=True)

    async def _probe(self) -> None:
        started = self.clock()
        if await self.recovered():
            self._open.set()
            return
        self.say(self.notes.paused())
        delay, next_note = self.first_delay, started + NOTE_EVERY
        while not await self.recovered():
            waited = self.clock() - started
            if waited > self.wait_limit:
                self.say(self.notes.given_up(waited))
                self.give_up()
                self._open.set()
                return
            if self.clock() >= next_note:
                self.say(self.notes.still(waited))
                next_note += NOTE_EVERY
            await self.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
        self.say(self.notes.back(self.clock() - started))
        self._open.set()
