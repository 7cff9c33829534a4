"""The recommendation: the best configuration within the limits at the job's concurrency,
and the generation job's projected time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.analyze.stats import collect_stats
from workbench.config import load_manifest
from workbench.errors import ConfigError, InputError
from workbench.rundir.run import load_run
from workbench.text import format_gpu_hours, format_gpus, format_table
from workbench.tune.fidelity import verdict
from workbench.tune.measurement import PointResult, _rounded, violations
from workbench.tune.parameters import FidelityParams, LatencyLimits, ProjectionParams
from workbench.tune.probe import sweep_fidelity, with_fidelity
from workbench.tune.results import load_results, sweep_params

__all__ = [
    "ConfigChoice",
    "Recommendation",
    "fidelity_frame",
    "format_gpu_hours",
    "format_gpus",
    "format_hours",
    "format_latency_ms",
    "format_limit",
    "format_results_table",
    "job_model",
    "projection",
    "recommend",
    "recommend_sweep",
    "remaining_from_manifest",
    "remaining_from_run",
    "remaining_tokens_for",
]


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


def format_latency_ms(ms: float) -> str:
    """A latency in the unit its size wants: `100 ms`, `850 ms`; from a second on `20 s`,
    `16.7 s` (never `16,732 ms` or `15k`)."""
    return f"{ms / 1000:,.3g} s" if abs(ms) >= 1000 else f"{ms:,.3g} ms"


LIMIT_LABELS = {"ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "itl_p50_ms": "ITL p50",
                "itl_p99_ms": "ITL p99", "e2e_p50_s": "end-to-end p50",
                "e2e_p99_s": "end-to-end p99", "max_error_rate": "error rate"}


def format_limit(name: str, value: float) -> str:
    """One latency limit as a reader says it: `TTFT p99 ≤ 20 s`, `error rate ≤ 1%`."""
    if name == "max_error_rate":
        shown = f"{value * 100:g}%"
    elif name.endswith("_ms"):
        shown = format_latency_ms(value)
    else:
        shown = f"{value:,.3g} s"
    return f"{LIMIT_LABELS.get(name, name)} ≤ {shown}"


def _set_limits(limits: LatencyLimits) -> tuple[tuple[str, float], ...]:
    """The limits that are set, in LatencyLimits' order."""
    return tuple((name, float(getattr(limits, name))) for name in LatencyLimits.__struct_fields__
                 if getattr(limits, name) is not None)


def remaining_from_run(run_dir: str | os.PathLike[str],
                       mean_completion_tokens: float | None = None) -> int:
    """Completion tokens a generation run still has to produce, from its stats: a dataset's
    token budget left, else its records left times its mean completion."""

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
    spread: float | None = None  # (max - min) / mean of the repeats' output tok/s
    gpus: int | None = None  # the server's GPUs (measured, or projection.gpus)
    excluded: str | None = None  # why its replies drift too far from the baseline's

    @property
    def gpu_hours(self) -> float | None:
        return self.hours * self.gpus if self.hours is not None and self.gpus else None
    @property
    def eligible(self) -> bool:
        return (self.status == "ok" and not self.violations and self.excluded is None
                and self.output_throughput is not None)


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
    auto: tuple[tuple[str, float], ...] = ()  # configuration, auto tok/s / best fixed tok/s
    limits: tuple[tuple[str, float], ...] = ()  # the latency limits set: (LatencyLimits field, value)
    measured_model: str | None = None  # the model the sweep's server ran
    job_model: str | None = None  # the model of the job projected (None: not known)

    @property
    def limits_text(self) -> str:
        """`TTFT p99 ≤ 20 s, ITL p50 ≤ 100 ms, error rate ≤ 1%`, or that none is set."""
        if not self.limits:
            return "no latency limit set: every measured point is within"
        return ", ".join(format_limit(name, value) for name, value in self.limits)

    @property
    def models_text(self) -> str | None:
        """Which model the speeds were measured on, and which job's time they project, said
        plainly when they differ (None when the sweep's model is not known)."""
        measured, job = self.measured_model, self.job_model
        if measured is None:
            return None
        if job is None:
            return (f"Measured on {measured}; the job's model is not known here, so its projected "
                    f"times assume it runs at the speeds measured on {measured}.")
        if _same_model(measured, job):
            return f"Measured on {measured}, the job's model."
        return (f"Measured on {measured}, projected for a job of {job}: a different model. The "
                f"projected times are that job's tokens at the speeds measured on {measured}, "
                f"not a measurement of {job}; sweep the job's own model for its times.")

    @property
    def exclusions(self) -> list[str]:
        """The configurations left out for their replies' drift, one line each."""
        return [r.excluded for r in self.rows if r.excluded is not None]

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
        """`57.0 h -> 18.3 h (456 -> 146 GPU-hours on 8 GPUs)` (baseline -> best)."""
        text = f"{format_hours(self.baseline_hours)} -> {format_hours(self.best_hours)}"
        base, best = self.row(self.baseline), self.row(self.best)
        if base is None or best is None or base.gpu_hours is None or best.gpu_hours is None:
            return text
        gpus = (format_gpus(best.gpus) if base.gpus == best.gpus
                else f"{base.gpus} -> {format_gpus(best.gpus)}")
        return f"{text} ({format_gpu_hours(base.gpu_hours)} -> {format_gpu_hours(best.gpu_hours)} GPU-hours on {gpus})"

    @property
    def text(self) -> str:
        if self.best is None:
            return f"no configuration within the limits{f' ({self.note})' if self.note else ''}"
        best = self.row(self.best)
        assert best is not None
        head = (f"recommended: {self.best} at concurrency {self.concurrency}: "
                f"{best.output_throughput:,.0f} output tok/s")
        if best.ratio is not None and self.baseline != self.best:
            head += f" ({best.ratio:.2f}x {self.baseline}{self._spread_text(best)})"
        auto = dict(self.auto).get(self.best)
        if auto is not None:
            head += f"; auto concurrency reaches {auto:.2f} of its best fixed concurrency"
        if self.remaining_tokens is None:
            return head + (f"; no projection: {self.note}" if self.note else "")
        source = f" ({self.remaining_source})" if self.remaining_source else ""
        return (f"{head}; job of {self.remaining_tokens:,} completion tokens{source}: "
                f"{self.projection_text}")

    @property
    def lines(self) -> list[str]:
        """`text`, then each configuration excluded for drift."""
        return [self.text, *self.exclusions]

    def _spread_text(self, best: ConfigChoice) -> str:
        """How far repeats of the same point disagreed, and whether the win is inside that."""
        base = self.row(self.baseline)
        spreads = [r.spread for r in (best, base) if r is not None and r.spread is not None]
        if not spreads:
            return ""
        widest = max(spreads)
        text = f"; repeats spread up to {widest:.0%}"
        if best.ratio is not None and best.ratio - 1 <= widest:
            text += ": within it, not a clear win"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "baseline": self.baseline, "concurrency": self.concurrency,
                "remaining_tokens": self.remaining_tokens, "remaining_source": self.remaining_source,
                "projection": self.projection_text, "text": self.text, "note": self.note,
                "rows": [_choice_dict(r) for r in self.rows], "auto": dict(self.auto),
                "exclusions": self.exclusions, "limits": dict(self.limits),
                "limits_text": self.limits_text, "measured_model": self.measured_model,
                "job_model": self.job_model, "models_text": self.models_text}


