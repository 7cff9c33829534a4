"""Simulator profiles (a GPU/model pair) and every formula the simulator's model uses.

All sizes are decimal: 1 GB = 1e9 bytes. All formulas live in this module, one function each:

KV bytes per token (`kv_bytes_per_token`)
    bytes = kv_bytes_per_token_bf16 for bf16, half of it for fp8_e4m3 / fp8_e5m2.
    `auto` means the profile's `auto_kv_dtype` (what the server picks for the checkpoint).
    Kimi-K2.5 is MLA: 61 layers x (512 latent + 64 rope) dims x 2 bytes = 70,272 bytes (~70 KB).
    Under tensor parallelism the MLA latent is replicated, so this is also the cost per rank.

Memory check (`check_memory`): a server fails at start ("out of memory") when
    weights_gb / tp_size  >=  gpu_mem_gb * mem_fraction_static      (no room left for KV), or
    gpu_mem_gb * (1 - mem_fraction_static)  <  activation_gb        (activations do not fit).

KV pool (`kv_pool_tokens`, SGLang's max_total_num_tokens, per rank)
    tokens = (gpu_mem_gb * mem_fraction_static - weights_gb / tp_size) * 1e9 / bytes_per_token
    Kimi on 8 x 96 GB at 74 GB of weights per rank, bf16: ~40k tokens at 0.80, ~149k at 0.88.
    `--max-total-tokens N` caps it: tokens = min(tokens from memory, N), as SGLang's
    `_apply_token_constraints` does (a larger N than memory allows is a warning, and the
    memory's value is kept). The memory check above applies either way.

Host cache (`host_pool_tokens`, hierarchical cache only)
    tokens = hicache_size_gb * 1e9 / bytes_per_token when --hicache-size > 0,
    otherwise hicache_ratio * device pool tokens (SGLang's default sizing).

Request limits (`default_max_running_requests`, `max_req_input_len`, `prefill_budget`):
    max_running_requests = min(max(pool_tokens / context_length * 512, 2048), 4096)
    max_req_input_len    = min(context_length, pool_tokens) - 1
    prefill budget       = chunked_prefill_size tokens per step (-1: context_length)

Step time (`step_seconds`, model time; the server divides it by --speed)
    seconds = (step_base_ms
               + step_per_req_ms * running * dtype_factor     (fp8 KV: slower attention kernels)
               + prefill_ms_per_token * prefilled_tokens      (newly admitted, not cached)
               + host_load_ms_per_token * host_loaded_tokens) (prefix hits read back from host)
              * deterministic_step_factor                     (--enable-deterministic-inference)
              / 1000
    Kimi: 25 ms + 0.4 ms per running request.

What the sweep sees, with the pool limiting admission (see `workbench.sim.batch`):
    more mem_fraction_static or a smaller KV dtype -> more pool tokens -> more requests
    running at once -> more output tok/s, until the per-request part of the step dominates
    (the step becomes compute-bound); with fp8_step_factor > 1 a larger batch of fp8 KV can
    then be slightly slower than a smaller bf16 one. Too much mem_fraction_static leaves no
    room for activations: the server exits at start with an "out of memory" line.
    The hierarchical cache keeps prefixes the full device pool evicts, so prompts that
    share prefixes hit the cache again (prefill skipped, host_load_ms_per_token paid).

Kimi calibration (kimi-k2.5-8xrtx6000). Target: the seeds' own tuning of this node, ~600
output tok/s for the untuned server (0.80, default KV) at 150 concurrent requests and
1.5-2.3x that (1,000-1,300 tok/s) for the tuned one (0.88, bf16, hierarchical cache 48 GB).
Replay of params/tuning.kimi-k25.yaml (prompts of 600-1,400 tokens, 512 of them shared in 64
groups, max_new_tokens 8192, 150 workers, 1,200 s window, speed 200, no streaming):
    config                   KV tokens  running  tok/s   x untuned  prefix hit rate
    0.80 auto (untuned)         79,690     26.9    582     1.00        0.07
    0.80 auto   hicache48       79,690     27.0    595     1.02        0.54
    0.80 bf16                   39,845     13.0    415     0.71        0.03
    0.80 bf16   hicache48       39,845     13.0    427     0.73        0.64
    0.88 auto                  298,269     99.5    975     1.67        0.26
    0.88 auto   hicache48      298,269     99.4    984     1.69        0.51
    0.88 bf16                  149,134     49.4  1,037     1.78        0.12
    0.88 bf16   hicache48      149,134     49.3  1,062     1.82        0.52   (tuned)
    The design's pool sizes (~40k at 0.80, ~145k at 0.88) are bf16's; with them and a step
    of 25 ms + 0.4 ms per request, 150 requests of this shape reach ~415 tok/s at 0.80, not
    600. What closes the gap is the assumption that the seed server's `auto` resolved to an
    FP8 KV cache (twice the tokens: ~26 running) and that FP8 MLA decode was slower on these
    GPUs (fp8_step_factor 1.8), which is also why the seeds' tuned configuration set bf16
    explicitly. Set `auto_kv_dtype` to "bf16" (and revisit the step constants) if that
    turns out wrong.

Dense calibration (dense-8b-1x24gb, for quick sweeps such as params/tuning.sim.yaml): an 8B
GQA model (32 layers x 8 KV heads x 128 dims x K,V x 2 bytes = 128 KiB per token) whose 16 GB
of weights leave ~24k tokens at 0.80, ~39k at 0.88 and twice that in fp8; the step is 16 ms
+ 0.12 ms per request, about 450 tok/s at 8 requests and 1,300-2,300 at 64.

Output lengths (`OutputShape`): reasoning and answer lengths are lognormal with the given
medians and sigmas; `unclosed_rate` of the samples reason until max_new_tokens; with tools
declared and the user's turn last, `tool_call_rate` of the replies call a tool instead of
answering (`workbench.sim.tools`; `--tool-call-rate` overrides it).

Prefix cache: with `--disable-radix-cache` nothing is cached: every prompt is prefilled whole
and the cache hit rate is 0 (the hierarchical cache has nothing to keep either).

Output fidelity (`Fidelity`, `flip_position`): at temperature 0 a reply is the same for the
same prompt, unless a token flips. A flip at position L (0-based, in the output) changes every
content id from L on (another run of the text; special ids stay where they were), and a reply
flips at most once, at the earliest of:
    fp8 KV (fp8_e4m3 / fp8_e5m2, no calibrated scales): P(flipped by L) = 1 - exp(-fp8_flip_rate
        * (L / 1000)^2), drawn per prompt (the same prompt flips at the same place on every
        fp8 server); and the chosen tokens' logprobs move by up to +-fp8_logprob_noise.
    batch dependence (bf16 kernels are not batch-invariant): the same law with batch_flip_rate,
        drawn per prompt and batch size at its arrival (requests running and waiting on its
        rank), so two runs whose batches differ part on some prompts: the noise floor.
        --enable-deterministic-inference turns it off and multiplies the step time by
        deterministic_step_factor.
    a corrupted prefix (fault_hicache_corrupt_rate, hierarchical cache only): a prompt whose
        prefix is read back from the host tier flips at 0 with that probability.
The hazard grows with the position (quantization error accumulates over the context). With
the defaults, an fp8 reply has flipped by token 256 with probability 1 - e^-0.13 (12%), by
512 with 1 - e^-0.52 (41%), by 1,000 with 86%; the batch noise by 512 with 1.3%, by 1,000
with 5%.

Profiles from a file (`load_sim_profile`, `get_sim_profile("path.yaml")`): a YAML mapping with
every SimProfile field (`output` a mapping of OutputShape's); unknown or missing keys and
negative values are ConfigErrors naming the file, its line and the key. `profile_yaml` writes
one back, under a comment.

Fitted profiles (`workbench tune fit`, `workbench.tune.fit`) stand in for a measured server.
From the ok points of the chosen configurations of a sweep, in server time (the client has
already multiplied its wall-clock readings by the sweep's time_scale, 1 for SGLang):
    step_ms = itl_p50_ms                          (a request's mean time between tokens: the
              mean step over its life, prefill steps of others included)
    R       = output_throughput * step_ms / 1000  (the decoding batch, by Little's law; the
              /metrics gauge num_running_reqs reads low: SGLang refreshes it every 40 decode
              steps and at admission), else, without streaming,
    R       = mean_running and step_ms = 1000 * R / output_throughput
    P       = R * L / N                           (prompt tokens prefilled per step: in a
              steady state a request joins for every N tokens the batch's requests make)
    L, N    = means of prompt_tokens - cached_tokens and of completion_tokens over the
              point's measured requests (requests.jsonl), else mean(input_len) *
              (1 - cache_hit_rate) and output_tokens / requests
    then    step_ms = step_base_ms + step_per_req_ms * R + prefill_ms_per_token * P
    solved by least squares with every constant >= 0 when P / R varies between the points
    (L / N has a coefficient of variation >= 0.1: prefix hits, radix cache on and off,
    other output lengths) and the P term brings the rms residual down to 0.9 of the fit
    without it. Otherwise P is proportional to R (or its term explains nothing beyond
    noise) and the two cannot be told apart: prefill_ms_per_token is 0 and the prefill
    cost is carried by step_per_req_ms (+ prefill cost * L / N), which is right for the
    sweep's load shape and extrapolation for other prompt and output lengths. (TTFT is no
    help: on a loaded host and at a simulator speed above 1 it is mostly client delay.)
    host_load_ms_per_token = prefill_ms_per_token / 10; fp8_step_factor 1.0.
Memory: a measured server reports its pool (max_total_num_tokens), and a replay passes it
as --max-total-tokens, so the fitted memory only has to hold any such pool: weights and KV
bytes per token from /server_info's memory_usage when reported (else 0.1 GB and 2,048 B),
no activation memory, and gpu_mem_gb that holds 16 x the largest measured pool (at least
1M tokens) at the smallest mem_fraction_static of the sweep. context_length and
default_chunked_prefill_size are what the server reported. Output shape: when 95% or more of
the measured replies were cut at max_new_tokens (finish "length"; without requests.jsonl,
completion tokens per request >= 98% of max_new_tokens), reasoning and answer medians of a
million tokens and unclosed_rate 1.0, which cut every reply at max_new_tokens whatever the
model profile; otherwise unclosed_rate is the share cut, and the replies that stopped give
the median length (0.8 of it reasoning, 0.2 answer) and the sigma of its logarithm.
Not modelled: a real server's separate prefill forward (a fixed cost per step that admits
requests, which a smaller chunked_prefill_size pays more often) and step time growing with
the context held (attention): within one load shape both are folded into the constants.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from workbench.config import load_yaml_params, with_line
from workbench.errors import ConfigError

__all__ = [
    "KV_DTYPES",
    "PROFILES",
    "OutOfMemory",
    "OutputShape",
    "SimProfile",
    "Sizing",
    "check_memory",
    "default_max_running_requests",
    "get_sim_profile",
    "host_pool_tokens",
    "is_profile_path",
    "kv_bytes_per_token",
    "kv_pool_tokens",
    "load_sim_profile",
    "max_req_input_len",
    "plan_sizing",
    "prefill_budget",
    "profile_yaml",
    "resolve_kv_dtype",
    "step_seconds",
]

GB = 1e9
KV_DTYPES = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2")
_FP8 = ("fp8_e4m3", "fp8_e5m2")


class OutOfMemory(ConfigError):
    """The configuration cannot start: weights, activations or the KV pool do not fit."""

    def __init__(self, message: str) -> None:
        super().__init__("mem_fraction_static", f"out of memory: {message}")


NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class OutputShape(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Lognormal output lengths of the simulated model (medians in tokens)."""

    reasoning_median: Positive
    reasoning_sigma: NonNegative
    answer_median: Positive
    answer_sigma: NonNegative
    unclosed_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.02
    tool_call_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.7


