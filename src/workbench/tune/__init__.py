"""Server-tuning sweep: configurations x load, per-point results, resume, recommendation.

Modules: `parameters` (the parameter file, the grid, server commands), `load` (prompts and
the closed loop of one point), `measurement` (a point's figures), `results` (the output
directory and frames), `recommendation` (best configuration, projection), `driver` (running
a sweep, `workbench tune`, the demo's sweep and report), `plots` (the tuning report's
figures and views).

A sweep takes a parameter file (`load_tuning_params`; see params/tuning.sim.yaml for every
key) and, for each configuration of its grid, launches the server (SGLang or the simulator,
`workbench.server.launch`), reads `/server_info`, then for each concurrency (and repeat): flushes
the prefix cache, runs a closed loop of requests through `SGLangClient` and scrapes
`/metrics` before and after. The server is stopped by process group after its points, and
in any case when the sweep ends or is interrupted.

Load and measurement. `concurrency` workers each send one request at a time (prompts in a
fixed order, the same for every point). The first `warmup_requests` finished requests are
the warm-up; the window opens when the last of them finishes and closes after `requests`
more have finished or after `duration` seconds, whichever comes first; requests still in
flight then are cancelled. A concurrency of `auto` runs the generation job's auto mode
(`workbench.generate.concurrency`: up to 1,024 workers, as many in flight as its cap allows, steered
from `/metrics`); its mean cap is `mean_concurrency` and the recommendation compares it with
the best fixed point. Over the window:

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

from workbench.tune.driver import (
    SweepSummary,
    default_out,
    run_demo_sweep,
    run_sweep,
    run_sweep_cli,
    sweep,
    tuning_report,
)
from workbench.tune.load import (
    LoadOutcome,
    LoadPrompt,
    PointLoad,
    RequestRow,
    build_prompts,
)
from workbench.tune.measurement import (
    RESULT_COLUMNS,
    PointResult,
    summarize_point,
    violations,
)
from workbench.tune.parameters import (
    Command,
    ConfigPlan,
    GridParams,
    LatencyLimits,
    LoadParams,
    NamedConfig,
    ProjectionParams,
    PromptParams,
    ServerParams,
    SimParams,
    TuningParams,
    apply_overrides,
    config_command,
    expand_grid,
    format_commands,
    load_server_params,
    load_tuning_params,
    plan_commands,
)
from workbench.tune.recommendation import (
    ConfigChoice,
    Recommendation,
    fidelity_frame,
    format_gpu_hours,
    format_gpus,
    format_hours,
    format_results_table,
    projection,
    recommend,
    recommend_sweep,
    remaining_from_manifest,
    remaining_from_run,
    remaining_tokens_for,
)
from workbench.tune.results import (
    PointPlan,
    configs_frame,
    curves_frame,
    load_results,
    results_frame,
    sweep_overview,
    sweep_params,
)

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
    "fidelity_frame",
    "format_commands",
    "format_gpu_hours",
    "format_gpus",
    "format_hours",
    "format_results_table",
    "load_results",
    "load_server_params",
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