def _same_model(measured: str, job: str) -> bool:
    """Whether a served model path and a job's model (a path, or `model profile NAME`) name
    the same model: equal, or the profile's name is the path's last part."""
    name = job.removeprefix("model profile ").strip()
    return measured == job or measured.rstrip("/").rsplit("/", 1)[-1] == name


def _choice_dict(row: ConfigChoice) -> dict[str, Any]:
    return {name: getattr(row, name) for name in ConfigChoice.__slots__} | {
        "violations": list(row.violations), "gpu_hours": row.gpu_hours}


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
                        merged.mean_running, tuple(violations(merged, limits)), None, None,
                        spread=_spread([p.output_throughput for p in ok]), gpus=ok[0].gpus)


def _spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / mean over two or more measurements, else None."""
    known = [v for v in values if v is not None]
    if len(known) < 2 or not sum(known):
        return None
    return round((max(known) - min(known)) / (sum(known) / len(known)), 4)


def recommend(
    results: Sequence[PointResult],
    *,
    limits: LatencyLimits | None = None,
    baseline: str | None = None,
    concurrency: int | None = None,
    remaining_tokens: int | None = None,
    remaining_source: str = "",
    note: str | None = None,
    gpus: int | None = None,
    fidelity: FidelityParams | None = None,
) -> Recommendation:
    """The best configuration within `limits` at `concurrency` (default: that of the best
    point within the limits), with each configuration's projected hours (and GPU-hours, on
    `gpus` GPUs, default each configuration's measured count) and its ratio to `baseline`
    (default: the first configuration). With `fidelity`, a configuration whose probe replies
    differ from the baseline's more than the noise floor plus `fidelity.threshold` is
    excluded, with a line that says so."""
    limits = limits or LatencyLimits()
    configs = list(dict.fromkeys(r.config for r in results))
    baseline = baseline or (configs[0] if configs else None)
    chosen = concurrency if concurrency is not None else _best_concurrency(results, limits)
    rows = [_choice(c, chosen, [r for r in results if r.config == c and r.concurrency == chosen],
                    limits) for c in configs]
    base_tok = next((r.output_throughput for r in rows if r.config == baseline), None)
    rows = [_with_projection(r, remaining_tokens, base_tok, gpus) for r in rows]
    if fidelity is not None and baseline is not None:
        rows = [_with_verdict(r, results, baseline, fidelity) for r in rows]
    eligible = [r for r in rows if r.eligible]
    best = max(eligible, key=lambda r: r.output_throughput or 0.0).config if eligible else None
    return Recommendation(best, baseline, chosen, remaining_tokens, remaining_source, tuple(rows),
                          note, _auto_ratios(results, configs), _set_limits(limits))


def _with_verdict(row: ConfigChoice, results: Sequence[PointResult], baseline: str,
                  fidelity: FidelityParams) -> ConfigChoice:
    """`row` excluded when its probe drifts beyond the noise floor (`verdict`)."""
    probed = next((r for r in results if r.config == row.config
                   and r.identical_share is not None), None)
    if probed is None or probed.identical_share is None or row.config == baseline:
        return row
    floor = (None if probed.floor_identical_share is None
             else 1.0 - probed.floor_identical_share)
    line = verdict(row.config, 1.0 - probed.identical_share, floor, fidelity.threshold,
                   baseline=baseline, speedup=row.ratio, max_new_tokens=fidelity.max_new_tokens)
    return dataclasses.replace(row, excluded=line)


def _auto_ratios(results: Sequence[PointResult], configs: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """Per configuration measured at `auto`: its mean tok/s over the best fixed point's."""
    ratios = []
    for config in configs:
        ok = [r for r in results if r.config == config and r.ok and r.output_throughput]
        auto = _mean(r.output_throughput for r in ok if r.concurrency == "auto")
        fixed = [r.output_throughput or 0.0 for r in ok if isinstance(r.concurrency, int)]
        if auto is not None and fixed and max(fixed) > 0:
            ratios.append((config, round(auto / max(fixed), 3)))
    return tuple(ratios)


