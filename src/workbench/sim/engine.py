"""The simulator's continuous-batching engine: one KV pool, a queue, a running batch.

Each `Engine.step()` is one scheduler iteration, modelled on SGLang's:

1. Admission (first come, first served, head of line blocks): a waiting request joins the batch
   when its tokens plus a reservation for its future output fit in what the pool has left,
   `free - sum(running reservations) >= tokens + reservation`, with
   `reservation = new_token_ratio * min(max_new_tokens - generated, 4096)`. The ratio starts at
   0.7 and decays to 0.1 over 600 steps (SGLang's defaults); requests also stop joining at
   `max_running_requests` or once the step's prefill budget (`chunked_prefill_size`) is used.
   Its prompt is looked up in the prefix cache: cached tokens are not prefilled (with
   `prefix_cache=False`, SGLang's --disable-radix-cache, nothing is cached: every prompt is
   prefilled whole).
2. Retraction (`srt/managers/schedule_batch.py` `retract_decode`, scheduler.py's caller):
   when the batch's next tokens do not fit, requests leave the batch in SGLang's order (fewest
   output tokens first, then longest prompt), free their KV and go back to the front of the
   queue; they keep their output so far and are recomputed (prompt and output prefilled
   again) when readmitted. The ratio is re-estimated from the batch,
   `(decoded + 20 * running) / sum(max_new_tokens)`, each retraction is counted (engine,
   request, metrics) and SGLang's warning is logged ("KV cache pool is full. Retract
   requests. ..."). A request alone that still does not fit is aborted (HTTP 500).
3. Decode: every running request gains one token; requests that reach their planned output
   length finish and free their tokens.

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
Work per step is O(running requests) plus O(prompt blocks) for each admitted request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import NamedTuple, Protocol

from workbench.sim.cache import PrefixCache
from workbench.sim.faults import TimedFaults
from workbench.sim.profiles import Sizing

__all__ = [
    "ABORT_MESSAGE",
    "POOL_FULL_MESSAGE",
    "QUEUE_ABORT_MESSAGE",
    "Engine",
    "EngineLoop",
    "EngineObserver",
    "Request",
    "RequestState",
    "Step",
    "StepCost",
]

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
MAX_LAG_SECONDS = 0.05
# output_streamer.py: a non-streaming request's progress reaches the tokenizer manager every
# SGLANG_FORCE_STREAM_INTERVAL (50) tokens, which is when its inter-token latency is observed.
FORCE_STREAM_INTERVAL = 50
POOL_FULL_MESSAGE = (
    "Out of memory even after retracting all other requests in the decode batch. Aborting "
    "the last request."
)
POOL_FULL_STATUS = 500
# schedule_batch `FINISH_ABORT()` (no status code) and tokenizer_manager `_handle_abort_req`.
ABORT_MESSAGE = "Aborted"
QUEUE_ABORT_MESSAGE = "Abort in waiting queue"

StepCost = Callable[[int, int, int], float]


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One sequence in the engine: its prompt size and blocks, planned output, progress."""

    __slots__ = (
        "abort_message",
        "abort_status",
        "aborted_in_queue",
        "admitted_at",
        "arrival",
        "cached_tokens",
        "finished_at",
        "first_token_at",
        "generated",
        "hashes",
        "health",
        "host_cached_tokens",
        "last_output_at",
        "max_new_tokens",
        "on_update",
        "output_ids",
        "prompt_len",
        "published",
        "retractions",
        "state",
        "stream",
    )

    def __init__(
        self,
        prompt_len: int,
        output_ids: list[int],
        max_new_tokens: int,
        *,
        hashes: list[int] | None = None,
        stream: bool = False,
        on_update: Callable[[], None] | None = None,
        health: bool = False,
    ) -> None:
        self.prompt_len = prompt_len
        self.output_ids = output_ids
        self.max_new_tokens = max_new_tokens
        self.hashes = hashes or []
        self.stream = stream
        self.on_update = on_update
        self.health = health
        self.generated = 0
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.abort_message: str | None = None
        self.abort_status: int | None = 503
        self.aborted_in_queue = False
        self.retractions = 0
        self.published = 0
        self.admitted_at: float | None = None
        self.last_output_at: float | None = None
        self.state = RequestState.WAITING
        self.arrival = 0.0
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    @property
    def kv_tokens(self) -> int:
        """Tokens this request holds in the pool while it runs."""
        return self.prompt_len + self.generated

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def aborted(self) -> bool:
        return self.abort_message is not None

    @property
    def done(self) -> bool:
        """Finished and published: what a client may see (the engine state runs a step ahead)."""
        return self.finished_at is not None


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
        self.capacity = sizing.max_total_num_tokens
        self.cache = (
            PrefixCache(self.capacity, sizing.host_tokens) if prefix_cache else PrefixCache(0, 0)
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.used_tokens = 0
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.retractions = 0
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
        self.waiting = kept
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
        admitted, prefilled, host_loaded = self._admit()
        dropped = self._make_room()
        running = len(self.running)
        started, updated, finished, tokens = self._decode()
        self.new_token_ratio = max(
            MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        )
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

    def _admit(self) -> tuple[list[Request], int, int]:
        admitted: list[Request] = []
        prefilled = host_loaded = 0
        if not self.waiting:
            return admitted, prefilled, host_loaded
        available = self.capacity - self.used_tokens - self._reserved_tokens()
        while self._may_admit(len(admitted), prefilled):
            request = self.waiting[0]
            if request.aborted:
                self.waiting.popleft()
                request.state = RequestState.FINISHED
                continue
            need = request.kv_tokens + self._reservation(request)
            if need > available and self.running:
                break
            self.waiting.popleft()
            computed, loaded = self._prefill(request)
            prefilled += computed
            host_loaded += loaded
            available -= need
            admitted.append(request)
        self.cache.shrink(self.capacity - self.used_tokens)
        return admitted, prefilled, host_loaded

    def _may_admit(self, admitted: int, prefilled: int) -> bool:
        if not self.waiting or len(self.running) >= self.sizing.max_running_requests:
            return False
        return admitted == 0 or prefilled < self.sizing.chunked_prefill_size

    def _prefill(self, request: Request) -> tuple[int, int]:
        """Move a request into the batch; returns (tokens computed, tokens loaded from host)."""
        hit = self.cache.match(request.hashes)
        cached = min(hit.tokens, request.prompt_len - 1)
        loaded = max(0, cached - hit.device_tokens)
        self.cache.insert(request.hashes)
        request.cached_tokens += cached
        request.host_cached_tokens += loaded
        request.state = RequestState.RUNNING
        self.running.append(request)
        self.used_tokens += request.kv_tokens
        return request.kv_tokens - cached, loaded

    def _reservation(self, request: Request) -> int:
        remaining = min(request.max_new_tokens - request.generated, CLIP_MAX_NEW_TOKENS)
        return int(self.new_token_ratio * max(remaining, 0))

    def _reserved_tokens(self) -> int:
        return sum(self._reservation(request) for request in self.running)

    def _make_room(self) -> list[Request]:
        """Retract requests until every running one has room for its next token."""
        if not self.running or self.used_tokens + len(self.running) <= self.capacity:
            return []
        # schedule_batch `_get_decode_retraction_order`: keep the longest outputs, then the
        # shortest prompts; the loop pops the least preferred.
        self.running.sort(key=lambda request: (request.generated, -request.prompt_len))
        self.running.reverse()
        retracted: list[Request] = []
        dropped: list[Request] = []
        gained = 0
        while len(self.running) > 1 and self.used_tokens + len(self.running) > self.capacity:
            victim = self.running.pop()
            self.used_tokens -= victim.kv_tokens
            gained += victim.kv_tokens
            if victim.aborted:  # marked to finish: it leaves now rather than wait in the queue
                victim.state = RequestState.FINISHED
                dropped.append(victim)
                continue
            victim.state = RequestState.WAITING
            victim.retractions += 1
            retracted.append(victim)
        if retracted:
            self._retracted(retracted, gained)
        if self.used_tokens + len(self.running) > self.capacity:
            dropped.append(self._abort_last())
        return dropped

    def _abort_last(self) -> Request:
        """The request left alone that still does not fit: aborted (HTTP 500), KV freed."""
        last = self.running.pop()
        self.used_tokens -= last.kv_tokens
        if not last.aborted:
            last.abort_message = POOL_FULL_MESSAGE
            last.abort_status = POOL_FULL_STATUS
        last.state = RequestState.FINISHED
        return last

    def _retracted(self, retracted: list[Request], gained: int) -> None:
        """Requeue retracted requests at the front, re-estimate the ratio, count and log."""
        self.waiting.extendleft(reversed(retracted))
        self.retractions += len(retracted)
        old_ratio = self.new_token_ratio
        self.new_token_ratio = self._ratio_after_retraction()
        if self._observer:
            self._observer.on_retract(retracted)
        if self._log:
            self._log(
                f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
                f"#new_tokens_gained: {gained}, #new_token_ratio: {old_ratio:.4f} -> "
                f"{self.new_token_ratio:.4f}"
            )

    def _ratio_after_retraction(self) -> float:
        """SGLang's estimate: (decoded + 20 per request) / max_new_tokens over the batch."""
        decoded = sum(request.generated for request in self.running)
        budget = sum(request.max_new_tokens for request in self.running)
        if budget <= 0:
            return 1.0
        return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / budget)

    def _decode(self) -> tuple[list[Request], list[Request], list[Request], int]:
        still: list[Request] = []
        started: list[Request] = []
        updated: list[Request] = []
        finished: list[Request] = []
        tokens = 0
        for request in self.running:
            if not request.aborted and request.generated < len(request.output_ids):
                request.generated += 1
                self.used_tokens += 1
                tokens += 1
                if request.generated == 1:
                    started.append(request)
            if request.aborted or request.generated >= len(request.output_ids):
                self.used_tokens -= request.kv_tokens
                request.state = RequestState.FINISHED
                finished.append(request)
            else:
                still.append(request)
                if request.stream or request.generated % FORCE_STREAM_INTERVAL == 0:
                    updated.append(request)
        self.running = still
        return started, updated, finished, tokens

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
