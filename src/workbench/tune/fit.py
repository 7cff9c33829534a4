"""A simulator profile fitted to a measured sweep (`workbench tune fit`), and its check: the
held-out configurations replayed on the simulator with that profile (`predict`).

The formulas are the simulator's, in one place: `workbench.sim.profiles`, paragraph "Fitted
profiles". This module gathers a sweep's points, solves them and writes the files:

    PROFILE.yaml            the profile, under a comment naming the sweep, the configurations
                            fitted and held out, the constants and each point's residual
    PROFILE.predict/        the replay's own sweep directory (written again on each replay)
    fit.csv                 beside PROFILE.yaml: per configuration and concurrency, measured
                            and predicted output tok/s, error %, running requests, step time

Points. Every ok point of the chosen configurations (all with an ok point by default) with a
measured mean of running requests and a step time. A point's uncached prompt tokens and
output tokens are the means of `prompt_tokens - cached_tokens` and `completion_tokens` over
its measured requests (requests.jsonl, written by the driver), else the mean of
`load.prompts.input_len` times (1 - cache hit rate) and output_tokens / requests.

Replay. The sweep's own parameters (sweep.json) with the simulator as launcher, the fitted
profile, the held-out configurations only (all of them when none is held out: an in-sample
check), each configuration's arguments with what its server resolved and reported in its
server_info.json (`max_total_num_tokens` as --max-total-tokens, `max_running_requests`), and
a speed at which the busiest point asks the simulator for about
`REPLAY_WALL_TOKENS` tok/s and `REPLAY_WALL_REQUESTS` requests/s of wall clock (beyond that, a
loaded two-core host falls behind, and the client's own delays, multiplied by the speed,
start to count).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from workbench.errors import InputError
from workbench.rundir.files import write_atomic
from workbench.sim.profiles import (
    KV_DTYPES,
    OutputShape,
    SimProfile,
    get_sim_profile,
    profile_yaml,
)
from workbench.tune.driver import REQUESTS_FILE, SERVER_INFO, run_sweep
from workbench.tune.load import RequestRow
from workbench.tune.measurement import PointResult
from workbench.tune.parameters import (
    ConfigPlan,
    GridParams,
    NamedConfig,
    SimParams,
    TuningParams,
    expand_grid,
)
from workbench.tune.results import PointPlan, plan_points, read_point, sweep_params

__all__ = [
    "FIT_FILE",
    "FitPoint",
    "FitReport",
    "Prediction",
    "fit_profile",
    "format_fit",
    "format_predictions",
    "predict",
    "replay_params",
    "solve_step",
    "write_profile",
]

FIT_FILE = "fit.csv"
RUN_TO_MAX_SHARE = 0.95  # replies cut at max_new_tokens above which every reply runs to it
RUN_TO_MAX_RATIO = 0.98  # without requests.jsonl: completion tokens / max_new_tokens above it
NEVER_STOPS = 1_000_000.0  # reasoning/answer median of a shape that always reaches the cut
IDENTIFIABLE_CV = 0.1  # spread of prefill tokens per running request that separates them
MIN_RESIDUAL_GAIN = 0.9  # the prefill term must bring the rms residual below this share
POOL_HEADROOM = 16  # the fitted memory holds this many times the largest measured pool
MIN_POOL = 1 << 20
DEFAULT_KV_BYTES = 2048  # 2 layers x K,V x 256 x 2 bytes: the tiny model of the CPU server
MIN_KV_BYTES = 64  # below it the reported KV memory was rounded away
REPLAY_WALL_TOKENS = 2500.0  # tok/s the replay asks of the simulator (wall clock)
REPLAY_WALL_REQUESTS = 30.0  # requests/s: the client's and server's overhead per request
MAX_REPLAY_SPEED = 50.0

Say = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


@dataclass(slots=True)
class FitPoint:
    """One measured point as the fit sees it (times in server milliseconds)."""

    config: str
    concurrency: int | str
    repeat: int
    running: float
    step_ms: float
    prefill_tokens: float  # uncached prompt tokens prefilled per step
    uncached_prompt: float
    ttft_ms: float | None
    fitted_ms: float = 0.0

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.fitted_ms - self.step_ms) / self.step_ms


@dataclass(slots=True)
class FitReport:
    """What the fit used and found."""

    sweep_dir: Path
    sweep_name: str
    configs: list[str]
    held_out: list[str]
    points: list[FitPoint]
    step_base_ms: float
    step_per_req_ms: float
    prefill_ms_per_token: float
    prefill_source: str
    output: str

    @property
    def rms_ms(self) -> float:
        return math.sqrt(statistics.fmean((p.fitted_ms - p.step_ms) ** 2 for p in self.points))

    @property
    def max_error_pct(self) -> float:
        return max(abs(p.error_pct) for p in self.points)


# ----------------------------------------------------------------------------- the fit


def fit_profile(
    sweep_dir: str | os.PathLike[str], configs: Sequence[str] | None = None
) -> tuple[SimProfile, FitReport]:
    """The profile fitted to the ok points of `configs` (default: every configuration with
    one) of a sweep directory, and the report; InputError when the points cannot fix it."""
    root = Path(sweep_dir)
    params = sweep_params(root)
    plans = plan_points(root, expand_grid(params), params.load, params.repeats)
    results = {name: [(p, r) for p in ps if (r := read_point(p)) is not None]
               for name, ps in plans.items()}
    chosen = _chosen(results, configs, root)
    points = [point for name in chosen for plan, result in results[name]
              if (point := _fit_point(plan, result, params)) is not None]
    _check_points(points, chosen, root)
    base, per_req, prefill, source = solve_step(points)
    for point in points:
        point.fitted_ms = base + per_req * point.running + prefill * point.prefill_tokens
    shape, output = _output_shape(root, params, [r for n in chosen for _, r in results[n]], plans)
    held_out = [name for name, pairs in results.items()
                if name not in chosen and any(r.ok for _, r in pairs)]
    report = FitReport(root.resolve(), params.name, list(chosen), held_out, points, base, per_req,
                       prefill, source, output)
    profile = _profile(root, params, results, chosen, report, shape)
    return profile, report


def _chosen(results: Mapping[str, list[tuple[PointPlan, PointResult]]],
            configs: Sequence[str] | None, root: Path) -> list[str]:
    measured = [name for name, pairs in results.items() if any(r.ok for _, r in pairs)]
    if not configs:
        if not measured:
            raise InputError(f"{root}: no configuration has an ok point to fit")
        return measured
    unknown = [name for name in configs if name not in results]
    if unknown:
        raise InputError(f"{root}: no configuration {unknown[0]!r} (known: "
                         f"{', '.join(results)})")
    failed = [name for name in configs if name not in measured]
    if failed:
        raise InputError(f"{root}: configuration {failed[0]!r} has no ok point to fit")
    return list(dict.fromkeys(configs))


def _fit_point(plan: PointPlan, result: PointResult, params: TuningParams) -> FitPoint | None:
    if not result.ok or not result.mean_running or not result.output_throughput:
        return None
    running, step = _batch_and_step(result)
    uncached, output = _lengths(plan, result, params)
    if output <= 0:
        return None
    return FitPoint(result.config, result.concurrency, result.repeat, running, step,
                    running * uncached / output, uncached, result.ttft_p50_ms)


def _batch_and_step(result: PointResult) -> tuple[float, float]:
    """(running requests, step ms) of a point with a measured throughput.

    With streaming, the step is the inter-token latency and the batch follows from Little's
    law (output tok/s x seconds per token): SGLang refreshes its `num_running_reqs` gauge
    only every `--decode-log-interval` (40) decode steps and when it admits requests, where it
    reads low (the real CPU sweep: 5.0 on the gauge where 7.5 requests were decoding at
    concurrency 8). Without streaming, the gauge is all there is.
    """
    assert result.output_throughput and result.mean_running
    if result.itl_p50_ms:
        return result.output_throughput * result.itl_p50_ms / 1000.0, result.itl_p50_ms
    return result.mean_running, 1000.0 * result.mean_running / result.output_throughput


def _lengths(plan: PointPlan, result: PointResult, params: TuningParams) -> tuple[float, float]:
    """(mean uncached prompt tokens, mean completion tokens) of the point's requests."""
    rows = [row for row in _requests(plan) if row.phase == "measured" and row.ok
            and row.prompt_tokens is not None and row.completion_tokens]
    if rows:
        uncached = statistics.fmean(row.prompt_tokens - (row.cached_tokens or 0)  # type: ignore[operator]
                                    for row in rows)
        return uncached, statistics.fmean(row.completion_tokens or 0 for row in rows)
    low, high = params.load.prompts.input_len
    output = result.output_tokens / result.requests if result.requests else 0.0
    return (low + high) / 2 * (1.0 - (result.cache_hit_rate or 0.0)), output


