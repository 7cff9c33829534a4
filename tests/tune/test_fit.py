"""A simulator profile fitted to a sweep (`workbench tune fit`): the simulator measured with a
known profile gives its step constants back, the held-out configuration replayed with the
fitted profile lands near its measurement, and profile files work in tuning parameters."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from test_tune import write_params

from workbench.cli import main
from workbench.errors import ConfigError, InputError
from workbench.sim import SimConfig
from workbench.sim.profiles import get_sim_profile, load_sim_profile, profile_yaml
from workbench.sim.server import SimServer
from workbench.tune import (
    PointResult,
    expand_grid,
    format_commands,
    load_tuning_params,
    plan_commands,
    run_sweep,
)
from workbench.tune.fit import (
    FitPoint,
    FitReport,
    Prediction,
    fit_profile,
    predict,
    replay_params,
    solve_step,
    write_profile,
)
from workbench.tune.results import plan_points

# The simulator's `fast` profile with steps long enough to measure at speed 2 on a loaded
# host (a few hundred streamed tok/s of wall clock).
TRUTH = msgspec.structs.replace(get_sim_profile("fast"), name="truth", step_base_ms=40.0,
                                step_per_req_ms=2.0, prefill_ms_per_token=0.02)
SPEED = 2.0
# Tolerances of the recovered constants: the step is measured by the client (ITL p50 of a few
# dozen requests per point, at 2x speed on a shared CPU), and with one prompt and output
# length per point the prefill cost (0.02 ms x 96 tokens / 32 outputs = 0.06 ms per running
# request) is folded into step_per_req_ms.
BASE_TOLERANCE = 0.15
PER_REQ_TOLERANCE = 0.25
PREDICTION_TOLERANCE_PCT = 15.0


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A sweep of the simulator running TRUTH: two configurations to fit, one held out."""
    folder = tmp_path_factory.mktemp("fit")
    (folder / "truth.yaml").write_text(profile_yaml(TRUTH))
    params = write_params(folder, {
        "server": {"launcher": "sim", "startup_timeout": 30, "stop_grace": 5,
                   "sim": {"profile": "truth.yaml", "speed": SPEED}},
        "grid": {"configs": [{"name": "plain", "args": {}},
                             {"name": "mrr4", "args": {"max_running_requests": 4}},
                             {"name": "pool1200", "args": {"max_total_tokens": 1200}}]},
        "load": {"concurrency": [2, 12], "warmup_requests": 4, "duration": 6,
                 "max_new_tokens": 32, "prompts": {"count": 100, "input_len": [64, 128]},
                 "sample_interval": 0.25},
        "projection": {"remaining_tokens": 1000},
        "fidelity": {"prompts": 0},  # no probe: the fit reads the points only (test_tune_fidelity)
    })
    run_sweep(params, folder / "out")
    yield folder / "out"


@pytest.mark.integration
def test_the_fit_recovers_the_step_constants(measured: Path) -> None:
    profile, report = fit_profile(measured, ["plain", "mrr4"])
    assert report.configs == ["plain", "mrr4"] and report.held_out == ["pool1200"]
    assert len(report.points) == 4
    assert abs(profile.step_base_ms - 40.0) <= 40.0 * BASE_TOLERANCE, report
    assert abs(profile.step_per_req_ms - 2.06) <= 2.06 * PER_REQ_TOLERANCE, report
    assert profile.prefill_ms_per_token == 0.0 and "folded" in report.prefill_source
    assert report.max_error_pct < 10.0
    # every reply of `fast` outgrows 32 tokens: the fitted shape cuts them all there
    assert profile.output.unclosed_rate == 1.0 and "100% were cut at 32" in report.output
    # memory in which any pool starts, and the server's own limits
    assert profile.context_length == 32_768 and profile.default_chunked_prefill_size == 8192


@pytest.mark.integration
def test_the_profile_file_says_what_it_was_fitted_on(measured: Path, tmp_path: Path) -> None:
    profile, report = fit_profile(measured, ["plain", "mrr4"])
    path = write_profile(profile, report, tmp_path / "fitted.yaml")
    text = path.read_text()
    assert f"# sweep: {measured.resolve()}" in text
    assert "# fitted on: plain, mrr4\n# held out: pool1200\n" in text
    assert f"rms {report.rms_ms:.2f} ms" in text
    assert text.count("\n# mrr4 ") == 2  # one residual line per point used
    assert load_sim_profile(path) == profile


