"""Server-tuning sweep: configurations x load, per-point results, resume, recommendation.

A sweep takes a parameter file (`load_tuning_params`; see params/tuning.sim.yaml for every
key) and, for each configuration of its grid, launches the server (SGLang or the simulator,
`workbench.launch`), reads `/server_info`, then for each concurrency (and repeat): flushes
the prefix cache, runs a closed loop of requests through `SGLangClient` and scrapes
`/metrics` before and after. The server is stopped by process group after its points, and
in any case when the sweep ends or is interrupted.

Load and measurement. `concurrency` workers each send one request at a time (prompts in a
fixed order, the same for every point). The first `warmup_requests` finished requests are
the warm-up; the window opens when the last of them finishes and closes after `requests`
more have finished or after `duration` seconds, whichever comes first; requests still in
flight then are cancelled. Over the window:

    output_throughput   tokens streamed inside the window / window (streaming); without
                        streaming, completion tokens of the window's finished requests /
                        window (unbiased in a steady state, noisier on short windows)
    request_throughput  finished requests / window
    ttft                first streamed token - send (streaming only)
    itl                 a request's mean time between tokens after the first,
                        (last token - first token) / (completion_tokens - 1) (streaming only)
    e2e                 reply (or last chunk) - send
    peak_token_usage, mean_running, max_running, mean_queued
                        from `/metrics` gauges sampled every `sample_interval`
    cache_hit_rate      from the counters scraped when the window opens and closes

Time. Durations are server time: on the simulator, which runs `--speed` times faster than
the model it simulates, wall-clock durations are multiplied by `time_scale` (the speed read
from `/server_info`, 1 for SGLang), so throughputs and latencies are the modelled GPU's.
`duration`, `sample_interval` and `request_timeout` are server time too. This holds while
the simulator keeps pace (throughput x speed within what the host serves: on two cores
about 8,000 tok/s streamed, 200,000 not); the client's own delays are scaled as well, so
latencies at a high speed carry its overhead times the speed.

Output directory (`OUT`):

    sweep.json                       the parameters, configurations and their commands
    results.csv                      one row per point, rebuilt from the point folders
    <config>/config.json             its arguments, command and ignored flags
    <config>/server.log              the server's log; server_info.json at start
    <config>/c<N>[-r<k>]/            one folder per point: result.json (written last, it
                                     marks the point finished), requests.jsonl,
                                     metrics_before.txt, metrics_after.txt, samples.jsonl,
                                     server_info.json, server.log (the log during the point)

`--resume` skips points whose result.json exists (finished or failed); a failed
configuration is recorded on each of its points and the sweep goes on.

Recommendation. The best configuration by output tok/s among the points within the
latency limits, at the job's concurrency (`projection.concurrency`, else the best
point's), and the generation job's projected time: remaining completion tokens (given,
from a run directory's stats, or from a manifest's budgets) / the measured throughput,
next to the baseline configuration's ("57.0 h -> 18.3 h").
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import msgspec.inspect
import yaml

from workbench import __version__
from workbench.client import SGLangClient, api_key_from_env
from workbench.config import DATASET_NAME_PATTERN, load_yaml_params
from workbench.errors import ConfigError, InputError, LaunchError, RequestFailed
from workbench.launch import (
    HEALTH_PATHS,
    ServerProcess,
    command_line,
    find_free_port,
    server_command,
    split_sim_args,
)
from workbench.metrics import MetricsSnapshot, cache_hit_rate, parse_metrics

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "RESULT_COLUMNS",
    "Command",
    "ConfigChoice",
    "ConfigPlan",
    "GridParams",
    "LatencyLimits",
    "LoadOutcome",
    "LoadParams",
    "LoadPrompt",
    "NamedConfig",
    "PointLoad",
    "PointPlan",
    "PointResult",
    "ProjectionParams",
    "PromptParams",
    "Recommendation",
    "RequestRow",
    "ServerParams",
    "SimParams",
    "SweepSummary",
    "TuningParams",
    "apply_overrides",
    "build_prompts",
    "config_command",
    "configs_frame",
    "curves_frame",
    "default_out",
    "expand_grid",
    "format_commands",
    "format_hours",
    "format_results_table",
    "load_results",
    "load_tuning_params",
    "plan_commands",
    "projection",
    "recommend",
    "recommend_sweep",
    "remaining_from_manifest",
    "remaining_from_run",
    "remaining_tokens_for",
    "results_frame",
    "run_demo_sweep",
    "run_sweep",
    "run_sweep_cli",
    "summarize_point",
    "sweep",
    "sweep_overview",
    "sweep_params",
    "tuning_report",
    "violations",
]

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
ArgValue = str | int | float | bool | None | list[str | int | float]

SWEEP_FILE = "sweep.json"
RESULTS_FILE = "results.csv"
RESULT_FILE = "result.json"
REQUESTS_FILE = "requests.jsonl"
SAMPLES_FILE = "samples.jsonl"
SERVER_LOG = "server.log"
SERVER_INFO = "server_info.json"
MIN_SAMPLE_WALL = 0.05
FLUSH_WAIT_WALL = 60.0
ERROR_PAUSE_WALL = 0.05
DEFAULT_MODEL_PROFILE = "kimi-k2.5"
_SHORT_NAMES = {
    "mem_fraction_static": "mfs",
    "kv_cache_dtype": "kv",
    "max_running_requests": "mrr",
    "chunked_prefill_size": "cps",
    "schedule_policy": "sched",
    "hicache_size": "hicache",
    "hicache_ratio": "hiratio",
    "enable_hierarchical_cache": "hicache",
    "tp_size": "tp",
    "dp_size": "dp",
}
_SECRET_WORDS = ("api_key", "password", "secret", "hf_token", "access_token")


# ============================================================================ parameters


class SimParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Simulator settings, used when the launcher is `sim`."""

    profile: str = "fast"
    speed: Seconds = 1.0
    args: dict[str, ArgValue] = {}


class ServerParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How every configuration's server is started and stopped."""

    launcher: Literal["sglang", "sim"] = "sim"
    model_path: str | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    args: dict[str, ArgValue] = {}
    env: dict[str, str] = {}
    startup_timeout: Seconds = 600.0
    stop_grace: Seconds = 30.0
    health_paths: list[str] = msgspec.field(default_factory=lambda: list(HEALTH_PATHS))
    python: str | None = None
    sim: SimParams = msgspec.field(default_factory=SimParams)


class NamedConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One configuration: server arguments (and environment) on top of the base ones."""

    name: str
    args: dict[str, ArgValue] = {}
    env: dict[str, str] = {}


class GridParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Named configurations and/or a matrix whose product is taken (after them)."""

    configs: list[NamedConfig] = []
    matrix: dict[str, list[Any]] = {}
    baseline: str | None = None


class PromptParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Prompts: random token ids of random lengths, or a dataset manifest's prompts."""

    source: Literal["random", "manifest"] = "random"
    count: Positive = 256
    input_len: list[Positive] = msgspec.field(default_factory=lambda: [256, 1024])
    shared_prefix: NonNegative = 0
    prefix_groups: Positive = 1
    model_profile: str = DEFAULT_MODEL_PROFILE
    manifest: str | None = None
    datasets: list[str] = []
    seed: int = 0


class LoadParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The load of every point (times are server time)."""

    concurrency: list[Positive]
    prompts: PromptParams = msgspec.field(default_factory=PromptParams)
    requests: Positive | None = None
    duration: Seconds | None = None
    warmup_requests: NonNegative = 0
    max_new_tokens: Positive = 2048
    temperature: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    top_k: int = -1
    stream: bool = True
    request_timeout: Seconds = 3600.0
    sample_interval: Seconds = 2.0
    flush_cache: bool = True


class LatencyLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upper limits a recommended point must respect (None: no limit)."""

    ttft_p50_ms: Seconds | None = None
    ttft_p99_ms: Seconds | None = None
    itl_p50_ms: Seconds | None = None
    itl_p99_ms: Seconds | None = None
    e2e_p50_s: Seconds | None = None
    e2e_p99_s: Seconds | None = None
    max_error_rate: Fraction | None = None


class ProjectionParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the generation job's remaining completion tokens come from (first set wins:
    remaining_tokens, run_dir, manifest) and the job's concurrency."""

    remaining_tokens: NonNegative | None = None
    run_dir: str | None = None
    manifest: str | None = None
    mean_completion_tokens: Seconds | None = None
    concurrency: Positive | None = None


class TuningParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A tuning parameter file."""

    load: LoadParams
    server: ServerParams = msgspec.field(default_factory=ServerParams)
    grid: GridParams = msgspec.field(default_factory=GridParams)
    repeats: Positive = 1
    limits: LatencyLimits = msgspec.field(default_factory=LatencyLimits)
    projection: ProjectionParams = msgspec.field(default_factory=ProjectionParams)
    name: str = "sweep"


def load_tuning_params(
    path: str | os.PathLike[str], overrides: Iterable[str] | Mapping[str, Any] = ()
) -> TuningParams:
    """Load, override and check a tuning parameter file; paths come back absolute.

    `overrides` are `key.path=value` strings (values read as YAML) or a mapping of them.
    Every problem is a ConfigError naming the file (or `--set`) and the key.
    """
    source = str(path)
    params = load_yaml_params(Path(path), TuningParams, source=source)
    params = apply_overrides(params, _parse_overrides(overrides))
    _check_params(params, source)
    return _resolve_paths(params, Path(path).resolve().parent)


def _parse_overrides(overrides: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(overrides, Mapping):
        return dict(overrides)
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", f"expected key.path=value, got {item!r}")
        try:
            parsed[key.strip()] = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            parsed[key.strip()] = text
    return parsed


def apply_overrides(params: TuningParams, overrides: Mapping[str, Any]) -> TuningParams:
    """`params` with `{"server.launcher": "sim", ...}` applied, checked key by key."""
    for key, value in overrides.items():
        data = msgspec.to_builtins(params)
        _set_path(data, key.split("."), value, key)
        try:
            params = msgspec.convert(data, TuningParams, str_keys=True)
        except msgspec.ValidationError as exc:
            raise ConfigError(key, _override_message(str(exc), key), "--set") from None
    return params


def _override_message(error: str, key: str) -> str:
    """msgspec's message in the YAML's terms: `unknown key (known: ...)`, `expected float`."""
    message = error.split(" - at ")[0]
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$([^`]*)`)?", error)
    if unknown:
        where = [part for part in re.sub(r"\[\d+\]", "", unknown[2] or "").split(".") if part]
        known = ", ".join(_known_keys(where))
        return f"unknown key {unknown[1]!r} (known: {known})"
    message = re.sub(r"`([^`]*)`", r"\1", message).replace(" | null", "")
    return message[:1].lower() + message[1:]


def _known_keys(parts: Sequence[str]) -> list[str]:
    info: Any = msgspec.inspect.type_info(TuningParams)
    for part in parts:
        field_type = next((f.type for f in getattr(info, "fields", ()) if f.name == part), None)
        if field_type is None:
            return []
        info = field_type
    return sorted(f.name for f in getattr(info, "fields", ()))


def _set_path(data: Any, parts: list[str], value: Any, key: str) -> None:
    for part in parts[:-1]:
        if isinstance(data, dict):
            data = data.setdefault(part, {})
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            raise ConfigError(key, f"no such key {part!r}", "--set")
    last = parts[-1]
    if isinstance(data, list) and last.isdigit() and int(last) < len(data):
        data[int(last)] = value
    elif isinstance(data, dict):
        data[last] = value
    else:
        raise ConfigError(key, f"no such key {last!r}", "--set")


def _check_params(params: TuningParams, source: str) -> None:
    _check_server(params.server, source)
    _check_load(params.load, source)
    names = [config.name for config in expand_grid(params, source=source)]
    baseline = params.grid.baseline
    if baseline is not None and baseline not in names:
        raise ConfigError("grid.baseline", f"no configuration {baseline!r} (known: "
                          f"{', '.join(names)})", source)


def _check_server(server: ServerParams, source: str) -> None:
    if server.launcher == "sglang" and not server.model_path:
        raise ConfigError("server.model_path", "required with launcher sglang", source)
    if server.launcher == "sim":
        from workbench.sim.profiles import get_sim_profile

        try:
            get_sim_profile(server.sim.profile)
        except ConfigError as exc:
            raise ConfigError("server.sim.profile", str(exc).split(": ", 1)[-1], source) from None
    _check_args(server.args, "server.args", source)
    _check_args(server.sim.args, "server.sim.args", source)


def _check_args(args: Mapping[str, Any], key: str, source: str) -> None:
    for name in args:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
            raise ConfigError(f"{key}.{name}", "not a server argument name", source)


def _check_load(load: LoadParams, source: str) -> None:
    if load.requests is None and load.duration is None:
        raise ConfigError("load", "set requests or duration (or both) per point", source)
    if not load.concurrency:
        raise ConfigError("load.concurrency", "at least one concurrency is needed", source)
    if len(set(load.concurrency)) != len(load.concurrency):
        raise ConfigError("load.concurrency", "values must be unique", source)
    prompts = load.prompts
    if len(prompts.input_len) != 2 or prompts.input_len[0] > prompts.input_len[1]:
        raise ConfigError("load.prompts.input_len", "expected [min, max] with min <= max", source)
    if prompts.shared_prefix >= prompts.input_len[0]:
        raise ConfigError("load.prompts.shared_prefix", "must be shorter than input_len's min",
                          source)
    if prompts.source == "manifest" and not prompts.manifest:
        raise ConfigError("load.prompts.manifest", "required with source manifest", source)
    if load.top_k != -1 and load.top_k < 1:
        raise ConfigError("load.top_k", f"expected -1 (off) or >= 1, got {load.top_k}", source)


def _resolve_paths(params: TuningParams, base: Path) -> TuningParams:
    def resolve(value: str | None) -> str | None:
        return None if value is None else str((base / Path(value).expanduser()).resolve())

    prompts = msgspec.structs.replace(params.load.prompts, manifest=resolve(params.load.prompts.manifest))
    projection = msgspec.structs.replace(
        params.projection, run_dir=resolve(params.projection.run_dir),
        manifest=resolve(params.projection.manifest))
    load = msgspec.structs.replace(params.load, prompts=prompts)
    return msgspec.structs.replace(params, load=load, projection=projection)


# ============================================================================ the grid


@dataclass(frozen=True, slots=True)
class ConfigPlan:
    """One configuration as it will run: its merged arguments and environment."""

    name: str
    args: dict[str, Any]
    env: dict[str, str]


def _normalise(args: Mapping[str, Any]) -> dict[str, Any]:
    return {name.replace("-", "_"): value for name, value in args.items()}


def _level(key: str, value: Any, where: str, source: str | None) -> tuple[str, dict[str, Any]]:
    """(name part, arguments) of one matrix value: a flag value or a {name, args} mapping."""
    if isinstance(value, Mapping):
        if set(value) - {"name", "args"} or not isinstance(value.get("name"), str):
            raise ConfigError(where, "expected a value or a mapping {name, args}", source)
        return value["name"], _normalise(value.get("args") or {})
    if isinstance(value, list):
        raise ConfigError(where, "expected a value or a mapping {name, args}", source)
    short = _SHORT_NAMES.get(key, key)
    if isinstance(value, bool):
        return (short if value else f"no{short}"), {key: value}
    return f"{short}{value}", {key: value}


def expand_grid(params: TuningParams, *, source: str | None = None) -> list[ConfigPlan]:
    """The configurations: the named ones, then the matrix's product (named by its values).

    Without either, one configuration `default` with the base arguments.
    """
    base_args = _normalise(params.server.args)
    base_env = dict(params.server.env)
    plans = [ConfigPlan(c.name, {**base_args, **_normalise(c.args)}, {**base_env, **c.env})
             for c in params.grid.configs]
    matrix = params.grid.matrix
    dimensions = []
    for key, values in matrix.items():
        if not values:
            raise ConfigError(f"grid.matrix.{key}", "expected a non-empty list", source)
        dimensions.append([_level(key.replace("-", "_"), value, f"grid.matrix.{key}[{i}]", source)
                           for i, value in enumerate(values)])
    for combo in itertools.product(*dimensions) if dimensions else ():
        args = {**base_args}
        for _, level_args in combo:
            args.update(level_args)
        plans.append(ConfigPlan("-".join(name for name, _ in combo), args, base_env))
    if not plans:
        plans = [ConfigPlan("default", base_args, base_env)]
    _check_names([plan.name for plan in plans], source)
    return plans


def _check_names(names: list[str], source: str | None) -> None:
    seen: set[str] = set()
    for name in names:
        if not DATASET_NAME_PATTERN.fullmatch(name):
            raise ConfigError("grid", f"configuration name {name!r} is not a safe directory "
                              "name (letters, digits, '.', '_', '-')", source)
        if name in seen:
            raise ConfigError("grid", f"two configurations are called {name!r}", source)
        seen.add(name)


@dataclass(frozen=True, slots=True)
class Command:
    """A configuration's server command."""

    config: str
    argv: list[str]
    env: dict[str, str]
    ignored: list[str]
    port: int