def _requests(plan: PointPlan) -> list[RequestRow]:
    """The point's requests.jsonl (written by the driver); empty when missing or unreadable."""
    try:
        data = (plan.folder / REQUESTS_FILE).read_bytes()
    except OSError:
        return []
    decoder = msgspec.json.Decoder(RequestRow)
    rows = []
    for line in data.splitlines():
        try:
            rows.append(decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return rows


def _check_points(points: Sequence[FitPoint], chosen: Sequence[str], root: Path) -> None:
    if len(points) < 2:
        raise InputError(f"{root}: {len(points)} usable point(s) in {', '.join(chosen)}; the fit "
                         "needs two or more with a measured mean of running requests")
    if max(p.running for p in points) - min(p.running for p in points) < 1.0:
        raise InputError(f"{root}: every point of {', '.join(chosen)} ran about "
                         f"{points[0].running:.0f} requests; the fit needs different batch sizes "
                         "(more concurrencies)")


def solve_step(points: Sequence[FitPoint]) -> tuple[float, float, float, str]:
    """(step_base_ms, step_per_req_ms, prefill_ms_per_token, how the prefill cost was found).

    The three constants come from one least squares with every constant >= 0 when the
    prefill tokens per running request vary between the points (coefficient of variation
    >= IDENTIFIABLE_CV) and the prefill term lowers the residual by a tenth or more;
    otherwise prefill_ms_per_token is 0 and the prefill cost stays in step_per_req_ms."""
    running = np.array([p.running for p in points])
    prefill = np.array([p.prefill_tokens for p in points])
    step = np.array([p.step_ms for p in points])
    ones = np.ones_like(step)
    base, per_req = _nnls(np.column_stack([ones, running]), step)
    two = _rms(step - base - per_req * running)
    ratio = prefill / running
    if ratio.mean() <= 0 or ratio.std() / ratio.mean() < IDENTIFIABLE_CV:
        return base, per_req, 0.0, ("folded into step_per_req_ms (prefill tokens per running "
                                    "request hardly vary between the points)")
    full = _nnls(np.column_stack([ones, running, prefill]), step)
    three = _rms(step - full[0] - full[1] * running - full[2] * prefill)
    if three > MIN_RESIDUAL_GAIN * two:
        return base, per_req, 0.0, (f"folded into step_per_req_ms (a prefill term lowers the "
                                    f"residual only from {two:.2f} to {three:.2f} ms)")
    return full[0], full[1], full[2], "least squares with the step times"


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(values ** 2)))


