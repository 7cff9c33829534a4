"""The throughput_tuning report says what its claims rest on: the limits "within limits" means,
latencies in a unit their size wants, the model measured against the job projected, one
failure reason said once; unit tests of those choices, then a quick simulator sweep rendered
and read in Chromium."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from browser import open_page
from conftest import ROOT, workbench

from workbench import __version__
from workbench.report.plots import REPORT_CSS
from workbench.report.render import run_report
from workbench.tune import plots as tuning_plots
from workbench.tune.measurement import PointResult
from workbench.tune.parameters import LatencyLimits
from workbench.tune.recommendation import format_latency_ms, format_limit, recommend

OOM = ("server exited with code 1 before it was ready: out of memory: workbench sim: "
       "mem_fraction_static: out of memory: activations need 1.5 GB per rank but "
       "mem_fraction_static 0.97 leaves 0.7 GB; decrease --mem-fraction-static")


def _point(config: str, tok_s: float, ttft_p99_ms: float, itl_p50_ms: float) -> PointResult:
    return PointResult(config=config, concurrency=64, output_throughput=tok_s, requests=100,
                       ttft_p50_ms=ttft_p99_ms / 3, ttft_p99_ms=ttft_p99_ms, itl_p50_ms=itl_p50_ms,
                       e2e_p50_s=16.9, peak_token_usage=0.56, cache_hit_rate=0.39, mean_running=28.4)


def _recommendation() -> Any:
    points = [_point("default", 1263, 16_732, 22.4), _point("mfs0.88", 1750, 7_459, 25.9),
              _point("fast-but-slow-start", 2400, 25_000, 27.0),
              PointResult(config="mfs0.97", concurrency=64, status="failed", reason=OOM)]
    return recommend(points, limits=LatencyLimits(ttft_p99_ms=20_000, itl_p50_ms=100, max_error_rate=0.01),
                     remaining_tokens=230_000)


def _text(markup: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


# --- units, limits, reasons ------------------------------------------------------------------


def test_latencies_take_the_unit_their_size_wants() -> None:
    assert tuning_plots.latency_unit([22.4, 46.0, None]) == (1.0, "ms")
    assert tuning_plots.latency_unit([71.0, 16_732.0]) == (1000.0, "s")  # never "15k" ms
    assert format_latency_ms(100) == "100 ms" and format_latency_ms(16_732) == "16.7 s"
    assert format_limit("ttft_p99_ms", 20_000) == "TTFT p99 ≤ 20 s"
    assert format_limit("itl_p50_ms", 100) == "ITL p50 ≤ 100 ms"
    assert format_limit("max_error_rate", 0.01) == "error rate ≤ 1%"


def test_within_limits_shows_the_limits_and_their_values() -> None:
    rec = _recommendation()
    assert rec.best == "mfs0.88" and rec.limits_text == "TTFT p99 ≤ 20 s, ITL p50 ≤ 100 ms, error rate ≤ 1%"
    view = tuning_plots.recommendation_view(rec)
    text = _text(view.html)
    assert "Limits a recommended point must respect (the sweep's parameter file): TTFT p99 ≤ 20 s, " in text
    assert "TTFT p99 (s), limit 20 s" in text and "ITL p50 (ms), limit 100 ms" in text
    assert "16.73" in text and "16,732" not in text  # the baseline, 3.3 s under its limit
    assert "no: TTFT p99 25 s > 20 s" in text  # the point over a limit says by how much
    assert view.data["limits"] == {"ttft_p99_ms": 20_000, "itl_p50_ms": 100, "max_error_rate": 0.01}


def test_an_out_of_memory_reason_is_said_once_with_its_flag_whole() -> None:
    said = tuning_plots.reason_text(OOM)
    assert said.lower().count("out of memory") == 1
    assert said == ("server exited with code 1 before it was ready: out of memory: activations need "
                    "1.5 GB per rank but mem_fraction_static 0.97 leaves 0.7 GB; decrease --mem-fraction-static")
    view = tuning_plots.recommendation_view(_recommendation()).html
    assert '<span class="wb-flag">--mem-fraction-static</span>' in view
    assert ".wb-report .wb-flag{white-space:nowrap" in REPORT_CSS  # the header carries it


def test_the_model_measured_and_the_job_projected_are_named() -> None:
    rec = _recommendation()
    assert rec.models_text is None  # nothing known about either
    rec = dataclasses.replace(rec, measured_model="sim/dense-8b", job_model="model profile kimi-k2.5")
    assert rec.models_text is not None and rec.models_text.startswith(
        "Measured on sim/dense-8b, projected for a job of model profile kimi-k2.5: a different model.")
    same = dataclasses.replace(rec, job_model="model profile dense-8b")
    assert same.models_text == "Measured on sim/dense-8b, the job's model."
    assert "Measured on sim/dense-8b, projected for" in _text(tuning_plots.recommendation_view(rec).html)


def test_peak_usage_is_a_percentage_in_the_table_as_in_the_chart() -> None:
    frame = pd.DataFrame([{"config": "default", "concurrency": 64, "repeat": 1, "status": "ok",
                           "output_throughput": 1263.0, "request_throughput": 2.8, "ttft_p50_ms": 4963.0,
                           "itl_p50_ms": 22.4, "e2e_p50_s": 16.9, "peak_token_usage": 0.94,
                           "cache_hit_rate": 0.23, "errors": 0, "reason": None}])
    text = _text(tuning_plots.points_view(frame).html)
    assert "peak KV usage" in text and " 94% " in text and "0.94" not in text
    assert "TTFT p50 (s)" in text and " 4.96 " in text


def test_the_header_says_version_and_when() -> None:
    header = tuning_plots.sweep_header({"name": "s", "model": "sim/dense-8b"}, now=1_800_000_000.0)
    text = _text(header.html)
    assert f"workbench {__version__}" in text and "Report generated 2027-01-15 08:00:00 UTC" in text
    assert "Model measured sim/dense-8b" in text


def test_latency_figure_draws_the_limits_in_the_unit_of_its_panel() -> None:
    curves = pd.DataFrame([{"config": c, "concurrency": n, "ttft_p50_ms": t / 3, "ttft_p99_ms": t,
                            "itl_p50_ms": 20.0, "itl_p99_ms": 30.0, "e2e_p50_s": 7.0, "e2e_p99_s": 18.0}
                           for c, t in (("a", 700.0), ("b", 16_000.0)) for n in (16, 64)])
    curves["config"] = pd.Categorical(curves["config"], categories=["a", "b"])
    fig = tuning_plots.latency_figure(curves, (("ttft_p99_ms", 20_000.0), ("itl_p50_ms", 100.0)))
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:3] == ["TTFT (s)", "ITL (ms)", "end-to-end (s)"]
    assert [(s.y0, s.yref) for s in fig.layout.shapes] == [(20.0, "y"), (100.0, "y2")]
    assert "limit p99 20 s" in titles and "limit p50 100 ms" in titles
    ttft = [y for t in fig.data if t.yaxis == "y" for y in t.y]
    assert max(ttft) == pytest.approx(16.0) and min(ttft) == pytest.approx(700 / 3 / 1000)  # in seconds


# --- a sweep rendered --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick simulator sweep of dense-8b (one configuration that runs, one that runs out of
    memory at start) projecting the demo's kimi-k2.5 job, rendered as throughput_tuning."""
    base = tmp_path_factory.mktemp("truthful-sweep")
    params = base / "tuning.yaml"
    params.write_text(json.dumps({
        "server": {"launcher": "sim", "model_path": "sim/dense-8b", "startup_timeout": 30,
                   "stop_grace": 5, "sim": {"profile": "dense-8b-1x24gb", "speed": 3.0}},
        "grid": {"configs": [{"name": "default", "args": {"mem_fraction_static": 0.8}},
                             {"name": "mfs0.97", "args": {"mem_fraction_static": 0.97}}]},
        "load": {"concurrency": [4], "warmup_requests": 2, "duration": 3, "max_new_tokens": 256,
                 "prompts": {"count": 40, "input_len": [100, 200]}, "sample_interval": 0.5},
        "limits": {"ttft_p99_ms": 20000, "itl_p50_ms": 100},
        "projection": {"manifest": str(ROOT / "params" / "datasets.demo.yaml"),
                       "mean_completion_tokens": 420},
        "fidelity": {"prompts": 0}}))
    done = workbench("tune", "--params", str(params), "--out", str(base / "sweep"), "--no-report", cwd=base)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_report("throughput_tuning", None, {"sweep_dir": str(base / "sweep")}, base / "reports").html_path


def test_sweep_report_shows_limits_models_and_reasons(sweep_report: Path, tmp_path: Path) -> None:
    page = open_page(sweep_report, screenshot=tmp_path / "throughput_tuning.png", evaluate={
        "text": "document.body.innerText",
        "shapes": "[...document.querySelectorAll('.plotly-graph-div')].map(d => (d.layout.shapes || []).length)",
    })
    assert page.errors == []
    text = " ".join(page.values["text"].split())
    assert "Limits a recommended point must respect (the sweep's parameter file): TTFT p99 ≤ 20 s, ITL p50 ≤ 100 ms" in text
    assert "Measured on sim/dense-8b, projected for a job of model profile kimi-k2.5: a different model." in text
    assert f"WORKBENCH {__version__}" in text.upper() and "Report generated" in text
    failed = next(line for line in page.values["text"].splitlines() if line.startswith("mfs0.97"))
    assert failed.lower().count("out of memory") == 1 and "--mem-fraction-static" in failed
    assert sum(page.values["shapes"]) >= 2  # the TTFT and ITL limit lines of the latency figure