def config_command(params: TuningParams, config: ConfigPlan, port: int) -> Command:
    """The argv (and environment) that starts `config`'s server on `port`."""
    server = params.server
    args = {"enable_metrics": True, **config.args}
    ignored: list[str] = []
    if server.launcher == "sim":
        sim = server.sim
        args = {"profile": sim.profile, "speed": sim.speed, **_normalise(sim.args), **args}
        args, ignored = split_sim_args(args)
    argv = server_command(server.launcher, port=port, host=server.host,
                          model_path=server.model_path, args=args,
                          python=server.python or sys.executable)
    return Command(config.name, argv, dict(config.env), ignored, port)


def plan_commands(params: TuningParams) -> list[Command]:
    """Every configuration's command (port 0 in the parameters: a port free right now)."""
    return [config_command(params, config, params.server.port or find_free_port(params.server.host))
            for config in expand_grid(params)]


def format_commands(commands: Sequence[Command]) -> str:
    """The dry-run listing: one commented block per configuration (secrets as ***)."""
    lines: list[str] = []
    for command in commands:
        lines.append(f"# {command.config}")
        if command.ignored:
            flags = " ".join("--" + name.replace("_", "-") for name in command.ignored)
            lines.append(f"# ignored by the simulator: {flags}")
        lines.append(command_line(_redact_argv(command.argv), _redact(command.env)))
    return "\n".join(lines)


# ============================================================================ prompts


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
    from workbench.profiles import get_profile

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
    from workbench.config import load_manifest
    from workbench.profiles import get_profile
    from workbench.prompts import load_prompts

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


# ============================================================================ one point


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
    """A closed loop of `concurrency` workers with a warm-up and a measurement window."""

    def __init__(
        self,
        client: SGLangClient,
        prompts: Sequence[LoadPrompt],
        load: LoadParams,
        concurrency: int,
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
        self._t0 = 0.0
        self._window: list[float | None] = [None, None]
        self._stop = asyncio.Event()
        self._scrapes: dict[str, asyncio.Future[str | None]] = {}
        self._crash: str | None = None
        self._streamed: dict[int, int] = {}  # request index -> tokens streamed so far
        self._base: dict[int, int] = {}  # ... and before the window opened
        self._window_tokens = 0

    def _now(self) -> float:
        return (self.clock() - self._t0) * self.scale

    async def run(self) -> LoadOutcome:
        """Run until the window closes (or the server dies); cancel what is in flight."""
        self._t0 = self.clock()
        if self.load.warmup_requests == 0:
            self._open_window()
        jobs: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self._worker()) for _ in range(self.concurrency)]
        jobs.append(asyncio.ensure_future(self._watch()))
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

    async def _worker(self) -> None:
        while not self._stop.is_set():
            index = self._next
            self._next += 1
            row = await self._request(index, self.prompts[index % len(self.prompts)])
            self._record(row)
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
        start, duration = self._window[0], self.load.duration
        return start is not None and duration is not None and self._now() - start >= duration

    async def _sample(self) -> None:
        text = await self._metrics_text()
        if text is None:
            return
        try:
            snap = parse_metrics(text)
        except ValueError:
            return
        self.samples.append(Sample(self._now(), snap.running, snap.queued, snap.token_usage))


# ============================================================================ results


class PointResult(msgspec.Struct, kw_only=True):
    """One point's figures (result.json); None where nothing was measured."""

    config: str
    concurrency: int
    repeat: int = 1
    status: str = "ok"
    reason: str | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p99_s: float | None = None
    max_total_num_tokens: int | None = None
    peak_token_usage: float | None = None
    mean_running: float | None = None
    max_running: float | None = None
    mean_queued: float | None = None
    cache_hit_rate: float | None = None
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    window_s: float | None = None
    time_scale: float = 1.0
    kv_cache_dtype: str | None = None
    within_limits: bool | None = None
    args: dict[str, Any] = {}
    finished_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RESULT_COLUMNS = tuple(name for name in PointResult.__struct_fields__ if name != "finished_at")


