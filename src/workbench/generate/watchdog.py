"""The run's watchdog: a server that answers but makes no progress, or crawls.

A server can hang while it still answers ``/health`` (its scheduler stuck: no token is
generated), or degrade (after heavy retraction SGLang's decode throughput has been seen to
fall about 14 times and stay there). A server that stops answering is the outage gate's
(:mod:`workbench.generate.servers`); the watchdog watches one that answers.

:class:`Detector` reads nothing and keeps no clock of its own: it is fed :class:`Reading`\\ s
(each with its time ``at``, in seconds) and returns a :class:`Detection` when the state
changes, ``ok`` -> ``stalled`` or ``degraded`` -> ``recovered`` -> ``ok``:

progress    a server's token counter went up, or a reply finished (the run's own count).
            A server's counter is its ``sglang:inter_token_latency_seconds_count`` (every
            generated token after a request's first, counted while requests run), else its
            ``sglang:generation_tokens_total`` (which moves only when a request finishes).
            Several servers (the workers behind an sglang-router): each one's increase since
            its previous reading, summed; a counter that went down (a restarted server) is
            read afresh and counts nothing.

stalled     requests are in flight and nothing progressed for ``stall_seconds``. The clock
            starts again whenever nothing is in flight or the run is paused (the outage gate
            or a failed write: those say so themselves). Without /metrics the only progress
            seen is a finished reply. Several servers: also one of them whose counter did not
            move for ``stall_seconds`` while it says requests are running on it (the others'
            progress would hide a hung worker, whose requests wait for --request-timeout);
            it recovers when its own counter moves again.

degraded    all of these at one reading:
              - ``rate``: tokens per second between this reading and the latest one at least
                ``window`` seconds older (needs /metrics);
              - ``best``: the highest such rate seen so far in the run;
              - rate < ``degrade_fraction`` x best;
              - token usage >= ``usage_high`` (the fullest server's);
              - the retraction counters went up over the last ``retract_lookback`` seconds
                (or since the first reading, in a younger run);
              - requests in flight.
            A server whose /metrics lack the inter-token latency histogram gives rates from
            finished requests only: lumpy when requests finish in cohorts.

recovered   from stalled: progress again. From degraded: a rate at or above
            ``recover_fraction`` x best.

A stall outranks a degradation: a degraded server that stalls is reported stalled. A
Detection says what was seen, as one sentence (``message``) and as ``figures``.

:class:`Watchdog` runs a detector in a run: every ``interval`` seconds (a quarter of
``stall_seconds`` when that is shorter), while requests are in flight, it reads the servers'
/metrics (the reading auto concurrency made within that time when there is one: the runner
:meth:`~Watchdog.offer`\\ s each of its readings; else one of its own through the same
reader), adds the run's counts and feeds the detector; a stall is told with whether
``/health`` still answers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from workbench.errors import ConfigError
from workbench.generate.concurrency import ServerReading

__all__ = [
    "Detection",
    "Detector",
    "Reading",
    "RunCounts",
    "Watchdog",
    "WatchdogSettings",
    "reading_from",
]

PROBE_TIMEOUT = 10.0  # seconds a reading of /metrics or /health may take

Kind = Literal["stalled", "degraded", "recovered"]
State = Literal["ok", "stalled", "degraded"]
Figure = float | int | bool | str


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """The detector's thresholds (module docstring); ``stall_seconds`` 0 turns the stall
    check off, ``degrade_fraction`` 0 the degradation check."""

    stall_seconds: float = 300.0  # SGLang's own --watchdog-timeout
    degrade_fraction: float = 0.25
    window: float = 60.0
    usage_high: float = 0.9
    retract_lookback: float = 600.0
    recover_fraction: float = 0.5
    interval: float = 5.0

    def __post_init__(self) -> None:
        for key, ok, expected in (
            ("stall_seconds", self.stall_seconds >= 0, "0 (off) or more seconds"),
            ("degrade_fraction", 0 <= self.degrade_fraction < 1, "a fraction in [0, 1)"),
            ("window", self.window > 0, "a positive number of seconds"),
            ("usage_high", 0 < self.usage_high <= 1, "a fraction in (0, 1]"),
            ("retract_lookback", self.retract_lookback > 0, "a positive number of seconds"),
            ("recover_fraction", 0 < self.recover_fraction <= 1, "a fraction in (0, 1]"),
            ("interval", self.interval > 0, "a positive number of seconds"),
        ):
            if not ok:
                raise ConfigError(key, f"expected {expected}, got {getattr(self, key)}")

    @property
    def enabled(self) -> bool:
        return self.stall_seconds > 0 or self.degrade_fraction > 0

    @property
    def every(self) -> float:
        """Seconds between two readings: `interval`, shorter for a short stall timeout (a
        quarter of it), so that a stall is told at most a quarter late."""
        if self.stall_seconds <= 0:
            return self.interval
        return min(self.interval, self.stall_seconds / 4)

    def record(self) -> dict[str, float]:
        """What run.json keeps of them."""
        return {"stall_timeout": self.stall_seconds, "degrade_fraction": self.degrade_fraction}


@dataclass(frozen=True, slots=True)
class Reading:
    """What the detector is fed at time `at` (seconds, any clock): per server URL its token
    and retraction counters (`tokens` None without /metrics), the servers' gauges (running
    and queued summed, the fullest server's token usage) and the run's own counts."""

    at: float
    tokens: Mapping[str, float] | None = None
    running: float | None = None
    queued: float | None = None
    token_usage: float | None = None
    retracted: Mapping[str, float] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)  # per server URL, requests running
    in_flight: int = 0
    finished: int = 0  # replies finished in this run so far
    paused: bool = False  # the run waits for the server or the disk


@dataclass(frozen=True, slots=True)
class Detection:
    """A change of state: its kind, what was seen as a sentence, and as figures."""

    kind: Kind
    message: str
    figures: Mapping[str, Figure] = field(default_factory=dict)

    def event(self, ts: float) -> dict[str, Any]:
        """run.json's event: ``{"ts", "kind", "message", ...figures}``."""
        return {"ts": round(ts, 3), "kind": self.kind, "message": self.message, **self.figures}