class Fidelity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How replies drift at temperature 0 (module docstring, "Output fidelity")."""

    fp8_flip_rate: NonNegative = 2.0
    fp8_logprob_noise: NonNegative = 0.03
    batch_flip_rate: NonNegative = 0.05
    deterministic_step_factor: Positive = 1.3


def flip_position(key: bytes, rate: float) -> float:
    """Where a reply keyed `key` flips under `rate` (module docstring): the position L with
    1 - exp(-rate * (L / 1000)^2) = u, u drawn from `key`; inf when `rate` is 0."""
    if rate <= 0:
        return math.inf
    digest = hashlib.blake2b(key, digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64
    return 1000.0 * math.sqrt(-math.log1p(-u) / rate)


class SimProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One GPU/model pair: memory sizes, KV cost, step-time constants and output lengths."""

    name: str
    description: str
    gpu_mem_gb: Positive
    weights_gb: NonNegative
    activation_gb: NonNegative
    kv_bytes_per_token_bf16: PositiveInt
    auto_kv_dtype: str
    context_length: PositiveInt
    default_tp_size: PositiveInt
    default_mem_fraction_static: Annotated[float, msgspec.Meta(gt=0, lt=1)]
    default_chunked_prefill_size: PositiveInt
    step_base_ms: NonNegative
    step_per_req_ms: NonNegative
    fp8_step_factor: Positive
    prefill_ms_per_token: NonNegative
    host_load_ms_per_token: NonNegative
    output: OutputShape
    fidelity: Fidelity = Fidelity()


