"""`workbench demo`: the whole pipeline on the simulator, start to finish.

Starts the simulator on a free port, generates the example datasets into the output
directory (stopping the simulator whatever happens), then writes the token-distribution and
format-validation reports, a training-ready export of the run, and a short tuning sweep on
the simulator with its report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.config import load_manifest
from workbench.export.exporter import export_run, format_summary
from workbench.export.options import ExportOptions
from workbench.generate.plan import GenerateOptions
from workbench.generate.progress import RunSummary
from workbench.report.render import demo_reports
from workbench.resources import data_dir
from workbench.server.launch import ServerProcess, find_free_port, server_command
from workbench.tune import run_demo_sweep

__all__ = ["DEMO_SIM_ARGS", "run_demo", "start_simulator"]

# The simulator's fast profile, slowed down so the four example datasets take about half a minute
# and their progress can be watched.
DEMO_SIM_ARGS: dict[str, Any] = {"profile": "fast", "speed": 0.2, "enable_metrics": True, "random_seed": 0}

GenerateFn = Callable[[Any, str, Path, GenerateOptions], RunSummary]


def start_simulator(log_path: Path, args: dict[str, Any] | None = None, timeout: float = 60.0) -> ServerProcess:
    """A simulator on a free port, healthy when returned; stop it with `.stop()`."""
    port = find_free_port()
    argv = server_command("sim", port=port, args=args or DEMO_SIM_ARGS, python=sys.executable)
    server = ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log_path)
    server.start()
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server


def run_demo(
    out: Path,
    *,
    datasets: Path,
    generate: GenerateFn,
    resume: bool = True,
    say: Callable[[str], None] = lambda message: None,
) -> RunSummary:
    """Generate the example datasets, then report on and export them; returns the run summary."""
    summary = _generate(out, datasets, generate, resume, say)
    if summary.interrupted:
        return summary
    _report(out, say)
    _export(out, say)
    _tune(out, say)
    return summary


def _generate(out: Path, datasets: Path, generate: GenerateFn, resume: bool,
              say: Callable[[str], None]) -> RunSummary:
    manifest = load_manifest(datasets)
    out.mkdir(parents=True, exist_ok=True)
    server = start_simulator(out / "sim.log")
    say(f"simulator ready at {server.url} (log: {out / 'sim.log'})")
    try:
        # the made-up benchmark the demo's format_validation report looks for: generate keeps
        # each record's overlap with it as it writes, so the report reads no id as a word again
        benchmark = data_dir("examples") / "benchmarks" / "tiny_bench.jsonl"
        options = GenerateOptions(resume=resume, progress_interval=2.0,
                                  decontaminate=(str(benchmark),))
        return generate(manifest, server.url, out, options)
    finally:
        server.stop()


def _report(out: Path, say: Callable[[str], None]) -> None:
    say("writing reports (papermill + nbconvert) ...")
    for result in demo_reports(out, out / "reports"):
        say(f"report: {result.html_path}")


def _export(out: Path, say: Callable[[str], None]) -> None:
    target = out / "export" / "train.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    summary = export_run(out, target, ExportOptions(drop=("truncated", "reasoning_unclosed")))
    say(format_summary(summary))


def _tune(out: Path, say: Callable[[str], None]) -> None:
    say("tuning sweep on the simulator (params/tuning.sim.yaml, shortened) ...")
    report = run_demo_sweep(out / "tuning", out / "reports", say=say)
    say(f"tuning report: {report.html_path}")