class _Sample(NamedTuple):
    at: float
    tokens: float  # the run's cumulative count of the servers' token increases
    retracted: float  # the same for retractions


class Detector:
    """The watchdog's decisions from readings (module docstring); no I/O."""

    def __init__(self, settings: WatchdogSettings = WatchdogSettings()) -> None:
        self.settings = settings
        self.state: State = "ok"
        self.best: float | None = None  # the best window rate so far (tokens/s)
        self._since: float | None = None  # since when nothing progressed with requests in flight
        self._entered = 0.0  # when the state last changed
        self._finished = 0
        self._tokens: dict[str, float] = {}
        self._retracted: dict[str, float] = {}
        self._total = _Sample(0.0, 0.0, 0.0)
        self._samples: deque[_Sample] = deque()
        self._workers = _WorkerClocks()

    def feed(self, reading: Reading) -> Detection | None:
        """The detection this reading makes, if the state changes."""
        self._workers.feed(reading, self._tokens)
        gained = self._count(reading)
        progressed = gained > 0 or reading.finished > self._finished
        self._finished = reading.finished
        before = self._since if self._since is not None else reading.at
        if progressed or reading.in_flight == 0 or reading.paused or self._since is None:
            self._since = reading.at
        quiet = reading.at - self._since  # seconds without progress with requests in flight
        rate = self._rate(reading.at) if reading.tokens is not None else None
        if rate is not None:
            self.best = rate if self.best is None else max(self.best, rate)
        if self.state == "stalled" and self._workers.stalled is not None:
            return self._worker_recovered(reading)
        if self.state == "stalled":
            return self._recovered(reading, progressed, rate, reading.at - before)
        if self._stalled(reading, quiet):
            return self._enter("stalled", reading, _stall_message(reading, quiet),
                               seconds=round(quiet))
        worker = self._worker_stalled(reading)
        if worker is not None:
            return worker
        if self.state == "degraded":
            return self._recovered(reading, False, rate, reading.at - self._entered)
        degraded = self._degraded(reading, rate)
        if degraded is not None:
            return self._enter("degraded", reading, *degraded)
        return None

    def _count(self, reading: Reading) -> float:
        """Add the servers' counter increases to the run's totals (and keep a sample);
        returns the tokens gained since the previous reading."""
        if reading.tokens is None:
            return 0.0
        gained = _increase(self._tokens, reading.tokens)
        retracted = _increase(self._retracted, reading.retracted)
        self._total = _Sample(reading.at, self._total.tokens + gained,
                              self._total.retracted + retracted)
        self._samples.append(self._total)
        horizon = reading.at - max(self.settings.window, self.settings.retract_lookback)
        while len(self._samples) > 2 and self._samples[1].at <= horizon:
            self._samples.popleft()
        return gained

    def _before(self, at: float) -> _Sample | None:
        """The latest sample taken at or before `at`."""
        return next((s for s in reversed(self._samples) if s.at <= at), None)

    def _rate(self, now: float) -> float | None:
        """Tokens per second over the last window (None while the run is younger)."""
        start = self._before(now - self.settings.window)
        if start is None or now <= start.at:
            return None
        return (self._total.tokens - start.tokens) / (now - start.at)

    def _stalled(self, reading: Reading, quiet: float) -> bool:
        stall = self.settings.stall_seconds
        return stall > 0 and reading.in_flight > 0 and quiet >= stall

    def _worker_stalled(self, reading: Reading) -> Detection | None:
        """`stalled` for the server (one of several) quiet longest with requests running on
        it, when that is `stall_seconds` or more."""
        stall = self.settings.stall_seconds
        if stall <= 0 or reading.in_flight == 0 or reading.paused:
            return None
        found = self._workers.quietest(reading)
        if found is None or found[1] < stall:
            return None
        url, quiet = found
        self._workers.stalled = url
        self._workers.stalled_since = reading.at - quiet
        running = reading.busy.get(url, 0.0)
        message = (f"worker {url} stalled: no token generated for {quiet:.0f} s with "
                   f"{running:.0f} requests running on it, while the other servers progress")
        return self._enter("stalled", reading, message, seconds=round(quiet), worker=url)

    def _worker_recovered(self, reading: Reading) -> Detection | None:
        """`recovered` when the stalled worker's counter moved, or it has nothing running."""
        url = self._workers.stalled
        assert url is not None
        if not self._workers.moved(url, reading):
            return None
        self._workers.stalled = None
        lasted = reading.at - self._workers.stalled_since
        return self._enter("recovered", reading,
                           f"worker {url} recovered: progress again after {lasted:.0f} s without",
                           after="stalled", seconds=round(lasted), worker=url)

    def _degraded(self, reading: Reading,
                  rate: float | None) -> tuple[str, dict[str, Figure]] | None:
        s = self.settings
        if s.degrade_fraction <= 0 or rate is None or not self.best or reading.in_flight == 0:
            return None
        if rate >= s.degrade_fraction * self.best:
            return None
        if reading.token_usage is None or reading.token_usage < s.usage_high:
            return None
        start = self._before(reading.at - s.retract_lookback) or self._samples[0]
        retractions = self._total.retracted - start.retracted
        if retractions <= 0:
            return None
        lookback = reading.at - start.at
        message = (f"server degraded: {rate:,.0f} tokens/s over the last {s.window:.0f} s, "
                   f"{rate / self.best:.0%} of this run's best ({self.best:,.0f} tokens/s), "
                   f"{retractions:,.0f} retractions in the last {lookback:.0f} s, with "
                   f"{_server_text(reading)}")
        return message, {"tok_s": round(rate, 1), "best_tok_s": round(self.best, 1),
                         "retractions": int(retractions)}

    def _recovered(self, reading: Reading, progressed: bool, rate: float | None,
                   lasted: float) -> Detection | None:
        """`recovered` when the state ends (`lasted`: for how long it was so)."""
        was = self.state
        if was == "stalled" and progressed:
            message = f"server recovered: progress again after {lasted:.0f} s without"
        elif (was == "degraded" and rate is not None and self.best
              and rate >= self.settings.recover_fraction * self.best):
            message = (f"server recovered: {rate:,.0f} tokens/s over the last "
                       f"{self.settings.window:.0f} s ({rate / self.best:.0%} of the best) "
                       f"after {lasted:.0f} s degraded")
        else:
            return None
        figures: dict[str, Figure] = {"after": was, "seconds": round(lasted)}
        if rate is not None:
            figures["tok_s"] = round(rate, 1)
        return self._enter("recovered", reading, message, **figures)

    def _enter(self, kind: Kind, reading: Reading, message: str,
               figures: Mapping[str, Figure] | None = None, **more: Figure) -> Detection:
        self.state = "ok" if kind == "recovered" else kind
        self._entered = reading.at
        return Detection(kind, message, {**_reading_figures(reading), **(figures or {}), **more})


