"""Running a sweep: a server per configuration, its points, resume, interruption, and the
blocking entry points (`run_sweep`, `workbench tune`, the demo's short sweep and report).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from workbench.errors import InputError, LaunchError, ReportError, RequestFailed
from workbench.report.parameters import notebooks_dir
from workbench.report.render import run_report
from workbench.rundir.files import write_atomic
from workbench.server.client import SGLangClient, api_key_from_env
from workbench.server.info import gpu_count
from workbench.server.launch import (
    ServerProcess,
    command_line,
    find_free_port,
    url_host,
)
from workbench.server.spec import ConfigPlan, config_command, redact, redact_argv
from workbench.tune.load import LoadOutcome, LoadPrompt, PointLoad, build_prompts
from workbench.tune.measurement import PointResult, failed_point, summarize_point, violations
from workbench.tune.parameters import (
    TuningParams,
    expand_grid,
    format_commands,
    load_tuning_params,
    plan_commands,
)
from workbench.tune.probe import (
    PROBE_AGAIN_FILE,
    PROBE_FILE,
    probe_set,
    run_probe,
    sweep_fidelity,
    with_fidelity,
    write_probe,
)
from workbench.tune.recommendation import format_results_table, recommend_sweep
from workbench.tune.results import (
    RESULTS_FILE,
    SWEEP_FILE,
    PointPlan,
    _read_sweep_record,
    _sweep_record,
    _write_json,
    load_results,
    plan_points,
    read_point,
    write_results_csv,
)

__all__ = [
    "SweepSummary",
    "default_out",
    "run_demo_sweep",
    "run_sweep",
    "run_sweep_cli",
    "sweep",
    "tuning_report",
]

REQUESTS_FILE = "requests.jsonl"
SAMPLES_FILE = "samples.jsonl"
SERVER_LOG = "server.log"
SERVER_INFO = "server_info.json"
FLUSH_WAIT_WALL = 60.0


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

    @property
    def baseline(self) -> str | None:
        """The configuration the others are compared with (grid.baseline, else the first)."""
        return self.params.grid.baseline or (self.configs[0].name if self.configs else None)

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
        with_fidelity(results, sweep_fidelity(self.out, [c.name for c in self.configs],
                                               self.baseline))
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
    commands = [config_command(params.server, c, params.server.port) for c in configs]
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
    """Launch the configuration's server, run its pending points and probe it, stop the
    server; the baseline is started once more for its second probe (its noise floor)."""
    folder = run.out / config.name
    started = _started(run, config, folder / SERVER_LOG)
    if isinstance(started, str):
        _fail_points(run, config, pending, started)
        return
    server, port = started
    _write_json(folder / "config.json", {
        "name": config.name, "args": redact(config.args), "env": sorted(config.env),
        "command": command_line(redact_argv(server.argv)), "ignored": server.ignored,
        "url": server.process.url, "pid": server.process.pid, "started": time.time()})
    try:
        await _serve_points(run, config, pending, server.process)
    finally:
        _stop(run, server.process, port)
    again = folder / PROBE_AGAIN_FILE
    if config.name == run.baseline and (folder / PROBE_FILE).exists() and _wants_probe(run, again):
        await _probe_again(run, config, folder)  # only a baseline that answered its first


@dataclass(slots=True)
class _Started:
    process: ServerProcess
    argv: list[str]
    ignored: list[str]


def _started(run: _Sweep, config: ConfigPlan, log: Path) -> tuple[_Started, int] | str:
    """The configuration's server started (not yet ready) and its port, or why it failed."""
    params = run.params
    port = params.server.port or find_free_port(params.server.host)
    command = config_command(params.server, config, port)
    server = ServerProcess(command.argv, url=f"http://{url_host(params.server.host)}:{port}",
                           log_path=log, env=command.env, health_path=params.server.health_paths)
    run.say(f"{config.name}: starting {command_line(redact_argv(command.argv))}")
    try:
        server.start()
    except LaunchError as exc:
        return str(exc)
    return _Started(server, list(command.argv), list(command.ignored)), port


def _stop(run: _Sweep, server: ServerProcess, port: int) -> None:
    server.stop(run.params.server.stop_grace)
    with contextlib.suppress(LaunchError):
        server.wait_port_free(port, run.params.server.host)


def _wants_probe(run: _Sweep, path: Path) -> bool:
    return run.params.fidelity.prompts > 0 and not path.exists()


