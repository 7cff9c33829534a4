"""The simulator's configuration and its command-line flags (SGLang's spellings).

Flags left unset that SGLang derives (mem_fraction_static, tp_size, max_running_requests,
chunked_prefill_size) take the simulator profile's values when the server starts.
`--profile` is a profile's name or a profile file (.yaml/.yml, see `load_sim_profile`).
`--tool-call-rate` overrides the profile's `tool_call_rate` (`workbench.sim.tools`).
The timed fault flags (`--fault-stall-after`, `--fault-decay-after`, `--fault-exit-after`)
count server seconds from the server's creation: wall-clock seconds times `--speed`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import msgspec

from workbench.errors import ConfigError
from workbench.profiles import PROFILES as MODEL_PROFILES
from workbench.sim.profiles import KV_DTYPES, PROFILES, get_sim_profile, is_profile_path

__all__ = ["SCHEDULE_POLICIES", "SimConfig", "add_sim_arguments", "config_from_args"]

SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "dfs-weight", "lof", "priority")


class SimConfig(msgspec.Struct, kw_only=True):
    """Every simulator setting; the SGLang ones keep SGLang's names."""

    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "sim/kimi-k2.5"
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    reasoning_parser: str | None = None
    trust_request_chat_template: bool = False
    stream_interval: int = 1
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"
    enable_hierarchical_cache: bool = False
    enable_deterministic_inference: bool = False
    hicache_size: float = 0.0
    hicache_ratio: float = 2.0
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"
    tp_size: int | None = None
    dp_size: int = 1
    allow_auto_truncate: bool = False
    enable_metrics: bool = False
    api_key: str | None = None
    random_seed: int = 0
    decode_log_interval: int = 40
    profile: str = "fast"
    model_profile: str = "kimi-k2.5"
    speed: float = 1.0
    fixed_latency: float | None = None
    tool_call_rate: float | None = None
    fault_error_rate: float = 0.0
    fault_drop_rate: float = 0.0
    fault_hang_rate: float = 0.0
    fault_abort_rate: float = 0.0
    fault_truncate_rate: float = 0.0
    fault_hicache_corrupt_rate: float = 0.0
    fault_stall_after: float | None = None
    fault_stall_for: float | None = None
    fault_decay_after: float | None = None
    fault_decay_factor: float = 10.0
    fault_exit_after: float | None = None
    fault_seed: int = 0

    def __post_init__(self) -> None:
        _check_config(self)


def _positive(value: float | None) -> bool:
    return value is None or (value > 0 and math.isfinite(value))


def _non_negative(value: float | None) -> bool:
    return value is None or (value >= 0 and math.isfinite(value))


_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "profile",
        lambda value: value in PROFILES or is_profile_path(value),
        f"expected one of {', '.join(PROFILES)} or a .yaml file",
    ),
    ("model_profile", lambda value: value in MODEL_PROFILES, "unknown model profile"),
    ("kv_cache_dtype", lambda value: value in KV_DTYPES, f"expected one of {', '.join(KV_DTYPES)}"),
    ("schedule_policy", lambda value: value in SCHEDULE_POLICIES, "unknown schedule policy"),
    ("mem_fraction_static", lambda value: value is None or 0 < value < 1, "must be in (0, 1)"),
    ("speed", lambda value: value is not None and _positive(value), "must be positive"),
    ("fixed_latency", _non_negative, "must be >= 0"),
    ("tool_call_rate", lambda value: value is None or 0.0 <= value <= 1.0, "must be in [0, 1]"),
    ("hicache_size", _non_negative, "must be >= 0"),
    ("hicache_ratio", _positive, "must be positive"),
    ("tp_size", _positive, "must be at least 1"),
    ("dp_size", _positive, "must be at least 1"),
    ("max_running_requests", _positive, "must be at least 1"),
    ("max_total_tokens", _positive, "must be at least 1"),
    ("chunked_prefill_size", lambda value: value in (None, -1) or value >= 1, "-1 or >= 1"),
    ("decode_log_interval", _positive, "must be at least 1"),
    ("stream_interval", _positive, "must be at least 1"),
    ("fault_truncate_rate", lambda value: 0.0 <= value <= 1.0, "must be in [0, 1]"),
    ("fault_hicache_corrupt_rate", lambda value: 0.0 <= value <= 1.0, "must be in [0, 1]"),
    ("fault_stall_after", _non_negative, "must be >= 0 (server seconds)"),
    ("fault_stall_for", _positive, "must be positive (server seconds)"),
    ("fault_decay_after", _non_negative, "must be >= 0 (server seconds)"),
    ("fault_decay_factor", lambda value: value > 1 and math.isfinite(value), "must be above 1"),
    ("fault_exit_after", _non_negative, "must be >= 0 (server seconds)"),
)


