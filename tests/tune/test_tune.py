"""The tuning sweep on the simulator: results, failures, resume, interruption, dry run,
parameters, recommendation and projection, the report, and the Kimi-K2.5 replay."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from conftest import ROOT, wait_until
from prometheus_client.parser import text_string_to_metric_families

from workbench.errors import ConfigError, InputError
from workbench.server.client import SGLangClient
from workbench.server.info import gpu_count
from workbench.tune import (
    LatencyLimits,
    LoadParams,
    LoadPrompt,
    PointLoad,
    PointResult,
    SweepSummary,
    expand_grid,
    format_hours,
    load_results,
    load_server_params,
    load_tuning_params,
    projection,
    recommend,
    recommend_sweep,
    remaining_from_manifest,
    remaining_from_run,
    run_sweep,
    run_sweep_cli,
    summarize_point,
)

PARAMS = ROOT / "params"
REQUIRED_COLUMNS = ("config", "concurrency", "status", "output_throughput", "request_throughput",
                    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "e2e_p50_s", "max_total_num_tokens",
                    "peak_token_usage", "time_scale")


def write_params(folder: Path, body: dict[str, Any], name: str = "tuning.yaml") -> Path:
    path = folder / name
    path.write_text(json.dumps(body, indent=1))  # JSON is YAML
    return path


def sim_params(configs: list[dict[str, Any]], *, speed: float = 3.0, **load: Any) -> dict[str, Any]:
    """A sweep of the dense-8b simulator profile with small, quick points."""
    return {
        "server": {"launcher": "sim", "startup_timeout": 30, "stop_grace": 5,
                   "sim": {"profile": "dense-8b-1x24gb", "speed": speed}},
        "grid": {"configs": configs},
        "load": {"concurrency": [4, 48], "warmup_requests": 8, "duration": 10, "max_new_tokens": 256,
                 "prompts": {"count": 200, "input_len": [300, 700], "shared_prefix": 128,
                             "prefix_groups": 8},
                 "sample_interval": 0.5, **load},
        "projection": {"remaining_tokens": 10_000_000},
        "fidelity": {"prompts": 0},  # its own test below
    }


def csv_rows(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open() as f:
        return list(csv.DictReader(f))


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_group_gone(pgid: int, what: str) -> None:
    wait_until(lambda: group_gone(pgid), 60, what)


def server_pids(out: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in sorted(out.glob("*/config.json"))]


def sweep_subprocess(params: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    code = textwrap.dedent(f"""
        import sys
        from workbench.tune import run_sweep_cli
        sys.exit(run_sweep_cli({str(params)!r}, {str(out)!r}, resume={'--resume' in extra},
                               say=lambda m: print(m, flush=True)))
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def model_throughput(point: Path) -> float:
    """Output tok/s of the point's window in model time, from the simulator's own counters
    scraped when the window opened and closed: generated tokens over the model time its engine
    worked (`workbench_sim:model_busy_seconds`), which neither the host's load nor the client's
    delays move."""
    before, after = (metric_totals((point / f"metrics_{name}.txt").read_text())
                     for name in ("before", "after"))
    tokens = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    seconds = after["workbench_sim:model_busy_seconds"] - before["workbench_sim:model_busy_seconds"]
    assert tokens > 0 and seconds > 0, point
    return tokens / seconds


