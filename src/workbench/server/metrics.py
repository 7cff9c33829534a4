"""SGLang's Prometheus metrics and scheduler log lines, read into small typed snapshots.

Prometheus text (``/metrics``, only with ``--enable-metrics``) is parsed with
``prometheus_client``'s text parser. A metric may come in several label sets (one per DP
rank, one per model behind a router); they are combined as:

    sum     running and queued requests, used tokens, generation throughput, and the
            counters (prompt, generation and cached tokens, finished and retracted requests,
            the inter-token latency histogram's count)
    max     token usage (a share of one rank's KV pool: the fullest rank is the one that
            makes requests queue)

Counters are cumulative, so rates come from two snapshots: :func:`cache_hit_rate` is
Δcached / Δprompt tokens (or the totals' ratio with one snapshot) and :func:`generation_rate`
Δgeneration tokens / Δt. Gauges only move while the server logs statistics.

Scheduler log lines (``Decode batch, #running-req: 12, #token: 3456, token usage: 0.42,
cuda graph: True, gen throughput (token/s): 1234.5, #queue-req: 0``; older builds write
``Decode batch.``; prefill lines ``Prefill batch. #new-seq: 1, #new-token: 512, ...``) are
read as ``key: value`` pairs, never by position, so added or reordered keys do not matter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BatchLine",
    "MetricsSnapshot",
    "cache_hit_rate",
    "generation_rate",
    "log_snapshot",
    "parse_log_line",
    "parse_log_lines",
    "parse_metrics",
]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One reading of a server's metrics; None for what the server did not report.

    ``at`` is the time of the reading (seconds, any clock), used for rates.
    """

    running: float | None = None
    queued: float | None = None
    token_usage: float | None = None
    used_tokens: float | None = None
    gen_throughput: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    cached_tokens: float | None = None
    requests: float | None = None
    retracted: float | None = None
    # the inter-token latency histogram's count: every generated token after a request's first,
    # counted while requests run (every step when streamed, every 50 tokens otherwise), where
    # `generation_tokens` moves only when a request finishes
    decoded_tokens: float | None = None
    at: float | None = None


_Combine = Callable[[list[float]], float]

# metric name without the "sglang:" prefix and "_total" suffix -> (snapshot field, combine)
_METRICS: dict[str, tuple[str, _Combine]] = {
    "num_running_reqs": ("running", sum),
    "num_queue_reqs": ("queued", sum),
    "token_usage": ("token_usage", max),
    "num_used_tokens": ("used_tokens", sum),
    "gen_throughput": ("gen_throughput", sum),
    "prompt_tokens": ("prompt_tokens", sum),
    "generation_tokens": ("generation_tokens", sum),
    "cached_tokens": ("cached_tokens", sum),
    "num_requests": ("requests", sum),
    "num_retracted_requests": ("retracted", sum),
    "inter_token_latency_seconds_count": ("decoded_tokens", sum),
}


def _metric_key(sample_name: str) -> str | None:
    """``sglang:prompt_tokens_total`` -> ``prompt_tokens``; None for other servers' metrics."""
    for prefix in ("sglang:", "sglang_"):
        if sample_name.startswith(prefix):
            return sample_name[len(prefix) :].removesuffix("_total")
    return None


