"""The load of one point: the prompts, and a closed loop of workers with a warm-up and a
measurement window that samples the server's gauges.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from workbench.config import load_manifest
from workbench.errors import ConfigError, RequestFailed
from workbench.generate.concurrency import (
    CEILING,
    START,
    AutoConcurrency,
    Limiter,
    ServerReading,
    Steering,
    read_servers,
)
from workbench.generate.prompts import load_prompts
from workbench.profiles import get_profile
from workbench.server.client import SGLangClient
from workbench.server.metrics import parse_metrics
from workbench.tune.parameters import LoadParams, PromptParams

__all__ = ["LoadOutcome", "LoadPrompt", "PointLoad", "RequestRow", "build_prompts"]

MIN_SAMPLE_WALL = 0.05
ERROR_PAUSE_WALL = 0.05
AUTO_INTERVAL = 2.0  # server seconds between two readings of /metrics (auto)
OVERTIME = 4.0  # a window waits up to this many durations for its first finished request


@dataclass(frozen=True, slots=True)
class LoadPrompt:
    """One prompt of the load: token ids or text."""

    sample_id: int | str
    input_ids: list[int] | None
    text: str | None = None


def build_prompts(params: PromptParams) -> list[LoadPrompt]:
    """The load's prompts in a fixed, seeded order."""
    rng = random.Random(params.seed)
    prompts = _manifest_prompts(params) if params.source == "manifest" else _random_prompts(params, rng)
    if not prompts:
        raise ConfigError("load.prompts", "no prompts")
    rng.shuffle(prompts)
    return prompts


def _random_prompts(params: PromptParams, rng: random.Random) -> list[LoadPrompt]:
    low, high = get_profile(params.model_profile).sim_content_ids
    prefixes = [[rng.randrange(low, high) for _ in range(params.shared_prefix)]
                for _ in range(params.prefix_groups)]
    prompts = []
    for index in range(params.count):
        length = rng.randint(params.input_len[0], params.input_len[1])
        body = [rng.randrange(low, high) for _ in range(length - params.shared_prefix)]
        prompts.append(LoadPrompt(index, prefixes[index % params.prefix_groups] + body))
    return prompts


def _manifest_prompts(params: PromptParams) -> list[LoadPrompt]:
    assert params.manifest is not None
    manifest = load_manifest(params.manifest)
    profile = get_profile(manifest.model_profile)
    names = params.datasets or [ds.name for ds in manifest.datasets]
    prompts: list[LoadPrompt] = []
    for name in names:
        spec = manifest.dataset(name)
        for prompt in load_prompts(spec, profile, limit=params.count):
            prompts.append(LoadPrompt(f"{name}/{prompt.sample_id}", prompt.input_ids, prompt.text))
    return prompts


def _payload(prompt: LoadPrompt, load: LoadParams) -> dict[str, Any]:
    sampling = {"temperature": load.temperature, "top_p": load.top_p, "top_k": load.top_k,
                "max_new_tokens": load.max_new_tokens}
    if prompt.input_ids is not None:
        return {"input_ids": prompt.input_ids, "sampling_params": sampling}
    return {"text": prompt.text, "sampling_params": sampling}


class RequestRow(msgspec.Struct, omit_defaults=True):
    """One request of a point (times in server seconds since the load started)."""

    index: int
    sample_id: int | str
    phase: str
    start_s: float
    e2e_s: float
    ok: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    error_type: str | None = None
    message: str | None = None


class Sample(msgspec.Struct):
    """One reading of the server's gauges (t: server seconds since the load started)."""

    t: float
    running: float | None
    queued: float | None
    token_usage: float | None
    cap: int | None = None  # auto: the concurrency cap at the time


@dataclass(slots=True)
class LoadOutcome:
    """What a point's load produced."""

    rows: list[RequestRow]
    samples: list[Sample]
    window_start: float | None
    window_end: float | None
    before: str | None = None
    after: str | None = None
    crash: str | None = None
    window_tokens: int | None = None