class Sizing(msgspec.Struct, frozen=True):
    """What a configuration resolves to on one rank, as SGLang reports it."""

    kv_cache_dtype: str
    kv_bytes_per_token: int
    max_total_num_tokens: int
    host_tokens: int
    max_running_requests: int
    max_req_input_len: int
    context_length: int
    chunked_prefill_size: int


PROFILES: dict[str, SimProfile] = {
    "fast": SimProfile(
        name="fast",
        description="tiny model on one 24 GB GPU: a huge pool and millisecond steps, for tests",
        gpu_mem_gb=24.0,
        weights_gb=0.5,
        activation_gb=1.0,
        kv_bytes_per_token_bf16=16_384,
        auto_kv_dtype="bf16",
        context_length=32_768,
        default_tp_size=1,
        default_mem_fraction_static=0.80,
        default_chunked_prefill_size=8192,
        step_base_ms=1.0,
        step_per_req_ms=0.01,
        fp8_step_factor=1.05,
        prefill_ms_per_token=0.0005,
        host_load_ms_per_token=0.0001,
        output=OutputShape(
            reasoning_median=100, reasoning_sigma=0.5, answer_median=40, answer_sigma=0.5
        ),
    ),
    "dense-8b-1x24gb": SimProfile(
        name="dense-8b-1x24gb",
        description="a dense 8B model (bf16, 16 GB) on one 24 GB GPU: quick tuning sweeps",
        gpu_mem_gb=24.0,
        weights_gb=16.0,
        activation_gb=1.5,
        kv_bytes_per_token_bf16=2 * 32 * 8 * 128 * 2,
        auto_kv_dtype="bf16",
        context_length=32_768,
        default_tp_size=1,
        default_mem_fraction_static=0.80,
        default_chunked_prefill_size=8192,
        step_base_ms=16.0,
        step_per_req_ms=0.12,
        fp8_step_factor=1.05,
        prefill_ms_per_token=0.1,
        host_load_ms_per_token=0.01,
        output=OutputShape(
            reasoning_median=300, reasoning_sigma=0.6, answer_median=120, answer_sigma=0.5
        ),
    ),
    "kimi-k2.5-8xrtx6000": SimProfile(
        name="kimi-k2.5-8xrtx6000",
        description="Kimi-K2.5 (INT4, ~595 GB) with tp 8 on 8 x RTX PRO 6000 Blackwell 96 GB",
        gpu_mem_gb=96.0,
        weights_gb=592.0,
        activation_gb=6.0,
        kv_bytes_per_token_bf16=61 * (512 + 64) * 2,
        auto_kv_dtype="fp8_e4m3",
        context_length=262_144,
        default_tp_size=8,
        default_mem_fraction_static=0.80,
        default_chunked_prefill_size=8192,
        step_base_ms=25.0,
        step_per_req_ms=0.4,
        fp8_step_factor=1.8,
        prefill_ms_per_token=0.1,
        host_load_ms_per_token=0.005,
        output=OutputShape(
            reasoning_median=1200, reasoning_sigma=0.8, answer_median=400, answer_sigma=0.7
        ),
    ),
}