@pytest.mark.integration
def test_the_held_out_configuration_is_predicted_within_15_percent(
        measured: Path, tmp_path: Path) -> None:
    profile, report = fit_profile(measured, ["plain", "mrr4"])
    path = write_profile(profile, report, tmp_path / "fitted.yaml")
    rows = predict(measured, path, fitted=report.configs, speed=SPEED)
    assert [(row.config, row.concurrency, row.role) for row in rows] == [
        ("pool1200", 2, "held out"), ("pool1200", 12, "held out")]
    for row in rows:
        assert row.error_pct is not None and abs(row.error_pct) <= PREDICTION_TOLERANCE_PCT, rows
    with (tmp_path / "fit.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [float(r["predicted_tok_s"]) for r in table] == pytest.approx(
        [row.predicted for row in rows], rel=1e-3)
    # the replay ran the held-out configuration with its pool, on the fitted profile
    command = json.loads((tmp_path / "fitted.predict" / "pool1200" / "config.json").read_text())
    assert f"--profile {path}" in command["command"]
    assert "--max-total-tokens 1200" in command["command"]


@pytest.mark.integration
def test_workbench_tune_fit_prints_the_constants_and_each_point(
        measured: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yaml"
    assert main(["tune", "fit", str(measured), "--out", str(out), "--configs", "plain,mrr4"]) == 0
    printed = capsys.readouterr().out
    assert "step_base_ms" in printed and "step_per_req_ms" in printed
    assert sum(line.startswith(("plain ", "mrr4 ")) for line in printed.splitlines()) == 4
    assert f"wrote {out}" in printed and out.is_file()


def test_fit_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match="not a sweep directory"):
        fit_profile(tmp_path)
    assert main(["tune", "fit", str(tmp_path), "--out", str(tmp_path / "p.txt")]) == 2
    assert "--out: a profile file ends in .yaml or .yml" in capsys.readouterr().err


