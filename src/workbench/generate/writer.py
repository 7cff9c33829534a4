"""Putting a run's lines on disk: whole, in order, and never counted before they are there.

The :class:`RunWriter` is the one way the dispatcher writes records and error lines. A line
is appended whole (:class:`~workbench.rundir.appender.JsonlAppender` cuts a failed write
back); a reply is counted as done only once its record is on disk (the ``on_written``
callback). When a write fails (a full disk, an I/O error, a read-only file system):

- the writer closes its gate (:mod:`workbench.generate.gate`) at once: the dispatcher sends
  nothing new until it opens;
- the failed line and every line after it are held in memory, in order (at most the
  replies of the requests in flight);
- the gate's prober tries the held lines again, every second at first and every 10 s at
  most, and says so when the pause starts, every minute while it lasts and when it ends;
- space back: the held lines are written, counted, and sending resumes;
- no space after ``wait_limit`` seconds: it gives up (``give_up``, the dispatcher stops as
  if interrupted); what is still held is not on disk and not counted: resume sends those
  prompts again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from workbench.errors import StorageError
from workbench.generate.gate import Gate, Notes
from workbench.rundir.appender import JsonlAppender
from workbench.text import format_duration

__all__ = ["RunWriter"]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(slots=True)
class _Held:
    """A line not yet on disk: where it goes, what it is, what to count once it is there."""

    appender: JsonlAppender
    obj: Any
    on_written: Callable[[], None] | None


class RunWriter:
    """Writes the lines of one run; holds them while the disk says no (module docstring)."""

    def __init__(self, say: Callable[[str], None], wait_limit: float,
                 give_up: Callable[[StorageError], None], *, clock: Clock = time.perf_counter,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.error: StorageError | None = None  # the last failure, while lines are held
        self._held: list[_Held] = []
        notes = Notes(paused=self._paused, still=self._still, back=self._back,
                      given_up=self._given_up)
        self._gate = Gate(self._flushed, notes, say, wait_limit, lambda: give_up(self._failure()),
                          first_delay=1.0, clock=clock, sleep=sleep)

    @property
    def held(self) -> int:
        """Lines not on disk yet."""
        return len(self._held)

    async def wait(self) -> None:
        """Return once writing works (at once, unless a write failed and no space came back)."""
        await self._gate.wait()

    def write(self, appender: JsonlAppender, obj: Any,
              on_written: Callable[[], None] | None = None) -> bool:
        """Append obj as one line and call `on_written`; False when it is held instead (a
        write failed now, or earlier lines are still held: they go first)."""
        held = _Held(appender, obj, on_written)
        if self._held:
            self._held.append(held)
            return False
        try:
            appender.append(obj)
        except StorageError as exc:
            self._held.append(held)
            self.error = exc
            self._gate.close()
            return False
        if on_written is not None:
            on_written()
        return True

    def flush(self) -> bool:
        """Write the held lines in order until one fails; True when none is left."""
        while self._held:
            held = self._held[0]
            try:
                held.appender.append(held.obj)
            except StorageError as exc:
                self.error = exc
                return False
            self._held.pop(0)
            if held.on_written is not None:
                held.on_written()
        self.error = None
        return True

    def release(self) -> None:
        """Stop retrying (the run is stopping) and let every waiter go."""
        self._gate.release()

    async def aclose(self) -> None:
        """A last try at the held lines, once the run has stopped."""
        self.release()
        await self._gate.stopped()
        self.flush()

    async def _flushed(self) -> bool:
        return self.flush()

    def _failure(self) -> StorageError:
        assert self.error is not None
        return self.error

    def _paused(self) -> str:
        return (f"{self._failure()}: sending paused, {self.held} lines held; retrying for up to "
                f"{format_duration(self._gate.wait_limit)}")

    def _still(self, waited: float) -> str:
        return f"still cannot write after {format_duration(waited)}: {self._failure()}"

    def _back(self, waited: float) -> str:
        return (f"writing again after {format_duration(waited)}: held lines written, "
                "sending resumes")

    def _given_up(self, waited: float) -> str:
        return (f"{self._failure()}: still failing after {format_duration(waited)}: stopping "
                f"with {self.held} lines not written (sent again on resume)")