def metric_totals(text: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


# --- one point's load against a fake server ------------------------------------------------------


def reply(ids: list[int]) -> dict[str, Any]:
    return {"text": "", "output_ids": ids, "meta_info": {
        "prompt_tokens": 3, "completion_tokens": len(ids), "cached_tokens": 1,
        "finish_reason": {"type": "stop", "matched": ids[-1]}, "e2e_latency": 0.01}}


def fake_server(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":
        return httpx.Response(404, json={"error": {"message": "metrics off"}})
    body = json.loads(request.content)
    if not body.get("stream"):
        return httpx.Response(200, json=reply([5, 6, 7]))
    chunks = [f"data: {json.dumps(reply([5, 6, 7][:n]))}\n\n" for n in (1, 2, 3)]
    return httpx.Response(200, text="".join(chunks) + "data: [DONE]\n\n",
                          headers={"content-type": "text/event-stream"})


def run_load(load: LoadParams, concurrency: int = 2, **kwargs: Any) -> Any:
    import asyncio

    async def go() -> Any:
        async with SGLangClient("http://sim", transport=httpx.MockTransport(fake_server)) as client:
            prompts = [LoadPrompt(i, [1, 2, 3]) for i in range(5)]
            return await PointLoad(client, prompts, load, concurrency, **kwargs).run()

    return asyncio.run(go())


def test_warm_up_requests_are_left_out_of_the_window() -> None:
    outcome = run_load(LoadParams(concurrency=[2], warmup_requests=3, requests=10, stream=False),
                       time_scale=2.0)
    phases = [row.phase for row in outcome.rows]
    assert phases[:3] == ["warmup"] * 3 and phases[3:] == ["measured"] * 10
    result = summarize_point(outcome, config="a", concurrency=2, repeat=1, time_scale=2.0)
    assert (result.status, result.requests, result.errors, result.output_tokens) == ("ok", 10, 0, 30)
    window = outcome.window_end - outcome.window_start
    assert result.output_throughput == pytest.approx(30 / window, rel=1e-3)
    assert result.ttft_p50_ms is None and result.e2e_p50_s is not None
    assert result.time_scale == 2.0 and result.peak_token_usage is None


def test_streamed_requests_give_ttft_itl_and_window_tokens() -> None:
    outcome = run_load(LoadParams(concurrency=[1], warmup_requests=1, requests=4), concurrency=1)
    result = summarize_point(outcome, config="a", concurrency=1, repeat=1, time_scale=1.0)
    assert result.status == "ok" and result.requests == 4 and result.output_tokens == 12
    assert result.ttft_p50_ms is not None and result.itl_p50_ms is not None
    assert all(row.completion_tokens == 3 for row in outcome.rows)


def run_slow_load(load: LoadParams, reply_after: float) -> Any:
    """One request in flight at a time against a server that answers after `reply_after` s."""
    import asyncio

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404, json={"error": {"message": "metrics off"}})
        await asyncio.sleep(reply_after)
        return httpx.Response(200, json=reply([5, 6, 7]))

    async def go() -> Any:
        async with SGLangClient("http://sim", transport=httpx.MockTransport(slow)) as client:
            return await PointLoad(client, [LoadPrompt(0, [1, 2, 3])], load, 1).run()

    return asyncio.run(go())


def test_a_window_waits_for_its_first_finished_request() -> None:
    # requests take 0.5 s and the window is 0.2 s: it stays open until one finishes
    outcome = run_slow_load(LoadParams(concurrency=[1], duration=0.2, sample_interval=0.05,
                                       stream=False), reply_after=0.5)
    result = summarize_point(outcome, config="a", concurrency=1, repeat=1, time_scale=1.0)
    assert result.status == "ok" and result.requests == 1 and result.output_tokens == 3
    assert 0.45 <= (result.window_s or 0) < 0.8  # not at 0.2 s, and not at 4 x 0.2 s
    assert result.e2e_p50_s is not None


def test_a_window_where_nothing_finishes_fails_after_overtime() -> None:
    outcome = run_slow_load(LoadParams(concurrency=[1], duration=0.1, sample_interval=0.02,
                                       stream=False), reply_after=5.0)
    result = summarize_point(outcome, config="a", concurrency=1, repeat=1, time_scale=1.0)
    assert result.status == "failed" and result.requests == 0
    assert (result.reason or "").startswith("no request finished in the window")
    assert 0.4 <= (result.window_s or 0) < 1.0  # OVERTIME x duration, then it gives up


def test_a_server_that_dies_fails_the_point_with_its_reason() -> None:
    calls: list[int] = []

    def server_exit() -> str | None:
        calls.append(1)
        return "server killed by SIGKILL: out of memory: CUDA out of memory" if len(calls) > 3 else None

    outcome = run_load(LoadParams(concurrency=[2], duration=1e9, sample_interval=0.05, stream=False),
                       server_exit=server_exit)
    result = summarize_point(outcome, config="a", concurrency=2, repeat=1, time_scale=1.0)
    assert result.status == "failed" and "out of memory" in (result.reason or "")


# --- a sweep of three configurations (one failing) by two concurrencies ------------------------


@pytest.fixture(scope="module")
def sim_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SweepSummary]]:
    folder = tmp_path_factory.mktemp("sweep")
    params = write_params(folder, sim_params([
        {"name": "small", "args": {"mem_fraction_static": 0.80}},
        {"name": "oom", "args": {"mem_fraction_static": 0.97}},
        {"name": "big", "args": {"mem_fraction_static": 0.88, "kv_cache_dtype": "fp8_e4m3"}},
    ]))
    out = folder / "out"
    yield out, run_sweep(params, out)