def _check_config(config: SimConfig) -> None:
    for name, valid, message in _RULES:
        value = getattr(config, name)
        if not valid(value):
            raise ConfigError(name, f"{message}, got {value!r}")
    if is_profile_path(config.profile):
        get_sim_profile(config.profile)  # the file's own ConfigError names the file and key
    rates = (
        config.fault_error_rate,
        config.fault_drop_rate,
        config.fault_hang_rate,
        config.fault_abort_rate,
    )
    if any(not 0.0 <= rate <= 1.0 for rate in rates) or sum(rates) > 1.0:
        raise ConfigError("fault rates", "each must be in [0, 1] and together at most 1")
    if config.fault_stall_for is not None and config.fault_stall_after is None:
        raise ConfigError("fault_stall_for", "needs fault_stall_after (when the stall starts)")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a rate in [0, 1], got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _factor(text: str) -> float:
    value = float(text)
    if not (value > 1 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number above 1, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _chunk_size(text: str) -> int:
    value = int(text)
    if value != -1 and value < 1:
        raise argparse.ArgumentTypeError(f"expected -1 or an integer >= 1, got {text}")
    return value


def _profile(text: str) -> str:
    if text in PROFILES or is_profile_path(text):
        return text
    raise argparse.ArgumentTypeError(
        f"expected one of {', '.join(sorted(PROFILES))} or a .yaml file, got {text!r}"
    )


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0 picks a free one), got {text}")
    return value


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags: SGLang server flags, simulator flags, fault flags."""
    _add_server_arguments(parser.add_argument_group("server (SGLang flags)"))
    _add_simulator_arguments(parser.add_argument_group("simulator"))
    _add_fault_arguments(
        parser.add_argument_group(
            "faults",
            "misbehave on purpose; S and D are server seconds since the server started "
            "(wall-clock seconds times --speed)",
        )
    )


def _add_server_arguments(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=_port, default=30000, help="port to listen on; 0 picks a free one")
    add("--model-path", default="sim/kimi-k2.5", help="model name reported by the server")
    add(
        "--tokenizer-path",
        default=None,
        help="tokenizer reported by the server (default: the model profile's local tokenizer)",
    )
    add("--served-model-name", default=None, help="model name of the OpenAI API and metrics")
    add(
        "--reasoning-parser",
        default=None,
        help="split reasoning_content in /v1/chat/completions (e.g. kimi_k2, qwen3)",
    )
    add(
        "--trust-request-chat-template",
        action="store_true",
        help="let a chat request bring its own template (chat_template_kwargs.chat_template); "
        "without it such a request is a 400, as on SGLang",
    )
    add(
        "--stream-interval",
        type=_positive_int,
        default=1,
        help="tokens per streamed chunk (default: %(default)s)",
    )
    add(
        "--mem-fraction-static",
        type=_fraction,
        default=None,
        help="GPU memory share for weights and KV cache (default: the profile's)",
    )
    add(
        "--kv-cache-dtype",
        choices=KV_DTYPES,
        default="auto",
        help="KV cache dtype; auto is the profile's choice for the model",
    )
    add(
        "--enable-hierarchical-cache",
        action="store_true",
        help="keep evicted prefixes in host memory",
    )
    add(
        "--hicache-size",
        type=_non_negative_float,
        default=0.0,
        help="host cache GB per rank (0: --hicache-ratio times the device pool)",
    )
    add(
        "--hicache-ratio",
        type=_positive_float,
        default=2.0,
        help="host cache size as a multiple of the device pool (default: %(default)s)",
    )
    add("--max-running-requests", type=_positive_int, default=None, help="cap on the running batch")
    add(
        "--max-total-tokens",
        type=_positive_int,
        default=None,
        help="KV pool size in tokens (caps the size the memory leaves; default: from memory)",
    )
    add(
        "--chunked-prefill-size",
        type=_chunk_size,
        default=None,
        help="prefill tokens per step; -1 turns chunking off (default: the profile's)",
    )
    add(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default="fcfs",
        help="accepted for compatibility; the simulator serves first come, first served",
    )
    add(
        "--tp-size",
        "--tensor-parallel-size",
        type=_positive_int,
        default=None,
        help="tensor parallel size (default: the profile's)",
    )
    add(
        "--dp-size",
        "--data-parallel-size",
        type=_positive_int,
        default=1,
        help="data parallel replicas, each with its own KV pool",
    )
    add(
        "--enable-deterministic-inference",
        action="store_true",
        help="batch-invariant kernels: temperature 0 gives the same reply whatever the batch, "
        "each step slower (the profile's deterministic_step_factor)",
    )
    add(
        "--allow-auto-truncate",
        action="store_true",
        help="cut an over-long input (keeping its start) instead of answering 400; "
        "max_new_tokens is cut to fit the context",
    )
    add(
        "--disable-radix-cache",
        action="store_true",
        help="no prefix cache: every prompt is prefilled whole",
    )
    add("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    add("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    add("--random-seed", type=int, default=0, help="seed of the simulated outputs")
    add(
        "--decode-log-interval",
        type=_positive_int,
        default=40,
        help="decode steps between scheduler log lines (default: %(default)s)",
    )


def _add_simulator_arguments(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add(
        "--profile",
        type=_profile,
        default="fast",
        metavar="NAME|FILE.yaml",
        help=f"GPU/model pair to simulate: {', '.join(sorted(PROFILES))}, or a profile file "
        "such as `workbench tune fit` writes (default: %(default)s)",
    )
    add(
        "--model-profile",
        choices=sorted(MODEL_PROFILES),
        default="kimi-k2.5",
        help="special token ids of the simulated outputs (default: %(default)s)",
    )
    add("--speed", type=_positive_float, default=1.0, help="run model time X times faster")
    add(
        "--fixed-latency",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help="bypass the engine: every /generate replies after exactly this latency",
    )
    add(
        "--tool-call-rate",
        type=_rate,
        default=None,
        metavar="RATE",
        help="share of the replies to a prompt that declares tools, the user's turn last, "
        "that call a tool instead of answering (default: the profile's, 0.7)",
    )


def _add_fault_arguments(group: argparse._ArgumentGroup) -> None:
    add = group.add_argument
    add("--fault-error-rate", type=_rate, default=0.0, help="share of /generate answered 500/503")
    add(
        "--fault-drop-rate",
        type=_rate,
        default=0.0,
        help="share of /generate dropped without reply",
    )
    add("--fault-hang-rate", type=_rate, default=0.0, help="share of /generate never answered")
    add(
        "--fault-abort-rate",
        type=_rate,
        default=0.0,
        help="share of /generate aborted (SGLang's abort: HTTP 503, or a streamed abort chunk)",
    )
    add(
        "--fault-truncate-rate",
        type=_rate,
        default=0.0,
        help="share of prompts (of 2+ tokens) silently cut to their first half; "
        "meta_info.prompt_tokens is the cut length",
    )
    add(
        "--fault-hicache-corrupt-rate",
        type=_rate,
        default=0.0,
        help="share of prompts whose prefix, read back from the hierarchical cache's host "
        "tier, is corrupted: their reply differs from the first token on",
    )
    add(
        "--fault-stall-after",
        type=_non_negative_float,
        default=None,
        metavar="S",
        help="from S server seconds after start the scheduler makes no progress (no token, "
        "requests queue) while /health and /metrics still answer",
    )
    add(
        "--fault-stall-for",
        type=_positive_float,
        default=None,
        metavar="D",
        help="the stall ends after D server seconds (default: it lasts)",
    )
    add(
        "--fault-decay-after",
        type=_non_negative_float,
        default=None,
        metavar="S",
        help="from S server seconds after start every step takes --fault-decay-factor times "
        "as long, for good",
    )
    add(
        "--fault-decay-factor",
        type=_factor,
        default=10.0,
        metavar="F",
        help="slowdown of --fault-decay-after, above 1 (default: %(default)s)",
    )
    add(
        "--fault-exit-after",
        type=_non_negative_float,
        default=None,
        metavar="S",
        help="the process dies S server seconds after start (one log line, exit status 1, "
        "no graceful shutdown)",
    )
    add(
        "--fault-seed",
        type=int,
        default=0,
        help="seed of the fault draws (default: %(default)s)",
    )


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """The SimConfig of parsed arguments (other attributes of `ns` are ignored)."""
    values = {name: getattr(ns, name) for name in SimConfig.__struct_fields__ if hasattr(ns, name)}
    return SimConfig(**values)