def is_profile_path(name: str) -> bool:
    """Whether a --profile value names a profile file (.yaml or .yml) rather than a profile."""
    return name.lower().endswith((".yaml", ".yml"))


def get_sim_profile(name: str) -> SimProfile:
    """The simulator profile called `name`, or loaded from `name` when it is a .yaml/.yml
    path; a ConfigError lists the known names (or names the file and key)."""
    if is_profile_path(name):
        return load_sim_profile(name)
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ConfigError(
            "profile", f"unknown simulator profile {name!r} (known: {known}, or a .yaml file)"
        ) from None


def load_sim_profile(path: str | os.PathLike[str]) -> SimProfile:
    """A SimProfile from a YAML file; ConfigError naming the file, line and key."""
    profile = load_yaml_params(Path(path), SimProfile, source=str(path))
    if profile.auto_kv_dtype not in KV_DTYPES[1:]:
        error = ConfigError(
            "auto_kv_dtype",
            f"expected one of {', '.join(KV_DTYPES[1:])}, got {profile.auto_kv_dtype!r}",
            str(path),
        )
        raise with_line(error, Path(path))
    return profile


def profile_yaml(profile: SimProfile, comment: str = "") -> str:
    """The profile as a YAML file's text (fields in order), under `comment` as # lines."""
    header = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines())
    body = yaml.safe_dump(msgspec.to_builtins(profile), sort_keys=False, width=100)
    return header + body


