"""The simulated server's state: engines per data-parallel rank, metrics, faults, jobs.

Prompts go to the ranks round robin, as SGLang's data-parallel controller sends them; the
server plans each sequence's output (a tool call for a share of the prompts that declare
tools: `workbench.sim.tools`) and queues it (`start_job`). Its other parts:

    loops          one `workbench.sim.engine.EngineLoop` per data-parallel rank
    jobs           `workbench.sim.aborts.LiveJobs`: unfinished jobs by rid, aborts
    info           `workbench.sim.info.ServerInfo`: /server_info, /model_info, /v1/models
    reply_options  settings of `workbench.sim.replies`, which shapes every /generate reply

Fault state lives here too: the per-request draws (`faults`), the prompt truncations
(`truncations`, applied to every sequence but health checks as it is queued) and the timed
faults (`timed`: stall and decay act through the engine loops; `exit_when_due` is the task
that ends the process through `exit_process`, `os._exit` unless a test replaces it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from workbench.profiles import get_profile
from workbench.sim.aborts import LiveJobs
from workbench.sim.cache import block_hashes
from workbench.sim.completion import complete, reasoning_length
from workbench.sim.config import SimConfig
from workbench.sim.drift import DriftSettings, diverge, flip_at
from workbench.sim.engine import Engine, EngineLoop
from workbench.sim.faults import FaultPlan, TimedFaults, TruncationPlan
from workbench.sim.info import ServerInfo
from workbench.sim.job import Job
from workbench.sim.metrics import SimMetrics
from workbench.sim.outputs import output_seed, plan_output, prompt_thinks
from workbench.sim.profiles import get_sim_profile, plan_sizing, step_seconds
from workbench.sim.protocol import GenerateItem, Limits
from workbench.sim.replies import ReplyOptions, abort_reply, fixed_reply, generate_reply
from workbench.sim.request import Request
from workbench.sim.tools import plan_call

__all__ = ["EXIT_MESSAGE", "SimServer"]

EXIT_MESSAGE = "Injected fault: the server process exits with status 1 (--fault-exit-after {0:g})"
EXIT_STATUS = 1


class SimServer:
    """Everything the HTTP layer needs; raises OutOfMemory when the configuration cannot start."""

    def __init__(
        self,
        config: SimConfig,
        *,
        log: Callable[[str], None] | None = None,
        exit_process: Callable[[int], object] = os._exit,
    ) -> None:
        self.config = config
        self.log = log
        self.exit_process = exit_process
        self.profile = get_sim_profile(config.profile)
        self.model = get_profile(config.model_profile)
        self.mem_fraction_static = (
            config.mem_fraction_static or self.profile.default_mem_fraction_static
        )
        self.tp_size = config.tp_size or self.profile.default_tp_size
        self.tool_call_rate = (
            self.profile.output.tool_call_rate
            if config.tool_call_rate is None
            else config.tool_call_rate
        )
        self.sizing = plan_sizing(
            self.profile,
            mem_fraction_static=self.mem_fraction_static,
            kv_cache_dtype=config.kv_cache_dtype,
            tp_size=self.tp_size,
            enable_hierarchical_cache=config.enable_hierarchical_cache,
            hicache_size_gb=config.hicache_size,
            hicache_ratio=config.hicache_ratio,
            max_running_requests=config.max_running_requests,
            chunked_prefill_size=config.chunked_prefill_size,
            max_total_tokens=config.max_total_tokens,
        )
        self._warn_pool_cap(log)
        self.limits = Limits(
            self.model.vocab_size,
            self.sizing.max_req_input_len,
            self.sizing.context_length,
            allow_auto_truncate=config.allow_auto_truncate,
            warn=log,
        )
        self.metrics = SimMetrics(config.model_path)
        self.metrics.emit_constants(self.sizing.max_total_num_tokens)
        self.faults = FaultPlan(
            error=config.fault_error_rate,
            drop=config.fault_drop_rate,
            hang=config.fault_hang_rate,
            abort=config.fault_abort_rate,
            seed=config.fault_seed,
        )
        self.truncations = TruncationPlan(rate=config.fault_truncate_rate, seed=config.fault_seed)
        self.timed = TimedFaults(
            speed=config.speed,
            stall_after=config.fault_stall_after,
            stall_for=config.fault_stall_for,
            decay_after=config.fault_decay_after,
            decay_factor=config.fault_decay_factor,
            exit_after=config.fault_exit_after,
        )
        self.loops = [
            EngineLoop(self._engine(rank, log), config.speed, faults=self.timed)
            for rank in range(config.dp_size)
        ]
        self.metrics.engines = self.engines
        self.info = ServerInfo(
            config,
            self.profile,
            self.model,
            self.sizing,
            self.engines,
            mem_fraction_static=self.mem_fraction_static,
            tp_size=self.tp_size,
        )
        self.drift = DriftSettings(
            fp8=self.sizing.kv_cache_dtype.startswith("fp8"),
            deterministic=config.enable_deterministic_inference,
            corrupt_rate=config.fault_hicache_corrupt_rate,
            fault_seed=config.fault_seed,
        )
        self.reply_options = ReplyOptions(
            self.model,
            config.enable_metrics,
            config.enable_hierarchical_cache,
            config.dp_size > 1,
            logprob_noise=self.profile.fidelity.fp8_logprob_noise if self.drift.fp8 else 0.0,
        )
        self._ranks = itertools.cycle(enumerate(self.loops))
        self.jobs = LiveJobs(self.loops, self.metrics)

    def _warn_pool_cap(self, log: Callable[[str], None] | None) -> None:
        """SGLang's warning when --max-total-tokens asks for more than the memory holds."""
        asked = self.config.max_total_tokens
        if log is not None and asked is not None and asked > self.sizing.max_total_num_tokens:
            log(
                f"max_total_tokens={asked} is larger than the profiled value "
                f"{self.sizing.max_total_num_tokens}. Use the profiled value instead."
            )

    def _engine(self, rank: int, log: Callable[[str], None] | None) -> Engine:
        if log is not None and self.config.dp_size > 1:
            log = partial(_tagged, log, f"[DP{rank}] ")
        return Engine(
            self.sizing,
            partial(step_seconds, self.profile, self.sizing.kv_cache_dtype,
                    deterministic=self.config.enable_deterministic_inference),
            observer=self.metrics,
            log=log,
            log_interval=self.config.decode_log_interval,
            prefix_cache=not self.config.disable_radix_cache,
            step_factor=self.timed.step_factor,
        )

    @property
    def engines(self) -> list[Engine]:
        return [loop.engine for loop in self.loops]

    @property
    def busy(self) -> bool:
        return any(engine.has_work for engine in self.engines)

    def start_job(
        self,
        item: GenerateItem,
        *,
        stream: bool,
        on_update: Callable[[], None],
        health: bool = False,
    ) -> Job:
        """Plan the sequence's output and queue it on the next rank (`health`: a health check,
        left out of the metrics and the truncation fault)."""
        if not health:
            item = self.truncated(item)
        sampling = item.sampling
        seed = output_seed(
            self.config.random_seed,
            item.prompt,
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            0 if sampling.greedy else item.sample,
        )
        rank, loop = next(self._ranks)
        hashes = block_hashes(item.input_ids)
        call = plan_call(self.model, item.prompt, seed, self.tool_call_rate)
        plan = plan_output(self.model, self.profile.output, seed, sampling.max_new_tokens, call,
                           thinking=prompt_thinks(self.model, item.prompt))
        completion = complete(plan, sampling, self.model, seed)
        if sampling.greedy and not health:
            completion = completion._replace(
                output_ids=self._drifted(completion.output_ids, seed, loop.engine, hashes))
        request = Request(
            len(item.input_ids),
            completion.output_ids,
            sampling.max_new_tokens,
            hashes=hashes,
            stream=stream,
            health=health,
        )
        job = Job(item, completion, request, loop.engine, rank)
        job.reasoning_length = reasoning_length(completion.output_ids, self.model)
        request.on_update = partial(self.jobs.updated, job, on_update)
        if not health:
            self.jobs.add(job)
        loop.submit(request)
        return job

    def _drifted(self, ids: list[int], seed: int, engine: Engine, hashes: list[int]) -> list[int]:
        """A greedy reply's ids as this server's numerics leave them (`workbench.sim.drift`)."""
        batch = len(engine.running) + len(engine.waiting)
        host_hit = self.config.enable_hierarchical_cache and engine.cache.reads_host(hashes)
        at = flip_at(self.profile.fidelity, self.drift, seed, batch=batch, host_hit=host_hit)
        return ids if at is None else diverge(ids, at, self.model, seed)

    def truncated(self, item: GenerateItem) -> GenerateItem:
        """The sequence as the truncation fault leaves it: its first half, when drawn."""
        kept = self.truncations.cut(item.input_ids)
        if kept is None:
            return item
        return item._replace(prompt=kept, input_ids=kept)

    def output_since(self, moment: float) -> bool:
        """Whether any rank published output after `moment` (time.perf_counter)."""
        return any(engine.last_output_at > moment for engine in self.engines)

    def cancel(self, job: Job) -> None:
        """Abort a job whose client went away (the tokenizer manager's abort, counted)."""
        self.jobs.cancel(job)

    def abort_request(self, rid: str, *, abort_all: bool = False) -> int:
        """POST /abort_request (`LiveJobs.abort_request`); returns how many it aborted."""
        return self.jobs.abort_request(rid, abort_all=abort_all)

    async def exit_when_due(self) -> None:
        """The --fault-exit-after crash: at its time, one log line, then `exit_process(1)`
        (no graceful shutdown: nothing after it runs in a real process)."""
        delay = self.timed.exit_in()
        if delay is None:
            return
        await asyncio.sleep(delay)
        if self.log is not None:
            self.log(EXIT_MESSAGE.format(self.config.fault_exit_after))
        self.exit_process(EXIT_STATUS)

    def job_reply(self, job: Job, e2e_latency: float | None = None) -> dict[str, Any]:
        """The job's reply as published so far; `e2e_latency` only on the final one."""
        return generate_reply(job, self.reply_options, e2e_latency)

    def fixed_reply(self, item: GenerateItem, e2e_latency: float) -> dict[str, Any]:
        """The fixed-latency mode's reply (the truncation fault applies)."""
        return fixed_reply(self.truncated(item), self.model, e2e_latency)

    def abort_reply(self, item: GenerateItem, e2e_latency: float) -> dict[str, Any]:
        """The reply of a request aborted by an injected fault (SGLang's abort: 503)."""
        return abort_reply(item, self.model, e2e_latency)

    def flush_cache(self) -> bool:
        """Empty every rank's prefix cache; refused while any request runs or waits."""
        if self.busy:
            return False
        return all(engine.flush_cache() for engine in self.engines)

    async def close(self) -> None:
        """Stop the engine loops."""
        for loop in self.loops:
            await loop.close()

    @property
    def served_model_name(self) -> str:
        return self.info.served_model_name

    @property
    def tokenizer_path(self) -> str | None:
        """--tokenizer-path, else the model profile's local tokenizer (one that loads)."""
        return self.info.tokenizer_path

    def server_args(self) -> dict[str, Any]:
        """The server arguments as SGLang reports them: derived values filled, no API key."""
        return self.info.server_args()

    def server_info(self) -> dict[str, Any]:
        """GET /server_info."""
        return self.info.server_info()

    def model_info(self) -> dict[str, Any]:
        """GET /model_info."""
        return self.info.model_info()

    def models(self) -> dict[str, Any]:
        """GET /v1/models."""
        return self.info.models()


def _tagged(log: Callable[[str], None], tag: str, line: str) -> None:
    log(tag + line)