def test_sweep_completes_with_sensible_numbers(sim_sweep: tuple[Path, SweepSummary]) -> None:
    out, summary = sim_sweep
    assert (summary.ran, summary.skipped, summary.failed, summary.interrupted) == (6, 0, 2, False)
    rows = csv_rows(out)
    assert set(REQUIRED_COLUMNS) <= set(rows[0])
    assert [(r["config"], r["concurrency"], r["status"]) for r in rows] == [
        ("small", "4", "ok"), ("small", "48", "ok"), ("oom", "4", "failed"), ("oom", "48", "failed"),
        ("big", "4", "ok"), ("big", "48", "ok")]
    ok = {(r["config"], int(r["concurrency"])): r for r in rows if r["status"] == "ok"}
    for row in ok.values():
        assert float(row["output_throughput"]) > 0 and float(row["request_throughput"]) > 0
        assert 0 < float(row["ttft_p50_ms"]) <= float(row["ttft_p99_ms"])
        assert 0 < float(row["itl_p50_ms"]) < 200 and float(row["e2e_p50_s"]) > 0
        assert float(row["time_scale"]) == 3.0 and 0 < float(row["peak_token_usage"]) <= 1
    small, big = ok["small", 48], ok["big", 48]
    assert int(big["max_total_num_tokens"]) > int(small["max_total_num_tokens"])
    assert float(big["output_throughput"]) >= float(small["output_throughput"])
    assert float(big["mean_running"]) > float(small["mean_running"])
    assert float(ok["small", 48]["output_throughput"]) > float(ok["small", 4]["output_throughput"])


def test_a_failing_configuration_is_recorded_and_the_sweep_goes_on(
        sim_sweep: tuple[Path, SweepSummary]) -> None:
    out, _ = sim_sweep
    failed = [r for r in load_results(out) if r.config == "oom"]
    assert [r.status for r in failed] == ["failed", "failed"]
    assert all("out of memory" in (r.reason or "") for r in failed)
    assert "exited with code 1" in (failed[0].reason or "")
    assert all(r.ok for r in load_results(out) if r.config == "big")