class _WorkerClocks:
    """Per server (when a reading has several), since when its counter has not moved while
    requests run on it: the watchdog's view of one hung worker among working ones."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}
        self.moving: set[str] = set()  # servers whose counter moved at the latest reading
        self.stalled: str | None = None  # the server a worker stall was told of
        self.stalled_since = 0.0  # since when it had not progressed

    def feed(self, reading: Reading, last: Mapping[str, float]) -> None:
        """Take a reading (`last`: the counters of the previous one, not yet updated)."""
        tokens = reading.tokens or {}
        if not tokens or reading.paused or reading.in_flight == 0:
            self.since.clear()  # not read, or nothing to wait for: the clocks start again
        self.moving = {url for url, value in tokens.items()
                       if url not in last or value != last[url]}
        for url in tokens:
            idle = reading.busy.get(url, 0.0) <= 0
            if url in self.moving or idle or reading.paused or url not in self.since:
                self.since[url] = reading.at

    def quietest(self, reading: Reading) -> tuple[str, float] | None:
        """The server quiet longest with requests running on it, and for how long; None
        with fewer than two servers."""
        tokens = reading.tokens or {}
        if len(tokens) < 2:
            return None
        busy = [url for url in tokens if reading.busy.get(url, 0.0) > 0]
        if not busy:
            return None
        url = min(busy, key=lambda u: self.since[u])
        return url, reading.at - self.since[url]

    def moved(self, url: str, reading: Reading) -> bool:
        """Whether `url` progressed at this reading (or runs nothing, or is gone)."""
        tokens = reading.tokens or {}
        return url in self.moving or url not in tokens or reading.busy.get(url, 0.0) <= 0


def _increase(last: dict[str, float], now: Mapping[str, float]) -> float:
    """The counters' increases since `last` (updated), summed over the servers seen in both;
    a counter that went down (a restarted server) counts nothing."""
    gained = 0.0
    for url, value in now.items():
        before = last.get(url)
        if before is not None and value > before:
            gained += value - before
        last[url] = value
    return gained


def _server_text(reading: Reading) -> str:
    """`48 requests running, 10 queued, token usage 0.97` (what the servers said), or the
    run's requests in flight without /metrics."""
    if reading.running is None or reading.queued is None:
        return f"{reading.in_flight} requests in flight"
    text = f"{reading.running:.0f} requests running, {reading.queued:.0f} queued"
    if reading.token_usage is not None:
        text += f", token usage {reading.token_usage:.2f}"
    return text


