"""How many requests in flight: a fixed cap, or `auto`, steered to keep every server busy.

A fixed `--concurrency N` is a cap. `auto` (the default) starts at `START` and moves the cap
every `interval` seconds, in one of two modes, and says which (`mode`):

metrics     The servers' `/metrics` (through an sglang-router: every worker's own) are read
            with `workbench.server.metrics`. SGLang runs best with its waiting queue non-empty and
            its KV pool well used; a long queue only holds memory and, when the server admits
            too much, causes retractions (recomputed work). So, per server, with `running`
            and `queued` requests:

              a server with an empty queue (not saturated)
                  -> grow the cap by `GROW` (when the cap is in use: more prompts to send)
              every server queued
                  -> cap = sum(peak + queue target) over the servers, `peak` being the
                     most requests a server ran in its last `PEAK_READINGS` readings (a
                     KV-bound server runs fewer as its requests grow, and more once they
                     finish: the queue must refill it then) and the queue target
                     max(QUEUE_MIN, QUEUE_SHARE * peak): the queue stays non-empty but
                     bounded by about that target above the peak
              retractions since the last reading on more than `RETRACT_SHARE` of the
              running requests
                  -> a short queue: cap = running + QUEUE_MIN per server (never more than
                     now), and hold growth for `HOLD` readings

throughput  `/metrics` is off (404) or unreadable: hill-climb on the output tokens per
            second of finished requests: grow by `GROW` while a window is at least
            `GAIN` better than the best so far, else go back to the best cap and hold; probe
            again after `HOLD` windows.

:class:`Slots` holds a run's slots: the global cap (a fixed Limiter, or one steered by
`Steering`) and the lower cap of requests with long prompts.

In both modes a failed request that the server caused (timeout, 5xx, 429, abort) shrinks the
cap by `BACKOFF` and holds growth (a lost connection pauses the whole run instead, see
`workbench.generate.servers`). Every change of the cap is kept in
`history` as (seconds since start, cap) for run.json and the progress line.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from workbench.errors import RequestFailed
from workbench.server.metrics import MetricsSnapshot, parse_metrics

if TYPE_CHECKING:
    from workbench.server.client import SGLangClient

__all__ = [
    "AutoConcurrency",
    "Limiter",
    "ServerReading",
    "Slots",
    "Steering",
    "read_servers",
]

START = 32
FLOOR = 4
CEILING = 1024
GROW = 1.5
QUEUE_MIN = 8
QUEUE_SHARE = 0.5
RETRACT_SHARE = 0.02
BACKOFF = 0.7
HOLD = 3
PEAK_READINGS = 10
GAIN = 0.03
MIN_WINDOW_REQUESTS = 8

Mode = Literal["fixed", "metrics", "throughput"]


class Limiter:
    """A semaphore whose limit can change while requests hold it (lowering it lets the
    holders finish: no new one starts until the count is under the new limit)."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._wake()

    async def acquire(self, first: bool = False) -> None:
        """A slot; `first` waits ahead of every other waiter (the next turn of a
        conversation goes before a new conversation)."""
        while self.in_use >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            if first:
                self._waiters.appendleft(waiter)
            else:
                self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the wake-up on
                raise
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self._wake()

    def _wake(self) -> None:
        free = self._limit - self.in_use
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One server's gauges (a worker behind a router, or the server itself)."""

    url: str
    running: float
    queued: float
    token_usage: float | None = None
    retracted: float | None = None  # counter: total retracted requests
    generated: float | None = None  # counter: generation tokens (moves when a request finishes)
    decoded: float | None = None  # counter: tokens generated so far (moves while requests run)


