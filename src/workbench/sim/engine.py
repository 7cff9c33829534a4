"""The simulator's continuous-batching engine: one KV pool, a queue, a running batch.

Each `Engine.step()` is one scheduler iteration, modelled on SGLang's: admission, retraction
when the pool is full, then one decode token for every running request. The queue, the batch
and the KV budget they live under are a `Batch` (`workbench.sim.batch`, where the rules are);
the engine drives it, times its steps and publishes them.

Aborts (`Engine.abort`, scheduler.py `Scheduler.abort_request`): a waiting request leaves the
queue at once and is published finished ("Abort in waiting queue", the tokenizer manager's
`_handle_abort_req`); a running one is marked (`req.to_finish = FINISH_ABORT()`) and leaves
the batch at the next step, which frees its KV. A marked request that a retraction picks
finishes there instead of going back to the queue.

The step's duration comes from `step_cost(running, prefilled_tokens, host_loaded_tokens)`
(see `workbench.sim.profiles.step_seconds`), times `step_factor()` (1 unless a decay fault
slows every step down). `step()` changes the state at once;
`publish()` is called when the step's time has passed: it stamps times, notifies waiters and,
every `log_interval` decode steps, reports throughput. The observer's statistics are also
reported when the engine falls idle (a step or an abort leaves nothing running or waiting), as
SGLang's scheduler publishes them from `on_idle` when its running-requests gauge is stale.
`Engine.model_seconds` sums the steps' durations: the model time the engine has worked,
whatever the host's speed (idle time is not counted). `EngineLoop` paces steps in real time
(its clock and sleep are injectable) and holds them while a stall fault lasts.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

from workbench.sim.batch import Batch
from workbench.sim.cache import PrefixCache
from workbench.sim.faults import TimedFaults
from workbench.sim.profiles import Sizing
from workbench.sim.request import Request, RequestState

__all__ = [
    "ABORT_MESSAGE",
    "QUEUE_ABORT_MESSAGE",
    "Engine",
    "EngineLoop",
    "EngineObserver",
    "Step",
    "StepCost",
]

MAX_LAG_SECONDS = 0.05
# schedule_batch `FINISH_ABORT()` (no status code) and tokenizer_manager `_handle_abort_req`.
ABORT_MESSAGE = "Aborted"
QUEUE_ABORT_MESSAGE = "Abort in waiting queue"

StepCost = Callable[[int, int, int], float]


class Step(NamedTuple):
    """What one scheduler iteration did; published once `duration` has passed."""

    duration: float
    admitted: list[Request]
    started: list[Request]
    updated: list[Request]
    finished: list[Request]
    tokens: int


class EngineObserver(Protocol):
    """Receives request timings and the engine's periodic statistics."""

    def on_first_token(self, request: Request) -> None: ...

    def on_finish(self, request: Request) -> None: ...

    def on_tokens(self, request: Request, count: int, now: float) -> None: ...

    def on_retract(self, requests: list[Request]) -> None: ...

    def on_stats(self, engine: Engine) -> None: ...


