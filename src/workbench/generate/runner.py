"""Generation: scheduling, budgets, resume, retries, the writer and progress.

One run sends every pending prompt of the chosen datasets through one `SGLangClient`:

- Concurrency: a global limit, and a lower one for prompts longer than a threshold. Short
  and long prompts are fed by two producers so a waiting long prompt never stalls the
  pipeline, which stays full across dataset boundaries. The global limit is a fixed cap
  (`concurrency: N`) or `auto` (the default), steered from the servers' `/metrics`
  (`workbench.generate.concurrency`); run.json keeps its history.
- Order: a dataset's prompts are sent in a seeded random order (`order: random`, the
  default; the seed is `order_seed` in run.json, kept on resume), or in file order
  (`order: file`). So a budget keeps a fair subset of a sorted or grouped file.
- Budgets: `max_samples` limits the prompts taken (drawn in the send order); with
  `max_tokens`, a request is sent only while the finished completion tokens plus the
  projected tokens of the requests in flight and of the new one fit the budget
  (`workbench.generate.budget`); when nothing is in flight and not even one more fits, the budget is
  reached. In-flight requests always finish and are kept.
- Resume (the default): finished `sample_id`s are skipped, failed ones retried, a torn last
  line is moved to `raw_responses.jsonl.torn`; a changed model or sampling refuses to resume.
- Retries: exponential backoff with jitter for retryable errors, up to `max_attempts`;
  every failed attempt is an `errors.jsonl` line. A bad request is not retried.
- Stop: `request_stop()` (first Ctrl-C) stops sending and lets in-flight requests finish
  within a grace period; a second call cancels them. Lines are written whole either way.
- Outage: a connection failure pauses every request until the server answers `/health`
  again (a restart, a crash), so an outage does not spend the prompts' attempts; after
  `server_wait` seconds without an answer the run stops as if interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from workbench import __version__
from workbench.analyze.stats import format_duration
from workbench.config import DatasetSpec, Manifest, Sampling
from workbench.errors import (
    BadRequest,
    ConnectionLost,
    DataError,
    ProtocolError,
    RequestFailed,
    ResumeMismatch,
)
from workbench.generate.budget import BudgetProjection
from workbench.generate.concurrency import (
    AutoConcurrency,
    Limiter,
    ServerReading,
    Steering,
    read_servers,
)
from workbench.generate.prompts import Prompt, load_prompts
from workbench.profiles import get_profile
from workbench.rundir.lock import hold_run_lock
from workbench.rundir.records import (
    ERRORS_FILE,
    MANIFEST_FILE,
    PROMPTS_FILE,
    RAW_FILE,
    ErrorRecord,
    JsonlAppender,
    PromptRecord,
    Record,
    iter_blocks,
    repair_torn_tail,
    write_atomic,
)
from workbench.server.client import (
    DEFAULT_REQUEST_TIMEOUT,
    GenerateResult,
    SGLangClient,
    api_key_from_env,
    redact_url,
)

__all__ = [
    "DatasetProgress",
    "GenerateOptions",
    "Runner",
    "RunSummary",
    "format_progress_line",
    "preflight",
    "probe_server",
    "run_generation",
]


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """Run-wide settings; the CLI flags map one to one onto these fields."""

    concurrency: int | str | None = None  # N (a cap), "auto", None: the manifest's, else auto
    long_concurrency: int = 16
    long_threshold: int = 4096
    only: tuple[str, ...] = ()
    max_samples: int | None = None
    max_tokens_per_dataset: int | None = None
    max_new_tokens: int | None = None
    resume: bool = True
    force: bool = False
    max_attempts: int = 5
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    grace_period: float = 30.0
    progress_interval: float = 5.0
    seed: int | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    preflight: bool = False
    server_wait: float = 3600.0
    auto_interval: float = 2.0  # seconds between two readings of the servers (auto)


@dataclass(slots=True)
class DatasetProgress:
    """Live counters of one dataset (previous runs included in `done` and `completion_tokens`)."""

    name: str
    target: int
    done: int = 0
    done_this_run: int = 0
    errors: int = 0
    failed_ids: int = 0
    failed_samples: list[int | str] = field(default_factory=list)  # their ids, in failing order
    in_flight: int = 0
    completion_tokens: int = 0
    tokens_this_run: int = 0
    max_tokens: int | None = None
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    budget_closed: bool = False  # nothing in flight and not even one more request fits

    @property
    def budget_reached(self) -> bool:
        if self.max_tokens is None:
            return False
        return self.budget_closed or self.completion_tokens >= self.max_tokens

    @property
    def overshoot(self) -> int:
        return max(0, self.completion_tokens - self.max_tokens) if self.max_tokens else 0

    @property
    def active(self) -> bool:
        return self.finished is None and self.in_flight + self.done_this_run > 0

    def elapsed(self, now: float | None = None) -> float:
        end = self.finished if self.finished is not None else (now or time.perf_counter())
        return max(end - self.started, 1e-9)

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left at this run's rate, by samples or by the token budget (whichever ends first)."""
        elapsed = self.elapsed(now)
        if self.done_this_run == 0:
            return None
        by_samples = max(self.target - self.done, 0) / (self.done_this_run / elapsed)
        if not self.max_tokens or self.tokens_this_run == 0:
            return by_samples
        by_tokens = max(self.max_tokens - self.completion_tokens, 0) / (self.tokens_this_run / elapsed)
        return min(by_samples, by_tokens)