@dataclass(slots=True)
class AutoConcurrency:
    """The cap's decisions from readings (no I/O: the runner's Steering feeds it)."""

    limit: int = START
    floor: int = FLOOR
    ceiling: int = CEILING
    mode: Mode = "metrics"
    history: list[tuple[float, int]] = field(default_factory=list)
    _hold: int = 0
    _retracted: dict[str, float] = field(default_factory=dict)
    _running: dict[str, deque[float]] = field(default_factory=dict)
    _best: tuple[float, int] | None = None  # throughput mode: (tok/s, cap)

    def start(self, at: float) -> int:
        """The first cap (recorded in the history)."""
        return self._set(self.limit, at, force=True)

    def _set(self, limit: int, at: float, *, force: bool = False) -> int:
        limit = max(self.floor, min(self.ceiling, int(limit)))
        if limit != self.limit or force:
            self.history.append((round(at, 1), limit))
        self.limit = limit
        return limit

    def on_readings(self, readings: Sequence[ServerReading], in_use: int, at: float) -> int:
        """The cap after a reading of every server (metrics mode)."""
        self.mode = "metrics"
        if self._over_admitted(readings):
            self._hold = HOLD
            short = sum(r.running for r in readings) + QUEUE_MIN * len(readings)
            return self._set(min(self.limit, math.ceil(short)), at)
        self._hold = max(0, self._hold - 1)
        peaks = {r.url: self._peak(r) for r in readings}
        starved = [r for r in readings if r.queued < 1]
        if starved:
            busy = in_use >= 0.9 * self.limit
            grow = busy and self._hold == 0
            return self._set(math.ceil(self.limit * GROW) if grow else self.limit, at)
        target = sum(peak + max(QUEUE_MIN, math.ceil(QUEUE_SHARE * peak)) for peak in peaks.values())
        return self._set(round((self.limit + target) / 2), at)

    def _peak(self, reading: ServerReading) -> float:
        recent = self._running.setdefault(reading.url, deque(maxlen=PEAK_READINGS))
        recent.append(reading.running)
        return max(recent)

    def _over_admitted(self, readings: Sequence[ServerReading]) -> bool:
        over = False
        for r in readings:
            if r.retracted is None:
                continue
            before = self._retracted.get(r.url)
            self._retracted[r.url] = r.retracted
            if before is not None and r.retracted - before > RETRACT_SHARE * max(r.running, 1):
                over = True
        return over

    def on_window(self, tok_s: float, requests: int, at: float) -> int:
        """The cap after a window of finished requests (throughput mode)."""
        self.mode = "throughput"
        if requests < MIN_WINDOW_REQUESTS:
            return self.limit
        if self._best is None or tok_s >= self._best[0] * (1 + GAIN):
            self._best = (tok_s, self.limit)
            if self._hold == 0:
                return self._set(math.ceil(self.limit * GROW), at)
        elif self._hold == 0:
            self._hold = HOLD
            return self._set(self._best[1], at)
        self._hold = max(0, self._hold - 1)
        if self._hold == 0 and self._best[1] == self.limit:
            self._best = (self._best[0] * (1 - GAIN), self.limit)  # probe again
        return self.limit

    def on_error(self, at: float) -> int:
        """A failure the server caused: back off and hold growth."""
        self._hold = HOLD
        self._best = None
        return self._set(math.floor(self.limit * BACKOFF), at)


async def read_servers(client: SGLangClient, worker_client: Callable[[str], SGLangClient],
                       ) -> list[ServerReading] | None:
    """Every server's gauges: the server's own `/metrics`, or through an sglang-router each
    worker's; None when no server has metrics (or they cannot be read)."""
    try:
        text = await client.metrics()
        if text is not None:
            return _reading(client.base_url, text)
        workers = await client.workers()
    except RequestFailed:
        return None
    if not workers:
        return None
    readings = await asyncio.gather(*(_worker(worker_client(w["url"])) for w in workers))
    found = [r for reading in readings if reading for r in reading]
    return found or None


async def _worker(client: SGLangClient) -> list[ServerReading] | None:
    try:
        text = await client.metrics()
    except RequestFailed:
        return None
    return None if text is None else _reading(client.base_url, text)


def _reading(url: str, text: str) -> list[ServerReading] | None:
    try:
        snap: MetricsSnapshot = parse_metrics(text)
    except ValueError:
        return None
    if snap.running is None or snap.queued is None:
        return None
    return [ServerReading(url, snap.running, snap.queued, snap.token_usage, snap.retracted,
                          snap.generation_tokens, snap.decoded_tokens)]