def test_each_point_has_its_folder(sim_sweep: tuple[Path, SweepSummary]) -> None:
    out, _ = sim_sweep
    point = out / "big" / "c48"
    for name in ("result.json", "requests.jsonl", "samples.jsonl", "metrics_before.txt",
                 "metrics_after.txt", "server_info.json", "server.log"):
        assert (point / name).is_file(), name
    rows = [json.loads(line) for line in (point / "requests.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in rows]
    assert phases.count("warmup") == 8 and "measured" in phases
    result = json.loads((point / "result.json").read_text())
    assert result["requests"] == sum(1 for r in rows if r["phase"] == "measured" and r["ok"])
    assert "sglang:num_running_reqs" in (point / "metrics_after.txt").read_text()
    assert "Decode batch" in (point / "server.log").read_text()
    assert json.loads((out / "big" / "server_info.json").read_text())["max_total_num_tokens"] > 0


def test_no_server_is_left_after_the_sweep(sim_sweep: tuple[Path, SweepSummary]) -> None:
    out, _ = sim_sweep
    pids = server_pids(out)
    assert len(pids) == 3
    for pid in pids:
        wait_group_gone(pid, f"the server group {pid} to be gone")


def test_the_recommendation_and_the_report(sim_sweep: tuple[Path, SweepSummary], tmp_path: Path) -> None:
    from workbench.report.render import cell_data
    from workbench.tune import tuning_report

    out, _ = sim_sweep
    rec = recommend_sweep(out)
    assert (rec.best, rec.baseline, rec.concurrency) == ("big", "small", 48)
    assert rec.projection_text.count(" h") == 2 and "->" in rec.text
    report = tuning_report(out, tmp_path / "reports")
    assert report.html_path.is_file()
    shown = cell_data(report.notebook_path, "recommendation")
    assert shown["best"] == "big" and shown["projection"] == rec.projection_text
    assert len(cell_data(report.notebook_path, "points")) == 6


# --- resume and interruption ---------------------------------------------------------------------


def test_a_killed_sweep_resumes_without_redoing_finished_points(tmp_path: Path) -> None:
    params = write_params(tmp_path, sim_params(
        [{"name": "only", "args": {"mem_fraction_static": 0.85}}], speed=10.0,
        concurrency=[2, 4, 8], duration=None, requests=12, warmup_requests=2, stream=False))
    out = tmp_path / "out"
    proc = sweep_subprocess(params, out)
    first = out / "only" / "c2" / "result.json"
    try:
        wait_until(first.exists, 120, f"{first} to be written")
    finally:
        proc.kill()
        proc.wait()
    pid = server_pids(out)[0]
    wait_group_gone(pid, "the killed sweep's server to go down with it")
    done = {p.parent.name: p.read_bytes() for p in out.glob("only/*/result.json")}
    requests_before = (out / "only" / "c2" / "requests.jsonl").read_bytes()
    assert "c2" in done and len(done) < 3
    summary = run_sweep(params, out, resume=True)
    assert (summary.ran, summary.skipped) == (3 - len(done), len(done))
    for name, data in done.items():
        assert (out / "only" / name / "result.json").read_bytes() == data
    assert (out / "only" / "c2" / "requests.jsonl").read_bytes() == requests_before
    assert [r["concurrency"] for r in csv_rows(out)] == ["2", "4", "8"]
    again = run_sweep(params, out, resume=True)
    assert (again.ran, again.skipped) == (0, 3)
    with pytest.raises(InputError, match="--resume"):
        run_sweep(params, out)


def test_an_interrupted_sweep_stops_its_server(tmp_path: Path) -> None:
    params = write_params(tmp_path, sim_params(
        [{"name": "a", "args": {}}, {"name": "b", "args": {}}], duration=3600))
    out = tmp_path / "out"
    proc = sweep_subprocess(params, out)
    try:
        wait_until(lambda: (out / "a" / "c4" / "samples.jsonl").exists() or
                   b"Decode batch" in _read(out / "a" / "server.log"), 120, "the first point's load")
    except AssertionError:
        proc.kill()
        raise
    pid = server_pids(out)[0]
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, output
    assert "stopping the sweep" in output
    wait_group_gone(pid, "the interrupted sweep's server to be gone")
    assert not (out / "b").exists()
    assert (out / "results.csv").read_text().startswith("config,")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# --- dry run and parameters -------------------------------------------------------------------------


def test_dry_run_prints_the_exact_server_commands(tmp_path: Path) -> None:
    params = write_params(tmp_path, {
        "server": {"launcher": "sglang", "model_path": "/models/Kimi-K2.5", "port": 30000,
                   "args": {"tp_size": 8, "trust_remote_code": True}, "python": "python3",
                   "env": {"SGLANG_X": "1"}},
        "grid": {"matrix": {"mem_fraction_static": [0.8, 0.88],
                            "hicache": [{"name": "nohicache"},
                                        {"name": "hicache48", "args": {"enable_hierarchical_cache": True,
                                                                       "hicache_size": 48}}]}},
        "load": {"concurrency": [150], "duration": 600},
    })
    lines: list[str] = []
    assert run_sweep_cli(params, dry_run=True, say=lines.append) == 0
    base = ("SGLANG_X=1 python3 -m sglang.launch_server --host 127.0.0.1 --port 30000 --model-path "
            "/models/Kimi-K2.5 --enable-metrics --tp-size 8 --trust-remote-code")
    assert lines[0].splitlines() == [
        "# mfs0.8-nohicache", f"{base} --mem-fraction-static 0.8",
        "# mfs0.8-hicache48", f"{base} --mem-fraction-static 0.8 --enable-hierarchical-cache --hicache-size 48",
        "# mfs0.88-nohicache", f"{base} --mem-fraction-static 0.88",
        "# mfs0.88-hicache48", f"{base} --mem-fraction-static 0.88 --enable-hierarchical-cache --hicache-size 48",
    ]
    sim: list[str] = []
    run_sweep_cli(params, dry_run=True, overrides=["server.launcher=sim"], say=sim.append)
    text = sim[0].splitlines()
    assert text[1] == "# ignored by the simulator: --trust-remote-code"
    assert text[2].startswith("SGLANG_X=1 python3 -m workbench.sim --host 127.0.0.1 --port 30000 "
                              "--model-path /models/Kimi-K2.5 --profile fast --speed 1.0")
    assert not (tmp_path / "outputs").exists()


def test_the_example_parameter_files_load() -> None:
    sim = load_tuning_params(PARAMS / "tuning.sim.yaml")
    assert len(expand_grid(sim)) >= 3 and sim.server.launcher == "sim"
    kimi = load_tuning_params(PARAMS / "tuning.kimi-k25.yaml")
    configs = expand_grid(kimi)
    assert [c.name for c in configs][:2] == ["mfs0.8-kvauto-nohicache", "mfs0.8-kvauto-hicache48"]
    assert len(configs) == 8 and kimi.grid.baseline == configs[0].name
    tuned = next(c for c in configs if c.name == "mfs0.88-kvbf16-hicache48")
    assert tuned.args == {"tp_size": 8, "trust_remote_code": True, "enable_metrics": True,
                          "mem_fraction_static": 0.88, "kv_cache_dtype": "bf16",
                          "enable_hierarchical_cache": True, "hicache_size": 48}


def test_the_real_sglang_sweep_finds_its_interpreter_and_model_beside_the_file() -> None:
    real = load_tuning_params(PARAMS / "tuning.real-sglang.yaml")
    root = PARAMS.resolve().parent
    assert real.server.python == str(root / ".venv-sglang" / "bin" / "python")  # not the symlink's target
    assert real.server.model_path == str(root / "outputs" / "real-sglang" / "model")
    names = [c.name for c in expand_grid(real)]
    assert {"default", "no-radix", "kv-fp8", "hicache"} <= set(names)
    assert real.server.env == {"SGLANG_USE_CPU_ENGINE": "1"} and real.repeats == 2


def test_a_server_section_loads_alone_with_its_paths_beside_the_file(tmp_path: Path) -> None:
    real = load_server_params(PARAMS / "tuning.real-sglang.yaml")  # a tuning file's section
    assert real.python == str(PARAMS.resolve().parent / ".venv-sglang" / "bin" / "python")
    (tmp_path / "model").mkdir()
    path = tmp_path / "server.yaml"
    path.write_text("server:\n  launcher: sglang\n  model_path: model\n  python: venv/bin/python\n")
    alone = load_server_params(path)
    assert (alone.model_path, alone.python) == (str(tmp_path / "model"), str(tmp_path / "venv/bin/python"))
    path.write_text("launcher: sim\n")
    with pytest.raises(ConfigError, match=r"server.yaml: server: missing required key$"):
        load_server_params(path)
    path.write_text("server:\n  launcher: sim\n  args: {mem_fraction_static: 0.8}\n  startup_timeout: 0\n")
    with pytest.raises(ConfigError, match=r"server.yaml:4: server.startup_timeout: "):
        load_server_params(path)


def test_model_paths_resolve_only_when_they_are_paths(tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    base = {"load": {"concurrency": [4], "duration": 5}}
    def server(**keys: Any) -> Any:
        path = write_params(tmp_path, {**base, "server": {"launcher": "sglang", **keys}})
        return load_tuning_params(path).server
    assert server(model_path="models/tiny").model_path == str(tmp_path / "models" / "tiny")
    assert server(model_path="moonshotai/Kimi-K2.5").model_path == "moonshotai/Kimi-K2.5"
    assert server(model_path="m", python="python3").python == "python3"  # found on PATH
    assert server(model_path="m", python="~/venv/bin/python").python == str(
        Path("~/venv/bin/python").expanduser())


@pytest.mark.parametrize(("change", "message"), [
    ({"load": {"concurency": [4], "duration": 5}}, "load.concurency: unknown key (known: "),
    ({"load": {"concurrency": [4], "duration": "long"}}, "load.duration: expected float, got str"),
    ({"load": {"concurrency": [4]}}, "load: set requests or duration"),
    ({"load": {"concurrency": [0], "duration": 5}}, "load.concurrency[0]: expected int >= 1"),
    ({"server": {"launcher": "vllm"}}, "server.launcher: invalid value"),
    ({"server": {"launcher": "sglang"}}, "server.model_path: required with launcher sglang"),
    ({"grid": {"configs": [{"name": "a"}, {"name": "a"}]}}, "two configurations are called 'a'"),
    ({"grid": {"configs": [{"name": "a/b"}]}}, "is not a safe directory name"),
    ({"grid": {"baseline": "x"}}, "grid.baseline: no configuration 'x'"),
    ({"grid": {"matrix": {"hicache": [{"nme": "x"}]}}}, "grid.matrix.hicache[0]: expected a value or"),
])
def test_bad_parameters_are_one_line_config_errors(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    body = {"load": {"concurrency": [4], "duration": 5}, **change}
    path = write_params(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        run_sweep_cli(path, tmp_path / "out", say=print)
    assert message in str(info.value)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_overrides_are_checked_key_by_key(tmp_path: Path) -> None:
    path = write_params(tmp_path, {"load": {"concurrency": [4], "duration": 5}})
    params = load_tuning_params(path, ["load.concurrency=[8, 16]", "server.sim.speed=50"])
    assert params.load.concurrency == [8, 16] and params.server.sim.speed == 50
    with pytest.raises(ConfigError, match=r"^--set: load.duratin: unknown key 'duratin' \(known: concurrency, "):
        load_tuning_params(path, ["load.duratin=3"])
    with pytest.raises(ConfigError, match=r"^--set: load.duration: expected float, got str$"):
        load_tuning_params(path, ["load.duration=abc"])
    with pytest.raises(ConfigError, match=r"^--set: server.launcher: invalid enum value 'x'"):
        load_tuning_params(path, ["server.launcher=x"])
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_tuning_params(path, ["load.duration"])


# --- recommendation and projection -----------------------------------------------------------------


def point(config: str, tok_s: float | None, *, concurrency: int | str = 150, status: str = "ok",
          **figures: Any) -> PointResult:
    return PointResult(config=config, concurrency=concurrency, status=status,
                       output_throughput=tok_s, requests=100, **figures)


def test_projection_shows_the_baseline_next_to_the_best() -> None:
    remaining = 123_120_000
    assert projection(remaining, 600) == pytest.approx(57.0)
    results = [point("untuned", 600.0), point("fast-but-slow-ttft", 2500.0, ttft_p99_ms=90_000.0),
               point("tuned", 1868.9), point("broken", None, status="failed", reason="out of memory"),
               point("tuned", 900.0, concurrency=64)]
    rec = recommend(results, limits=LatencyLimits(ttft_p99_ms=60_000), remaining_tokens=remaining,
                    concurrency=150)
    assert (rec.best, rec.baseline) == ("tuned", "untuned")
    assert rec.projection_text == "57.0 h -> 18.3 h"
    assert "recommended: tuned at concurrency 150: 1,869 output tok/s (3.11x untuned)" in rec.text
    rows = {r.config: r for r in rec.rows}
    assert rows["fast-but-slow-ttft"].violations == ("ttft_p99_ms 90,000 > 60,000",)
    assert rows["broken"].status == "failed" and rows["broken"].reason == "out of memory"
    assert format_hours(0.5) == "30.0 min" and format_hours(None) == "-"


def test_projection_gives_gpu_hours_from_the_servers_gpus() -> None:
    remaining = 123_120_000  # 57.0 h at 600 tok/s
    results = [point("untuned", 600.0, gpus=8), point("tuned", 1868.9, gpus=8)]
    rec = recommend(results, remaining_tokens=remaining, concurrency=150)
    rows = {r.config: r for r in rec.rows}
    assert rows["untuned"].gpu_hours == pytest.approx(57.0 * 8)
    assert rec.projection_text == "57.0 h -> 18.3 h (456 -> 146 GPU-hours on 8 GPUs)"
    assert rec.to_dict()["rows"][1]["gpu_hours"] == pytest.approx(rows["tuned"].hours * 8)
    # projection.gpus overrides what the servers said; unknown GPUs give hours only
    assert "(57.0 -> 18.3 GPU-hours on 1 GPU)" in recommend(
        results, remaining_tokens=remaining, concurrency=150, gpus=1).projection_text
    unknown = recommend([point("untuned", 600.0), point("tuned", 1868.9)],
                        remaining_tokens=remaining, concurrency=150)
    assert unknown.projection_text == "57.0 h -> 18.3 h" and unknown.rows[0].gpu_hours is None


@pytest.mark.parametrize(("info", "gpus"), [
    ({"tp_size": 8, "dp_size": 1}, 8),
    ({"tp_size": 4, "dp_size": 2, "pp_size": 2}, 16),
    ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8),
    ({"internal_states": [{"tp_size": 2, "dp_size": 2}]}, 4),
    ({"version": "0.5.23"}, None),
    ({"tp_size": "8"}, 1),  # not a count: taken as SGLang's default
])
def test_gpu_count_from_server_info(info: dict[str, Any], gpus: int | None) -> None:
    assert gpu_count(info) == gpus


def test_without_a_concurrency_the_best_point_chooses_it() -> None:
    results = [point("a", 500.0, concurrency=64), point("a", 600.0), point("b", 700.0, concurrency=64),
               point("b", 650.0)]
    rec = recommend(results)
    assert (rec.best, rec.concurrency, rec.remaining_tokens) == ("b", 64, None)
    assert "no projection" not in rec.text


def test_repeats_give_a_spread_and_a_win_inside_it_is_called_so() -> None:
    results = [point("base", 400.0, repeat=1), point("base", 600.0, repeat=2),
               point("big", 540.0, repeat=1), point("big", 560.0, repeat=2)]
    rec = recommend(results)
    assert rec.row("base").spread == pytest.approx(0.4)  # type: ignore[union-attr]
    assert rec.row("big").spread == pytest.approx(20 / 550, abs=1e-4)  # type: ignore[union-attr]
    assert rec.best == "big" and "(1.10x base; repeats spread up to 40%: within it, not a clear win)" in rec.text
    clear = recommend([point("base", 500.0, repeat=1), point("base", 510.0, repeat=2),
                       point("big", 900.0, repeat=1), point("big", 910.0, repeat=2)])
    assert "x base; repeats spread up to 2%)" in clear.text and "not a clear win" not in clear.text
    assert recommend([point("base", 500.0), point("big", 900.0)]).row("big").spread is None  # type: ignore[union-attr]


def test_remaining_tokens_from_a_manifest_and_from_a_run(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"sample_id": i, "input_ids": [1, 2, 3]}) + "\n" for i in range(10)))
    manifest = tmp_path / "datasets.yaml"
    manifest.write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": [
        {"name": "a", "path": str(data), "input": "input_ids", "max_tokens": 5000},
        {"name": "b", "path": str(data), "input": "input_ids", "max_samples": 4},
        {"name": "c", "path": str(data), "input": "input_ids"}]}))
    assert remaining_from_manifest(manifest, 100) == 5000 + 4 * 100 + 10 * 100
    with pytest.raises(ConfigError, match="mean_completion_tokens"):
        remaining_from_manifest(manifest)
    run = tmp_path / "run"
    for name in ("a", "b"):
        (run / name).mkdir(parents=True)
        (run / name / "raw_responses.jsonl").write_text("".join(json.dumps(
            {"sample_id": i, "output_ids": [], "prompt_tokens": 3, "completion_tokens": 200,
             "cached_tokens": 0, "finish_reason": "stop", "matched_stop": None, "e2e_latency": 1.0,
             "ts": 1.0, "schema": 1}) + "\n" for i in range(4)))
    (run / "run.json").write_text(json.dumps({"datasets": {"a": {"prompts": 10, "max_tokens": 5000},
                                                           "b": {"prompts": 10}}}))
    assert remaining_from_run(run) == (5000 - 800) + 6 * 200