def _nnls(matrix: np.ndarray, target: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: the best of the unconstrained solutions
    over each subset of columns (a handful of columns: exhaustive is exact and small)."""
    columns = matrix.shape[1]
    best: tuple[float, list[float]] = (math.inf, [0.0] * columns)
    for mask in range(1, 1 << columns):
        used = [c for c in range(columns) if mask >> c & 1]
        solution, *_ = np.linalg.lstsq(matrix[:, used], target, rcond=None)
        if (solution < 0).any():
            continue
        full = [0.0] * columns
        for column, value in zip(used, solution, strict=True):
            full[column] = float(value)
        residual = float(np.sum((matrix @ np.array(full) - target) ** 2))
        if residual < best[0] - 1e-12:
            best = (residual, full)
    return best[1]


# ----------------------------------------------------------------------- profile fields


def _output_shape(root: Path, params: TuningParams, results: Sequence[PointResult],
                  plans: Mapping[str, list[PointPlan]]) -> tuple[OutputShape, str]:
    """The output lengths: run to max_new_tokens when that is what was measured."""
    limit = params.load.max_new_tokens
    rows = [row for name in {r.config for r in results} for plan in plans[name]
            for row in _requests(plan) if row.phase == "measured" and row.ok
            and row.completion_tokens is not None]
    if rows:
        cut = sum(1 for row in rows if row.finish_reason == "length") / len(rows)
        stops = [row.completion_tokens for row in rows if row.finish_reason != "length"]
    else:
        ok = [r for r in results if r.ok and r.requests]
        mean = statistics.fmean(r.output_tokens / r.requests for r in ok) if ok else 0.0
        cut, stops = (1.0 if mean >= RUN_TO_MAX_RATIO * limit else 0.0), []
    if cut >= RUN_TO_MAX_SHARE or not stops:
        shape = OutputShape(NEVER_STOPS, 0.01, NEVER_STOPS, 0.01, unclosed_rate=1.0)
        return shape, f"every reply runs to max_new_tokens ({100 * cut:.0f}% were cut at {limit})"
    lengths = np.log(np.maximum(np.array(stops, dtype=float), 2.0))
    median = float(np.exp(np.median(lengths)))
    sigma = max(0.1, float(lengths.std()))
    shape = OutputShape(round(max(1.0, 0.8 * median), 1), round(sigma, 3),
                        round(max(1.0, 0.2 * median), 1), round(sigma, 3),
                        unclosed_rate=round(cut, 4))
    return shape, (f"{100 * cut:.0f}% cut at {limit}; the others stop at a median of "
                   f"{median:.0f} tokens")


def _server_info(root: Path, config: str) -> dict[str, Any]:
    try:
        data = msgspec.json.decode((root / config / SERVER_INFO).read_bytes())
    except (OSError, msgspec.DecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _state(info: Mapping[str, Any]) -> dict[str, Any]:
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0]
    return {}


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _profile(root: Path, params: TuningParams, results: Mapping[str, list[Any]],
             chosen: Sequence[str], report: FitReport, shape: OutputShape) -> SimProfile:
    infos = {name: _server_info(root, name) for name in results}
    first = next((infos[n] for n in chosen if infos[n]), {})
    # the largest pool's KV memory: SGLang rounds GB to 3 decimals
    largest = max((infos[n] for n in chosen), key=lambda info: _int(info.get(
        "max_total_num_tokens")) or 0, default={})
    weights_gb, kv_bytes = _memory(largest)
    pools = [r.max_total_num_tokens for pairs in results.values() for _, r in pairs
             if r.max_total_num_tokens]
    fractions = [float(v) for plan in expand_grid(params)
                 if isinstance(v := plan.args.get("mem_fraction_static"), int | float)]
    default_fraction = statistics.mode(fractions) if fractions else 0.8
    smallest = min([*fractions, default_fraction])
    tokens = max(MIN_POOL, POOL_HEADROOM * max(pools, default=0))
    return SimProfile(
        name=f"fitted-{params.name}",
        description=f"fitted by workbench tune fit to {root.resolve()} ({', '.join(chosen)})",
        gpu_mem_gb=round((weights_gb + tokens * kv_bytes / 1e9) / smallest * 1.01, 3),
        weights_gb=weights_gb,
        activation_gb=0.0,
        kv_bytes_per_token_bf16=kv_bytes,
        auto_kv_dtype=_kv_dtype(results, chosen),
        context_length=_context_length(first, params),
        default_tp_size=1,
        default_mem_fraction_static=default_fraction,
        default_chunked_prefill_size=_chunked_prefill(infos, params),
        step_base_ms=round(report.step_base_ms, 4),
        step_per_req_ms=round(report.step_per_req_ms, 5),
        fp8_step_factor=1.0,
        prefill_ms_per_token=round(report.prefill_ms_per_token, 6),
        host_load_ms_per_token=round(report.prefill_ms_per_token / 10, 6),
        output=shape,
    )


def _memory(info: Mapping[str, Any]) -> tuple[float, int]:
    """(weights GB, KV bytes per token) from /server_info's memory_usage (SGLang rounds its
    GB to 3 decimals; a CPU build may report nothing usable), else small ones."""
    weights, kv_bytes = 0.1, DEFAULT_KV_BYTES
    usage = _state(info).get("memory_usage")
    if not isinstance(usage, dict):
        return weights, kv_bytes
    weight, kv, capacity = usage.get("weight"), usage.get("kvcache"), _int(usage.get("token_capacity"))
    if isinstance(weight, int | float) and weight > 0:
        weights = round(float(weight), 3)
    if isinstance(kv, int | float) and capacity and kv * 1e9 / capacity >= MIN_KV_BYTES:
        kv_bytes = round(float(kv) * 1e9 / capacity)
    return weights, kv_bytes


def _kv_dtype(results: Mapping[str, list[Any]], chosen: Sequence[str]) -> str:
    dtypes = {r.kv_cache_dtype for name in chosen for _, r in results[name] if r.kv_cache_dtype}
    fp8 = [d for d in KV_DTYPES if d.startswith("fp8") and d in dtypes]
    return fp8[0] if fp8 and len(dtypes) == 1 else "bf16"


def _context_length(info: Mapping[str, Any], params: TuningParams) -> int:
    needed = params.load.prompts.input_len[1] + params.load.max_new_tokens + 1
    context = _int(info.get("context_length")) or _int(_state(info).get("context_length"))
    if context is None and (limit := _int(info.get("max_req_input_len"))) is not None:
        context = limit + 1
    return max(context or 0, needed)


def _chunked_prefill(infos: Mapping[str, Mapping[str, Any]], params: TuningParams) -> int:
    """The server's own chunked_prefill_size: from a configuration that did not set it."""
    unset = {plan.name for plan in expand_grid(params) if "chunked_prefill_size" not in plan.args}
    for name, info in infos.items():
        size = _int(info.get("chunked_prefill_size"))
        if name in unset and size is not None and size > 0:
            return size
    return 8192