class Engine:
    """Continuous batching over one KV pool (one data-parallel rank)."""

    def __init__(
        self,
        sizing: Sizing,
        step_cost: StepCost,
        *,
        clock: Callable[[], float] = time.perf_counter,
        observer: EngineObserver | None = None,
        log: Callable[[str], None] | None = None,
        log_interval: int = 40,
        prefix_cache: bool = True,
        step_factor: Callable[[], float] | None = None,
    ) -> None:
        self.sizing = sizing
        self.batch = Batch(sizing, observer=observer, log=log, prefix_cache=prefix_cache)
        self.last_gen_throughput = 0.0
        self.model_seconds = 0.0
        self.last_output_at = -math.inf  # when a step last published tokens (engine clock)
        self._step_cost = step_cost
        self._step_factor = step_factor
        self._clock = clock
        self._observer = observer
        self._log = log
        self._log_interval = log_interval
        self._decode_steps = 0
        self._tokens_since_log = 0
        self._last_log_at = clock()

    # The batch's state, as the server, the metrics and the tests read it.
    @property
    def waiting(self) -> deque[Request]:
        return self.batch.waiting

    @property
    def running(self) -> list[Request]:
        return self.batch.running

    @property
    def used_tokens(self) -> int:
        return self.batch.used_tokens

    @property
    def capacity(self) -> int:
        return self.batch.capacity

    @property
    def cache(self) -> PrefixCache:
        return self.batch.cache

    @property
    def retractions(self) -> int:
        return self.batch.retractions

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.capacity

    def submit(self, request: Request) -> None:
        """Queue a request; it joins the batch at a coming step."""
        request.arrival = self._clock()
        self.waiting.append(request)

    def cancel(self, request: Request, message: str, status: int = 503) -> bool:
        """Abort a request (its client went away); it leaves the engine at the next step.
        False when it had already finished or been aborted."""
        if request.finished or request.aborted:
            return False
        request.abort_message = message
        request.abort_status = status
        return True

    def abort(self, matches: Callable[[Request], bool]) -> int:
        """Abort the requests `matches` picks (scheduler `abort_request`): waiting ones are
        published finished at once, running ones leave at the next step. Returns how many."""
        kept: deque[Request] = deque()
        queued: list[Request] = []
        for request in self.waiting:
            (queued if matches(request) else kept).append(request)
        self.batch.waiting = kept
        marked = [one for one in self.running if not one.aborted and matches(one)]
        for request in marked:
            request.abort_message = ABORT_MESSAGE
            request.abort_status = None
        now = self._clock()
        for request in queued:
            self._finish_in_queue(request, now)
        if queued:
            self._report_if_idle()
        return len(queued) + len(marked)

    def _report_if_idle(self) -> None:
        """Report the statistics once nothing runs or waits (scheduler `on_idle`)."""
        if not self.has_work and self._observer:
            self._observer.on_stats(self)

    @staticmethod
    def _finish_in_queue(request: Request, now: float) -> None:
        """Publish a request aborted in the queue: no step, no metrics, its waiter told."""
        request.abort_message = QUEUE_ABORT_MESSAGE
        request.abort_status = None
        request.aborted_in_queue = True
        request.state = RequestState.FINISHED
        request.finished_at = now
        if request.on_update is not None:
            request.on_update()

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait."""
        if self.has_work:
            return False
        self.cache.clear()
        return True

    def step(self) -> Step:
        """Run one scheduler iteration: admit, retract if needed, decode one token each."""
        admitted, prefilled, host_loaded = self.batch.admit()
        dropped = self.batch.make_room()
        running = len(self.running)
        started, updated, finished, tokens = self.batch.decode()
        self.batch.decay_ratio()
        duration = self._step_cost(running, prefilled, host_loaded)
        if self._step_factor is not None:
            duration *= self._step_factor()
        self.model_seconds += duration
        return Step(duration, admitted, started, updated, finished + dropped, tokens)

    def publish(self, step: Step) -> None:
        """Deliver a step whose time has passed: timestamps, metrics, waiters, logs."""
        now = self._clock()
        for request in step.admitted:
            if request.admitted_at is None:
                request.admitted_at = now
        for request in step.started:
            request.first_token_at = now
            if self._observer:
                self._observer.on_first_token(request)
        for request in (*step.updated, *step.finished):
            new = request.generated - request.published
            if new > 0:
                if self._observer:
                    self._observer.on_tokens(request, new, now)
                request.published = request.generated
                request.last_output_at = now
        for request in step.finished:
            request.finished_at = now
            if self._observer:
                self._observer.on_finish(request)
        for request in (*step.updated, *step.finished):
            if request.on_update is not None:
                request.on_update()
        if step.tokens or step.finished:
            self.last_output_at = now
        if step.admitted and self._observer:
            self._observer.on_stats(self)
        self._count_decode(step, now)
        self._report_if_idle()

    def decode_log_line(self) -> str:
        """SGLang's scheduler line for decode batches."""
        return (
            f"Decode batch, #running-req: {len(self.running)}, #token: {self.used_tokens}, "
            f"token usage: {self.token_usage:.2f}, cuda graph: False, "
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )

    def _count_decode(self, step: Step, now: float) -> None:
        self._tokens_since_log += step.tokens
        if not step.tokens:
            return
        self._decode_steps += 1
        if self._decode_steps % self._log_interval:
            return
        elapsed = now - self._last_log_at
        self.last_gen_throughput = self._tokens_since_log / elapsed if elapsed > 0 else 0.0
        self._tokens_since_log = 0
        self._last_log_at = now
        if self._observer:
            self._observer.on_stats(self)
        if self._log:
            self._log(self.decode_log_line())


class EngineLoop:
    """Runs an engine in real time: step, sleep its duration / speed, publish, repeat.

    Each step is published at its deadline, never earlier. Sleeps overshoot (the event loop
    waits in whole milliseconds), so a loop that is late runs the next steps without sleeping
    until it has caught up, keeping the average pace; it gives up catching up beyond
    MAX_LAG_SECONDS (the process is then too busy for the requested speed). The loop task
    starts on the first submit and ends when the engine is idle.

    With `faults`, no step starts while a stall lasts (the steps already taken are published
    at their time): requests stay where they are and new ones queue. Scheduler actions that
    `when_running` is given (aborts) wait for the stall's end too, as a hung scheduler reads
    none of its input.
    """

    def __init__(
        self,
        engine: Engine,
        speed: float = 1.0,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        faults: TimedFaults | None = None,
    ) -> None:
        self.engine = engine
        self.speed = speed
        self._clock = clock
        self._sleep = sleep
        self._faults = faults
        self._deferred: list[Callable[[], object]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def stalled(self) -> bool:
        return self._faults is not None and self._faults.stalled()

    def submit(self, request: Request) -> None:
        """Queue a request and make sure the loop runs."""
        self.engine.submit(request)
        self._ensure_running()

    def when_running(self, action: Callable[[], object]) -> None:
        """Run `action` on the engine now, or once a stall is over."""
        if not self.stalled:
            action()
            return
        self._deferred.append(action)
        self._ensure_running()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop the loop (server shutdown)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        deadline = self._clock()
        while self.engine.has_work or self._deferred:
            if self._faults is not None and self.stalled:
                await self._faults.until_running(self._sleep)
                deadline = self._clock()
            for action in self._deferred:
                action()
            self._deferred.clear()
            if not self.engine.has_work:
                break
            step = self.engine.step()
            now = self._clock()
            deadline = max(deadline, now - MAX_LAG_SECONDS) + step.duration / self.speed
            await self._sleep(max(0.0, deadline - now))
            self.engine.publish(step)
