"""What a run sends next: the queues of short and long prompts, the slots, the token budgets.

A :class:`Feeder` starts the requests of a run's :class:`SendingDataset`\\ s, in queue order
(each dataset's pending prompts in send order, the datasets in manifest order), and waits
for them at the end:

- Slots: every request holds one of the run's slots (:class:`~workbench.generate.concurrency.Slots`:
  a fixed cap or `auto`), a request with a prompt over ``long_threshold`` tokens also one of
  the long ones. Short and long prompts are fed by two producers, so a waiting long prompt
  never stalls the pipeline, which stays full across dataset boundaries.
- Budgets: under ``max_tokens``, a request is sent only while the finished completion
  tokens plus the projected tokens of the requests in flight and of the new one fit the
  budget (:mod:`workbench.generate.budget`); when nothing is in flight and not even one
  more fits, the budget is reached. In-flight requests always finish and are kept. A prompt
  held back by its budget is tried again each time a request ends (:meth:`Feeder.wake`), so
  other datasets keep the pipeline full meanwhile.
- Drain: once nothing is left to start, the feeder waits for the requests in flight; after
  a stop, for at most ``grace_period`` seconds, then cancels them.

What one request does, from its first attempt to its record, is
:mod:`workbench.generate.attempts`'.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.generate.budget import BudgetProjection
from workbench.generate.concurrency import Slots
from workbench.generate.plan import GenerateOptions, PlannedDataset
from workbench.generate.progress import DatasetProgress
from workbench.generate.prompts import Prompt
from workbench.rundir.appender import JsonlAppender
from workbench.rundir.figures import FigureAppender

__all__ = ["Feeder", "SendingDataset", "Work"]


@dataclass(slots=True)
class SendingDataset:
    """A planned dataset while it is sent: its appenders and its budget's projection."""

    planned: PlannedDataset
    raw: JsonlAppender
    errors: JsonlAppender
    budget: BudgetProjection
    figures: FigureAppender  # the replies' data-quality figures, kept for validate
    prompts: JsonlAppender | None = None  # a turns: each dataset's later turns, as sent

    @property
    def name(self) -> str:
        return self.planned.spec.name

    @property
    def progress(self) -> DatasetProgress:
        return self.planned.progress

    def close(self) -> None:
        self.raw.close()
        self.errors.close()
        self.figures.close()
        if self.prompts is not None:
            self.prompts.close()


Work = Callable[[SendingDataset, Prompt, bool], Coroutine[Any, Any, None]]
"""One request's whole life (a prompt, whether it is a long one), run as its own task."""


class Feeder:
    """Starts requests as slots and budgets allow, and waits for them (module docstring).

    `datasets` are the run's (filled when it opens); `work` runs one request and calls
    :meth:`wake` when it ends; `stop` is the run's stop.
    """

    def __init__(self, datasets: Mapping[str, SendingDataset], slots: Slots,
                 options: GenerateOptions, stop: asyncio.Event, work: Work) -> None:
        self.datasets = datasets
        self.slots = slots
        self.options = options
        self.sent = False  # a request was sent in this session
        self.tasks: set[asyncio.Task[None]] = set()  # the requests in flight
        self.producers: list[asyncio.Task[None]] = []
        self._stop = stop
        self._work = work
        self._wakeups: list[asyncio.Event] = []

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        """The two producers: short prompts and long ones."""
        self.producers = [asyncio.create_task(self._produce(long=False)),
                          asyncio.create_task(self._produce(long=True))]

    def wake(self) -> None:
        """A request ended: the prompts held back by a budget are tried again."""
        for wakeup in self._wakeups:
            wakeup.set()

    async def wait_producers(self) -> None:
        """Until both producers are done, or cancelled by a stop (an error of theirs raises)."""
        await asyncio.wait(self.producers, return_when=asyncio.FIRST_EXCEPTION)
        for producer in self.producers:
            error = producer.exception() if producer.done() and not producer.cancelled() else None
            if error is not None:
                raise error

    def _queue(self, *, long: bool) -> list[tuple[SendingDataset, Prompt]]:
        threshold = self.options.long_threshold
        return [(ds, p) for ds in self.datasets.values() for p in ds.planned.pending
                if (p.prompt_tokens > threshold) == long]

    async def _produce(self, *, long: bool) -> None:
        """Start requests in queue order; prompts held back by a token budget are retried
        each time a request finishes, so other datasets keep the pipeline full meanwhile."""
        wakeup = asyncio.Event()
        self._wakeups.append(wakeup)
        deferred = await self._send_all(self._queue(long=long), long)
        while deferred and not self.stopping:
            await wakeup.wait()
            wakeup.clear()
            deferred = await self._send_all(deferred, long)

    async def _send_all(self, items: list[tuple[SendingDataset, Prompt]],
                        long: bool) -> list[tuple[SendingDataset, Prompt]]:
        """Send what fits; return the prompts whose dataset's budget says wait."""
        deferred: list[tuple[SendingDataset, Prompt]] = []
        gated: set[str] = set()
        for ds, prompt in items:
            if self.stopping:
                break
            if ds.progress.budget_reached:
                continue
            if ds.name in gated or not self._budget_allows(ds) or not await self._send(ds, prompt, long):
                gated.add(ds.name)
                deferred.append((ds, prompt))
        return [(ds, prompt) for ds, prompt in deferred if not ds.progress.budget_reached]

    def _budget_allows(self, ds: SendingDataset) -> bool:
        """One more request fits the token budget with the projected tokens of those in
        flight (`BudgetProjection`); when none is in flight and it does not fit, the budget
        is reached."""
        p = ds.progress
        if p.max_tokens is None:
            return True
        if p.budget_reached:
            return False
        if ds.budget.fits(p.completion_tokens, p.max_tokens, time.perf_counter()):
            return True
        p.budget_closed = p.in_flight == 0
        return False

    async def _send(self, ds: SendingDataset, prompt: Prompt, long: bool) -> bool:
        """Start one request; False (nothing started) when the budget now says wait."""
        await self.slots.acquire(long)
        if self.stopping or ds.progress.budget_reached or not self._budget_allows(ds):
            self.slots.release(long)
            return self.stopping or ds.progress.budget_reached
        ds.progress.in_flight += 1
        self.sent = True
        ds.budget.start(prompt.sample_id, time.perf_counter())
        task = asyncio.create_task(self._work(ds, prompt, long))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def drain(self) -> None:
        """Wait for in-flight requests; after a stop, for at most the grace period."""
        stop_waiter = asyncio.create_task(self._stop.wait())
        try:
            while self.tasks and not self.stopping:
                await asyncio.wait([*self.tasks, stop_waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_waiter.cancel()
        if not self.tasks:
            return
        _done, still = await asyncio.wait(list(self.tasks), timeout=self.options.grace_period)
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)