# --- the Kimi-K2.5 replay -------------------------------------------------------------------------------


def test_kimi_replay_reproduces_the_seeds_measurements(tmp_path: Path) -> None:
    """The untuned and the tuned server of params/tuning.kimi-k25.yaml on the simulator's
    kimi-k2.5-8xrtx6000 profile, with a shorter window: ~600 tok/s, then 1.5x to 2.3x that.

    The throughputs are read in model time from the simulator's counters (`model_throughput`):
    the client's figure is wall time x 200, so a loaded host (a simulator falling behind its
    pace, client delays x 200) would lower it. 150 workers keep the queue full (the pool
    admits fewer than 150), so the engine's steps do not depend on how fast replies return."""
    params = load_tuning_params(PARAMS / "tuning.kimi-k25.yaml", {
        "server.launcher": "sim", "load.stream": False, "load.duration": 900,
        "grid.matrix": {}, "grid.baseline": "untuned",
        "grid.configs": [
            {"name": "untuned", "args": {"mem_fraction_static": 0.80}},
            {"name": "tuned", "args": {"mem_fraction_static": 0.88, "kv_cache_dtype": "bf16",
                                       "enable_hierarchical_cache": True, "hicache_size": 48}}]})
    out = tmp_path / "out"
    run_sweep(params, out)
    results = {r.config: r for r in load_results(out)}
    untuned, tuned = results["untuned"], results["tuned"]
    assert untuned.time_scale == 200.0 and untuned.ok and tuned.ok
    model = {name: model_throughput(out / name / "c150") for name in results}
    assert 500 <= model["untuned"] <= 700
    assert 1.5 <= model["tuned"] / model["untuned"] <= 2.3
    assert (untuned.mean_running or 0) < 40 < (tuned.mean_running or 0) < 150
    assert (tuned.cache_hit_rate or 0) > (untuned.cache_hit_rate or 0)
    in_model_time = [msgspec.structs.replace(r, output_throughput=model[r.config])
                     for r in results.values()]
    assert recommend(in_model_time).best == "tuned"


