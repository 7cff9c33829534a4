"""The simulated server's state: engines per data-parallel rank, metrics, faults, info replies.

Prompts go to the ranks round robin, as SGLang's data-parallel controller sends them. The
server knows its unfinished jobs by rid, as the tokenizer manager's `rid_to_state`, for
POST /abort_request (`abort_request`): an unknown or empty rid is ignored; a known one aborts,
on every rank, each request whose rid starts with it (the scheduler matches by prefix); and
`abort_all` aborts everything. While a stall fault holds the scheduler, aborts wait for its end.

Fault state lives here too: the per-request draws (`faults`), the prompt truncations
(`truncations`, applied to every sequence but health checks as it is queued) and the timed
faults (`timed`: stall and decay act through the engine loops; `exit_when_due` is the task
that ends the process through `exit_process`, `os._exit` unless a test replaces it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shlex
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from workbench.errors import InputError
from workbench.profiles import get_profile
from workbench.resources import data_dir
from workbench.sim.cache import block_hashes
from workbench.sim.completion import complete, reasoning_length
from workbench.sim.config import SimConfig
from workbench.sim.drift import DriftSettings, diverge, flip_at
from workbench.sim.engine import Engine, EngineLoop, Request
from workbench.sim.faults import FaultPlan, TimedFaults, TruncationPlan
from workbench.sim.job import Job
from workbench.sim.metrics import SimMetrics
from workbench.sim.outputs import (
    fixed_output,
    output_seed,
    plan_output,
    render_text,
)
from workbench.sim.profiles import GB, get_sim_profile, plan_sizing, step_seconds
from workbench.sim.protocol import GenerateItem, Limits, abort_reason
from workbench.sim.replies import ReplyOptions, generate_reply

__all__ = ["CLIENT_GONE_MESSAGE", "EXIT_MESSAGE", "FAULT_ABORT_MESSAGE", "VERSION", "SimServer"]

VERSION = "0.5.23"  # the SGLang release whose API the simulator follows
FAULT_ABORT_MESSAGE = "Abort request: injected fault"
CLIENT_GONE_MESSAGE = "Abort request: the client disconnected"
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
        self.created = int(time.time())
        self.startup_time = time.time()
        self.launch_command = shlex.join(_without_api_key(sys.argv))
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
        self._live: set[Job] = set()  # unfinished jobs, health checks left out

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
        plan = plan_output(self.model, self.profile.output, seed, sampling.max_new_tokens)
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
        request.on_update = partial(self._updated, job, on_update)
        if not health:
            self._live.add(job)
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

    def _updated(self, job: Job, on_update: Callable[[], None]) -> None:
        """A job's request published: forget it once done, then tell its waiter."""
        if job.request.done:
            self._live.discard(job)
        on_update()

    def output_since(self, moment: float) -> bool:
        """Whether any rank published output after `moment` (time.perf_counter)."""
        return any(engine.last_output_at > moment for engine in self.engines)

    def cancel(self, job: Job) -> None:
        """Abort a job whose client went away (the tokenizer manager's abort, counted)."""
        self._live.discard(job)
        if job.engine.cancel(job.request, CLIENT_GONE_MESSAGE):
            self.metrics.abort_sent()

    def abort_request(self, rid: str, *, abort_all: bool = False) -> int:
        """POST /abort_request (tokenizer_manager `abort_request`, scheduler `abort_request`);
        returns how many requests it aborted. Waiting ones are answered at once, running
        ones at the next step; during a stall the abort waits for its end (and counts 0)."""
        if not abort_all and not self._knows(rid):
            return 0
        self.metrics.abort_sent()
        if abort_all:
            matches: Callable[[Request], bool] = _everything
        else:
            matches = {job.request for job in self._live if job.item.rid.startswith(rid)}.__contains__
        aborted = 0

        def run(engine: Engine) -> None:
            nonlocal aborted
            aborted += engine.abort(matches)

        for loop in self.loops:
            loop.when_running(partial(run, loop.engine))
        return aborted

    def _knows(self, rid: str) -> bool:
        """Whether `rid` names an unfinished request (an empty one never does)."""
        return bool(rid) and any(job.item.rid == rid for job in self._live)

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
        item = self.truncated(item)
        plan = fixed_output(self.model, item.max_new_tokens)
        finish: dict[str, Any] = (
            {"type": "stop", "matched": plan.matched}
            if plan.finish == "stop"
            else {"type": "length", "length": item.max_new_tokens}
        )
        return self._plain_reply(item, plan.output_ids, finish, e2e_latency)

    def abort_reply(self, item: GenerateItem, e2e_latency: float) -> dict[str, Any]:
        """The reply of a request aborted by an injected fault (SGLang's abort: 503)."""
        return self._plain_reply(item, [], abort_reason(FAULT_ABORT_MESSAGE), e2e_latency)

    def _plain_reply(
        self, item: GenerateItem, ids: list[int], finish: dict[str, Any], e2e_latency: float
    ) -> dict[str, Any]:
        return {
            "text": render_text(ids, self.model),
            "output_ids": ids,
            "meta_info": {
                "id": item.rid,
                "finish_reason": finish,
                "prompt_tokens": len(item.input_ids),
                "weight_version": "default",
                "num_retractions": 0,
                "reasoning_tokens": 0,
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "e2e_latency": e2e_latency,
            },
        }

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
        return self.config.served_model_name or self.config.model_path

    @property
    def tokenizer_path(self) -> str | None:
        """--tokenizer-path, else the model profile's local tokenizer (one that loads)."""
        return self.config.tokenizer_path or local_tokenizer_path(self.model.name)

    def server_args(self) -> dict[str, Any]:
        """The server arguments as SGLang reports them: derived values filled, no API key."""
        args = msgspec.structs.asdict(self.config)
        del args["api_key"]
        args.update(
            mem_fraction_static=self.mem_fraction_static,
            tp_size=self.tp_size,
            max_running_requests=self.sizing.max_running_requests,
            chunked_prefill_size=self.config.chunked_prefill_size
            or self.sizing.chunked_prefill_size,
            context_length=self.sizing.context_length,
            tokenizer_path=self.tokenizer_path,
            served_model_name=self.served_model_name,
        )
        return args

    def server_info(self) -> dict[str, Any]:
        """GET /server_info: http_server `server_info` (resolved args, `launch_command`,
        scheduler info, `startup_time`, `internal_states` per DP rank, `version`)."""
        return {
            **self.server_args(),
            "launch_command": self.launch_command,
            "status": "ready",
            "max_total_num_tokens": self.sizing.max_total_num_tokens,
            "max_req_input_len": self.sizing.max_req_input_len,
            "startup_time": self.startup_time,
            "internal_states": [self._internal_state(rank) for rank in range(len(self.loops))],
            "version": VERSION,
            "frontend": "python",
        }

    def _internal_state(self, rank: int) -> dict[str, Any]:
        """scheduler_components/internal_state.py: resolved args, topology, memory usage."""
        engine = self.loops[rank].engine
        sizing = self.sizing
        return {
            **self.server_args(),
            "world_size": self.tp_size * self.config.dp_size,
            "startup_time": self.startup_time,
            "effective_max_running_requests_per_dp": sizing.max_running_requests,
            "last_gen_throughput": engine.last_gen_throughput,
            "memory_usage": {
                "weight": round(self.profile.weights_gb / self.tp_size, 3),
                "kvcache": round(sizing.max_total_num_tokens * sizing.kv_bytes_per_token / GB, 3),
                "token_capacity": sizing.max_total_num_tokens,
            },
            # The simulator's own readings, kept beside SGLang's keys.
            "dp_rank": rank,
            "num_running_reqs": len(engine.running),
            "num_queue_reqs": len(engine.waiting),
            "token_usage": engine.token_usage,
            "num_retractions": engine.retractions,
            "prefix_cache_tokens": {
                "device": engine.cache.device_tokens,
                "host": engine.cache.host_tokens,
            },
            "host_token_capacity": sizing.host_tokens,
        }

    def model_info(self) -> dict[str, Any]:
        """GET /model_info (http_server `model_info`)."""
        return {
            "model_path": self.config.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": self.config.reasoning_parser,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_k2" if self.model.name == "kimi-k2.5" else self.model.name,
            "architectures": ["DeepseekV3ForCausalLM"],
        }

    def models(self) -> dict[str, Any]:
        """GET /v1/models (OpenAI's list, as SGLang's serving_models answers it)."""
        model = {
            "id": self.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
            "root": self.config.model_path,
            "parent": None,
            "max_model_len": self.sizing.context_length,
        }
        return {"object": "list", "data": [model]}


def local_tokenizer_path(model_profile: str) -> str | None:
    """The example tokenizer carried with the workbench, for the profile it was made for."""
    if model_profile != "kimi-k2.5":
        return None
    try:
        folder = data_dir("examples") / "tokenizer"
    except InputError:
        return None
    return str(folder) if (folder / "tokenizer.json").is_file() else None


def _everything(request: Request) -> bool:
    """`abort_all`: every request matches."""
    return True


def _tagged(log: Callable[[str], None], tag: str, line: str) -> None:
    log(tag + line)


def _without_api_key(argv: list[str]) -> list[str]:
    """The command line with the value of `--api-key` hidden: it is served in /server_info."""
    hidden, previous = [], ""
    for arg in argv:
        if previous == "--api-key":
            arg = "***"
        elif arg.startswith("--api-key="):
            arg = "--api-key=***"
        hidden.append(arg)
        previous = arg
    return hidden