def test_tune_without_params_or_verb_keeps_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["tune"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("workbench: error: the following arguments are required: "
                                       "--params (see: workbench tune --help)\n")


# --- the least squares, on points made up with known constants -------------------------------


def made_up(base: float, per_req: float, per_token: float,
            shapes: list[tuple[float, float]]) -> list[FitPoint]:
    """Points of the given (running, prompt tokens per output token) at the exact step."""
    points = []
    for running, per_output in shapes:
        prefill = running * per_output
        step = base + per_req * running + per_token * prefill
        points.append(FitPoint("c", int(running), 1, running, step, prefill, 100.0, None))
    return points


def test_the_three_constants_come_back_when_prompt_shapes_vary() -> None:
    points = made_up(16.0, 0.12, 0.1, [(8, 0.8), (30, 0.6), (45, 0.75), (8, 0.5), (30, 0.9)])
    base, per_req, per_token, source = solve_step(points)
    assert (base, per_req, per_token) == pytest.approx((16.0, 0.12, 0.1), rel=1e-6)
    assert source == "least squares with the step times"


def test_with_one_prompt_shape_the_prefill_cost_is_folded_into_each_request() -> None:
    points = made_up(20.0, 1.0, 0.01, [(2, 3.0), (8, 3.0), (16, 3.0)])
    base, per_req, per_token, source = solve_step(points)
    assert (base, per_req, per_token) == pytest.approx((20.0, 1.03, 0.0), rel=1e-6)
    assert source.startswith("folded into step_per_req_ms")


def test_constants_are_never_negative() -> None:
    points = made_up(0.0, 1.0, 0.0, [(1, 1.0), (2, 1.0)])
    points[0].step_ms = 2.0  # a fall with the batch would need a negative slope
    base, per_req, _, _ = solve_step(points)
    assert base >= 0 and per_req >= 0


def test_a_prediction_without_a_measurement_has_no_error() -> None:
    assert Prediction("c", 8, "held out", None, 100.0).error_pct is None
    assert Prediction("c", 8, "held out", 200.0, 150.0).error_pct == -25.0
    assert FitReport  # the report type is public


# --- profile files in tuning parameters ------------------------------------------------------


def sim_sweep_params(folder: Path, profile: str) -> Path:
    return write_params(folder, {
        "server": {"launcher": "sim", "sim": {"profile": profile}},
        "load": {"concurrency": [4], "duration": 5},
    })


def test_a_profile_file_in_tuning_parameters_is_relative_to_them(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    profile = tmp_path / "profiles" / "fitted.yaml"
    profile.write_text(profile_yaml(TRUTH))
    params = load_tuning_params(sim_sweep_params(tmp_path, "profiles/fitted.yaml"))
    assert params.server.sim.profile == str(profile.resolve())
    assert f"--profile {profile.resolve()}" in format_commands(plan_commands(params))
    assert load_tuning_params(sim_sweep_params(tmp_path, "fast")).server.sim.profile == "fast"


def test_a_bad_profile_file_names_the_parameters_the_file_and_its_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(profile_yaml(TRUTH).replace("step_base_ms:", "step_bass_ms:"))
    with pytest.raises(ConfigError) as caught:
        load_tuning_params(sim_sweep_params(tmp_path, "bad.yaml"))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'tuning.yaml'}:")
    assert f"server.sim.profile: {bad}:" in message and "step_bass_ms: unknown key" in message
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_tuning_params(sim_sweep_params(tmp_path, "missing.yaml"))


# --- a sweep of the real SGLang on the CPU, as its files look (made up, no server) -----------


def real_like_sweep(root: Path) -> Path:
    """params/tuning.real-sglang.yaml's sweep with three configurations measured by a made-up
    server whose step is 18 ms + 1.2 ms per running request; every reply runs to 128 tokens.
    Its /metrics gauge of running requests reads low, as SGLang's does (refreshed every 40
    decode steps and at admission): 0.65 of the batch. /server_info as SGLang 0.5.23 writes it (memory_usage, effective_max_running_requests)."""
    params = load_tuning_params(Path(__file__).resolve().parents[2] / "params"
                                / "tuning.real-sglang.yaml")
    params = msgspec.structs.replace(params, grid=msgspec.structs.replace(params.grid, configs=[
        c for c in params.grid.configs if c.name in ("default", "pool8k", "no-radix")]))
    root.mkdir()
    (root / "sweep.json").write_text(json.dumps({"params": msgspec.to_builtins(params)}))
    for config, plans in plan_points(root, expand_grid(params), params.load, params.repeats).items():
        pool = 8192 if config == "pool8k" else 16384
        cached = 0 if config == "no-radix" else 64
        (root / config).mkdir()
        (root / config / "server_info.json").write_text(json.dumps({
            "context_length": 4096, "chunked_prefill_size": 4096, "max_total_num_tokens": pool,
            "max_running_requests": None, "max_total_tokens": pool,
            "internal_states": [{"effective_max_running_requests_per_dp": 2048, "memory_usage": {
                "weight": 0.093, "kvcache": round(pool * 2048 / 1e9, 3),
                "token_capacity": pool}}]}))
        for plan in plans:
            running = 0.95 * int(plan.concurrency)
            step = 18.0 + 1.2 * running
            tok_s = 1000 * running / step
            plan.folder.mkdir()
            result = PointResult(config=config, concurrency=plan.concurrency, output_throughput=tok_s,
                                 request_throughput=tok_s / 128, itl_p50_ms=step, ttft_p50_ms=2 * step,
                                 mean_running=0.65 * running, max_total_num_tokens=pool, requests=20,
                                 output_tokens=20 * 128, window_s=40.0)
            (plan.folder / "result.json").write_bytes(msgspec.json.encode(result))
            rows = [{"index": i, "sample_id": i, "phase": "measured", "start_s": 0, "e2e_s": 1,
                     "ok": True, "prompt_tokens": 250, "completion_tokens": 128,
                     "cached_tokens": cached, "finish_reason": "length"} for i in range(20)]
            (plan.folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_a_real_sglang_sweep_fits_and_replays_on_the_simulator(tmp_path: Path) -> None:
    root = real_like_sweep(tmp_path / "real")
    profile, report = fit_profile(root, ["default", "pool8k"])
    assert (profile.step_base_ms, profile.step_per_req_ms) == pytest.approx((18.0, 1.2), rel=1e-3)
    assert report.held_out == ["no-radix"] and report.rms_ms < 1e-6
    assert profile.context_length == 4096 and profile.default_chunked_prefill_size == 4096
    assert profile.kv_bytes_per_token_bf16 == pytest.approx(2048, rel=0.02)  # GB to 3 decimals
    assert profile.output.unclosed_rate == 1.0
    path = write_profile(profile, report, tmp_path / "cpu.yaml")
    replay = replay_params(root, path, ["no-radix"], speed=5)
    commands = format_commands(plan_commands(replay))
    assert "-m workbench.sim" in commands and ".venv-sglang" not in commands
    assert f"--profile {path}" in commands and "--speed 5" in commands
    assert "--disable-radix-cache" in commands and "--max-total-tokens 16384" in commands
    assert "--mem-fraction-static 0.05" in commands  # the memory check passes at 0.05 ...
    assert "# ignored by the simulator: --device --load-format --attention-backend" in commands
    server = SimServer(SimConfig(profile=str(path), mem_fraction_static=0.05,
                                 max_total_tokens=16384, disable_radix_cache=True))
    assert server.sizing.max_total_num_tokens == 16384  # ... and the pool is the flag's