def parse_metrics(text: str, *, at: float | None = None) -> MetricsSnapshot:
    """A snapshot of SGLang's metrics in Prometheus text; ValueError if the text is not that."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _metric_key(sample.name)
                if key in _METRICS and _is_number(sample.value):
                    values.setdefault(_METRICS[key][0], []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not Prometheus text: {exc}") from None
    combined = {
        name: combine(values[name]) for name, combine in _METRICS.values() if name in values
    }
    return MetricsSnapshot(**combined, at=at)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def cache_hit_rate(
    current: MetricsSnapshot, baseline: MetricsSnapshot | None = None
) -> float | None:
    """Share of prompt tokens served from the prefix cache, from the counters.

    Over the interval since ``baseline`` when its prompt counter is lower (and not reset),
    else over the totals; None when no prompt tokens were counted.
    """
    cached, prompt = current.cached_tokens, current.prompt_tokens
    if cached is None or prompt is None:
        return None
    if (
        baseline is not None
        and baseline.cached_tokens is not None
        and baseline.prompt_tokens is not None
    ):
        d_prompt = prompt - baseline.prompt_tokens
        if d_prompt > 0 and cached >= baseline.cached_tokens:
            return (cached - baseline.cached_tokens) / d_prompt
    return cached / prompt if prompt > 0 else None


def generation_rate(current: MetricsSnapshot, baseline: MetricsSnapshot | None) -> float | None:
    """Generated tokens per second between two snapshots (None without a usable interval)."""
    if baseline is None or current.at is None or baseline.at is None:
        return None
    if current.generation_tokens is None or baseline.generation_tokens is None:
        return None
    elapsed = current.at - baseline.at
    produced = current.generation_tokens - baseline.generation_tokens
    if elapsed <= 0 or produced < 0:
        return None
    return produced / elapsed


# --- scheduler log lines ---------------------------------------------------------------------

Value = int | float | bool | str

_BATCH = re.compile(r"\b(Decode|Prefill) batch\b[.,:]?")
_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)")
_DP = re.compile(r"\bDP\s?(\d+)\b")


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One ``Decode batch`` or ``Prefill batch`` log line, its pairs keyed as logged."""

    kind: Literal["decode", "prefill"]
    fields: dict[str, Value] = field(default_factory=dict)
    dp_rank: int | None = None
    time: str | None = None

    def number(self, *keys: str) -> float | None:
        """The first of keys that holds a number."""
        for key in keys:
            value = self.fields.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return None

    @property
    def running(self) -> float | None:
        return self.number("#running-req")

    @property
    def queued(self) -> float | None:
        return self.number("#queue-req")

    @property
    def token_usage(self) -> float | None:
        return self.number("token usage", "full token usage")

    @property
    def used_tokens(self) -> float | None:
        return self.number("#token")

    @property
    def gen_throughput(self) -> float | None:
        return self.number("gen throughput (token/s)")

    @property
    def new_tokens(self) -> float | None:
        return self.number("#new-token")

    @property
    def cached_tokens(self) -> float | None:
        return self.number("#cached-token")


def _value(text: str) -> Value:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _pairs(text: str) -> dict[str, Value]:
    fields: dict[str, Value] = {}
    for piece in text.split(","):
        key, colon, value = piece.partition(":")
        if colon and key.strip():
            fields[key.strip()] = _value(value)
    return fields


def parse_log_line(line: str) -> BatchLine | None:
    """The batch statistics of one scheduler log line; None for any other line."""
    match = _BATCH.search(line)
    if match is None:
        return None
    prefix = line[: match.start()]
    dp = _DP.search(prefix)
    stamp = _TIME.search(prefix)
    return BatchLine(
        kind="decode" if match.group(1) == "Decode" else "prefill",
        fields=_pairs(line[match.end() :]),
        dp_rank=int(dp.group(1)) if dp else None,
        time=stamp.group(1) if stamp else None,
    )


def parse_log_lines(lines: Iterable[str]) -> list[BatchLine]:
    """Every batch line among lines."""
    return [parsed for line in lines if (parsed := parse_log_line(line)) is not None]


def log_snapshot(lines: Iterable[str], *, at: float | None = None) -> MetricsSnapshot:
    """Server state from the latest batch line of each DP rank, combined as for metrics.

    Running, queued and used tokens come from the latest line of any kind; the generation
    throughput from the latest decode line (prefill lines do not carry it).
    """
    latest: dict[int | None, BatchLine] = {}
    decode: dict[int | None, BatchLine] = {}
    for parsed in parse_log_lines(lines):
        latest[parsed.dp_rank] = parsed
        if parsed.kind == "decode":
            decode[parsed.dp_rank] = parsed
    ranks = list(latest.values())
    return MetricsSnapshot(
        running=_combined([r.running for r in ranks], sum),
        queued=_combined([r.queued for r in ranks], sum),
        token_usage=_combined([r.token_usage for r in ranks], max),
        used_tokens=_combined([r.used_tokens for r in ranks], sum),
        gen_throughput=_combined([r.gen_throughput for r in decode.values()], sum),
        at=at,
    )


def _combined(values: list[float | None], combine: _Combine) -> float | None:
    known = [v for v in values if v is not None]
    return combine(known) if known else None
