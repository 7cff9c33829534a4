"""Sending a plan's prompts: one run, from the open run directory to its summary.

One :class:`Runner` sends every pending prompt of a :class:`~workbench.generate.plan.Plan`
through one `SGLangClient`. It holds the pieces of a run and runs them together:

    feed          what is sent next: the queues of short and long prompts, the slots,
                  the token budgets, the requests drained at the end
    attempts      one prompt until its record is on disk or it failed for good: its
                  payload, deadline and abort, retries with backoff, context fit
    servers       the outage gate; the workers behind an sglang-router and their readings
    run_manifest  run.json while the run goes, and the session's events
    writer        every line on disk whole, held while the disk says no
    watchdog      a server that answers but makes no progress, or crawls

- Disk: every line goes through the :class:`~workbench.generate.writer.RunWriter`; a reply
  counts as done once its record is on disk. A failed write stops sending at once and holds
  the lines until space comes back (``disk_wait`` seconds at most; then the run stops and
  says which file, why and how much space is left).
- Outage: a server gone pauses every request at the outage gate
  (:mod:`workbench.generate.servers`); after ``server_wait`` seconds without an answer the
  run stops as if interrupted.
- Stop: :meth:`Runner.request_stop` (first Ctrl-C) stops sending at once (auto
  concurrency stops steering) and lets in-flight requests finish within a grace period; a
  second call cancels them. Records are appended as whole lines either way.
- run.json: written when the run opens, whenever the concurrency cap moved (its history,
  for the monitor), when something happened (its ``events``) and when the run ends (which
  budgets stopped their dataset): :mod:`workbench.generate.run_manifest`.
- Watchdog: a server that answers but generates nothing, or crawls
  (:mod:`workbench.generate.watchdog`, on the readings auto concurrency makes, or its own):
  each detection is said, added to run.json's ``events`` and passed to ``on_watchdog``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workbench import sketch
from workbench.config import Manifest
from workbench.errors import ConfigError, StorageError
from workbench.generate.attempts import Attempts
from workbench.generate.budget import BudgetProjection
from workbench.generate.concurrency import Slots
from workbench.generate.feed import Feeder, SendingDataset
from workbench.generate.gate import Gate
from workbench.generate.plan import GenerateOptions, Plan, ServerFacts, model_name
from workbench.generate.progress import DatasetProgress, RunSummary
from workbench.generate.prompts import Prompt
from workbench.generate.rendering import probe_prompt, probe_rendering
from workbench.generate.run_manifest import RunManifest
from workbench.generate.servers import Workers, server_gate
from workbench.generate.watchdog import Detection, RunCounts, Watchdog, WatchdogSettings
from workbench.generate.writer import RunWriter
from workbench.profiles import get_profile, reasoning_expected
from workbench.rundir.appender import JsonlAppender
from workbench.rundir.figures import FigureAppender, PromptFigureKeeper
from workbench.rundir.manifest import BenchmarkChoice, choose_benchmarks, read_manifest
from workbench.server.client import SGLangClient, redact_url
from workbench.tokenizer import load_tokenizer

__all__ = ["Runner"]


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
        self._workers = Workers(client)  # the servers' readings, the workers' clients
        self.slots = Slots(options.concurrency or manifest.concurrency or "auto",
                           options.long_concurrency, self._workers.read,
                           interval=options.auto_interval, on_mode=self.on_event)
        self.datasets: dict[str, SendingDataset] = {}
        self.stop_requests = 0
        self.storage_error: StorageError | None = None  # what stopped the run, if the disk did
        self.writer = RunWriter(self.on_event, options.disk_wait, self._disk_gave_up)
        self._stop = asyncio.Event()
        self.serving_gpus: int | None = None  # what the servers' /server_info say
        self._written_limit: int | None = None
        self._written_targets: list[int] = []  # the turns datasets' targets run.json holds
        self._gate: Gate | None = None
        self._prompt_figures: PromptFigureKeeper | None = None
        self._decontaminate: sketch.Decontamination | None = None  # the overlaps kept as written
        watchdog = watchdog or WatchdogSettings()  # on by default
        self._manifest = RunManifest(self.out, self.plan, self.slots, lambda: self._feeder.sent,
                                     self.on_event, watchdog if watchdog.enabled else None,
                                     on_watchdog)
        self._attempts = Attempts(client, options, self.plan, self.slots, self.writer,
                                  self._manifest, self._stop, lambda: self._feeder.wake(),
                                  self.plan.conversations)
        self._feeder = Feeder(self.datasets, self.slots, options, self._stop, self._attempts.work)
        self.watchdog = (Watchdog(watchdog, self._workers.read, self._run_counts,
                                  client.health, self._manifest.watchdog_saw)
                         if watchdog.enabled else None)
        self._workers.watchdog = self.watchdog

    # ----------------------------------------------------------------- preparation
    def load(self) -> None:
        """Load every dataset's prompts and the benchmarks (bad input fails here, before any
        server is asked)."""
        self.plan.load()
        resumed = read_manifest(self.out) if self.options.resume else {}
        self._manifest.benchmarks = choose_benchmarks(
            resumed, self.options.decontaminate, self.options.benchmark_field, self.options.ngram)
        for note in self.benchmarks.notes():
            self.on_event(note)
        if self.benchmarks.files:
            self._decontaminate = sketch.Decontamination.load(
                self.benchmarks.files, field=self.benchmarks.field, ngram=self.benchmarks.ngram,
                tokenizer=_reading_tokenizer(self.plan.manifest))

    @property
    def benchmarks(self) -> BenchmarkChoice:
        """The benchmarks looked for (chosen by :meth:`load`), as run.json records them."""
        return self._manifest.benchmarks

    @property
    def events(self) -> list[dict[str, Any]]:
        """This session's events, as run.json keeps them."""
        return self._manifest.events

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
            modes = [mode.name for mode in planned.spec.mode_list()] or [None]
            reasoning = any(reasoning_expected(profile, planned.spec.template_kwargs(mode))
                            for mode in modes)  # some mode's replies reason: split them
            figures = FigureAppender(folder.folder, profile.think_end if reasoning else None,
                                     sketch.DEFAULT_REPEAT_NGRAM,
                                     decontaminate=self._decontaminate)
            self.datasets[planned.spec.name] = SendingDataset(
                planned, JsonlAppender(folder.raw_path), JsonlAppender(folder.errors_path),
                BudgetProjection(planned.sampling.max_new_tokens), figures,
                JsonlAppender(folder.prompts_path)
                if planned.spec.turns == "each" or planned.spec.render == "server" else None)
        self._prompt_figures = PromptFigureKeeper(  # for validate, while the replies come
            [ds.planned.folder.prompts_path for ds in self.datasets.values()], self._decontaminate)
        self._manifest.server = ServerFacts(redact_url(self.client.base_url),
                                            model_name(server_info, model_info), server_info,
                                            model_info)
        self._manifest.write()

    async def probe_renderings(self) -> None:
        """For each chat dataset whose data follows the tokenizer's rendering, ask the server
        once how it renders the first prompt left and say whether the two differ
        (:mod:`workbench.generate.rendering`); kept in run.json."""
        assert self._manifest.server is not None
        for ds in self.datasets.values():
            check = ds.planned.rendering
            prompt = probe_prompt(ds.planned.pending)
            if check is None or check.follows != "tokenizer" or prompt is None:
                continue
            await probe_rendering(self.client, ds.planned.spec, prompt,
                                  self._manifest.server.model, check, self.on_event)
        self._manifest.update()

    # ----------------------------------------------------------------- running
    def request_stop(self) -> None:
        """First call: stop sending (at once: the producers waiting for a slot are cancelled,
        auto concurrency freezes), let in-flight requests finish. Second call: cancel them."""
        self.stop_requests += 1
        self._stop.set()
        self.slots.freeze()
        for producer in self._feeder.producers:
            producer.cancel()
        if self._gate is not None:
            self._gate.release()
        self.writer.release()
        if self.stop_requests >= 2:
            for task in list(self._feeder.tasks):
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

    @property
    def retries(self) -> int:
        """Attempts sent again so far."""
        return self._attempts.retries

    @property
    def dropped(self) -> int:
        """Prompts a stop cut before they were recorded or failed for good."""
        return self._attempts.dropped

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
        self._manifest.add_event(event, said=said)

    async def run(self) -> RunSummary:
        """Send every pending prompt; returns when all are done, or after a stop."""
        started = time.perf_counter()
        steering = self.slots.start()
        self._gate = self._attempts.gate = server_gate(self.client, self.on_event,
                                                       self.options.server_wait, self.request_stop)
        for ds in self.datasets.values():
            ds.progress.started = time.perf_counter()
        reporter = asyncio.create_task(self._report_loop())
        watching = asyncio.create_task(self.watchdog.run()) if self.watchdog is not None else None
        self._feeder.start()
        try:
            await self._feeder.wait_producers()
            await self._feeder.drain()
            if not self.stopping:
                await self.writer.wait()  # the last replies held: until space is back, or not
        finally:
            reporter.cancel()
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            for producer in self._feeder.producers:
                producer.cancel()
            if steering is not None:
                steering.cancel()
                await asyncio.gather(steering, return_exceptions=True)
            await self._workers.aclose()
            self._gate.release()
            await self._attempts.wait_aborts()  # the server told to stop what this run gave up on
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

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.progress_interval)
            self._emit_progress()
            targets = [ds.progress.target for ds in self.datasets.values() if ds.progress.turns]
            if self._manifest.server is not None and (self.concurrency != self._written_limit
                                                      or targets != self._written_targets):
                self._written_limit = self.concurrency
                self._written_targets = targets
                self._manifest.update()  # the concurrency's history, for the monitor; the
                # turns the conversations still ask for, for stats

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
        if self._manifest.server is not None:
            self._manifest.update()  # records which budgets stopped their dataset


def _reading_tokenizer(manifest: Manifest) -> Any:
    """The tokenizer that reads the replies' ids as words for the benchmarks: the first one
    the manifest's datasets name (as validate takes the first one run.json records)."""
    spec = next((spec for spec in manifest.datasets if spec.tokenizer), None)
    if spec is None or spec.tokenizer is None:
        raise ConfigError("--decontaminate", "the manifest names no tokenizer to read the "
                                             "replies' ids as words: set `tokenizer` in it")
    return load_tokenizer(spec.tokenizer, trust_remote_code=spec.trust_remote_code)