@dataclass(slots=True)
class RunSummary:
    datasets: dict[str, DatasetProgress]
    interrupted: bool
    wall_seconds: float
    retries: int
    dropped: int = 0  # requests in flight when the run stopped, whose prompts a resume sends again

    @property
    def failed(self) -> int:
        return sum(p.failed_ids for p in self.datasets.values())


def format_progress_line(p: DatasetProgress, now: float | None = None) -> str:
    """`[B1_glaive] 428/10000 (0 err) 1.1 req/s avg_comp=217tok 238 tok/s ETA=2.4h`."""
    elapsed = p.elapsed(now)
    avg = p.completion_tokens / p.done if p.done else 0.0
    line = (
        f"[{p.name}] {p.done}/{p.target} ({p.errors} err) {p.done_this_run / elapsed:.1f} req/s "
        f"avg_comp={avg:.0f}tok {p.tokens_this_run / elapsed:.0f} tok/s"
    )
    if p.finished is not None or p.budget_reached:
        return line + (" budget reached" if p.budget_reached else " done")
    return line + f" ETA={format_duration(p.eta_seconds(now))}"


class _ServerGate:
    """Open while the server answers; closed by a connection failure until `/health` answers.

    One prober coroutine polls `/health` with a growing interval (0.5 s to 10 s) and reports the
    outage through `say`; after `wait_limit` seconds it calls `give_up` and opens the gate.
    """

    def __init__(self, client: SGLangClient, say: Callable[[str], None], wait_limit: float,
                 give_up: Callable[[], None]) -> None:
        self.client = client
        self.say = say
        self.wait_limit = wait_limit
        self.give_up = give_up
        self._open = asyncio.Event()
        self._open.set()
        self._prober: asyncio.Task[None] | None = None

    async def wait(self) -> None:
        await self._open.wait()

    def close(self) -> None:
        if self._open.is_set():
            self._open.clear()
            self._prober = asyncio.create_task(self._probe())

    def release(self) -> None:
        """Let every waiter go (the run is stopping) and stop probing."""
        self._open.set()
        if self._prober is not None:
            self._prober.cancel()

    async def _probe(self) -> None:
        """Silent when the server answers at once (one dropped connection); else the outage
        is reported when it starts, every minute, and when it ends."""
        started = time.perf_counter()
        if await self.client.health():
            self._open.set()
            return
        self.say(f"server unreachable at {redact_url(self.client.base_url)}: "
                 "requests paused until it answers /health")
        delay, next_note = 0.5, started + 60
        while not await self.client.health():
            waited = time.perf_counter() - started
            if waited > self.wait_limit:
                self.say(f"server unreachable for {format_duration(waited)}: "
                         "stopping (resume later)")
                self.give_up()
                self._open.set()
                return
            if time.perf_counter() >= next_note:
                self.say(f"server still unreachable after {format_duration(waited)}")
                next_note += 60
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
        self.say(f"server answers again after {format_duration(time.perf_counter() - started)}: "
                 "requests resume")
        self._open.set()


@dataclass(slots=True)
class _Dataset:
    spec: DatasetSpec
    sampling: Sampling
    prompts: list[Prompt]
    pending: list[Prompt]
    progress: DatasetProgress
    raw: JsonlAppender
    errors: JsonlAppender
    budget: BudgetProjection