@dataclass(slots=True)
class Steering:
    """The `auto` loop of one run: every `interval` seconds read the servers and move the
    limiter's cap; without metrics, steer on the finished requests' throughput."""

    limiter: Limiter
    auto: AutoConcurrency
    read: Callable[[], Awaitable[list[ServerReading] | None]]
    interval: float = 2.0
    clock: Callable[[], float] = time.perf_counter
    on_mode: Callable[[str], None] = lambda message: None
    frozen: bool = False  # the run is stopping: the cap stays where it is
    _start: float = 0.0
    _tokens: int = 0
    _requests: int = 0

    def finished(self, tokens: int) -> None:
        """A request finished with `tokens` completion tokens."""
        self._tokens += tokens
        self._requests += 1

    def failed(self) -> None:
        """A request failed because of the server (timeout, 5xx, lost connection, ...)."""
        if not self.frozen:
            self.limiter.set_limit(self.auto.on_error(self.clock() - self._start))

    async def run(self) -> None:
        self._start = self.clock()
        self.limiter.set_limit(self.auto.start(0.0))
        mode: str | None = None
        window = self.clock()
        while not self.frozen:
            await asyncio.sleep(self.interval)
            if self.frozen:
                return
            now = self.clock()
            readings = await self.read()
            if readings is not None:
                limit = self.auto.on_readings(readings, self.limiter.in_use, now - self._start)
            elif now - window > 0:
                limit = self.auto.on_window(self._tokens / (now - window), self._requests,
                                            now - self._start)
                if self._requests >= MIN_WINDOW_REQUESTS:
                    self._tokens, self._requests, window = 0, 0, now
            else:
                continue
            if self.auto.mode != mode:
                mode = self.auto.mode
                self.on_mode(describe_mode(self.auto))
            self.limiter.set_limit(limit)


def describe_mode(auto: AutoConcurrency) -> str:
    if auto.mode == "metrics":
        return "concurrency auto: steering on the servers' /metrics (queue and running requests)"
    return ("concurrency auto: /metrics is off, steering on the output tokens per second of "
            "finished requests")


Reader = Callable[[], Awaitable[list[ServerReading] | None]]


class Slots:
    """The request slots of one run: every request holds a global one (the cap: `setting` N,
    or "auto" steered from `read`), and a request with a long prompt a long one too (at
    most `long_cap`, and never more than a fixed cap)."""

    def __init__(self, setting: int | str, long_cap: int, read: Reader, *,
                 interval: float = 2.0, on_mode: Callable[[str], None] = lambda message: None) -> None:
        self.setting = setting
        self.steering: Steering | None = None
        if isinstance(setting, int):
            self.limiter = Limiter(setting)
            long_cap = min(long_cap, setting)
        else:
            auto = AutoConcurrency()
            self.limiter = Limiter(auto.limit)
            self.steering = Steering(self.limiter, auto, read, interval=interval, on_mode=on_mode)
        self._long = asyncio.Semaphore(max(1, long_cap))

    @property
    def limit(self) -> int:
        """The cap on requests in flight right now."""
        return self.limiter.limit

    def start(self) -> asyncio.Task[None] | None:
        """The steering task (auto), started; None for a fixed cap."""
        return None if self.steering is None else asyncio.create_task(self.steering.run())

    async def acquire(self, long: bool, first: bool = False) -> None:
        """One slot (and a long one for a long prompt); nothing held when cancelled. `first`
        goes ahead of the other waiters (a conversation's next turn)."""
        if long:
            await self._long.acquire()
        try:
            await self.limiter.acquire(first)
        except BaseException:
            if long:
                self._long.release()
            raise

    def freeze(self) -> None:
        """The run is stopping: auto concurrency moves the cap no more."""
        if self.steering is not None:
            self.steering.frozen = True

    def release(self, long: bool) -> None:
        self.limiter.release()
        if long:
            self._long.release()

    def finished(self, tokens: int) -> None:
        """A request finished with `tokens` completion tokens (auto steers on them without
        metrics)."""
        if self.steering is not None:
            self.steering.finished(tokens)

    def failed(self) -> None:
        """A request failed because of the server: auto backs off."""
        if self.steering is not None:
            self.steering.failed()

    def text(self) -> str:
        """`concurrency 96 (auto, metrics)` or `concurrency 150 (fixed)`."""
        if self.steering is None:
            return f"concurrency {self.limit} (fixed)"
        return f"concurrency {self.limit} (auto, {self.steering.auto.mode})"

    def record(self) -> dict[str, object]:
        """run.json's `concurrency`: the setting, mode, cap now and the cap's history."""
        auto = self.steering.auto if self.steering is not None else None
        return {"setting": self.setting, "mode": auto.mode if auto else "fixed",
                "current": self.limit,
                "history": [list(point) for point in auto.history[-500:]] if auto else []}