def _stall_message(reading: Reading, seconds: float) -> str:
    if reading.tokens is None:
        return (f"server stalled: no reply finished for {seconds:.0f} s with "
                f"{reading.in_flight} requests in flight (no /metrics to see tokens)")
    return f"server stalled: no token generated for {seconds:.0f} s with {_server_text(reading)}"


def _reading_figures(reading: Reading) -> dict[str, Figure]:
    figures: dict[str, Figure] = {"in_flight": reading.in_flight}
    for key in ("running", "queued", "token_usage"):
        value = getattr(reading, key)
        if value is not None:
            figures[key] = round(value, 3)
    return figures


def reading_from(servers: Sequence[ServerReading] | None, at: float, in_flight: int,
                 finished: int, paused: bool = False) -> Reading:
    """A Reading of the servers' readings (None: no /metrics) and the run's counts."""
    if not servers:
        return Reading(at, in_flight=in_flight, finished=finished, paused=paused)
    tokens = {r.url: r.decoded if r.decoded is not None else r.generated for r in servers}
    usage = [r.token_usage for r in servers if r.token_usage is not None]
    return Reading(
        at,
        tokens={url: value for url, value in tokens.items() if value is not None},
        running=sum(r.running for r in servers), queued=sum(r.queued for r in servers),
        token_usage=max(usage) if usage else None,
        retracted={r.url: r.retracted for r in servers if r.retracted is not None},
        busy={r.url: r.running for r in servers}, in_flight=in_flight, finished=finished, paused=paused,
    )