def send_order(prompts: list[Prompt], order: str, seed: int, name: str) -> list[Prompt]:
    """The prompts in the order they are sent: the file's, or shuffled by `seed` and the
    dataset's name (the same order for the same seed, whatever else the run holds)."""
    ordered = list(prompts)
    if order != "file":
        random.Random(f"{seed}/{name}").shuffle(ordered)
    return ordered


def _sampling_for(manifest: Manifest, spec: DatasetSpec, options: GenerateOptions) -> Sampling:
    sampling = manifest.sampling_for(spec)
    if options.max_new_tokens is not None:
        sampling = msgspec.structs.replace(sampling, max_new_tokens=options.max_new_tokens)
    return sampling


def _limit(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _scan_done(path: Path) -> tuple[set[int | str], int]:
    """Finished sample ids and their completion tokens in an existing raw file."""
    ids: set[int | str] = set()
    tokens = 0
    if not path.exists():
        return ids, tokens
    for block in iter_blocks(path):
        for row in block.rows:
            if row.sample_id is not None and row.sample_id not in ids:
                ids.add(row.sample_id)
                tokens += row.completion_tokens or 0
    return ids, tokens


def _write_prompts(path: Path, prompts: Iterable[Prompt]) -> None:
    """The prepared prompts as sent, written whole (temp file, then rename)."""
    tmp = path.with_suffix(".jsonl.tmp")
    encoder = msgspec.json.Encoder()
    with tmp.open("wb") as fh:
        for p in prompts:
            fh.write(encoder.encode(PromptRecord(sample_id=p.sample_id, input_ids=p.input_ids, text=p.text)))
            fh.write(b"\n")
    os.replace(tmp, path)


def _set_aside(path: Path) -> Path | None:
    """Move an existing file aside (never delete it) for a run that does not resume."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    target = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
    os.replace(path, target)
    return target


class Runner:
    """One generation run. Build it, then `await runner.run()`; `request_stop()` from signals."""

    def __init__(
        self,
        manifest: Manifest,
        client: SGLangClient,
        out: Path | str,
        options: GenerateOptions = GenerateOptions(),
        *,
        on_progress: Callable[[Runner], None] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.manifest = manifest
        self.client = client
        self.out = Path(out)
        self.options = options
        self.on_progress = on_progress
        self.on_event = on_event or (lambda message: None)
        self.datasets: dict[str, _Dataset] = {}
        self.retries = 0
        self.dropped = 0
        self._rng = random.Random(options.seed)
        self._stop = asyncio.Event()
        self.stop_requests = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._global: Limiter | None = None
        self._long: asyncio.Semaphore | None = None
        self.steering: Steering | None = None
        self._workers: dict[str, SGLangClient] = {}
        self._written_limit: int | None = None
        self._wakeups: list[asyncio.Event] = []
        self._snapshot: tuple[dict[str, Any], dict[str, Any], str] | None = None
        self._loaded: list[tuple[DatasetSpec, Sampling, list[Prompt]]] = []
        self._gate: _ServerGate | None = None
        self.order_seed = 0

    # ----------------------------------------------------------------- preparation
    def selected_specs(self) -> list[DatasetSpec]:
        specs = self.manifest.datasets
        if not self.options.only:
            return list(specs)
        names = {s.name for s in specs}
        unknown = [n for n in self.options.only if n not in names]
        if unknown:
            from workbench.errors import ConfigError

            raise ConfigError("--only", f"unknown dataset {unknown[0]!r} (known: {', '.join(sorted(names))})")
        return [s for s in specs if s.name in self.options.only]

    def prepare(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> None:
        """`load`, `check_resume` then `open`: nothing is written unless every check passes."""
        self.load()
        self.check_resume(server_info, model_info)
        self.open(server_info, model_info)

    def load(self) -> None:
        """Load every dataset's prompts (bad input fails here, before any server is asked)."""
        profile = get_profile(self.manifest.model_profile)
        self._loaded = [
            (spec, _sampling_for(self.manifest, spec, self.options), self._load_dataset(spec, profile))
            for spec in self.selected_specs()
        ]

    def _load_dataset(self, spec: DatasetSpec, profile: Any) -> list[Prompt]:
        """The prompts of a dataset: with a sample cap in file order, the first ones; in
        random order, the whole file (the cap then draws from all of it)."""
        cap = _limit(spec.max_samples, self.options.max_samples)
        if spec.order == "file" or cap is None:
            return load_prompts(spec, profile, limit=cap)
        return load_prompts(msgspec.structs.replace(spec, max_samples=None), profile)

    def check_resume(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> None:
        """ResumeMismatch when the run in `out` was made with another model or sampling."""
        sampling = {spec.name: params for spec, params, _prompts in self._loaded}
        self._check_resume(_model_name(server_info, model_info), sampling)

    def first_prompt(self) -> Prompt | None:
        """The first loaded prompt (for a preflight request), if any."""
        return next((prompts[0] for _spec, _sampling, prompts in self._loaded if prompts), None)

    def open(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> None:
        """Repair torn tails, write prompts and run.json, open the appenders (after `load`)."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = f"cannot create the output directory: {exc.strerror}"
            raise DataError(self.out, reason) from None
        self.order_seed = self._choose_order_seed()
        for spec, sampling, prompts in self._loaded:
            self.datasets[spec.name] = self._open_dataset(spec, sampling, prompts)
        self._snapshot = (dict(server_info), dict(model_info), _model_name(server_info, model_info))
        self._write_manifest(*self._snapshot)

    def _open_dataset(self, spec: DatasetSpec, sampling: Sampling, prompts: list[Prompt]) -> _Dataset:
        folder = self.out / spec.name
        folder.mkdir(parents=True, exist_ok=True)
        raw_path = folder / RAW_FILE
        if not self.options.resume:
            for name in (RAW_FILE, ERRORS_FILE):
                moved = _set_aside(folder / name)
                if moved:
                    self.on_event(f"[{spec.name}] --no-resume: moved {name} to {moved.name}")
        torn = repair_torn_tail(raw_path) if raw_path.exists() else 0
        if torn:
            self.on_event(f"[{spec.name}] moved a torn last line ({torn} bytes) to {RAW_FILE}.torn")
        done_ids, done_tokens = _scan_done(raw_path)
        prompts, pending = self._draw(spec, prompts, done_ids)
        _write_prompts(folder / PROMPTS_FILE, prompts)
        budget = _limit(spec.max_tokens, self.options.max_tokens_per_dataset)
        done = sum(1 for p in prompts if p.sample_id in done_ids)
        progress = DatasetProgress(name=spec.name, target=len(prompts), max_tokens=budget,
                                   done=done, completion_tokens=done_tokens)
        return _Dataset(spec, sampling, prompts, pending, progress, JsonlAppender(raw_path),
                        JsonlAppender(folder / ERRORS_FILE), BudgetProjection(sampling.max_new_tokens))

    def _draw(self, spec: DatasetSpec, prompts: list[Prompt],
              done_ids: set[int | str]) -> tuple[list[Prompt], list[Prompt]]:
        """(the dataset's prompts of this run in file order, those still to send in send
        order): a sample cap keeps the first ones of the send order, plus any finished
        before (a resumed run keeps what it has)."""
        ordered = send_order(prompts, spec.order or "random", self.order_seed, spec.name)
        cap = _limit(spec.max_samples, self.options.max_samples)
        if cap is None or cap >= len(prompts):
            return prompts, [p for p in ordered if p.sample_id not in done_ids]
        kept = {p.sample_id for p in ordered[:cap]} | done_ids
        done = sum(1 for p in prompts if p.sample_id in done_ids)
        pending = [p for p in ordered if p.sample_id in kept and p.sample_id not in done_ids]
        return [p for p in prompts if p.sample_id in kept], pending[:max(0, cap - done)]

    def _choose_order_seed(self) -> int:
        """The previous run's seed on resume (the same order, the same subset), else
        `options.seed`, else a fresh one."""
        previous = self._previous_manifest() if self.options.resume else {}
        seed = previous.get("order_seed")
        if isinstance(seed, int):
            return seed
        return self.options.seed if self.options.seed is not None else random.SystemRandom().randrange(2**31)

    def _previous_manifest(self) -> dict[str, Any]:
        try:
            data = json.loads((self.out / MANIFEST_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _check_resume(self, model: str, sampling: Mapping[str, Sampling]) -> None:
        path = self.out / MANIFEST_FILE
        if not self.options.resume or self.options.force or not path.exists():
            return
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        old_model = previous.get("model")
        if old_model and old_model != model:
            raise ResumeMismatch(
                f"{path}: the run was made with model {old_model!r}, the server now serves {model!r} "
                "(use --force to resume anyway, or another --out)")
        for name, params in sampling.items():
            old = previous.get("datasets", {}).get(name, {}).get("sampling")
            if old is not None and old != msgspec.to_builtins(params):
                raise ResumeMismatch(
                    f"{path}: datasets.{name}.sampling changed from {old} to {msgspec.to_builtins(params)} "
                    "(use --force to resume anyway, or another --out)")

    def _write_manifest(self, server_info: Mapping[str, Any], model_info: Mapping[str, Any], model: str) -> None:
        path = self.out / MANIFEST_FILE
        previous = self._previous_manifest()
        datasets = dict(previous.get("datasets", {}))
        for name, ds in self.datasets.items():
            datasets[name] = {
                "path": ds.spec.path, "input": ds.spec.input, "prompts": len(ds.prompts),
                "max_samples": _limit(ds.spec.max_samples, self.options.max_samples),
                "max_tokens": ds.progress.max_tokens,
                "sampling": msgspec.to_builtins(ds.sampling),
                "id_field": ds.spec.id_field,
                "tokenizer": ds.spec.tokenizer,
                "chat_template_kwargs": dict(ds.spec.chat_template_kwargs),
                "budget_reached": ds.progress.budget_reached,
                "order": ds.spec.order or "random",
            }
        manifest = {
            "workbench_version": __version__,
            "created": previous.get("created", time.time()),
            "updated": time.time(),
            "server_url": redact_url(self.client.base_url),
            "model": model,
            "model_profile": self.manifest.model_profile,
            "manifest_file": str(Path(self.manifest.source).resolve()),
            "server_info": dict(server_info),
            "model_info": dict(model_info),
            "options": dataclasses.asdict(self.options),
            "order_seed": self.order_seed,
            "concurrency": self.concurrency_record(),
            "datasets": datasets,
        }
        write_atomic(path, (json.dumps(manifest, indent=2, default=str) + "\n").encode())

    # ----------------------------------------------------------------- running
    def request_stop(self) -> None:
        """First call: stop sending, let in-flight requests finish. Second call: cancel them."""
        self.stop_requests += 1
        self._stop.set()
        if self._gate is not None:
            self._gate.release()
        if self.stop_requests >= 2:
            for task in list(self._tasks):
                task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def concurrency_setting(self) -> int | str:
        """`--concurrency`, else the manifest's `concurrency`, else "auto"."""
        return self.options.concurrency or self.manifest.concurrency or "auto"

    @property
    def concurrency(self) -> int:
        """The cap on requests in flight right now."""
        if self._global is not None:
            return self._global.limit
        setting = self.concurrency_setting
        return setting if isinstance(setting, int) else AutoConcurrency().limit

    def concurrency_text(self) -> str:
        """`concurrency 96 (auto, metrics)` or `concurrency 150 (fixed)`."""
        if self.steering is None:
            return f"concurrency {self.concurrency} (fixed)"
        return f"concurrency {self.concurrency} (auto, {self.steering.auto.mode})"

    def concurrency_record(self) -> dict[str, Any]:
        """run.json's `concurrency`: the setting, mode, cap now and the cap's history."""
        auto = self.steering.auto if self.steering is not None else None
        return {"setting": self.concurrency_setting, "mode": auto.mode if auto else "fixed",
                "current": self.concurrency,
                "history": [list(point) for point in auto.history[-500:]] if auto else []}

    def _start_concurrency(self) -> asyncio.Task[None] | None:
        setting = self.concurrency_setting
        if isinstance(setting, int):
            self._global = Limiter(setting)
            return None
        auto = AutoConcurrency()
        self._global = Limiter(auto.limit)
        self.steering = Steering(self._global, auto, self._read_servers,
                                 interval=self.options.auto_interval, on_mode=self.on_event)
        return asyncio.create_task(self.steering.run())

    async def _read_servers(self) -> list[ServerReading] | None:
        return await read_servers(self.client, self._worker_client)

    def _worker_client(self, url: str) -> SGLangClient:
        if url not in self._workers:
            self._workers[url] = SGLangClient(url, api_key=api_key_from_env(), timeout=10.0)
        return self._workers[url]

    async def run(self) -> RunSummary:
        """Send every pending prompt; returns when all are done, or after a stop."""
        started = time.perf_counter()
        steering = self._start_concurrency()
        long_cap = self.options.long_concurrency
        setting = self.concurrency_setting
        self._long = asyncio.Semaphore(max(1, min(long_cap, setting) if isinstance(setting, int) else long_cap))
        self._gate = _ServerGate(self.client, self.on_event, self.options.server_wait,
                                 self.request_stop)
        for ds in self.datasets.values():
            ds.progress.started = time.perf_counter()
        reporter = asyncio.create_task(self._report_loop())
        try:
            await asyncio.gather(self._produce(long=False), self._produce(long=True))
            await self._drain()
        finally:
            reporter.cancel()
            if steering is not None:
                steering.cancel()
                await asyncio.gather(steering, return_exceptions=True)
            for worker in self._workers.values():
                await worker.aclose()
            self._gate.release()
            self._close()
        self._emit_progress()
        return RunSummary(
            datasets={name: ds.progress for name, ds in self.datasets.items()},
            interrupted=self.stopping, wall_seconds=time.perf_counter() - started, retries=self.retries,
            dropped=self.dropped,
        )

    def _queue(self, *, long: bool) -> list[tuple[_Dataset, Prompt]]:
        threshold = self.options.long_threshold
        return [
            (ds, p) for ds in self.datasets.values() for p in ds.pending
            if (p.prompt_tokens > threshold) == long
        ]

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

    async def _send_all(self, items: list[tuple[_Dataset, Prompt]], long: bool) -> list[tuple[_Dataset, Prompt]]:
        """Send what fits; return the prompts whose dataset's budget says wait."""
        deferred: list[tuple[_Dataset, Prompt]] = []
        gated: set[str] = set()
        for ds, prompt in items:
            if self.stopping:
                break
            if ds.progress.budget_reached:
                continue
            if ds.spec.name in gated or not self._budget_allows(ds) or not await self._send(ds, prompt, long):
                gated.add(ds.spec.name)
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
        await self._acquire(long)
        if self.stopping or ds.progress.budget_reached or not self._budget_allows(ds):
            self._release(long)
            return self.stopping or ds.progress.budget_reached
        ds.progress.in_flight += 1
        ds.budget.start(prompt.sample_id, time.perf_counter())
        task = asyncio.create_task(self._work(ds, prompt, long))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _release(self, long: bool) -> None:
        assert self._global is not None and self._long is not None
        self._global.release()
        if long:
            self._long.release()

    async def _acquire(self, long: bool) -> None:
        assert self._global is not None and self._long is not None
        if long:
            await self._long.acquire()
        await self._global.acquire()

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

    def _payload(self, ds: _Dataset, prompt: Prompt, attempt: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "sampling_params": ds.sampling.to_sglang(),
            "rid": f"{ds.spec.name}-{prompt.sample_id}-{attempt}-{self._rng.getrandbits(32):08x}",
        }
        if prompt.input_ids is not None:
            payload["input_ids"] = prompt.input_ids
        else:
            payload["text"] = prompt.text
        return payload

    async def _work(self, ds: _Dataset, prompt: Prompt, long: bool) -> None:
        """Send one prompt, retrying retryable failures; holds a slot only while a request runs."""
        holding = True
        settled = False  # recorded, or failed for good; else dropped by a stop
        try:
            for attempt in range(1, self.options.max_attempts + 1):
                if attempt > 1:
                    await self._sleep_unless_stopped(self._backoff(attempt - 1))
                    if self.stopping:
                        return
                    await self._acquire(long)
                    holding = True
                assert self._gate is not None
                await self._gate.wait()
                if self.stopping:
                    return
                error = await self._attempt(ds, prompt, attempt)
                if error is None:
                    settled = True
                    return
                self._release(long)
                holding = False
                if not error.retryable or attempt == self.options.max_attempts:
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
                self._release(long)
            for wakeup in self._wakeups:
                wakeup.set()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _attempt(self, ds: _Dataset, prompt: Prompt, attempt: int) -> RequestFailed | None:
        try:
            result = await self.client.generate(self._payload(ds, prompt, attempt))
        except RequestFailed as exc:
            ds.progress.errors += 1
            ds.errors.append(ErrorRecord(
                sample_id=prompt.sample_id, attempt=attempt, error_type=exc.error_type,
                http_status=exc.http_status, message=str(exc)[:1000], ts=time.time(),
            ))
            if isinstance(exc, ConnectionLost) and self._gate is not None:
                self._gate.close()
            elif exc.retryable and self.steering is not None:
                self.steering.failed()
            return exc
        self._record(ds, prompt, result)
        return None

    def _record(self, ds: _Dataset, prompt: Prompt, result: GenerateResult) -> None:
        ds.raw.append(Record(
            sample_id=prompt.sample_id, output_ids=result.output_ids,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens, finish_reason=result.finish_reason,
            matched_stop=result.matched_stop, e2e_latency=result.e2e_latency, ts=time.time(),
            num_retractions=(msgspec.UNSET if result.num_retractions is None
                             else result.num_retractions),
        ))
        ds.budget.finish(prompt.sample_id, time.perf_counter(), result.completion_tokens)
        if self.steering is not None:
            self.steering.finished(result.completion_tokens)
        p = ds.progress
        p.done += 1
        p.done_this_run += 1
        p.completion_tokens += result.completion_tokens
        p.tokens_this_run += result.completion_tokens
        if p.done >= p.target:
            p.finished = time.perf_counter()

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.backoff_cap, self.options.backoff_base * 2 ** (attempt - 1))
        return base * self._rng.uniform(0.5, 1.5)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.progress_interval)
            self._emit_progress()
            if self._snapshot is not None and self.concurrency != self._written_limit:
                self._written_limit = self.concurrency
                self._write_manifest(*self._snapshot)  # the concurrency's history, for the monitor

    def _emit_progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self)

    def _close(self) -> None:
        now = time.perf_counter()
        for ds in self.datasets.values():
            if ds.progress.finished is None and (not ds.pending or ds.progress.budget_reached):
                ds.progress.finished = now
            ds.raw.close()
            ds.errors.close()
        if self._snapshot is not None:
            self._write_manifest(*self._snapshot)  # records which budgets stopped their dataset

    def progress(self) -> list[DatasetProgress]:
        return [ds.progress for ds in self.datasets.values()]