def resolve_kv_dtype(profile: SimProfile, kv_cache_dtype: str) -> str:
    """The concrete KV dtype: `auto` is the profile's (the model's) own dtype."""
    if kv_cache_dtype not in KV_DTYPES:
        raise ConfigError("kv_cache_dtype", f"expected one of {', '.join(KV_DTYPES)}")
    return profile.auto_kv_dtype if kv_cache_dtype == "auto" else kv_cache_dtype


def kv_bytes_per_token(profile: SimProfile, kv_dtype: str) -> int:
    """KV bytes one token costs on one rank: half in fp8."""
    full = profile.kv_bytes_per_token_bf16
    return full // 2 if kv_dtype in _FP8 else full


def check_memory(profile: SimProfile, mem_fraction_static: float, tp_size: int) -> None:
    """Raise OutOfMemory when the weights or the activations do not fit on a rank."""
    static_gb = profile.gpu_mem_gb * mem_fraction_static
    weights_gb = profile.weights_gb / tp_size
    if weights_gb >= static_gb:
        raise OutOfMemory(
            f"weights need {weights_gb:.1f} GB per rank but mem_fraction_static "
            f"{mem_fraction_static} leaves {static_gb:.1f} GB of {profile.gpu_mem_gb:.0f} GB "
            f"(tp_size {tp_size}); increase --mem-fraction-static or --tp-size"
        )
    free_gb = profile.gpu_mem_gb - static_gb
    if free_gb < profile.activation_gb:
        raise OutOfMemory(
            f"activations need {profile.activation_gb:.1f} GB per rank but mem_fraction_static "
            f"{mem_fraction_static} leaves {free_gb:.1f} GB; decrease --mem-fraction-static"
        )


