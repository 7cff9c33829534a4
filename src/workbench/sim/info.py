"""What the simulated server says about itself, as SGLang 0.5.23's http_server does.

| endpoint          | method                   | holds                                          |
|-------------------|--------------------------|------------------------------------------------|
| GET /server_info  | `ServerInfo.server_info` | resolved arguments (no API key), the launch    |
|                   |                          | command, `startup_time`, per-rank state        |
| GET /model_info   | `ServerInfo.model_info`  | model path, served name, tokenizer path        |
| GET /v1/models    | `ServerInfo.models`      | OpenAI's list of one model                     |

The server (`workbench.sim.server`) holds one `ServerInfo`, made when it starts: the start time
and the command line (its `--api-key` value hidden) are read then. The per-rank state reads the
engines at each call.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from workbench.errors import InputError
from workbench.profiles import ModelProfile
from workbench.resources import data_dir
from workbench.sim.config import SimConfig
from workbench.sim.engine import Engine
from workbench.sim.profiles import GB, SimProfile, Sizing

__all__ = ["VERSION", "ServerInfo", "local_tokenizer_path"]

VERSION = "0.5.23"  # the SGLang release whose API the simulator follows


class ServerInfo:
    """The info replies of one server: its configuration resolved, its ranks' engines."""

    def __init__(
        self,
        config: SimConfig,
        profile: SimProfile,
        model: ModelProfile,
        sizing: Sizing,
        engines: Sequence[Engine],
        *,
        mem_fraction_static: float,
        tp_size: int,
    ) -> None:
        self.config = config
        self.profile = profile
        self.model = model
        self.sizing = sizing
        self.engines = engines
        self.mem_fraction_static = mem_fraction_static
        self.tp_size = tp_size
        self.created = int(time.time())
        self.startup_time = time.time()
        self.launch_command = shlex.join(_without_api_key(sys.argv))

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
            "internal_states": [self._internal_state(rank) for rank in range(len(self.engines))],
            "version": VERSION,
            "frontend": "python",
        }

    def _internal_state(self, rank: int) -> dict[str, Any]:
        """scheduler_components/internal_state.py: resolved args, topology, memory usage."""
        engine = self.engines[rank]
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