class PointLoad:
    """A closed loop of `concurrency` workers with a warm-up and a measurement window; with
    "auto", the generation job's auto concurrency (`workbench.generate.concurrency`) caps the workers
    in flight, steered from the server's /metrics."""

    def __init__(
        self,
        client: SGLangClient,
        prompts: Sequence[LoadPrompt],
        load: LoadParams,
        concurrency: int | str,
        *,
        time_scale: float = 1.0,
        server_exit: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.client = client
        self.prompts = prompts
        self.load = load
        self.concurrency = concurrency
        self.scale = time_scale
        self.server_exit = server_exit
        self.clock = clock
        self.rows: list[RequestRow] = []
        self.samples: list[Sample] = []
        self._next = 0
        self._finished = 0
        self._measured = 0
        self._measured_ok = 0
        self._t0 = 0.0
        self._window: list[float | None] = [None, None]
        self._stop = asyncio.Event()
        self._scrapes: dict[str, asyncio.Future[str | None]] = {}
        self._crash: str | None = None
        self._streamed: dict[int, int] = {}  # request index -> tokens streamed so far
        self._base: dict[int, int] = {}  # ... and before the window opened
        self._window_tokens = 0
        self.steering: Steering | None = None
        if not isinstance(concurrency, int):
            interval = max(MIN_SAMPLE_WALL, AUTO_INTERVAL / time_scale)
            self.steering = Steering(Limiter(START), AutoConcurrency(), self._read_server,
                                     interval=interval)

    def _now(self) -> float:
        return (self.clock() - self._t0) * self.scale

    async def run(self) -> LoadOutcome:
        """Run until the window closes (or the server dies); cancel what is in flight."""
        self._t0 = self.clock()
        if self.load.warmup_requests == 0:
            self._open_window()
        workers = self.concurrency if isinstance(self.concurrency, int) else CEILING
        jobs: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self._worker()) for _ in range(workers)]
        jobs.append(asyncio.ensure_future(self._watch()))
        if self.steering is not None:
            jobs.append(asyncio.ensure_future(self.steering.run()))
        try:
            await self._stop.wait()
        except asyncio.CancelledError:
            jobs += self._scrapes.values()
            raise
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
        before, after = await self._scraped("before"), await self._scraped("after")
        return LoadOutcome(self.rows, self.samples, self._window[0], self._window[1], before,
                           after, self._crash,
                           self._window_tokens if self.load.stream else None)

    async def _scraped(self, name: str) -> str | None:
        scrape = self._scrapes.get(name)
        return await scrape if scrape is not None else None

    def _open_window(self) -> None:
        self._window[0] = self._now()
        self._base = dict(self._streamed)
        self._scrapes["before"] = asyncio.ensure_future(self._metrics_text())

    def _close_window(self) -> None:
        if self._stop.is_set():
            return
        self._window[1] = self._now()
        self._window_tokens += sum(n - self._base.get(i, 0) for i, n in self._streamed.items())
        self._scrapes["after"] = asyncio.ensure_future(self._metrics_text())
        self._stop.set()

    async def _metrics_text(self) -> str | None:
        try:
            return await self.client.metrics()
        except RequestFailed:
            return None

    async def _read_server(self) -> list[ServerReading] | None:
        return await read_servers(self.client, lambda url: self.client)

    async def _worker(self) -> None:
        limiter = self.steering.limiter if self.steering is not None else None
        while not self._stop.is_set():
            if limiter is not None:
                await limiter.acquire()
            try:
                index = self._next
                self._next += 1
                row = await self._request(index, self.prompts[index % len(self.prompts)])
            finally:
                if limiter is not None:
                    limiter.release()
            self._record(row)
            if not row.ok and self.steering is not None and row.error_type != "bad_request":
                self.steering.failed()
            await asyncio.sleep(0 if row.ok else ERROR_PAUSE_WALL)  # let the watcher run

    def _record(self, row: RequestRow) -> None:
        if self._stop.is_set():
            return
        streamed = self._streamed.pop(row.index, 0)
        if self._window[0] is not None:
            self._window_tokens += streamed - self._base.pop(row.index, 0)
        self._finished += 1
        if self._window[0] is None:
            row.phase = "warmup"
            self.rows.append(row)
            if self._finished >= self.load.warmup_requests:
                self._open_window()
            return
        row.phase = "measured"
        self.rows.append(row)
        self._measured += 1
        self._measured_ok += row.ok
        if self.load.requests is not None and self._measured >= self.load.requests:
            self._close_window()

    async def _request(self, index: int, prompt: LoadPrompt) -> RequestRow:
        start = self.clock()
        row = RequestRow(index, prompt.sample_id, "", (start - self._t0) * self.scale, 0.0, False)
        try:
            if self.load.stream:
                await self._stream(row, prompt, start)
            else:
                result = await self.client.generate(_payload(prompt, self.load))
                self._fill(row, result)
        except RequestFailed as exc:
            row.error_type, row.message = exc.error_type, str(exc)[:300]
        row.e2e_s = (self.clock() - start) * self.scale
        return row

    async def _stream(self, row: RequestRow, prompt: LoadPrompt, start: float) -> None:
        first = last = None
        async for chunk in self.client.generate_stream(_payload(prompt, self.load)):
            if chunk.result is not None:
                self._fill(row, chunk.result)
                continue
            if chunk.output_ids:
                first = chunk.at if first is None else first
                last = chunk.at
                self._streamed[row.index] = len(chunk.output_ids)
        if first is not None and last is not None:
            row.ttft_s = (first - start) * self.scale
            if (row.completion_tokens or 0) > 1:
                row.itl_s = (last - first) * self.scale / (row.completion_tokens - 1)  # type: ignore[operator]

    @staticmethod
    def _fill(row: RequestRow, result: Any) -> None:
        row.ok = True
        row.prompt_tokens = result.prompt_tokens
        row.completion_tokens = result.completion_tokens
        row.cached_tokens = result.cached_tokens
        row.finish_reason = result.finish_reason

    async def _watch(self) -> None:
        """Sample the gauges, close the window at `duration`, notice a dead server."""
        interval = max(MIN_SAMPLE_WALL, self.load.sample_interval / self.scale)
        while not self._stop.is_set():
            crash = self.server_exit()
            if crash is not None:
                self._crash = crash
                self._close_window()
                return
            await self._sample()
            if self._duration_reached():
                self._close_window()
                return
            await asyncio.sleep(interval)

    def _duration_reached(self) -> bool:
        """`duration` has passed and a request finished in it (or OVERTIME x duration passed).

        Replies that all run to max_new_tokens move in cohorts: a window shorter than one
        cohort's life would see none finish and measure no latency at all.
        """
        start, duration = self._window[0], self.load.duration
        if start is None or duration is None:
            return False
        elapsed = self._now() - start
        return elapsed >= duration and (self._measured_ok > 0 or elapsed >= OVERTIME * duration)

    async def _sample(self) -> None:
        text = await self._metrics_text()
        if text is None:
            return
        try:
            snap = parse_metrics(text)
        except ValueError:
            return
        cap = self.steering.limiter.limit if self.steering is not None else None
        self.samples.append(Sample(self._now(), snap.running, snap.queued, snap.token_usage, cap))