def test_recommendation_says_how_close_auto_gets() -> None:
    results = [point("a", 500.0, concurrency=64), point("a", 600.0), point("a", 588.0, concurrency="auto")]
    rec = recommend(results)
    assert rec.concurrency == 150 and dict(rec.auto) == {"a": 0.98}
    assert "auto concurrency reaches 0.98 of its best fixed concurrency" in rec.text


def test_auto_is_measured_as_a_point(tmp_path: Path) -> None:
    params = write_params(tmp_path, sim_params([{"name": "small", "args": {"mem_fraction_static": 0.80}}],
                                               concurrency=[48, "auto"]))
    out = tmp_path / "out"
    summary = run_sweep(params, out)
    auto = next(r for r in summary.results if r.concurrency == "auto")
    fixed = next(r for r in summary.results if r.concurrency == 48)
    assert auto.ok and fixed.ok and (out / "small" / "cauto" / "result.json").exists()
    assert auto.mean_concurrency is not None and auto.mean_concurrency >= 4
    assert auto.output_throughput is not None and fixed.output_throughput is not None
    rec = recommend_sweep(out)
    assert rec.concurrency == 48 and dict(rec.auto)["small"] > 0
    assert [row["concurrency"] for row in csv_rows(out)] == ["48", "auto"]
