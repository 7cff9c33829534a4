"""Prometheus text and SGLang scheduler log lines into snapshots."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workbench.server.metrics import (
    MetricsSnapshot,
    cache_hit_rate,
    generation_rate,
    log_snapshot,
    parse_log_line,
    parse_log_lines,
    parse_metrics,
)


def exposition(ranks: dict[str, dict[str, float]]) -> str:
    """SGLang-named metrics as prometheus_client renders them, one label set per DP rank."""
    registry = CollectorRegistry()
    labels = ["model_name", "dp_rank"]
    gauges = {
        name: Gauge(f"sglang:{name}", name, labels, registry=registry)
        for name in (
            "num_running_reqs",
            "num_queue_reqs",
            "token_usage",
            "gen_throughput",
            "num_used_tokens",
        )
    }
    counters = {
        name: Counter(f"sglang:{name}", name, labels, registry=registry)
        for name in ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests")
    }
    latency = Histogram("sglang:e2e_request_latency_seconds", "e2e", labels, registry=registry)
    for rank, values in ranks.items():
        for name, value in values.items():
            if name in gauges:
                gauges[name].labels("m", rank).set(value)
            else:
                counters[name].labels("m", rank).inc(value)
        latency.labels("m", rank).observe(1.5)
    return generate_latest(registry).decode()


def test_parse_metrics_sums_label_sets_and_takes_the_fullest_rank() -> None:
    text = exposition(
        {
            "0": {
                "num_running_reqs": 12,
                "num_queue_reqs": 3,
                "token_usage": 0.42,
                "gen_throughput": 1000,
                "num_used_tokens": 4000,
                "prompt_tokens": 9000,
                "generation_tokens": 5000,
                "cached_tokens": 3000,
                "num_requests": 40,
            },
            "1": {
                "num_running_reqs": 8,
                "num_queue_reqs": 0,
                "token_usage": 0.97,
                "gen_throughput": 234.5,
                "num_used_tokens": 6000,
                "prompt_tokens": 1000,
                "generation_tokens": 700,
                "cached_tokens": 0,
                "num_requests": 10,
            },
        }
    )
    snap = parse_metrics(text, at=5.0)
    assert snap == MetricsSnapshot(
        running=20,
        queued=3,
        token_usage=0.97,
        used_tokens=10000,
        gen_throughput=1234.5,
        prompt_tokens=10000,
        generation_tokens=5700,
        cached_tokens=3000,
        requests=50,
        at=5.0,
    )


def test_parse_metrics_without_type_lines_and_with_other_metrics() -> None:
    text = (
        "# some other exporter\n"
        "process_cpu_seconds_total 12.5\n"
        'sglang:num_running_reqs{model_name="a"} 4\n'
        'sglang:num_running_reqs{model_name="b"} 1\n'
        "sglang:prompt_tokens_total 100\n"
        "sglang:cached_tokens_total 25\n"
        "sglang:token_usage NaN\n"
    )
    snap = parse_metrics(text)
    assert (snap.running, snap.prompt_tokens, snap.cached_tokens) == (5, 100, 25)
    assert snap.queued is None and snap.token_usage is None  # absent, or NaN: unknown, not 0


def test_parse_metrics_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_metrics("<html>\n<body>metrics {{ broken\n")


def test_cache_hit_rate_from_counter_deltas_or_totals() -> None:
    before = MetricsSnapshot(prompt_tokens=1000, cached_tokens=100, at=0)
    after = MetricsSnapshot(prompt_tokens=3000, cached_tokens=1600, at=10)
    assert cache_hit_rate(after, before) == pytest.approx(0.75)
    assert cache_hit_rate(after) == pytest.approx(1600 / 3000)
    assert cache_hit_rate(after, after) == pytest.approx(1600 / 3000)  # no new prompt tokens
    restarted = MetricsSnapshot(prompt_tokens=500, cached_tokens=50, at=20)
    assert cache_hit_rate(restarted, after) == pytest.approx(0.1)  # counters reset: totals
    assert cache_hit_rate(MetricsSnapshot()) is None
    assert cache_hit_rate(MetricsSnapshot(prompt_tokens=0, cached_tokens=0)) is None


def test_generation_rate() -> None:
    before = MetricsSnapshot(generation_tokens=1000, at=100.0)
    after = MetricsSnapshot(generation_tokens=4000, at=102.5)
    assert generation_rate(after, before) == pytest.approx(1200.0)
    assert generation_rate(after, None) is None
    assert generation_rate(before, after) is None


DECODE = (
    "[2025-05-01 12:00:00 DP1 TP0] Decode batch, #running-req: 12, #token: 3456, "
    "token usage: 0.42, cuda graph: True, gen throughput (token/s): 1234.5, #queue-req: 0"
)
DECODE_OLD = (
    "[2024-11-02 08:30:01 TP0] Decode batch. #running-req: 233, #token: 370959, "
    "token usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 317, "
)
PREFILL = (
    "[2024-11-02 08:30:00 TP0] Prefill batch. #new-seq: 1, #new-token: 512, "
    "#cached-token: 128, token usage: 0.01, #running-req: 0, #queue-req: 2"
)


def test_parse_decode_lines_by_key_not_position() -> None:
    line = parse_log_line(DECODE)
    assert line is not None and line.kind == "decode"
    assert (line.running, line.used_tokens, line.token_usage, line.gen_throughput, line.queued) == (
        12,
        3456,
        0.42,
        1234.5,
        0,
    )
    assert (
        line.fields["cuda graph"] is True
        and line.dp_rank == 1
        and line.time == "2025-05-01 12:00:00"
    )

    old = parse_log_line(DECODE_OLD)
    assert old is not None and (old.running, old.queued, old.gen_throughput) == (233, 317, 4594.01)
    assert old.dp_rank is None

    shuffled = parse_log_line(
        "Decode batch, #queue-req: 7, spec accept length: 2.5, #running-req: 3"
    )
    assert shuffled is not None and (shuffled.running, shuffled.queued) == (3, 7)
    assert shuffled.fields["spec accept length"] == 2.5 and shuffled.token_usage is None


def test_parse_prefill_and_other_lines() -> None:
    line = parse_log_line(PREFILL)
    assert line is not None and line.kind == "prefill"
    assert (line.new_tokens, line.cached_tokens, line.queued, line.gen_throughput) == (
        512,
        128,
        2,
        None,
    )
    assert parse_log_line('INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK') is None
    assert parse_log_line("") is None
    assert len(parse_log_lines([DECODE, "noise", PREFILL, DECODE_OLD])) == 3


def test_log_snapshot_combines_the_latest_line_of_each_rank() -> None:
    lines = [
        "[t DP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.10, "
        "gen throughput (token/s): 10.0, #queue-req: 9",
        "[t DP1] Decode batch, #running-req: 4, #token: 40, token usage: 0.90, "
        "gen throughput (token/s): 40.0, #queue-req: 2",
        "[t DP0] Decode batch, #running-req: 2, #token: 20, token usage: 0.20, "
        "gen throughput (token/s): 20.0, #queue-req: 1",
        "[t DP1] Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 0.95, "
        "#running-req: 5, #queue-req: 1",
    ]
    snap = log_snapshot(lines, at=3.0)
    assert snap == MetricsSnapshot(
        running=7, queued=2, token_usage=0.95, used_tokens=20, gen_throughput=60.0, at=3.0
    )
    assert log_snapshot([]) == MetricsSnapshot()
