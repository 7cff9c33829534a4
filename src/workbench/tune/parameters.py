"""The tuning parameter file (`load_tuning_params`), its overrides and checks, the grid of
configurations and their server commands.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect
import yaml

from workbench.config import DATASET_NAME_PATTERN, load_yaml_params, load_yaml_text, with_line
from workbench.errors import ConfigError
from workbench.server.launch import command_line, find_free_port
from workbench.server.spec import (
    ArgValue,
    Command,
    ConfigPlan,
    Seconds,
    ServerParams,
    SimParams,
    check_server,
    config_command,
    load_server_params,
    normalise_args,
    redact,
    redact_argv,
    resolve_server,
)

__all__ = [
    "Command",
    "ConfigPlan",
    "FidelityParams",
    "GridParams",
    "LatencyLimits",
    "LoadParams",
    "NamedConfig",
    "ProjectionParams",
    "PromptParams",
    "ServerParams",
    "SimParams",
    "TuningParams",
    "apply_overrides",
    "config_command",
    "expand_grid",
    "format_commands",
    "load_server_params",
    "load_tuning_params",
    "plan_commands",
]

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]

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

    concurrency: list[Positive | Literal["auto"]]  # "auto": the generation job's auto mode
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
    gpus: Positive | None = None  # GPUs of the job's server (default: from /server_info)


class FidelityParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fidelity probe (`workbench.tune.fidelity`): `prompts` of the load's prompts (a
    seeded draw; 0: no probe) sent at temperature 0 with logprobs to every configuration,
    `concurrency` at a time, after its points; the baseline is probed again after a restart
    (its noise floor). A configuration whose share of replies differing from the baseline's
    is above the floor's by more than `threshold` is never recommended."""

    prompts: NonNegative = 32
    max_new_tokens: Positive = 384
    concurrency: Positive = 32
    threshold: Fraction = 0.05
    seed: int = 0


class TuningParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A tuning parameter file."""

    load: LoadParams
    server: ServerParams = msgspec.field(default_factory=ServerParams)
    grid: GridParams = msgspec.field(default_factory=GridParams)
    repeats: Positive = 1
    limits: LatencyLimits = msgspec.field(default_factory=LatencyLimits)
    projection: ProjectionParams = msgspec.field(default_factory=ProjectionParams)
    fidelity: FidelityParams = msgspec.field(default_factory=FidelityParams)
    name: str = "sweep"


def load_tuning_params(
    path: str | os.PathLike[str], overrides: Iterable[str] | Mapping[str, Any] = ()
) -> TuningParams:
    """Load, override and check a tuning parameter file; paths come back absolute.

    `overrides` are `key.path=value` strings (values read as YAML) or a mapping of them.
    Every problem is a ConfigError naming the file and line (or `--set`) and the key.
    """
    source = str(path)
    params = load_yaml_params(Path(path), TuningParams, source=source)
    params = apply_overrides(params, _parse_overrides(overrides))
    try:
        _check_params(params, source)
    except ConfigError as exc:
        raise with_line(exc, Path(path)) from None
    return _resolve_paths(params, Path(path).resolve().parent)


def _parse_overrides(overrides: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(overrides, Mapping):
        return dict(overrides)
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", f"expected key.path=value, got {item!r}")
        try:  # read as parameter files are (no alias expansion); not YAML: the text itself
            parsed[key.strip()] = load_yaml_text(text, key.strip(), "--set") if text.strip() else ""
        except (ConfigError, yaml.YAMLError):
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
    check_server(params.server, source)
    _check_load(params.load, source)
    names = [config.name for config in expand_grid(params, source=source)]
    baseline = params.grid.baseline
    if baseline is not None and baseline not in names:
        raise ConfigError("grid.baseline", f"no configuration {baseline!r} (known: "
                          f"{', '.join(names)})", source)


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
    return msgspec.structs.replace(params, load=load, projection=projection,
                                   server=resolve_server(params.server, base))


def _level(key: str, value: Any, where: str, source: str | None) -> tuple[str, dict[str, Any]]:
    """(name part, arguments) of one matrix value: a flag value or a {name, args} mapping."""
    if isinstance(value, Mapping):
        if set(value) - {"name", "args"} or not isinstance(value.get("name"), str):
            raise ConfigError(where, "expected a value or a mapping {name, args}", source)
        return value["name"], normalise_args(value.get("args") or {})
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
    base_args = normalise_args(params.server.args)
    base_env = dict(params.server.env)
    plans = [ConfigPlan(c.name, {**base_args, **normalise_args(c.args)}, {**base_env, **c.env})
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


def plan_commands(params: TuningParams) -> list[Command]:
    """Every configuration's command (port 0 in the parameters: a port free right now)."""
    return [config_command(params.server, config,
                           params.server.port or find_free_port(params.server.host))
            for config in expand_grid(params)]


def format_commands(commands: Sequence[Command]) -> str:
    """The dry-run listing: one commented block per configuration (secrets as ***)."""
    lines: list[str] = []
    for command in commands:
        lines.append(f"# {command.config}")
        if command.ignored:
            flags = " ".join("--" + name.replace("_", "-") for name in command.ignored)
            lines.append(f"# ignored by the simulator: {flags}")
        lines.append(command_line(redact_argv(command.argv), redact(command.env)))
    return "\n".join(lines)

