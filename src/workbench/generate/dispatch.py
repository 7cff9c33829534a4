"""Sending a plan's prompts: requests in flight, retries, the outage gate, and the writer.

One :class:`Runner` sends every pending prompt of a :class:`~workbench.generate.plan.Plan`
through one `SGLangClient`:

- Slots: every request holds one of the run's slots (:class:`~workbench.generate.concurrency.Slots`:
  a fixed cap or `auto`), a request with a prompt over ``long_threshold`` tokens also one of
  the long ones. Short and long prompts are fed by two producers, so a waiting long prompt
  never stalls the pipeline, which stays full across dataset boundaries.
- Budgets: under ``max_tokens``, a request is sent only while the finished completion
  tokens plus the projected tokens of the requests in flight and of the new one fit the
  budget (:mod:`workbench.generate.budget`); when nothing is in flight and not even one
  more fits, the budget is reached. In-flight requests always finish and are kept.
- Retries: exponential backoff with jitter for retryable errors, up to ``max_attempts``;
  every failed attempt is an ``errors.jsonl`` line (a failed request is data, never a crash
  of the run). A bad request is not retried, except a refusal for length under
  ``context_fit: reduce_generation``: sent again once, at once, with ``max_new_tokens`` cut
  to fit the context (:mod:`workbench.generate.context_fit`).
- Outage: a connection failure pauses every request until the server answers ``/health``
  again (a restart, a crash), so an outage does not spend the prompts' attempts (the
  requests it cut are sent again without spending one, up to ``MAX_CONNECTION_LOSSES``
  times each; each is still an ``errors.jsonl`` line); after
  ``server_wait`` seconds without an answer the run stops as if interrupted.
- Disk: every line goes through the :class:`~workbench.generate.writer.RunWriter`; a reply
  counts as done once its record is on disk. A failed write stops sending at once and holds
  the lines until space comes back (``disk_wait`` seconds at most; then the run stops and
  says which file, why and how much space is left).
- Deadline: an attempt that has no whole reply after ``request_timeout`` seconds (however
  slowly its bytes trickle in) fails as a timeout, and the server is asked to abort it
  (``/abort_request`` with the request's ``rid``), as it is for requests cut by a stop.
- Stop: :meth:`Runner.request_stop` (first Ctrl-C) stops sending at once (auto
  concurrency stops steering) and lets in-flight requests finish within a grace period; a
  second call cancels them. Records are appended as whole lines either way.
- run.json: written when the run opens, whenever the concurrency cap moved (its history,
  for the monitor), when the watchdog noticed something (its ``events``) and when the run
  ends (which budgets stopped their dataset).
- Watchdog: a server that answers but generates nothing, or crawls
  (:mod:`workbench.generate.watchdog`, on the readings auto concurrency makes, or its own):
  each detection is said, added to run.json's ``events`` and passed to ``on_watchdog``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from workbench import sketch
from workbench.config import Manifest
from workbench.errors import (
    ConfigError,
    ConnectionLost,
    RequestFailed,
    RequestTimeout,
    StorageError,
)
from workbench.generate.budget import BudgetProjection
from workbench.generate.concurrency import ServerReading, Slots, read_servers
from workbench.generate.context_fit import context_cut
from workbench.generate.gate import Gate, Notes
from workbench.generate.plan import (
    GenerateOptions,
    Plan,
    PlannedDataset,
    ServerFacts,
    model_name,
)
from workbench.generate.progress import DatasetProgress, RunSummary
from workbench.generate.prompts import Prompt
from workbench.generate.watchdog import Detection, RunCounts, Watchdog, WatchdogSettings
from workbench.generate.writer import RunWriter
from workbench.profiles import get_profile, reasoning_expected
from workbench.rundir.figures import FigureAppender, PromptFigureKeeper
from workbench.rundir.manifest import (
    BenchmarkChoice,
    benchmarks_record,
    choose_benchmarks,
    read_manifest,
    with_events,
    with_session,
    write_manifest,
)
from workbench.rundir.records import ErrorRecord, JsonlAppender, Record
from workbench.server.client import (
    GenerateResult,
    SGLangClient,
    api_key_from_env,
    check_reply,
    redact_url,
)
from workbench.text import format_duration
from workbench.tokenizer import load_tokenizer

__all__ = ["Runner"]


def _server_gate(client: SGLangClient, say: Callable[[str], None], wait_limit: float,
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


@dataclass(slots=True)
class _Dataset:
    """A planned dataset while it is sent: its appenders and its budget's projection."""

    planned: PlannedDataset
    raw: JsonlAppender
    errors: JsonlAppender
    budget: BudgetProjection
    figures: FigureAppender  # the replies' data-quality figures, kept for validate

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