class RunCounts(NamedTuple):
    """The run's side of a reading."""

    in_flight: int
    finished: int
    paused: bool


ServersReader = Callable[[], Awaitable[list[ServerReading] | None]]


class Watchdog:
    """A detector at work in a run (module docstring): `read` reads the servers, `counts`
    gives the run's counts, `health` says whether `/health` answers, `on_detection` gets
    what the detector finds."""

    def __init__(self, settings: WatchdogSettings, read: ServersReader,
                 counts: Callable[[], RunCounts], health: Callable[[], Awaitable[bool]],
                 on_detection: Callable[[Detection], None], *,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.settings = settings
        self.detector = Detector(settings)
        self.read = read
        self.counts = counts
        self.health = health
        self.on_detection = on_detection
        self.clock = clock
        self.sleep = sleep
        self._offered: tuple[float, list[ServerReading] | None] | None = None

    def reset(self) -> None:
        """Watch afresh (a new server process: its counters, its best rate and its state
        start over; a server that stalls again before it ever progressed is told again)."""
        self.detector = Detector(self.settings)

    def offer(self, servers: list[ServerReading] | None) -> None:
        """A reading of the servers made by someone else (auto concurrency), reused when
        it is recent."""
        self._offered = (self.clock(), servers)

    async def run(self) -> None:
        """Every `settings.every` seconds, a reading fed to the detector (until cancelled)."""
        while True:
            await self.sleep(self.settings.every)
            await self.tick()

    async def tick(self) -> Detection | None:
        """One reading fed to the detector; what it found (already passed on), if anything."""
        counts = self.counts()
        servers = await self._servers() if counts.in_flight and not counts.paused else None
        reading = reading_from(servers, self.clock(), counts.in_flight, counts.finished,
                               counts.paused)
        detection = self.detector.feed(reading)
        if detection is None:
            return None
        if detection.kind == "stalled" and "worker" not in detection.figures:
            detection = await self._with_health(detection)  # the server the run talks to
        self.on_detection(detection)
        return detection

    async def _servers(self) -> list[ServerReading] | None:
        """The servers' readings: the one offered within the interval, else a new one
        (None when it takes over `PROBE_TIMEOUT` seconds)."""
        if self._offered is not None and self.clock() - self._offered[0] < self.settings.every:
            return self._offered[1]
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                return await self.read()
        except TimeoutError:
            return None

    async def _with_health(self, detection: Detection) -> Detection:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                answers = await self.health()
        except TimeoutError:
            answers = False
        note = "; /health answers" if answers else "; /health does not answer either"
        return replace(detection, message=detection.message + note,
                       figures={**detection.figures, "health": answers})