# ----------------------------------------------------------------------------- writing


def write_profile(profile: SimProfile, report: FitReport, out: str | os.PathLike[str]) -> Path:
    """PROFILE.yaml: the profile under a comment saying what it was fitted on and how well."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, profile_yaml(profile, _header(report)).encode())
    return path


def _header(report: FitReport) -> str:
    lines = [
        "Simulator profile fitted by `workbench tune fit` (formulas: workbench.sim.profiles,",
        "\"Fitted profiles\"). Use: workbench sim --profile THIS.yaml, or server.sim.profile.",
        f"sweep: {report.sweep_dir} ({report.sweep_name})",
        f"fitted on: {', '.join(report.configs)}",
        f"held out: {', '.join(report.held_out) or '-'}",
        (f"step ms = {report.step_base_ms:.3f} + {report.step_per_req_ms:.4f} * running "
         f"+ {report.prefill_ms_per_token:.5f} * prefilled tokens"),
        f"prefill cost from: {report.prefill_source}",
        f"outputs: {report.output}",
        (f"residuals over {len(report.points)} points: rms {report.rms_ms:.2f} ms, "
         f"max {report.max_error_pct:.1f}%"),
        "",
        *_point_lines(report),
    ]
    return "\n".join(lines)


def _point_lines(report: FitReport) -> list[str]:
    lines = [(f"{'config':<16} {'conc':>5} {'running':>8} {'prefill/step':>12} "
              f"{'step ms':>8} {'fitted':>8} {'error':>7}")]
    for p in report.points:
        conc = str(p.concurrency) + (f" r{p.repeat}" if p.repeat > 1 else "")
        lines.append(f"{p.config:<16} {conc:>5} {p.running:>8.1f} {p.prefill_tokens:>12.1f} "
                     f"{p.step_ms:>8.2f} {p.fitted_ms:>8.2f} {p.error_pct:>6.1f}%")
    return lines


def format_fit(report: FitReport) -> str:
    """The fitted constants and, per point used, measured against fitted step time."""
    return "\n".join([
        f"fitted on {len(report.points)} points of {', '.join(report.configs)}"
        + (f" (held out: {', '.join(report.held_out)})" if report.held_out else ""),
        (f"step_base_ms {report.step_base_ms:.3f}, step_per_req_ms {report.step_per_req_ms:.4f}, "
         f"prefill_ms_per_token {report.prefill_ms_per_token:.5f} ({report.prefill_source})"),
        f"outputs: {report.output}",
        *_point_lines(report),
        f"residuals: rms {report.rms_ms:.2f} ms, max {report.max_error_pct:.1f}%",
    ])


# ----------------------------------------------------------------------------- replay


@dataclass(slots=True)
class Prediction:
    """One configuration and concurrency: measured against the simulator with the profile
    (repeats averaged)."""

    config: str
    concurrency: int | str
    role: str  # "held out" or "fitted" (an in-sample check)
    measured: float | None
    predicted: float | None
    measured_running: float | None = None
    predicted_running: float | None = None
    measured_step_ms: float | None = None
    predicted_step_ms: float | None = None
    reason: str | None = None

    @property
    def error_pct(self) -> float | None:
        if self.measured is None or self.predicted is None or self.measured <= 0:
            return None
        return 100.0 * (self.predicted - self.measured) / self.measured


def predict(
    sweep_dir: str | os.PathLike[str],
    profile_path: str | os.PathLike[str],
    *,
    fitted: Sequence[str] = (),
    speed: float | None = None,
    say: Say = _quiet,
) -> list[Prediction]:
    """Replay the configurations not in `fitted` (all when that leaves none) on the simulator
    with the profile file; writes fit.csv beside it and returns its rows."""
    root, profile = Path(sweep_dir), Path(profile_path).resolve()
    measured = _measured(root, sweep_params(root))
    replayed = [name for name in measured if name not in fitted] or list(measured)
    replay = replay_params(root, profile, replayed, speed=speed)
    out = profile.with_suffix(".predict")
    _clear_replay(out)
    summary = run_sweep(replay, out, say=say)
    rows = _compare(measured, summary.results, replayed, set(fitted))
    _write_fit_csv(profile.parent / FIT_FILE, rows)
    return rows


def replay_params(
    sweep_dir: str | os.PathLike[str],
    profile_path: str | os.PathLike[str],
    configs: Sequence[str],
    *,
    speed: float | None = None,
) -> TuningParams:
    """The sweep's parameters (sweep.json) turned into a replay of `configs` on the simulator
    with the profile file (see the module's "Replay"); ConfigError naming the profile file."""
    root, profile = Path(sweep_dir), Path(profile_path).resolve()
    get_sim_profile(str(profile))  # a ConfigError naming the file before anything starts
    params = sweep_params(root)
    plans = {plan.name: plan for plan in expand_grid(params)}
    unknown = [name for name in configs if name not in plans]
    if unknown:
        raise InputError(f"{root}: no configuration {unknown[0]!r} (known: {', '.join(plans)})")
    named = [NamedConfig(name=name, args=_resolved_args(plans[name], root),
                         env=dict(plans[name].env)) for name in configs]
    speed = speed or _replay_speed(_measured(root, params), configs)
    sim = SimParams(profile=str(profile), speed=speed,
                    args={**params.server.sim.args, "random_seed": 0})
    server = msgspec.structs.replace(params.server, launcher="sim", python=None, sim=sim)
    baseline = params.grid.baseline if params.grid.baseline in configs else None
    return msgspec.structs.replace(params, name=f"{params.name}-replay", server=server,
                                   grid=GridParams(configs=named, baseline=baseline))


def _measured(root: Path, params: TuningParams) -> dict[str, list[PointResult]]:
    plans = plan_points(root, expand_grid(params), params.load, params.repeats)
    results = {name: [r for p in ps if (r := read_point(p)) is not None and r.ok]
               for name, ps in plans.items()}
    return {name: found for name, found in results.items() if found}


def _replay_speed(measured: Mapping[str, list[PointResult]], replayed: Sequence[str]) -> float:
    """The speed at which the busiest point asks the simulator (and the client) for at most
    REPLAY_WALL_TOKENS tok/s and REPLAY_WALL_REQUESTS requests/s of wall clock."""
    points = [r for name in replayed for r in measured.get(name, [])]
    tokens = max((r.output_throughput or 0.0 for r in points), default=0.0)
    requests = max((r.request_throughput or 0.0 for r in points), default=0.0)
    limits = [MAX_REPLAY_SPEED]
    limits += [REPLAY_WALL_TOKENS / tokens] if tokens > 0 else []
    limits += [REPLAY_WALL_REQUESTS / requests] if requests > 0 else []
    return round(max(1.0, min(limits)), 2)


def _resolved_args(config: ConfigPlan, root: Path) -> dict[str, Any]:
    """The configuration's arguments with the pool and the request cap its server reported
    (what it made of its flags and its memory, page alignment included)."""
    args = dict(config.args)
    info = _server_info(root, config.name)
    pool = _int(info.get("max_total_num_tokens"))
    if pool:
        args["max_total_tokens"] = pool
    cap = _int(_state(info).get("effective_max_running_requests_per_dp")) or _int(
        info.get("max_running_requests"))
    if cap:
        args["max_running_requests"] = cap
    return args


def _clear_replay(out: Path) -> None:
    """Remove an earlier replay (only a folder that holds a sweep: ours)."""
    if out.exists():
        if not (out / "sweep.json").is_file():
            raise InputError(f"{out} exists and is not a replay of ours; move it away")
        shutil.rmtree(out)


def _compare(measured: Mapping[str, list[PointResult]], replay: Sequence[PointResult],
             configs: Sequence[str], fitted: set[str]) -> list[Prediction]:
    rows = []
    for name in configs:
        role = "fitted" if name in fitted else "held out"
        for concurrency in dict.fromkeys(r.concurrency for r in measured[name]):
            real = [r for r in measured[name] if r.concurrency == concurrency]
            sim = [r for r in replay if r.config == name and r.concurrency == concurrency]
            ok = [r for r in sim if r.ok]
            rows.append(Prediction(
                name, concurrency, role,
                _mean(r.output_throughput for r in real), _mean(r.output_throughput for r in ok),
                _mean(r.mean_running for r in real), _mean(r.mean_running for r in ok),
                _mean(_step(r) for r in real), _mean(_step(r) for r in ok),
                None if ok else (sim[0].reason if sim else "not run")))
    return rows


def _step(result: PointResult) -> float | None:
    if result.itl_p50_ms is not None:
        return result.itl_p50_ms
    if result.mean_running and result.output_throughput:
        return 1000.0 * result.mean_running / result.output_throughput
    return None


def _mean(values: Any) -> float | None:
    found = [float(v) for v in values if v is not None]
    return statistics.fmean(found) if found else None


FIT_COLUMNS = ("config", "concurrency", "role", "measured_tok_s", "predicted_tok_s",
               "error_pct", "measured_running", "predicted_running", "measured_step_ms",
               "predicted_step_ms", "reason")


def _write_fit_csv(path: Path, rows: Sequence[Prediction]) -> Path:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIT_COLUMNS)
    for row in rows:
        writer.writerow([row.config, row.concurrency, row.role, _cell(row.measured),
                         _cell(row.predicted), _cell(row.error_pct), _cell(row.measured_running),
                         _cell(row.predicted_running), _cell(row.measured_step_ms),
                         _cell(row.predicted_step_ms), row.reason or ""])
    write_atomic(path, buffer.getvalue().encode())
    return path


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def format_predictions(rows: Sequence[Prediction]) -> str:
    """The replay's table: per configuration and concurrency, predicted and measured tok/s."""
    lines = [(f"{'config':<16} {'conc':>5} {'role':<9} {'predicted':>10} {'measured':>10} "
              f"{'error':>7} {'running sim/real':>17}")]
    for row in rows:
        error = f"{row.error_pct:+.1f}%" if row.error_pct is not None else "-"
        running = f"{_num(row.predicted_running, 1)}/{_num(row.measured_running, 1)}"
        lines.append(f"{row.config:<16} {row.concurrency!s:>5} {row.role:<9} "
                     f"{_num(row.predicted, 0):>10} {_num(row.measured, 0):>10} {error:>7} "
                     f"{running:>17}" + (f"  {row.reason}" if row.reason else ""))
    errors = [abs(e) for row in rows if (e := row.error_pct) is not None]
    if errors:
        lines.append(f"mean |error| {statistics.fmean(errors):.1f}%, max {max(errors):.1f}%")
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