def _percentile(values: Sequence[float], q: float, factor: float = 1.0) -> float | None:
    if not values:
        return None
    import numpy as np

    return round(float(np.percentile(values, q)) * factor, 4)


def _error_summary(rows: Sequence[RequestRow]) -> str | None:
    errors = [row for row in rows if not row.ok]
    if not errors:
        return None
    kinds = Counter(row.error_type for row in errors)
    kind, count = kinds.most_common(1)[0]
    example = next(row.message for row in errors if row.error_type == kind)
    return f"{count} x {kind}: {example}"


def _gauges(samples: Sequence[Sample], start: float, end: float) -> dict[str, Any]:
    inside = [s for s in samples if start <= s.t <= end] or list(samples[-1:])
    running = [s.running for s in inside if s.running is not None]
    queued = [s.queued for s in inside if s.queued is not None]
    usage = [s.token_usage for s in inside if s.token_usage is not None]
    return {
        "peak_token_usage": round(max(usage), 4) if usage else None,
        "mean_running": round(sum(running) / len(running), 2) if running else None,
        "max_running": max(running) if running else None,
        "mean_queued": round(sum(queued) / len(queued), 2) if queued else None,
    }


def _snapshot(text: str | None) -> MetricsSnapshot | None:
    if text is None:
        return None
    try:
        return parse_metrics(text)
    except ValueError:
        return None


def summarize_point(
    outcome: LoadOutcome, *, config: str, concurrency: int, repeat: int, time_scale: float
) -> PointResult:
    """The point's figures from its load outcome (server info fields are added later)."""
    measured = [row for row in outcome.rows if row.phase == "measured"]
    ok = [row for row in measured if row.ok]
    start, end = outcome.window_start, outcome.window_end
    window = (end - start) if start is not None and end is not None else None
    tokens = outcome.window_tokens
    if tokens is None:
        tokens = sum(row.completion_tokens or 0 for row in ok)
    before, after = _snapshot(outcome.before), _snapshot(outcome.after)
    result = PointResult(
        config=config, concurrency=concurrency, repeat=repeat, requests=len(ok),
        errors=len(measured) - len(ok), output_tokens=tokens, time_scale=time_scale,
        window_s=round(window, 3) if window is not None else None,
        cache_hit_rate=_rounded(cache_hit_rate(after, before) if after else None),
        finished_at=time.time(),
        **_latencies(ok),
        **(_gauges(outcome.samples, start or 0.0, end or math.inf) if outcome.samples else {}),
    )
    if window and ok:
        result.output_throughput = round(tokens / window, 3)
        result.request_throughput = round(len(ok) / window, 5)
    _set_status(result, outcome, measured)
    return result


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _latencies(rows: Sequence[RequestRow]) -> dict[str, Any]:
    ttft = [row.ttft_s for row in rows if row.ttft_s is not None]
    itl = [row.itl_s for row in rows if row.itl_s is not None]
    e2e = [row.e2e_s for row in rows]
    figures: dict[str, Any] = {}
    for q in (50, 90, 99):
        figures[f"ttft_p{q}_ms"] = _percentile(ttft, q, 1000.0)
        figures[f"itl_p{q}_ms"] = _percentile(itl, q, 1000.0)
        figures[f"e2e_p{q}_s"] = _percentile(e2e, q)
    return figures


def _set_status(result: PointResult, outcome: LoadOutcome, measured: list[RequestRow]) -> None:
    if outcome.crash is not None:
        result.status, result.reason = "failed", outcome.crash
    elif result.requests == 0:
        errors = _error_summary(measured or outcome.rows)
        result.status = "failed"
        result.reason = f"no request finished in the window: {errors or 'no reply'}"
    else:
        result.reason = _error_summary(measured)


def failed_point(config: str, concurrency: int, repeat: int, reason: str,
                 args: Mapping[str, Any]) -> PointResult:
    """A point that could not run (its server did not start or died before it)."""
    return PointResult(config=config, concurrency=concurrency, repeat=repeat, status="failed",
                       reason=reason, args=dict(args), finished_at=time.time())


def violations(result: PointResult, limits: LatencyLimits) -> list[str]:
    """The limits a point exceeds (`ttft_p99_ms 1234 > 1000`); unmeasured figures pass."""
    found = []
    for name in LatencyLimits.__struct_fields__:
        limit = getattr(limits, name)
        if limit is None:
            continue
        if name == "max_error_rate":
            total = result.requests + result.errors
            value = result.errors / total if total else None
        else:
            value = getattr(result, name)
        if value is not None and value > limit:
            found.append(f"{name} {value:,.6g} > {limit:,.6g}")
    return found


# ============================================================================ output directory


@dataclass(frozen=True, slots=True)
class PointPlan:
    """One point of the sweep and its folder."""

    config: str
    concurrency: int
    repeat: int
    folder: Path

    @property
    def result_path(self) -> Path:
        return self.folder / RESULT_FILE


def plan_points(out: Path, configs: Sequence[ConfigPlan], load: LoadParams,
                repeats: int) -> dict[str, list[PointPlan]]:
    """Every configuration's points, concurrency ascending, repeats innermost."""
    points: dict[str, list[PointPlan]] = {}
    for config in configs:
        points[config.name] = [
            PointPlan(config.name, c, r, out / config.name / _point_folder(c, r, repeats))
            for c in sorted(load.concurrency) for r in range(1, repeats + 1)
        ]
    return points


