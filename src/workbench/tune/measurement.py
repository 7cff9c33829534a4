"""One point's figures from its load outcome, and the latency limits it is held to.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from workbench.server.metrics import MetricsSnapshot, cache_hit_rate, parse_metrics
from workbench.tune.load import LoadOutcome, RequestRow, Sample
from workbench.tune.parameters import LatencyLimits

__all__ = ["RESULT_COLUMNS", "PointResult", "summarize_point", "violations"]


class PointResult(msgspec.Struct, kw_only=True):
    """One point's figures (result.json); None where nothing was measured."""

    config: str
    concurrency: int | str  # a fixed concurrency, or "auto"
    repeat: int = 1
    status: str = "ok"
    reason: str | None = None
    output_throughput: float | None = None
    request_throughput: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p99_s: float | None = None
    max_total_num_tokens: int | None = None
    peak_token_usage: float | None = None
    mean_running: float | None = None
    max_running: float | None = None
    mean_queued: float | None = None
    mean_concurrency: float | None = None  # auto: the cap's mean over the window
    cache_hit_rate: float | None = None
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    window_s: float | None = None
    time_scale: float = 1.0
    kv_cache_dtype: str | None = None
    gpus: int | None = None  # GPUs of the server (tp x pp x dp, from /server_info)
    within_limits: bool | None = None
    # the configuration's fidelity probe against the baseline's (workbench.tune.fidelity)
    identical_share: float | None = None
    first_divergence: float | None = None
    agreement: float | None = None
    logprob_diff: float | None = None
    floor_identical_share: float | None = None  # the baseline against itself, restarted
    args: dict[str, Any] = {}
    finished_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RESULT_COLUMNS = tuple(name for name in PointResult.__struct_fields__ if name != "finished_at")


def _percentile(values: Sequence[float], q: float, factor: float = 1.0) -> float | None:
    if not values:
        return None
    import numpy as np

    return round(float(np.percentile(values, q)) * factor, 4)


def _error_summary(rows: Sequence[RequestRow]) -> str | None:
    errors = [row for row in rows if not row.ok]
    if not errors:
        return None
    kinds = Counter(row.error_type for row in errors)
    kind, count = kinds.most_common(1)[0]
    example = next(row.message for row in errors if row.error_type == kind)
    return f"{count} x {kind}: {example}"


def _gauges(samples: Sequence[Sample], start: float, end: float) -> dict[str, Any]:
    inside = [s for s in samples if start <= s.t <= end] or list(samples[-1:])
    running = [s.running for s in inside if s.running is not None]
    queued = [s.queued for s in inside if s.queued is not None]
    caps = [s.cap for s in inside if s.cap is not None]
    usage = [s.token_usage for s in inside if s.token_usage is not None]
    return {
        "peak_token_usage": round(max(usage), 4) if usage else None,
        "mean_running": round(sum(running) / len(running), 2) if running else None,
        "max_running": max(running) if running else None,
        "mean_queued": round(sum(queued) / len(queued), 2) if queued else None,
        "mean_concurrency": round(sum(caps) / len(caps), 1) if caps else None,
    }


def _snapshot(text: str | None) -> MetricsSnapshot | None:
    if text is None:
        return None
    try:
        return parse_metrics(text)
    except ValueError:
        return None


def summarize_point(
    outcome: LoadOutcome, *, config: str, concurrency: int | str, repeat: int, time_scale: float
) -> PointResult:
    """The point's figures from its load outcome (server info fields are added later)."""
    measured = [row for row in outcome.rows if row.phase == "measured"]
    ok = [row for row in measured if row.ok]
    start, end = outcome.window_start, outcome.window_end
    window = (end - start) if start is not None and end is not None else None
    tokens = outcome.window_tokens
    if tokens is None:
        tokens = sum(row.completion_tokens or 0 for row in ok)
    before, after = _snapshot(outcome.before), _snapshot(outcome.after)
    result = PointResult(
        config=config, concurrency=concurrency, repeat=repeat, requests=len(ok),
        errors=len(measured) - len(ok), output_tokens=tokens, time_scale=time_scale,
        window_s=round(window, 3) if window is not None else None,
        cache_hit_rate=_rounded(cache_hit_rate(after, before) if after else None),
        finished_at=time.time(),
        **_latencies(ok),
        **(_gauges(outcome.samples, start or 0.0, end or math.inf) if outcome.samples else {}),
    )
    if window and ok:
        result.output_throughput = round(tokens / window, 3)
        result.request_throughput = round(len(ok) / window, 5)
    _set_status(result, outcome, measured)
    return result


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _latencies(rows: Sequence[RequestRow]) -> dict[str, Any]:
    ttft = [row.ttft_s for row in rows if row.ttft_s is not None]
    itl = [row.itl_s for row in rows if row.itl_s is not None]
    e2e = [row.e2e_s for row in rows]
    figures: dict[str, Any] = {}
    for q in (50, 90, 99):
        figures[f"ttft_p{q}_ms"] = _percentile(ttft, q, 1000.0)
        figures[f"itl_p{q}_ms"] = _percentile(itl, q, 1000.0)
        figures[f"e2e_p{q}_s"] = _percentile(e2e, q)
    return figures


def _set_status(result: PointResult, outcome: LoadOutcome, measured: list[RequestRow]) -> None:
    if outcome.crash is not None:
        result.status, result.reason = "failed", outcome.crash
    elif result.requests == 0:
        errors = _error_summary(measured or outcome.rows)
        result.status = "failed"
        result.reason = f"no request finished in the window: {errors or 'no reply'}"
    else:
        result.reason = _error_summary(measured)


def failed_point(config: str, concurrency: int | str, repeat: int, reason: str,
                 args: Mapping[str, Any]) -> PointResult:
    """A point that could not run (its server did not start or died before it)."""
    return PointResult(config=config, concurrency=concurrency, repeat=repeat, status="failed",
                       reason=reason, args=dict(args), finished_at=time.time())


def violations(result: PointResult, limits: LatencyLimits) -> list[str]:
    """The limits a point exceeds (`ttft_p99_ms 1234 > 1000`); unmeasured figures pass."""
    found = []
    for name in LatencyLimits.__struct_fields__:
        limit = getattr(limits, name)
        if limit is None:
            continue
        if name == "max_error_rate":
            total = result.requests + result.errors
            value = result.errors / total if total else None
        else:
            value = getattr(result, name)
        if value is not None and value > limit:
            found.append(f"{name} {value:,.6g} > {limit:,.6g}")
    return found
