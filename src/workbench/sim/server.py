"""The simulated server's state: engines per data-parallel rank, metrics, faults, info replies.

Prompts go to the ranks round robin, as SGLang's data-parallel controller sends them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from workbench.profiles import get_profile
from workbench.sim.cache import block_hashes
from workbench.sim.config import SimConfig
from workbench.sim.engine import Engine, EngineLoop, Request
from workbench.sim.faults import FaultPlan
from workbench.sim.metrics import SimMetrics
from workbench.sim.outputs import PlannedOutput, fixed_output, output_seed, plan_output
from workbench.sim.profiles import GB, get_sim_profile, plan_sizing, step_seconds
from workbench.sim.protocol import GenerateItem, Limits, abort_reason, finish_reason, reply

__all__ = ["CLIENT_GONE_MESSAGE", "FAULT_ABORT_MESSAGE", "VERSION", "Job", "SimServer"]

VERSION = "0.5.5-workbench-sim"
FAULT_ABORT_MESSAGE = "Abort request: injected fault"
CLIENT_GONE_MESSAGE = "Abort request: the client disconnected"


class Job:
    """One prompt of a /generate call: what it asked, its planned output, its engine request."""

    __slots__ = ("engine", "item", "plan", "request")

    def __init__(
        self, item: GenerateItem, plan: PlannedOutput, request: Request, engine: Engine
    ) -> None:
        self.item = item
        self.plan = plan
        self.request = request
        self.engine = engine


class SimServer:
    """Everything the HTTP layer needs; raises OutOfMemory when the configuration cannot start."""

    def __init__(self, config: SimConfig, *, log: Callable[[str], None] | None = None) -> None:
        self.config = config
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
        )
        self.limits = Limits(
            self.model.vocab_size, self.sizing.max_req_input_len, self.sizing.context_length
        )
        self.metrics = SimMetrics(config.model_path)
        self.faults = FaultPlan(
            error=config.fault_error_rate,
            drop=config.fault_drop_rate,
            hang=config.fault_hang_rate,
            abort=config.fault_abort_rate,
            seed=config.fault_seed,
        )
        self.loops = [
            EngineLoop(self._engine(rank, log), config.speed) for rank in range(config.dp_size)
        ]
        self.metrics.engines = self.engines
        self.created = int(time.time())
        self._ranks = itertools.cycle(self.loops)

    def _engine(self, rank: int, log: Callable[[str], None] | None) -> Engine:
        if log is not None and self.config.dp_size > 1:
            log = partial(_tagged, log, f"[DP{rank}] ")
        return Engine(
            self.sizing,
            partial(step_seconds, self.profile, self.sizing.kv_cache_dtype),
            observer=self.metrics,
            log=log,
            log_interval=self.config.decode_log_interval,
        )

    @property
    def engines(self) -> list[Engine]:
        return [loop.engine for loop in self.loops]

    @property
    def busy(self) -> bool:
        return any(engine.has_work for engine in self.engines)

    def start_job(self, item: GenerateItem, *, stream: bool, on_update: Callable[[], None]) -> Job:
        """Plan the prompt's output and queue it on the next rank."""
        seed = output_seed(
            self.config.random_seed, item.prompt, item.temperature, item.top_p, item.top_k
        )
        plan = plan_output(self.model, self.profile.output, seed, item.max_new_tokens)
        request = Request(
            len(item.input_ids),
            plan.output_ids,
            item.max_new_tokens,
            hashes=block_hashes(item.input_ids),
            stream=stream,
            on_update=on_update,
        )
        loop = next(self._ranks)
        loop.submit(request)
        return Job(item, plan, request, loop.engine)

    def cancel(self, job: Job) -> None:
        """Abort a job whose client went away."""
        job.engine.cancel(job.request, CLIENT_GONE_MESSAGE)

    def job_reply(self, job: Job, e2e_latency: float) -> dict[str, Any]:
        """The job's reply so far (final once the request finished)."""
        request = job.request
        finish: dict[str, Any] | None
        if request.abort_message is not None:
            finish = abort_reason(request.abort_message)
        else:
            finish = finish_reason(job.plan, request.generated, job.item.max_new_tokens)
        return reply(
            job.item,
            job.plan.output_ids[: request.generated],
            finish,
            model=self.model,
            cached_tokens=request.cached_tokens,
            e2e_latency=e2e_latency,
        )

    def fixed_reply(self, item: GenerateItem, e2e_latency: float) -> dict[str, Any]:
        """The fixed-latency mode's reply."""
        plan = fixed_output(self.model, item.max_new_tokens)
        finish = finish_reason(plan, len(plan.output_ids), item.max_new_tokens)
        return reply(
            item,
            plan.output_ids,
            finish,
            model=self.model,
            cached_tokens=0,
            e2e_latency=e2e_latency,
        )

    def abort_reply(self, item: GenerateItem, e2e_latency: float) -> dict[str, Any]:
        """The reply of a request aborted by an injected fault."""
        return reply(
            item,
            [],
            abort_reason(FAULT_ABORT_MESSAGE),
            model=self.model,
            cached_tokens=0,
            e2e_latency=e2e_latency,
        )

    def flush_cache(self) -> bool:
        """Empty every rank's prefix cache; refused while any request runs or waits."""
        if self.busy:
            return False
        return all(engine.flush_cache() for engine in self.engines)

    async def close(self) -> None:
        """Stop the engine loops."""
        for loop in self.loops:
            await loop.close()

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
            tokenizer_path=self.config.model_path,
            served_model_name=self.config.model_path,
        )
        return args

    def server_info(self) -> dict[str, Any]:
        """GET /server_info (and /get_server_info)."""
        return {
            **self.server_args(),
            "max_total_num_tokens": self.sizing.max_total_num_tokens,
            "max_req_input_len": self.sizing.max_req_input_len,
            "version": VERSION,
            "internal_states": [self._internal_state(rank) for rank in range(len(self.loops))],
        }

    def _internal_state(self, rank: int) -> dict[str, Any]:
        engine = self.loops[rank].engine
        sizing = self.sizing
        return {
            "dp_rank": rank,
            "last_gen_throughput": engine.last_gen_throughput,
            "num_running_reqs": len(engine.running),
            "num_queue_reqs": len(engine.waiting),
            "token_usage": engine.token_usage,
            "num_retractions": engine.retractions,
            "prefix_cache_tokens": {
                "device": engine.cache.device_tokens,
                "host": engine.cache.host_tokens,
            },
            "kv_cache_dtype": sizing.kv_cache_dtype,
            "memory_usage": {
                "weight": self.profile.weights_gb / self.tp_size,
                "kvcache": sizing.max_total_num_tokens * sizing.kv_bytes_per_token / GB,
                "token_capacity": sizing.max_total_num_tokens,
                "host_token_capacity": sizing.host_tokens,
            },
        }

    def model_info(self) -> dict[str, Any]:
        """GET /model_info (and /get_model_info)."""
        return {
            "model_path": self.config.model_path,
            "tokenizer_path": self.config.model_path,
            "is_generation": True,
        }

    def models(self) -> dict[str, Any]:
        """GET /v1/models (OpenAI's list)."""
        model = {
            "id": self.config.model_path,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
            "root": self.config.model_path,
            "max_model_len": self.sizing.context_length,
        }
        return {"object": "list", "data": [model]}


def _tagged(log: Callable[[str], None], tag: str, line: str) -> None:
    log(tag + line)