def _point_folder(concurrency: int, repeat: int, repeats: int) -> str:
    return f"c{concurrency}" if repeats == 1 else f"c{concurrency}-r{repeat}"


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_json(path: Path, value: Any) -> None:
    _write_atomic(path, msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")


def _redact(value: Any) -> Any:
    """A copy with the values of secret-looking keys (api_key, ...) replaced by '***'."""
    if isinstance(value, Mapping):
        return {k: ("***" if any(w in str(k).lower() for w in _SECRET_WORDS) else _redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _redact_argv(argv: Sequence[str]) -> list[str]:
    out = list(argv)
    for i, part in enumerate(out[:-1]):
        if part.startswith("--") and any(w in part.lower().replace("-", "_") for w in _SECRET_WORDS):
            out[i + 1] = "***"
    return out


def read_point(plan: PointPlan) -> PointResult | None:
    """The point's result, or None when it has not finished."""
    try:
        return msgspec.json.decode(plan.result_path.read_bytes(), type=PointResult)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_results_csv(out: Path, results: Sequence[PointResult]) -> Path:
    """results.csv from the given points (written whole, then renamed into place)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RESULT_COLUMNS)
    for result in results:
        writer.writerow([_cell(getattr(result, name)) for name in RESULT_COLUMNS])
    path = out / RESULTS_FILE
    _write_atomic(path, buffer.getvalue().encode())
    return path


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sweep_record(params: TuningParams, commands: Sequence[Command],
                  points: Mapping[str, list[PointPlan]]) -> dict[str, Any]:
    return {
        "workbench_version": __version__,
        "created": time.time(),
        "params": _redact(msgspec.to_builtins(params)),
        "configs": [{"name": c.config, "command": command_line(_redact_argv(c.argv)),
                     "env": sorted(c.env), "ignored": c.ignored} for c in commands],
        "points": [str(p.folder.relative_to(p.folder.parent.parent))
                   for plans in points.values() for p in plans],
    }


def load_results(out: str | os.PathLike[str]) -> list[PointResult]:
    """The finished points of a sweep directory, in the sweep's order (failed ones included);
    InputError when there is no such directory."""
    root = Path(out)
    if not root.is_dir():
        raise InputError(f"{root}: no such sweep directory")
    record = _read_sweep_record(root)
    if record is not None:
        folders = [root / rel for rel in record.get("points", [])]
    else:
        folders = sorted(path.parent for path in root.glob(f"*/*/{RESULT_FILE}"))
    results = []
    for folder in folders:
        result = read_point(PointPlan("", 0, 0, folder))
        if result is not None:
            results.append(result)
    return results


def _read_sweep_record(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sweep_params(out: str | os.PathLike[str]) -> TuningParams:
    """The parameters a sweep directory was run with (from its sweep.json)."""
    record = _read_sweep_record(Path(out))
    if record is None:
        raise InputError(f"{out}: no {SWEEP_FILE} (not a sweep directory)")
    return msgspec.convert(record["params"], TuningParams)


def results_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """The points as a DataFrame with the results.csv columns (config kept in sweep order)."""
    import pandas as pd

    rows = [{name: getattr(r, name) for name in RESULT_COLUMNS} for r in results]
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    order = list(dict.fromkeys(frame["config"]))
    frame["config"] = pd.Categorical(frame["config"], categories=order, ordered=True)
    return frame


CURVE_COLUMNS = ("output_throughput", "request_throughput", "ttft_p50_ms", "ttft_p99_ms",
                 "itl_p50_ms", "itl_p99_ms", "e2e_p50_s", "e2e_p99_s", "peak_token_usage",
                 "mean_running", "max_running", "mean_queued", "cache_hit_rate")


def curves_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per configuration and concurrency over the finished points (repeats
    averaged): the figures the throughput, latency and usage plots draw."""
    frame = results_frame([r for r in results if r.ok])
    if frame.empty:
        return frame[["config", "concurrency", *CURVE_COLUMNS]]
    curves = frame.groupby(["config", "concurrency"], observed=True, sort=True)[
        list(CURVE_COLUMNS)].mean().reset_index()
    curves["config"] = curves["config"].cat.set_categories(
        list(dict.fromkeys(r.config for r in results)), ordered=True)
    return curves.sort_values(["config", "concurrency"], ignore_index=True)


def configs_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per configuration: status (ok when a point ran), KV capacity, KV dtype,
    arguments and, for a failed one, the first failure's reason."""
    import pandas as pd

    rows = []
    for name in dict.fromkeys(r.config for r in results):
        points = [r for r in results if r.config == name]
        ok = [r for r in points if r.ok]
        first = (ok or points)[0]
        rows.append({"config": name, "status": "ok" if ok else "failed",
                     "max_total_num_tokens": first.max_total_num_tokens,
                     "kv_cache_dtype": first.kv_cache_dtype,
                     "args": json.dumps(first.args, sort_keys=True),
                     "reason": None if ok else first.reason})
    frame = pd.DataFrame(rows, columns=["config", "status", "max_total_num_tokens",
                                        "kv_cache_dtype", "args", "reason"])
    frame["config"] = pd.Categorical(frame["config"], categories=list(frame["config"]),
                                     ordered=True)
    return frame


def sweep_overview(out: str | os.PathLike[str]) -> dict[str, Any]:
    """The facts a report header shows about a sweep directory."""
    root = Path(out)
    record = _read_sweep_record(root) or {}
    params = record.get("params", {})
    server = params.get("server", {})
    load = params.get("load", {})
    launcher = server.get("launcher", "-")
    if launcher == "sim":
        sim = server.get("sim", {})
        launcher = f"simulator, profile {sim.get('profile')}, speed {sim.get('speed')}"
    results = load_results(root)
    return {
        "name": params.get("name", root.name), "out": str(root.resolve()),
        "launcher": launcher, "model": server.get("model_path") or "-",
        "configs": len(record.get("configs", [])), "points": len(record.get("points", [])),
        "finished": len(results), "failed": sum(1 for r in results if not r.ok),
        "concurrency": load.get("concurrency", []), "stream": load.get("stream"),
        "created": record.get("created"),
    }


# ============================================================================ the sweep


@dataclass(slots=True)
class SweepSummary:
    """What a sweep did."""

    out: Path
    results: list[PointResult]
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False


Say = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


@dataclass(slots=True)
class _Sweep:
    params: TuningParams
    out: Path
    prompts: list[LoadPrompt]
    say: Say
    summary: SweepSummary
    configs: list[ConfigPlan] = field(default_factory=list)
    points: dict[str, list[PointPlan]] = field(default_factory=dict)

    def finish_point(self, plan: PointPlan, result: PointResult) -> None:
        result.within_limits = not violations(result, self.params.limits) if result.ok else None
        _write_json(plan.result_path, result)
        self.summary.ran += 1
        self.summary.failed += 0 if result.ok else 1
        self.rebuild()
        self.say(_point_line(result))

    def rebuild(self) -> None:
        results = [r for plans in self.points.values() for p in plans
                   if (r := read_point(p)) is not None]
        for result in results:
            result.within_limits = (not violations(result, self.params.limits)
                                    if result.ok else None)
        self.summary.results = results
        write_results_csv(self.out, results)


def _point_line(result: PointResult) -> str:
    where = f"{result.config} c={result.concurrency}" + (
        f" r{result.repeat}" if result.repeat > 1 else "")
    if not result.ok:
        return f"{where}: failed: {result.reason}"
    ttft = f", TTFT p50 {result.ttft_p50_ms:.0f} ms" if result.ttft_p50_ms is not None else ""
    return (f"{where}: {result.output_throughput or 0:,.0f} output tok/s, "
            f"{result.mean_running or 0:.0f} running, e2e p50 {result.e2e_p50_s or 0:.1f} s"
            f"{ttft}, {result.errors} errors")


async def sweep(
    params: TuningParams,
    out: str | os.PathLike[str],
    *,
    resume: bool = False,
    say: Say = _quiet,
) -> SweepSummary:
    """Run the sweep (async). Every server it starts is stopped before this returns,
    also when it is cancelled; results.csv is rebuilt after every point."""
    root = Path(out)
    run = _prepare(params, root, resume, say)
    try:
        for config in run.configs:
            pending = [p for p in run.points[config.name] if read_point(p) is None]
            run.summary.skipped += len(run.points[config.name]) - len(pending)
            if pending:
                await _run_config(run, config, pending)
    except asyncio.CancelledError:
        run.summary.interrupted = True
        raise
    finally:
        run.rebuild()
    return run.summary


def _prepare(params: TuningParams, root: Path, resume: bool, say: Say) -> _Sweep:
    configs = expand_grid(params)
    points = plan_points(root, configs, params.load, params.repeats)
    finished = [p for plans in points.values() for p in plans if p.result_path.exists()]
    if finished and not resume:
        raise InputError(f"{root} already holds sweep results ({len(finished)} points): "
                         "pass --resume to continue that sweep, or choose another --out")
    if resume:
        _check_resumable(root, params, configs, points)
    run = _Sweep(params, root, build_prompts(params.load.prompts), say, SweepSummary(root, []),
                 configs, points)
    commands = [config_command(params, c, params.server.port) for c in configs]
    _write_json(root / SWEEP_FILE, _sweep_record(params, commands, points))
    return run


def _check_resumable(root: Path, params: TuningParams, configs: Sequence[ConfigPlan],
                     points: Mapping[str, list[PointPlan]]) -> None:
    """Refuse to mix points measured under other arguments or another load."""
    record = _read_sweep_record(root)
    if record is not None:
        old_load = dict(record.get("params", {}).get("load", {}))
        new_load = msgspec.to_builtins(params.load)
        old_load.pop("concurrency", None)
        new_load.pop("concurrency", None)
        if old_load and old_load != new_load:
            raise InputError(f"{root}: the finished points were measured with other load "
                             "parameters; use another --out for this load")
    by_name = {c.name: c for c in configs}
    for name, plans in points.items():
        for plan in plans:
            result = read_point(plan)
            if result is not None and result.args and result.args != _jsonable(by_name[name].args):
                raise InputError(f"{plan.folder}: measured with other server arguments than "
                                 f"configuration {name!r} has now; use another --out")


def _jsonable(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


async def _run_config(run: _Sweep, config: ConfigPlan, pending: list[PointPlan]) -> None:
    """Launch the configuration's server, run its pending points, stop the server."""
    params = run.params
    port = params.server.port or find_free_port(params.server.host)
    command = config_command(params, config, port)
    folder = run.out / config.name
    server = ServerProcess(command.argv, url=f"http://{_url_host(params.server.host)}:{port}",
                           log_path=folder / SERVER_LOG, env=command.env,
                           health_path=params.server.health_paths)
    run.say(f"{config.name}: starting {command_line(_redact_argv(command.argv))}")
    try:
        server.start()
    except LaunchError as exc:
        _fail_points(run, config, pending, str(exc))
        return
    _write_json(folder / "config.json", {
        "name": config.name, "args": _redact(config.args), "env": sorted(config.env),
        "command": command_line(_redact_argv(command.argv)), "ignored": command.ignored,
        "url": server.url, "pid": server.pid, "started": time.time()})
    try:
        await _serve_points(run, config, pending, server)
    finally:
        server.stop(params.server.stop_grace)
        with contextlib.suppress(LaunchError):
            server.wait_port_free(port, params.server.host)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


async def _serve_points(run: _Sweep, config: ConfigPlan, pending: list[PointPlan],
                        server: ServerProcess) -> None:
    try:
        await server.wait_ready_async(run.params.server.startup_timeout)
    except LaunchError as exc:
        _fail_points(run, config, pending, str(exc))
        return
    api_key = _api_key(config.args)
    timeout = _client_timeout(run.params)
    async with SGLangClient(server.url, api_key=api_key, timeout=timeout) as client:
        try:
            info = await client.server_info()
        except RequestFailed as exc:
            _fail_points(run, config, pending, f"/server_info failed: {exc}")
            return
        _write_json(run.out / config.name / SERVER_INFO, info)
        for index, plan in enumerate(pending):
            result = await _run_point(run, config, plan, client, server, info)
            run.finish_point(plan, result)
            crash = server.exit_reason()
            if crash is not None:
                _fail_points(run, config, pending[index + 1:], f"not run: {crash}")
                return


def _api_key(args: Mapping[str, Any]) -> str | None:
    key = args.get("api_key")
    return str(key) if key else api_key_from_env()


def _client_timeout(params: TuningParams) -> Any:
    import httpx

    scale = params.server.sim.speed if params.server.launcher == "sim" else 1.0
    return httpx.Timeout(connect=10.0, read=params.load.request_timeout / scale, write=60.0,
                         pool=None)


def _fail_points(run: _Sweep, config: ConfigPlan, plans: Sequence[PointPlan], reason: str) -> None:
    for plan in plans:
        run.finish_point(plan, failed_point(config.name, plan.concurrency, plan.repeat, reason,
                                            _jsonable(config.args)))


def _time_scale(run: _Sweep, info: Mapping[str, Any]) -> float:
    speed = info.get("speed")
    if run.params.server.launcher == "sim" and isinstance(speed, int | float) and speed > 0:
        return float(speed)
    return 1.0


async def _run_point(run: _Sweep, config: ConfigPlan, plan: PointPlan, client: SGLangClient,
                     server: ServerProcess, info: Mapping[str, Any]) -> PointResult:
    load = run.params.load
    scale = _time_scale(run, info)
    plan.folder.mkdir(parents=True, exist_ok=True)
    if load.flush_cache:
        await _flush(client)
    log_start = server.log_size()
    outcome = await PointLoad(client, run.prompts, load, plan.concurrency, time_scale=scale,
                              server_exit=server.exit_reason).run()
    result = summarize_point(outcome, config=config.name, concurrency=plan.concurrency,
                             repeat=plan.repeat, time_scale=scale)
    result.args = _jsonable(config.args)
    await _point_files(plan, outcome, server, log_start, client, result, info)
    return result


async def _flush(client: SGLangClient) -> bool:
    """Flush the prefix cache, retrying while the server still finishes cancelled requests."""
    deadline = time.monotonic() + FLUSH_WAIT_WALL
    while True:
        try:
            if await client.flush_cache():
                return True
        except RequestFailed:
            return False
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)


async def _point_files(plan: PointPlan, outcome: LoadOutcome, server: ServerProcess,
                       log_start: int, client: SGLangClient, result: PointResult,
                       start_info: Mapping[str, Any]) -> None:
    """Write the point's folder (everything but result.json) and complete the result."""
    folder = plan.folder
    rows = b"".join(msgspec.json.encode(row) + b"\n" for row in outcome.rows)
    _write_atomic(folder / REQUESTS_FILE, rows)
    samples = b"".join(msgspec.json.encode(s) + b"\n" for s in outcome.samples)
    _write_atomic(folder / SAMPLES_FILE, samples)
    _write_atomic(folder / "metrics_before.txt", (outcome.before or "").encode())
    _write_atomic(folder / "metrics_after.txt", (outcome.after or "").encode())
    _write_atomic(folder / SERVER_LOG, server.read_log(log_start))
    info = dict(start_info)
    if server.exit_reason() is None:
        with contextlib.suppress(RequestFailed):
            info = await client.server_info()
    _write_json(folder / SERVER_INFO, info)
    _complete_from_info(result, info)


def _complete_from_info(result: PointResult, info: Mapping[str, Any]) -> None:
    tokens = info.get("max_total_num_tokens")
    result.max_total_num_tokens = int(tokens) if isinstance(tokens, int | float) else None
    states = info.get("internal_states")
    dtype = info.get("kv_cache_dtype")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        dtype = states[0].get("kv_cache_dtype", dtype)
    result.kv_cache_dtype = str(dtype) if dtype is not None else None


# ============================================================================ blocking entry points


def run_sweep(
    params: TuningParams | str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    resume: bool = False,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    say: Say = _quiet,
) -> SweepSummary:
    """Run a sweep to the end (blocking). Inside a running event loop (a notebook) it runs
    in a thread of its own."""
    if not isinstance(params, TuningParams):
        params = load_tuning_params(params, overrides)
    coroutine = sweep(params, out, resume=resume, say=say)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    return _in_thread(coroutine)


def _in_thread(coroutine: Awaitable[SweepSummary]) -> SweepSummary:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="workbench-sweep")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def default_out(params_file: str | os.PathLike[str]) -> Path:
    """outputs/tuning/<name>: params/tuning.sim.yaml -> outputs/tuning/sim."""
    stem = Path(params_file).name.removesuffix(".yaml").removesuffix(".yml")
    return Path("outputs/tuning") / (stem.removeprefix("tuning.") or "sweep")


def run_sweep_cli(
    params_file: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    dry_run: bool = False,
    resume: bool = False,
    overrides: Iterable[str] = (),
    say: Say,
) -> int:
    """`workbench tune`: print the commands (dry run) or run the sweep with SIGINT/SIGTERM
    stopping it cleanly (servers stopped, results kept). Returns the exit code (130 when
    interrupted). Bad parameters raise ConfigError for the CLI's one-line message."""
    params = load_tuning_params(params_file, overrides)
    if dry_run:
        say(format_commands(plan_commands(params)))
        return 0
    root = Path(out) if out is not None else default_out(params_file)
    summary = asyncio.run(_interruptible(params, root, resume, say))
    say(format_results_table(summary.results))
    say(recommend_sweep(root, results=summary.results).text)
    say(f"results: {root / RESULTS_FILE}")
    return 130 if summary.interrupted else 0


async def _interruptible(params: TuningParams, root: Path, resume: bool, say: Say) -> SweepSummary:
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(sweep(params, root, resume=resume, say=say))
    stopping: list[int] = []

    def on_signal(signum: int) -> None:
        if not stopping:
            say(f"{signal.Signals(signum).name}: stopping the sweep (servers are being stopped)")
            inner.cancel()
        stopping.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await inner
    except asyncio.CancelledError:
        if not stopping:
            raise
        results = load_results(root)
        return SweepSummary(root, results, interrupted=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


# ============================================================================ recommendation


def projection(remaining_tokens: float, tok_s: float) -> float:
    """Hours to generate `remaining_tokens` completion tokens at `tok_s` output tok/s."""
    if tok_s <= 0:
        raise ValueError("throughput must be positive")
    return remaining_tokens / tok_s / 3600.0


def format_hours(hours: float | None) -> str:
    """`57.0 h`; under an hour `12.5 min`, under a minute `40 s`; `-` when unknown."""
    if hours is None:
        return "-"
    if hours >= 1:
        return f"{hours:,.1f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def remaining_from_run(run_dir: str | os.PathLike[str],
                       mean_completion_tokens: float | None = None) -> int:
    """Completion tokens a generation run still has to produce, from its stats: a dataset's
    token budget left, else its records left times its mean completion."""
    from workbench.stats import collect_stats

    stats = collect_stats(run_dir)
    total = 0.0
    for ds in stats.datasets.values():
        if ds.max_tokens is not None:
            total += max(0, ds.max_tokens - ds.completion_tokens)
            continue
        mean = ds.avg_completion_tokens or mean_completion_tokens
        if ds.remaining_records and mean is None:
            raise InputError(f"{run_dir}: {ds.name} has no finished record to take a mean "
                             "completion length from; set projection.mean_completion_tokens")
        total += (ds.remaining_records or 0) * (mean or 0)
    return int(total)


def remaining_from_manifest(manifest_path: str | os.PathLike[str],
                            mean_completion_tokens: float | None = None) -> int:
    """Completion tokens of a whole job from its manifest: a dataset's `max_tokens`, else its
    prompts (`max_samples` at most) times `mean_completion_tokens`."""
    from workbench.config import load_manifest

    manifest = load_manifest(Path(manifest_path))
    total = 0.0
    for ds in manifest.datasets:
        if ds.max_tokens is not None:
            total += ds.max_tokens
            continue
        if mean_completion_tokens is None:
            raise ConfigError("projection.mean_completion_tokens",
                              f"needed for dataset {ds.name} (it has no max_tokens)")
        rows = _count_rows(Path(ds.path))
        total += min(rows, ds.max_samples or rows) * mean_completion_tokens
    return int(total)


def _count_rows(path: Path) -> int:
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


@dataclass(frozen=True, slots=True)
class ConfigChoice:
    """One configuration at the chosen concurrency (repeats averaged)."""

    config: str
    concurrency: int | None
    status: str
    output_throughput: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    e2e_p50_s: float | None
    max_total_num_tokens: int | None
    mean_running: float | None
    violations: tuple[str, ...]
    hours: float | None
    ratio: float | None
    reason: str | None = None

    @property
    def eligible(self) -> bool:
        return self.status == "ok" and not self.violations and self.output_throughput is not None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The best configuration, the baseline, and the job's projected time for each."""

    best: str | None
    baseline: str | None
    concurrency: int | None
    remaining_tokens: int | None
    remaining_source: str
    rows: tuple[ConfigChoice, ...]
    note: str | None = None

    def row(self, name: str | None) -> ConfigChoice | None:
        return next((r for r in self.rows if r.config == name), None)

    @property
    def best_hours(self) -> float | None:
        row = self.row(self.best)
        return row.hours if row else None

    @property
    def baseline_hours(self) -> float | None:
        row = self.row(self.baseline)
        return row.hours if row else None

    @property
    def projection_text(self) -> str:
        """`57.0 h -> 18.3 h` (baseline -> best)."""
        return f"{format_hours(self.baseline_hours)} -> {format_hours(self.best_hours)}"

    @property
    def text(self) -> str:
        if self.best is None:
            return f"no configuration within the limits{f' ({self.note})' if self.note else ''}"
        best = self.row(self.best)
        assert best is not None
        head = (f"recommended: {self.best} at concurrency {self.concurrency}: "
                f"{best.output_throughput:,.0f} output tok/s")
        if best.ratio is not None and self.baseline != self.best:
            head += f" ({best.ratio:.2f}x {self.baseline})"
        if self.remaining_tokens is None:
            return head + (f"; no projection: {self.note}" if self.note else "")
        source = f" ({self.remaining_source})" if self.remaining_source else ""
        return (f"{head}; job of {self.remaining_tokens:,} completion tokens{source}: "
                f"{self.projection_text}")

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "baseline": self.baseline, "concurrency": self.concurrency,
                "remaining_tokens": self.remaining_tokens, "remaining_source": self.remaining_source,
                "projection": self.projection_text, "text": self.text, "note": self.note,
                "rows": [_choice_dict(r) for r in self.rows]}


def _choice_dict(row: ConfigChoice) -> dict[str, Any]:
    return {name: getattr(row, name) for name in ConfigChoice.__slots__} | {
        "violations": list(row.violations)}


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _choice(config: str, concurrency: int | None, points: Sequence[PointResult],
            limits: LatencyLimits) -> ConfigChoice:
    ok = [p for p in points if p.ok]
    if not ok:
        reason = points[0].reason if points else "not measured"
        return ConfigChoice(config, concurrency, "failed", None, None, None, None, None, None,
                            (), None, None, reason)
    means: dict[str, Any] = {name: _mean(getattr(p, name) for p in ok) for name in (
        "output_throughput", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
        "e2e_p50_s", "e2e_p99_s", "mean_running")}
    merged = PointResult(config=config, concurrency=concurrency or 0,
                         requests=sum(p.requests for p in ok), errors=sum(p.errors for p in ok),
                         **means)
    tokens = ok[0].max_total_num_tokens
    return ConfigChoice(config, concurrency, "ok", _rounded(merged.output_throughput, 1),
                        merged.ttft_p99_ms, merged.itl_p50_ms, merged.e2e_p50_s, tokens,
                        merged.mean_running, tuple(violations(merged, limits)), None, None)


def recommend(
    results: Sequence[PointResult],
    *,
    limits: LatencyLimits | None = None,
    baseline: str | None = None,
    concurrency: int | None = None,
    remaining_tokens: int | None = None,
    remaining_source: str = "",
    note: str | None = None,
) -> Recommendation:
    """The best configuration within `limits` at `concurrency` (default: that of the best
    point within the limits), with each configuration's projected hours and its ratio to
    `baseline` (default: the first configuration)."""
    limits = limits or LatencyLimits()
    configs = list(dict.fromkeys(r.config for r in results))
    baseline = baseline or (configs[0] if configs else None)
    chosen = concurrency if concurrency is not None else _best_concurrency(results, limits)
    rows = [_choice(c, chosen, [r for r in results if r.config == c and r.concurrency == chosen],
                    limits) for c in configs]
    eligible = [r for r in rows if r.eligible]
    best = max(eligible, key=lambda r: r.output_throughput or 0.0).config if eligible else None
    base_tok = next((r.output_throughput for r in rows if r.config == baseline), None)
    rows = [_with_projection(r, remaining_tokens, base_tok) for r in rows]
    return Recommendation(best, baseline, chosen, remaining_tokens, remaining_source, tuple(rows),
                          note)


def _best_concurrency(results: Sequence[PointResult], limits: LatencyLimits) -> int | None:
    candidates = [r for r in results if r.ok and r.output_throughput is not None
                  and not violations(r, limits)]
    if not candidates:
        return max((r.concurrency for r in results), default=None)
    return max(candidates, key=lambda r: r.output_throughput or 0.0).concurrency


def _with_projection(row: ConfigChoice, remaining: int | None, base_tok: float | None) -> ConfigChoice:
    tok = row.output_throughput
    hours = projection(remaining, tok) if remaining is not None and tok else None
    ratio = tok / base_tok if tok and base_tok else None
    return dataclasses.replace(row, hours=hours, ratio=ratio)


def remaining_tokens_for(params: ProjectionParams) -> tuple[int | None, str, str | None]:
    """(remaining tokens, where they come from, why there are none)."""
    try:
        if params.remaining_tokens is not None:
            return params.remaining_tokens, "given", None
        if params.run_dir is not None:
            return (remaining_from_run(params.run_dir, params.mean_completion_tokens),
                    f"left in {params.run_dir}", None)
        if params.manifest is not None:
            return (remaining_from_manifest(params.manifest, params.mean_completion_tokens),
                    f"budgets of {params.manifest}", None)
    except (InputError, OSError) as exc:
        return None, "", str(exc)
    return None, "", "no projection source (projection.remaining_tokens, run_dir or manifest)"


def recommend_sweep(out: str | os.PathLike[str],
                    results: Sequence[PointResult] | None = None) -> Recommendation:
    """The recommendation for a sweep directory, with its own limits and projection."""
    params = sweep_params(out)
    results = load_results(out) if results is None else results
    remaining, source, note = remaining_tokens_for(params.projection)
    return recommend(results, limits=params.limits, baseline=params.grid.baseline,
                     concurrency=params.projection.concurrency, remaining_tokens=remaining,
                     remaining_source=source, note=note)


def format_results_table(results: Sequence[PointResult]) -> str:
    """The points as a plain-text table."""
    from workbench.stats import format_table

    headers = ["config", "conc", "status", "tok/s", "req/s", "running", "KV tokens",
               "peak usage", "TTFT p50 ms", "ITL p50 ms", "e2e p50 s", "hit rate", "errors"]
    rows = [[r.config, str(r.concurrency), r.status, _fmt(r.output_throughput, ",.0f"),
             _fmt(r.request_throughput, ".3f"), _fmt(r.mean_running, ".1f"),
             _fmt(r.max_total_num_tokens, ",.0f"), _fmt(r.peak_token_usage, ".2f"),
             _fmt(r.ttft_p50_ms, ",.0f"), _fmt(r.itl_p50_ms, ".1f"), _fmt(r.e2e_p50_s, ",.1f"),
             _fmt(r.cache_hit_rate, ".2f"), str(r.errors)] for r in results]
    return format_table(headers, rows)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# ============================================================================ report


def tuning_report(sweep_dir: str | os.PathLike[str],
                  out_dir: str | os.PathLike[str] = "outputs/reports") -> Any:
    """The throughput_tuning notebook executed on a sweep directory (a ReportResult);
    InputError before any kernel starts when `sweep_dir` holds no sweep."""
    from workbench.reports import run_report

    if _read_sweep_record(Path(sweep_dir)) is None:
        raise InputError(f"{sweep_dir}: no {SWEEP_FILE} (not a sweep directory)")
    return run_report("throughput_tuning", None, {"sweep_dir": str(Path(sweep_dir).resolve())},
                      out_dir)


DEMO_OVERRIDES: dict[str, Any] = {"load.concurrency": [16, 64], "load.duration": 15,
                                  "load.warmup_requests": 16}


def run_demo_sweep(
    out: str | os.PathLike[str],
    report_dir: str | os.PathLike[str],
    *,
    params_file: str | os.PathLike[str] | None = None,
    say: Say = _quiet,
) -> Any:
    """`workbench demo`'s tuning part: params/tuning.sim.yaml (the checkout's, by default) at
    two concurrencies (about a minute; resumed when `out` holds it already), then its report
    (a ReportResult)."""
    if params_file is None:
        from workbench.reports import notebooks_dir

        params_file = notebooks_dir().parent / "params" / "tuning.sim.yaml"
    run_sweep(params_file, out, resume=True, overrides=DEMO_OVERRIDES, say=say)
    return tuning_report(out, report_dir)
