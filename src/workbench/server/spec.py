"""A server to start: the `server` section of a parameter file and the command it gives.

The tuning sweep starts one server per configuration from it (`workbench.tune`), and
`workbench generate --launch FILE` starts and supervises one (`load_server_params` reads the
section alone). Paths in it (the interpreter, a model folder, a simulator profile file) are
relative to the file. Arguments and environment values whose name says token, key, secret,
password or credential (`HF_TOKEN`, `--api-key`, `AWS_SECRET_ACCESS_KEY`: `is_secret_name`)
are shown as `***` wherever they are printed or written (`redact`, `redact_argv`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from workbench.config import load_yaml_params, with_line
from workbench.errors import ConfigError
from workbench.server.client import is_secret_name
from workbench.server.launch import HEALTH_PATHS, server_command, split_sim_args
from workbench.sim.profiles import get_sim_profile, is_profile_path

__all__ = [
    "ArgValue",
    "Command",
    "ConfigPlan",
    "Seconds",
    "ServerParams",
    "SimParams",
    "check_server",
    "config_command",
    "is_secret_name",
    "load_server_params",
    "normalise_args",
    "redact",
    "redact_argv",
    "resolve_profile",
    "resolve_server",
]

Seconds = Annotated[float, msgspec.Meta(gt=0)]
ArgValue = str | int | float | bool | None | list[str | int | float]


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


class _ServerFile(msgspec.Struct, kw_only=True):
    """A file with a `server` section: a tuning parameter file, or one with only that
    section (other keys are the tuning run's and are not read)."""

    server: ServerParams


def load_server_params(path: str | os.PathLike[str]) -> ServerParams:
    """The `server` section of a parameter file (`generate --launch`), checked as tuning
    checks it, its paths (python, model folder, simulator profile) absolute."""
    source = str(path)
    server = load_yaml_params(Path(path), _ServerFile, source=source).server
    try:
        check_server(server, source)
    except ConfigError as exc:
        raise with_line(exc, Path(path)) from None
    return resolve_server(server, Path(path).resolve().parent)


def check_server(server: ServerParams, source: str) -> None:
    if server.launcher == "sglang" and not server.model_path:
        raise ConfigError("server.model_path", "required with launcher sglang", source)
    if server.launcher == "sim" and is_profile_path(server.sim.profile):
        profile = resolve_profile(server.sim.profile, Path(source).resolve().parent)
        try:
            get_sim_profile(profile)
        except ConfigError as exc:  # the profile file's own error names it and its key
            raise ConfigError("server.sim.profile", str(exc), source) from None
    elif server.launcher == "sim":
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


def resolve_server(server: ServerParams, base: Path) -> ServerParams:
    sim = msgspec.structs.replace(server.sim, profile=resolve_profile(server.sim.profile, base))
    return msgspec.structs.replace(server, python=_resolve_command(server.python, base),
                                   model_path=_resolve_model_path(server, base), sim=sim)


def resolve_profile(profile: str, base: Path) -> str:
    """A simulator profile file (`fitted.yaml`) relative to the file; a profile name stays."""
    if not is_profile_path(profile):
        return profile
    return str((base / Path(profile).expanduser()).resolve())


def _resolve_command(python: str | None, base: Path) -> str | None:
    """A path (`../.venv-sglang/bin/python`) relative to the file; a bare name stays on PATH."""
    if python is None or "/" not in python:
        return python
    # normpath, not resolve: a venv's python is a symlink, and resolving it leaves the venv
    return os.path.normpath(base / Path(python).expanduser())


def _resolve_model_path(server: ServerParams, base: Path) -> str | None:
    """SGLang's model path relative to the file when it is a folder there (`../model`);
    a hub id (`org/name`) and the simulator's model names stay as they are."""
    value = server.model_path
    if value is None or server.launcher != "sglang":
        return value
    path = base / Path(value).expanduser()
    if value.startswith((".", "/", "~")) or path.is_dir():
        return str(path.resolve())
    return value


@dataclass(frozen=True, slots=True)
class ConfigPlan:
    """One configuration as it will run: its merged arguments and environment."""

    name: str
    args: dict[str, Any]
    env: dict[str, str]


def normalise_args(args: Mapping[str, Any]) -> dict[str, Any]:
    return {name.replace("-", "_"): value for name, value in args.items()}


@dataclass(frozen=True, slots=True)
class Command:
    """A configuration's server command."""

    config: str
    argv: list[str]
    env: dict[str, str]
    ignored: list[str]
    port: int


def config_command(server: ServerParams, config: ConfigPlan, port: int) -> Command:
    """The argv (and environment) that starts `config`'s server on `port`."""
    args = {"enable_metrics": True, **config.args}
    ignored: list[str] = []
    if server.launcher == "sim":
        sim = server.sim
        args = {"profile": sim.profile, "speed": sim.speed, **normalise_args(sim.args), **args}
        args, ignored = split_sim_args(args)
    argv = server_command(server.launcher, port=port, host=server.host,
                          model_path=server.model_path, args=args,
                          python=server.python or sys.executable)
    return Command(config.name, argv, dict(config.env), ignored, port)


def redact(value: Any) -> Any:
    """A copy with the values of secret-named keys (`HF_TOKEN`, `api_key`, ...) as '***'."""
    if isinstance(value, Mapping):
        return {k: ("***" if is_secret_name(str(k)) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The argv with the values of secret-named flags as '***': `--hf-token=***`, and every
    value after `--api-key` up to the next flag."""
    out: list[str] = []
    hiding = False
    for part in argv:
        if part.startswith("--"):
            name, eq, _ = part[2:].partition("=")
            hiding = is_secret_name(name)
            out.append(f"--{name}=***" if eq and hiding else part)
        else:
            out.append("***" if hiding else part)
    return out