def kv_pool_tokens(
    profile: SimProfile, mem_fraction_static: float, kv_dtype: str, tp_size: int
) -> int:
    """Tokens the KV pool of one rank holds (SGLang's max_total_num_tokens)."""
    free_gb = profile.gpu_mem_gb * mem_fraction_static - profile.weights_gb / tp_size
    return int(free_gb * GB / kv_bytes_per_token(profile, kv_dtype))


def host_pool_tokens(
    profile: SimProfile,
    kv_dtype: str,
    device_tokens: int,
    hicache_size_gb: float,
    hicache_ratio: float,
) -> int:
    """Tokens the hierarchical cache keeps in host memory on one rank."""
    if hicache_size_gb > 0:
        return int(hicache_size_gb * GB / kv_bytes_per_token(profile, kv_dtype))
    return int(hicache_ratio * device_tokens)


def default_max_running_requests(pool_tokens: int, context_length: int) -> int:
    """SGLang's default request slots: min(max(pool / context * 512, 2048), 4096)."""
    return min(max(int(pool_tokens / context_length * 512), 2048), 4096)


def max_req_input_len(pool_tokens: int, context_length: int) -> int:
    """The longest prompt the server accepts."""
    return min(context_length, pool_tokens) - 1


def step_seconds(
    profile: SimProfile,
    kv_dtype: str,
    running: int,
    prefilled_tokens: int,
    host_loaded_tokens: int,
    *,
    deterministic: bool = False,
) -> float:
    """Model time of one scheduler step (prefill of new requests plus one decode token each);
    batch-invariant kernels (`deterministic`) cost `fidelity.deterministic_step_factor`."""
    dtype_factor = profile.fp8_step_factor if kv_dtype in _FP8 else 1.0
    ms = (
        profile.step_base_ms
        + profile.step_per_req_ms * running * dtype_factor
        + profile.prefill_ms_per_token * prefilled_tokens
        + profile.host_load_ms_per_token * host_loaded_tokens
    )
    if deterministic:
        ms *= profile.fidelity.deterministic_step_factor
    return ms / 1000.0


def prefill_budget(chunked_prefill_size: int | None, profile: SimProfile) -> int:
    """Prefill tokens admitted per step: unset is the profile's, -1 (no chunking) the context."""
    if chunked_prefill_size is None:
        return profile.default_chunked_prefill_size
    return profile.context_length if chunked_prefill_size == -1 else chunked_prefill_size


def plan_sizing(
    profile: SimProfile,
    *,
    mem_fraction_static: float,
    kv_cache_dtype: str,
    tp_size: int,
    enable_hierarchical_cache: bool,
    hicache_size_gb: float,
    hicache_ratio: float,
    max_running_requests: int | None,
    chunked_prefill_size: int | None,
    max_total_tokens: int | None = None,
) -> Sizing:
    """Resolve a configuration to pool sizes and limits; OutOfMemory when it cannot start.

    `max_total_tokens` (--max-total-tokens) caps the pool the memory leaves."""
    check_memory(profile, mem_fraction_static, tp_size)
    dtype = resolve_kv_dtype(profile, kv_cache_dtype)
    pool = kv_pool_tokens(profile, mem_fraction_static, dtype, tp_size)
    if pool < 1024 and (max_total_tokens is None or pool < 1):
        raise OutOfMemory(
            f"the KV pool holds only {max(pool, 0)} tokens; increase --mem-fraction-static"
        )
    if max_total_tokens is not None:
        pool = min(pool, max_total_tokens)
    host = 0
    if enable_hierarchical_cache:
        host = host_pool_tokens(profile, dtype, pool, hicache_size_gb, hicache_ratio)
    return Sizing(
        kv_cache_dtype=dtype,
        kv_bytes_per_token=kv_bytes_per_token(profile, dtype),
        max_total_num_tokens=pool,
        host_tokens=host,
        max_running_requests=max_running_requests
        or default_max_running_requests(pool, profile.context_length),
        max_req_input_len=max_req_input_len(pool, profile.context_length),
        context_length=profile.context_length,
        chunked_prefill_size=prefill_budget(chunked_prefill_size, profile),
    )