def _model_name(server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> str:
    return str(model_info.get("model_path") or server_info.get("model_path") or "unknown")


async def preflight(client: SGLangClient, prompt: Prompt, *, attempts: int = 3) -> None:
    """One request of one token built from `prompt`, before anything is written.

    A reply that is not SGLang's shape (ProtocolError) or a refused request (BadRequest: 401,
    404, ...) raises: every request of the run would fail the same way. Retryable failures
    are tried `attempts` times, then left to the run's own retries.
    """
    payload: dict[str, Any] = {
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "rid": f"workbench-preflight-{random.getrandbits(64):016x}",
    }
    if prompt.input_ids is not None:
        payload["input_ids"] = prompt.input_ids[:1]
    else:
        payload["text"] = (prompt.text or " ")[:64]
    for attempt in range(attempts):
        try:
            await client.generate(payload)
            return
        except (BadRequest, ProtocolError):
            raise
        except RequestFailed:
            await asyncio.sleep(0.5 * 2**attempt)


async def probe_server(client: SGLangClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """`/server_info` and `/model_info` snapshots; an unreachable server raises ServerUnreachable."""
    server_info = await client.server_info()
    try:
        model_info = await client.model_info()
    except RequestFailed:
        model_info = {}
    return server_info, model_info


async def run_generation(
    manifest: Manifest,
    client: SGLangClient,
    out: Path | str,
    options: GenerateOptions = GenerateOptions(),
    *,
    on_start: Callable[[Runner], None] | None = None,
    on_progress: Callable[[Runner], None] | None = None,
    on_event: Callable[[str], None] | None = None,
) -> RunSummary:
    """Load the prompts, probe the server, prepare the output directory and run; the one call
    the CLI and notebooks use.

    `on_start` receives the prepared runner (e.g. to install signal handlers calling
    `runner.request_stop`).
    """
    runner = Runner(manifest, client, out, options, on_progress=on_progress, on_event=on_event)
    runner.load()
    server_info, model_info = await probe_server(client)
    runner.check_resume(server_info, model_info)
    first = runner.first_prompt()
    if options.preflight and first is not None:
        await preflight(client, first)
    Path(out).mkdir(parents=True, exist_ok=True)
    with hold_run_lock(out):  # held while writing: a second writer is refused, the monitor sees it
        runner.open(server_info, model_info)
        if on_start is not None:
            on_start(runner)
        return await runner.run()