async def _probe(run: _Sweep, config: ConfigPlan, client: SGLangClient, path: Path) -> None:
    """The fidelity probe against a ready server, written to `path` (a probe that fails
    outright is said and left out: the configuration then has no drift figures)."""
    fidelity = run.params.fidelity
    lines, seconds = await run_probe(client, probe_set(run.prompts, fidelity), fidelity)
    write_probe(path, lines)
    failed = sum(line.error is not None for line in lines)
    run.say(f"{config.name}: fidelity probe of {len(lines)} prompts in {seconds:.0f} s"
            + (f" ({failed} failed)" if failed else "") + f" -> {path.name}")


async def _probe_again(run: _Sweep, config: ConfigPlan, folder: Path) -> None:
    """The baseline restarted and probed a second time (its noise floor)."""
    started = _started(run, config, folder / f"again-{SERVER_LOG}")
    if isinstance(started, str):
        run.say(f"{config.name}: no second probe: {started}")
        return
    server, port = started
    try:
        await server.process.wait_ready_async(run.params.server.startup_timeout)
        async with SGLangClient(server.process.url, api_key=_api_key(config.args),
                                timeout=_client_timeout(run.params)) as client:
            await _probe(run, config, client, folder / PROBE_AGAIN_FILE)
    except (LaunchError, RequestFailed) as exc:
        run.say(f"{config.name}: no second probe: {exc}")
    finally:
        _stop(run, server.process, port)


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
        probe = run.out / config.name / PROBE_FILE
        if _wants_probe(run, probe):  # after the load: its caches as the job leaves them
            await _probe(run, config, client, probe)


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
    write_atomic(folder / REQUESTS_FILE, rows)
    samples = b"".join(msgspec.json.encode(s) + b"\n" for s in outcome.samples)
    write_atomic(folder / SAMPLES_FILE, samples)
    write_atomic(folder / "metrics_before.txt", (outcome.before or "").encode())
    write_atomic(folder / "metrics_after.txt", (outcome.after or "").encode())
    write_atomic(folder / SERVER_LOG, server.read_log(log_start))
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
    result.gpus = gpu_count(info)


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
    report_dir: str | os.PathLike[str] | None = None,
) -> int:
    """`workbench tune`: print the commands (dry run) or run the sweep with SIGINT/SIGTERM
    stopping it cleanly (servers stopped, results kept). A sweep that ran to its end renders
    its throughput_tuning report into `report_dir` (None: no report), which lists it in
    its index.html. Returns the exit code (130 when interrupted, 1 when the report failed).
    Bad parameters raise ConfigError for the CLI's one-line message."""
    params = load_tuning_params(params_file, overrides)
    if dry_run:
        say(format_commands(plan_commands(params)))
        return 0
    root = Path(out) if out is not None else default_out(params_file)
    summary = asyncio.run(_interruptible(params, root, resume, say))
    reported = True
    if report_dir is not None and not summary.interrupted:
        reported = _sweep_report(root, report_dir, say)
    say(format_results_table(summary.results))
    for line in recommend_sweep(root, results=summary.results).lines:
        say(line)
    say(f"results: {root / RESULTS_FILE}")
    return 130 if summary.interrupted else 0 if reported else 1


def _sweep_report(root: Path, report_dir: str | os.PathLike[str], say: Say) -> bool:
    """The sweep's throughput_tuning report, said; False when it failed (said why)."""
    if importlib.util.find_spec("papermill") is None:
        say("no tuning report: the notebooks extra is not installed (pip install 'workbench[notebooks]')")
        return True
    say("rendering the throughput_tuning report ...")
    try:
        result = tuning_report(root, report_dir)
    except (ReportError, InputError) as exc:
        say(f"tuning report failed: {exc}")
        return False
    say(f"report: {result.html_path} (index: {Path(report_dir) / 'index.html'})")
    return True


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


def tuning_report(sweep_dir: str | os.PathLike[str],
                  out_dir: str | os.PathLike[str] = "outputs/reports") -> Any:
    """The throughput_tuning notebook executed on a sweep directory (a ReportResult);
    InputError before any kernel starts when `sweep_dir` holds no sweep."""

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

        params_file = notebooks_dir().parent / "params" / "tuning.sim.yaml"
    run_sweep(params_file, out, resume=True, overrides=DEMO_OVERRIDES, say=say)
    return tuning_report(out, report_dir)