MAX_CONNECTION_LOSSES = 20  # lost connections a prompt may take without spending attempts


class Runner:
    """One generation run. Build it, :meth:`load`, :meth:`check_resume`, :meth:`open`, then
    ``await runner.run()``; :meth:`request_stop` from signal handlers."""

    def __init__(
        self,
        manifest: Manifest,
        client: SGLangClient,
        out: Path | str,
        options: GenerateOptions = GenerateOptions(),
        *,
        on_progress: Callable[[Runner], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        watchdog: WatchdogSettings | None = None,
        on_watchdog: Callable[[Detection], None] | None = None,
    ) -> None:
        self.client = client
        self.out = Path(out)
        self.options = options
        self.on_progress = on_progress
        self.on_event = on_event or (lambda message: None)
        self.plan = Plan(manifest, self.out, options, say=self.on_event)
        self.slots = Slots(options.concurrency or manifest.concurrency or "auto",
                           options.long_concurrency, self._read_servers,
                           interval=options.auto_interval, on_mode=self.on_event)
        self.datasets: dict[str, _Dataset] = {}
        self.retries = 0
        self.dropped = 0
        self.stop_requests = 0
        self.storage_error: StorageError | None = None  # what stopped the run, if the disk did
        self.writer = RunWriter(self.on_event, options.disk_wait, self._disk_gave_up)
        self._rng = random.Random(options.seed)
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers: dict[str, SGLangClient] = {}
        self.serving_gpus: int | None = None  # what the servers' /server_info say
        self._wakeups: list[asyncio.Event] = []
        self._server: ServerFacts | None = None
        self._written_limit: int | None = None
        self._gate: Gate | None = None
        self._producers: list[asyncio.Task[None]] = []
        self._aborts: set[asyncio.Task[bool]] = set()
        self._manifest_failed = False
        self._prompt_figures: PromptFigureKeeper | None = None
        self._decontaminate: sketch.Decontamination | None = None  # the overlaps kept as written
        self.benchmarks = BenchmarkChoice()  # the benchmarks looked for (load)
        self._sent = False  # a request was sent in this session
        self._session = time.time()
        self.on_watchdog = on_watchdog  # every detection (e.g. to restart a stalled server)
        self.events: list[dict[str, Any]] = []  # this session's, for run.json
        watchdog = watchdog or WatchdogSettings()  # on by default
        self.watchdog = (Watchdog(watchdog, self._read_servers, self._run_counts,
                                  client.health, self._watchdog_saw)
                         if watchdog.enabled else None)

    # ----------------------------------------------------------------- preparation
    def load(self) -> None:
        """Load every dataset's prompts and the benchmarks (bad input fails here, before any
        server is asked)."""
        self.plan.load()
        resumed = read_manifest(self.out) if self.options.resume else {}
        self.benchmarks = choose_benchmarks(resumed, self.options.decontaminate,
                                            self.options.benchmark_field, self.options.ngram)
        for note in self.benchmarks.notes():
            self.on_event(note)
        if self.benchmarks.files:
            self._decontaminate = sketch.Decontamination.load(
                self.benchmarks.files, field=self.benchmarks.field, ngram=self.benchmarks.ngram,
                tokenizer=_reading_tokenizer(self.plan.manifest))

    def check_resume(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> None:
        """ResumeMismatch when the run in `out` was made with another model or sampling."""
        self.plan.check_resume(model_name(server_info, model_info))

    def first_prompt(self) -> Prompt | None:
        return self.plan.first_prompt()

    def open(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> None:
        """Prepare the dataset folders, write run.json and open the appenders (after load)."""
        profile = get_profile(self.plan.manifest.model_profile)
        for planned in self.plan.open():
            folder = planned.folder
            reasoning = reasoning_expected(profile, planned.spec.chat_template_kwargs)
            figures = FigureAppender(folder.folder, profile.think_end if reasoning else None,
                                     sketch.DEFAULT_REPEAT_NGRAM,
                                     decontaminate=self._decontaminate)
            self.datasets[planned.spec.name] = _Dataset(
                planned, JsonlAppender(folder.raw_path), JsonlAppender(folder.errors_path),
                BudgetProjection(planned.sampling.max_new_tokens), figures)
        self._prompt_figures = PromptFigureKeeper(  # for validate, while the replies come
            [ds.planned.folder.prompts_path for ds in self.datasets.values()], self._decontaminate)
        self._server = ServerFacts(redact_url(self.client.base_url),
                                   model_name(server_info, model_info), server_info, model_info)
        self._write_manifest()

    def _write_manifest(self) -> None:
        """run.json now: this session's concurrency once it sent something (a session that
        sends nothing keeps the earlier one's), and this session's history entry."""
        assert self._server is not None
        mine = self.slots.record() if self._sent else None
        earlier = self.plan.previous.get("concurrency")
        concurrency = mine if mine is not None or not isinstance(earlier, dict) else earlier
        record = self.plan.manifest_record(self._server, concurrency or self.slots.record(),
                                           benchmarks_record(self.benchmarks))
        watchdog = self.watchdog.settings.record() if self.watchdog is not None else None
        record = with_session(record, self.plan.previous, self._session,
                              {"concurrency": mine, "watchdog": watchdog})
        write_manifest(self.out, with_events(record, self.plan.previous, self.events))

    def _update_manifest(self) -> None:
        """run.json brought up to date while running: a failed write is said (once) and
        tried again next time, never the end of the run."""
        try:
            self._write_manifest()
        except StorageError as exc:
            if not self._manifest_failed:
                self.on_event(f"{exc} (run.json is written again later)")
            self._manifest_failed = True
        else:
            self._manifest_failed = False

    # ----------------------------------------------------------------- running
    def request_stop(self) -> None:
        """First call: stop sending (at once: the producers waiting for a slot are cancelled,
        auto concurrency freezes), let in-flight requests finish. Second call: cancel them."""
        self.stop_requests += 1
        self._stop.set()
        self.slots.freeze()
        for producer in self._producers:
            producer.cancel()
        if self._gate is not None:
            self._gate.release()
        self.writer.release()
        if self.stop_requests >= 2:
            for task in list(self._tasks):
                task.cancel()

    def _disk_gave_up(self, error: StorageError) -> None:
        self.storage_error = error
        self.request_stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def concurrency(self) -> int:
        """The cap on requests in flight right now."""
        return self.slots.limit

    def concurrency_text(self) -> str:
        """`concurrency 96 (auto, metrics)` or `concurrency 150 (fixed)`."""
        return self.slots.text()

    def progress(self) -> list[DatasetProgress]:
        return [ds.progress for ds in self.datasets.values()]

    async def _read_servers(self) -> list[ServerReading] | None:
        readings = await read_servers(self.client, self._worker_client)
        if self.watchdog is not None:
            self.watchdog.offer(readings)  # one scrape for auto concurrency and the watchdog
        return readings

    def _run_counts(self) -> RunCounts:
        """The watchdog's view of the run: requests in flight, replies written, and whether
        it waits for the server or the disk."""
        progress = self.progress()
        paused = (self._gate is not None and not self._gate.is_open) or self.writer.held > 0
        return RunCounts(sum(p.in_flight for p in progress),
                         sum(p.done_this_run for p in progress), paused)

    def server_back(self) -> None:
        """The server answers again (a supervised restart is healthy): requests waiting at
        the outage gate go now, not at the gate's next probe."""
        if self._gate is not None and not self._gate.is_open:
            self._gate.release()

    def add_event(self, event: dict[str, Any], *, said: bool = False) -> None:
        """An event (``{"ts", "kind", "message", ...figures}``): said (unless it was
        already), kept in run.json's events (written now when the run is open, else when it
        opens)."""
        self.events.append(event)
        if not said:
            self.on_event(event["message"])
        if self._server is not None:
            self._update_manifest()

    def _watchdog_saw(self, detection: Detection) -> None:
        """A detection: an event, passed on to `on_watchdog`."""
        self.add_event(detection.event(time.time()))
        if self.on_watchdog is not None:
            self.on_watchdog(detection)

    def _worker_client(self, url: str) -> SGLangClient:
        if url not in self._workers:
            self._workers[url] = SGLangClient(url, api_key=api_key_from_env(), timeout=10.0)
        return self._workers[url]

    async def run(self) -> RunSummary:
        """Send every pending prompt; returns when all are done, or after a stop."""
        started = time.perf_counter()
        steering = self.slots.start()
        self._gate = _server_gate(self.client, self.on_event, self.options.server_wait,
                                  self.request_stop)
        for ds in self.datasets.values():
            ds.progress.started = time.perf_counter()
        reporter = asyncio.create_task(self._report_loop())
        watching = asyncio.create_task(self.watchdog.run()) if self.watchdog is not None else None
        self._producers = [asyncio.create_task(self._produce(long=False)),
                           asyncio.create_task(self._produce(long=True))]
        try:
            await self._wait_producers()
            await self._drain()
            if not self.stopping:
                await self.writer.wait()  # the last replies held: until space is back, or not
        finally:
            reporter.cancel()
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            for producer in self._producers:
                producer.cancel()
            if steering is not None:
                steering.cancel()
                await asyncio.gather(steering, return_exceptions=True)
            for worker in self._workers.values():
                await worker.aclose()
            self._gate.release()
            if self._aborts:  # the server told to stop what this run gave up on
                await asyncio.wait(self._aborts, timeout=5.0)
            await self.writer.aclose()
            self._close()
        self._emit_progress()
        return RunSummary(
            datasets={name: ds.progress for name, ds in self.datasets.items()},
            interrupted=self.stopping, wall_seconds=time.perf_counter() - started,
            retries=self.retries, dropped=self.dropped, unwritten=self.writer.held,
            storage_error=None if self.storage_error is None else str(self.storage_error),
            gpus=self.gpus,
        )

    @property
    def gpus(self) -> int | None:
        """The GPUs serving the run: `--gpus`, else `serving_gpus` (the servers' own count,
        set by the session); None when neither says."""
        return self.options.gpus if self.options.gpus is not None else self.serving_gpus

    async def _wait_producers(self) -> None:
        """Until both producers are done, or cancelled by a stop (an error of theirs raises)."""
        await asyncio.wait(self._producers, return_when=asyncio.FIRST_EXCEPTION)
        for producer in self._producers:
            error = producer.exception() if producer.done() and not producer.cancelled() else None
            if error is not None:
                raise error

    def _queue(self, *, long: bool) -> list[tuple[_Dataset, Prompt]]:
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

    async def _send_all(self, items: list[tuple[_Dataset, Prompt]],
                        long: bool) -> list[tuple[_Dataset, Prompt]]:
        """Send what fits; return the prompts whose dataset's budget says wait."""
        deferred: list[tuple[_Dataset, Prompt]] = []
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

    def _budget_allows(self, ds: _Dataset) -> bool:
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

    async def _send(self, ds: _Dataset, prompt: Prompt, long: bool) -> bool:
        """Start one request; False (nothing started) when the budget now says wait."""
        await self.slots.acquire(long)
        if self.stopping or ds.progress.budget_reached or not self._budget_allows(ds):
            self.slots.release(long)
            return self.stopping or ds.progress.budget_reached
        ds.progress.in_flight += 1
        self._sent = True
        ds.budget.start(prompt.sample_id, time.perf_counter())
        task = asyncio.create_task(self._work(ds, prompt, long))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _drain(self) -> None:
        """Wait for in-flight requests; after a stop, for at most the grace period."""
        stop_waiter = asyncio.create_task(self._stop.wait())
        try:
            while self._tasks and not self.stopping:
                await asyncio.wait([*self._tasks, stop_waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_waiter.cancel()
        if not self._tasks:
            return
        _done, still = await asyncio.wait(list(self._tasks), timeout=self.options.grace_period)
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)

    def _payload(self, ds: _Dataset, prompt: Prompt, attempt: int,
                 max_new_tokens: int | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sampling_params": ds.planned.sampling.to_sglang(),
            "rid": f"{ds.name}-{prompt.sample_id}-{attempt}-{self._rng.getrandbits(32):08x}",
        }
        if max_new_tokens is not None:  # cut to fit the context (context_fit)
            payload["sampling_params"]["max_new_tokens"] = max_new_tokens
        if prompt.input_ids is not None:
            payload["input_ids"] = prompt.input_ids
        else:
            payload["text"] = prompt.text
        return payload

    async def _work(self, ds: _Dataset, prompt: Prompt, long: bool) -> None:
        """Send one prompt, retrying retryable failures; holds a slot only while a request runs."""
        holding = True
        settled = False  # recorded, or failed for good; else dropped by a stop
        fitted: int | None = None  # max_new_tokens cut to fit the context (once: context_fit)
        cut: int | None = None  # the attempt before was refused for length: again, at once
        spent = lost = 0  # attempts spent; attempts lost with the connection (not spent)
        attempt, lost_last = 0, False
        try:
            while spent < self.options.max_attempts:
                attempt += 1
                if attempt > 1:
                    if cut is None and not lost_last:  # after a lost connection the gate waited
                        await self._sleep_unless_stopped(self._backoff(spent))
                    if self.stopping:
                        return
                    await self.slots.acquire(long)
                    holding = True
                assert self._gate is not None
                await self._gate.wait()
                await self.writer.wait()
                if self.stopping:
                    return
                error = await self._attempt(ds, prompt, attempt, fitted)
                if error is None:
                    settled = True
                    return
                self.slots.release(long)
                holding = False
                cut = None if fitted is not None else context_cut(
                    ds.planned.spec, ds.planned.sampling.max_new_tokens, prompt, error, self._server)
                fitted = cut or fitted
                lost_last = isinstance(error, ConnectionLost) and lost < MAX_CONNECTION_LOSSES
                if lost_last:
                    lost += 1  # the server went away (a crash, a restart): not the prompt's fault
                else:
                    spent += 1
                if (not error.retryable and cut is None) or spent == self.options.max_attempts:
                    ds.progress.failed_ids += 1
                    ds.progress.failed_samples.append(prompt.sample_id)
                    settled = True
                    return
                self.retries += 1
        finally:
            ds.progress.in_flight -= 1
            self.dropped += not settled
            ds.budget.finish(prompt.sample_id, time.perf_counter(), None)
            if holding:
                self.slots.release(long)
            for wakeup in self._wakeups:
                wakeup.set()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _attempt(self, ds: _Dataset, prompt: Prompt, attempt: int,
                       max_new_tokens: int | None = None) -> RequestFailed | None:
        payload = self._payload(ds, prompt, attempt, max_new_tokens)
        try:
            result = await self._generate(payload)
            check_reply(result, self.plan.vocab_size, self.client.base_url)
        except RequestFailed as exc:
            self._failed_attempt(ds, prompt, attempt, exc)
            return exc
        except asyncio.CancelledError:
            self._abort_later(payload["rid"])  # cut by a stop: the server stops generating it
            raise
        self._record(ds, prompt, result, max_new_tokens)
        return None

    async def _generate(self, payload: dict[str, Any]) -> GenerateResult:
        """One reply within the request timeout, counted from the request's start whatever
        the bytes do meanwhile; past it, a RequestTimeout (and the request aborted)."""
        deadline = self.options.request_timeout
        try:
            async with asyncio.timeout(deadline):
                return await self.client.generate(payload)
        except TimeoutError:
            self._abort_later(payload["rid"])
            raise RequestTimeout(f"no whole reply within the request timeout of "
                                 f"{format_duration(deadline)}", redact_url(self.client.base_url)
                                 ) from None

    def _abort_later(self, rid: str) -> None:
        """Ask the server to stop generating request `rid` (best effort, in the background)."""
        task = asyncio.get_running_loop().create_task(self.client.abort_request(rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _failed_attempt(self, ds: _Dataset, prompt: Prompt, attempt: int,
                        exc: RequestFailed) -> None:
        error = ErrorRecord(sample_id=prompt.sample_id, attempt=attempt,
                            error_type=exc.error_type, http_status=exc.http_status,
                            message=str(exc)[:1000], ts=time.time())
        self.writer.write(ds.errors, error, on_written=ds.progress.count_error)
        if isinstance(exc, ConnectionLost) and self._gate is not None:
            self._gate.close()
        elif exc.retryable:
            self.slots.failed()

    def _record(self, ds: _Dataset, prompt: Prompt, result: GenerateResult,
                reduced: int | None = None) -> None:
        """Write the reply's record (`reduced`: the max_new_tokens cut to fit the context);
        it counts as done once it is on disk. A prompt sent as ids whose reply counts other
        prompt_tokens was cut or changed by the server: counted in `prompt_mismatches`, and
        told as a `prompt_mismatch` event at the 1st, 2nd, 4th, 8th, ... one of a dataset."""
        record = Record(
            sample_id=prompt.sample_id, output_ids=result.output_ids,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens, finish_reason=result.finish_reason,
            matched_stop=result.matched_stop, e2e_latency=result.e2e_latency, ts=time.time(),
            num_retractions=(msgspec.UNSET if result.num_retractions is None
                             else result.num_retractions),
            max_new_tokens_reduced=msgspec.UNSET if reduced is None else reduced,
        )
        if prompt.input_ids is not None and result.prompt_tokens != len(prompt.input_ids):
            self._prompt_mismatch(ds, prompt.sample_id, len(prompt.input_ids),
                                  result.prompt_tokens)
        ds.budget.finish(prompt.sample_id, time.perf_counter(), result.completion_tokens)
        self.slots.finished(result.completion_tokens)
        tokens = result.completion_tokens

        def written() -> None:
            ds.progress.count_done(tokens)
            ds.figures.add(record.output_ids)

        self.writer.write(ds.raw, record, on_written=written)

    def _prompt_mismatch(self, ds: _Dataset, sample_id: int | str, sent: int,
                         counted: int) -> None:
        progress = ds.progress
        progress.prompt_mismatches += 1
        count = progress.prompt_mismatches
        if count & (count - 1):  # told at powers of two: a handful of events for any number
            return
        self.add_event({
            "ts": round(time.time(), 3), "kind": "prompt_mismatch", "dataset": progress.name,
            "message": (f"{progress.name}: prompt_tokens differ from the ids sent in {count} of "
                        f"this run's replies (sample_id {sample_id}: {sent} sent, {counted} "
                        f"counted): the server cut or changed the prompts (started with "
                        f"--allow-auto-truncate?); validate lists them (prompt_tokens_mismatch)"),
            "count": count, "sample_id": sample_id, "sent": sent, "counted": counted})

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.backoff_cap, self.options.backoff_base * 2 ** (attempt - 1))
        return base * self._rng.uniform(0.5, 1.5)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.progress_interval)
            self._emit_progress()
            if self._server is not None and self.concurrency != self._written_limit:
                self._written_limit = self.concurrency
                self._update_manifest()  # the concurrency's history, for the monitor

    def _emit_progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self)

    def _close(self) -> None:
        if self._prompt_figures is not None:
            self._prompt_figures.close()
        now = time.perf_counter()
        for ds in self.datasets.values():
            if ds.progress.finished is None and (not ds.planned.pending or ds.progress.budget_reached):
                ds.progress.finished = now
            ds.close()
        if self._server is not None:
            self._update_manifest()  # records which budgets stopped their dataset


def _reading_tokenizer(manifest: Manifest) -> Any:
    """The tokenizer that reads the replies' ids as words for the benchmarks: the first one
    the manifest's datasets name (as validate takes the first one run.json records)."""
    spec = next((spec for spec in manifest.datasets if spec.tokenizer), None)
    if spec is None or spec.tokenizer is None:
        raise ConfigError("--decontaminate", "the manifest names no tokenizer to read the "
                                             "replies' ids as words: set `tokenizer` in it")
    return load_tokenizer(spec.tokenizer, trust_remote_code=spec.trust_remote_code)