def _best_concurrency(results: Sequence[PointResult], limits: LatencyLimits) -> int | None:
    fixed = [r for r in results if isinstance(r.concurrency, int)]
    candidates = [r for r in fixed if r.ok and r.output_throughput is not None
                  and not violations(r, limits)]
    if not candidates:
        return max((int(r.concurrency) for r in fixed), default=None)
    return int(max(candidates, key=lambda r: r.output_throughput or 0.0).concurrency)


def _with_projection(row: ConfigChoice, remaining: int | None, base_tok: float | None,
                     gpus: int | None) -> ConfigChoice:
    tok = row.output_throughput
    hours = projection(remaining, tok) if remaining is not None and tok else None
    ratio = tok / base_tok if tok and base_tok else None
    return dataclasses.replace(row, hours=hours, ratio=ratio, gpus=gpus or row.gpus)


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
    configs = list(dict.fromkeys(r.config for r in results))
    baseline = params.grid.baseline or (configs[0] if configs else None)
    with_fidelity(results, sweep_fidelity(Path(out), configs, baseline))
    rec = recommend(results, limits=params.limits, baseline=baseline,
                    concurrency=params.projection.concurrency, remaining_tokens=remaining,
                    remaining_source=source, note=note, gpus=params.projection.gpus,
                    fidelity=params.fidelity if params.fidelity.prompts else None)
    return dataclasses.replace(rec, measured_model=params.server.model_path,
                               job_model=job_model(params.projection))


def job_model(params: ProjectionParams) -> str | None:
    """The model of the job a projection is for: a run directory's `model` (run.json), a
    dataset manifest's model profile (`model profile NAME`); None for a token count given,
    or a source that cannot be read (the projection says why)."""
    try:
        if params.remaining_tokens is not None:
            return None
        if params.run_dir is not None:
            model = load_run(params.run_dir).manifest.get("model")
            return model if isinstance(model, str) and model else None
        if params.manifest is not None:
            return f"model profile {load_manifest(Path(params.manifest)).model_profile}"
    except (InputError, OSError):
        return None
    return None


def format_results_table(results: Sequence[PointResult]) -> str:
    """The points as a plain-text table."""

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


FIDELITY_COLUMNS = ("config", "output_throughput", "identical_share", "first_divergence",
                    "agreement", "logprob_diff", "floor_identical_share", "threshold",
                    "excluded", "baseline")


def fidelity_frame(rec: Recommendation, results: Sequence[PointResult],
                   threshold: float) -> Any:
    """One row per probed configuration: its output tok/s at the recommendation's
    concurrency, its probe's figures against the baseline (results carry them: see
    `workbench.tune.probe.with_fidelity`), the noise floor, the exclusion threshold and why it
    is excluded (None when it is not); empty when nothing was probed."""
    import pandas as pd

    rows = []
    for row in rec.rows:
        probed = next((r for r in results if r.config == row.config
                       and r.identical_share is not None), None)
        if probed is None:
            continue
        rows.append({"config": row.config, "output_throughput": row.output_throughput,
                     "identical_share": probed.identical_share,
                     "first_divergence": probed.first_divergence,
                     "agreement": probed.agreement, "logprob_diff": probed.logprob_diff,
                     "floor_identical_share": probed.floor_identical_share,
                     "threshold": threshold, "excluded": row.excluded,
                     "baseline": row.config == rec.baseline})
    frame = pd.DataFrame(rows, columns=list(FIDELITY_COLUMNS))
    frame["config"] = pd.Categorical(frame["config"], categories=list(frame["config"]),
                                     ordered=True)
    return frame
