"""The simulator's Prometheus metrics, under SGLang's names, in their own registry.

Gauges move only when the engine reports statistics (after steps that admit requests and
every decode log interval), as SGLang's do; counters and histograms move per request. Two
simulator gauges count /generate HTTP requests in flight, now and at most since start.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workbench.sim.engine import Engine, Request

__all__ = ["SimMetrics"]

TTFT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    120,
    160,
)
ITL_BUCKETS = (
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
)
E2E_BUCKETS = (
    0.05,
    0.1,
    0.2,
    0.4,
    0.8,
    1,
    2,
    5,
    10,
    20,
    40,
    60,
    80,
    100,
    150,
    200,
    250,
    300,
    350,
    500,
    1000,
)


class SimMetrics:
    """SGLang's gauges, counters and histograms, fed by the engines (an EngineObserver)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engines: Sequence[Engine] = ()
        self.inflight = 0
        self.peak_inflight = 0
        self._labels = {"model_name": model_name}
        self._make_gauges()
        self._make_counters()
        self._make_histograms()
        self._make_inflight_gauges()

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, list(self._labels), registry=self.registry).labels(**self._labels)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, list(self._labels), registry=self.registry).labels(**self._labels)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(name, doc, list(self._labels), buckets=buckets, registry=self.registry)
        return metric.labels(**self._labels)

    def _make_gauges(self) -> None:
        self.num_running_reqs = self._gauge("sglang:num_running_reqs", "Running requests.")
        self.num_queue_reqs = self._gauge("sglang:num_queue_reqs", "Waiting requests.")
        self.token_usage = self._gauge("sglang:token_usage", "Share of the KV pool in use.")
        self.gen_throughput = self._gauge("sglang:gen_throughput", "Generation tokens per second.")
        self.num_used_tokens = self._gauge("sglang:num_used_tokens", "KV pool tokens in use.")

    def _make_counters(self) -> None:
        self.prompt_tokens = self._counter("sglang:prompt_tokens", "Prefill tokens.")
        self.generation_tokens = self._counter("sglang:generation_tokens", "Generated tokens.")
        self.cached_tokens = self._counter("sglang:cached_tokens", "Prompt tokens from the cache.")
        self.num_requests = self._counter("sglang:num_requests", "Finished requests.")

    def _make_histograms(self) -> None:
        self.ttft = self._histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.itl = self._histogram(
            "sglang:inter_token_latency_seconds", "Mean time between tokens.", ITL_BUCKETS
        )
        self.e2e = self._histogram(
            "sglang:e2e_request_latency_seconds", "Request latency.", E2E_BUCKETS
        )

    def _make_inflight_gauges(self) -> None:
        inflight = Gauge(
            "workbench_sim:inflight_requests",
            "/generate requests in flight.",
            registry=self.registry,
        )
        inflight.set_function(lambda: self.inflight)
        peak = Gauge(
            "workbench_sim:peak_inflight_requests",
            "Most /generate requests in flight at once.",
            registry=self.registry,
        )
        peak.set_function(lambda: self.peak_inflight)

    def request_started(self) -> None:
        """A /generate HTTP request arrived."""
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)

    def request_ended(self) -> None:
        """A /generate HTTP request left (answered, dropped or abandoned)."""
        self.inflight -= 1

    def on_first_token(self, request: Request) -> None:
        if request.first_token_at is not None:
            self.ttft.observe(request.first_token_at - request.arrival)

    def on_finish(self, request: Request) -> None:
        self.prompt_tokens.inc(request.prompt_len)
        self.generation_tokens.inc(request.generated)
        self.cached_tokens.inc(request.cached_tokens)
        self.num_requests.inc()
        if request.finished_at is None:
            return
        self.e2e.observe(request.finished_at - request.arrival)
        if request.first_token_at is not None and request.generated > 1:
            self.itl.observe(
                (request.finished_at - request.first_token_at) / (request.generated - 1)
            )

    def on_stats(self, engine: Engine) -> None:
        """Set the gauges from all ranks' current state (`engine` is the one reporting)."""
        engines = self.engines or (engine,)
        used = sum(rank.used_tokens for rank in engines)
        capacity = sum(rank.capacity for rank in engines)
        self.num_running_reqs.set(sum(len(rank.running) for rank in engines))
        self.num_queue_reqs.set(sum(len(rank.waiting) for rank in engines))
        self.num_used_tokens.set(used)
        self.token_usage.set(used / capacity)
        self.gen_throughput.set(sum(rank.last_gen_throughput for rank in engines))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
