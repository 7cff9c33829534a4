"""The simulator's Prometheus metrics as SGLang 0.5.23 emits them, in their own registry.

Names, labels and buckets follow `srt/observability/metrics_collector.py`: the tokenizer
manager's counters and histograms carry `model_name` and `engine_type` ("unified"), and
`is_streaming` where SGLang puts it; the scheduler's gauges carry `model_name`, `engine_type`,
`tp_rank`, `pp_rank` and `moe_ep_rank` (one series: the simulator sums its DP ranks). A
request is counted when its last output is published, before its final chunk or reply is
sent; health checks are not counted, nor requests aborted while they waited in the queue
(the tokenizer manager answers those without its metrics). `sglang:num_aborted_requests_total`
moves once per abort the tokenizer manager sends (`abort_request`: a client gone, or POST
/abort_request with a known rid or `abort_all`), not per request aborted, and not for the
pool-full aborts the scheduler makes itself. Inter-token latency is observed per token, from each
output batch (`observe_inter_token_latency`: the interval over the batch's new tokens),
streamed requests every step and others every 50 tokens. Gauges move only when the engine
reports statistics (after steps that admit requests, every decode log interval, and when it
falls idle: scheduler `on_idle`), as SGLang's do; a stalled engine reports nothing, so they
keep their last values. Two simulator gauges count /generate HTTP requests in flight, now and at most
since start; a third is the model time the engine has worked (the sum of its steps'
durations, the busiest data-parallel rank's), a clock that the host's speed does not move.
`sglang:max_total_num_tokens` is set once at start (the scheduler's `emit_constants`): the KV
pool of one rank in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workbench.sim.engine import Engine
from workbench.sim.request import Request

__all__ = ["SimMetrics"]

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
E2E_BUCKETS = (
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
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)


STREAMING = ("false", "true")


class SimMetrics:
    """SGLang's gauges, counters and histograms, fed by the engines (an EngineObserver)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engines: Sequence[Engine] = ()
        self.inflight = 0
        self.peak_inflight = 0
        self._labels = {"model_name": model_name, "engine_type": "unified"}
        self._scheduler_labels = {
            **self._labels,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self._make_gauges()
        self._make_counters()
        self._make_histograms()
        self._make_inflight_gauges()

    def _gauge(self, name: str, doc: str) -> Gauge:
        labels = self._scheduler_labels
        return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

    def _scheduler_counter(self, name: str, doc: str) -> Counter:
        labels = self._scheduler_labels
        return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

    def _by_streaming(self, metric: Counter | Histogram) -> tuple[Counter | Histogram, ...]:
        return tuple(metric.labels(**self._labels, is_streaming=flag) for flag in STREAMING)

    def _make_gauges(self) -> None:
        self.num_running_reqs = self._gauge(
            "sglang:num_running_reqs", "The number of running requests."
        )
        self.num_queue_reqs = self._gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue."
        )
        self.token_usage = self._gauge("sglang:token_usage", "The token usage.")
        self.gen_throughput = self._gauge(
            "sglang:gen_throughput", "The generation throughput (token/s)."
        )
        self.num_used_tokens = self._gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.num_retracted_reqs = self._gauge(
            "sglang:num_retracted_reqs", "The number of retracted requests."
        )
        self.max_total_num_tokens = self._gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
        )

    def _make_counters(self) -> None:
        names = [*self._labels, "is_streaming"]
        registry = self.registry
        self.prompt_tokens = self._by_streaming(
            Counter(
                "sglang:prompt_tokens",
                "Number of prefill tokens processed.",
                names,
                registry=registry,
            )
        )
        self.generation_tokens = self._by_streaming(
            Counter(
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                names,
                registry=registry,
            )
        )
        self.num_requests = self._by_streaming(
            Counter(
                "sglang:num_requests", "Number of requests processed.", names, registry=registry
            )
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*self._labels, "cache_source"],
            registry=registry,
        )
        # SGLang creates a source's series at its first cache hit; the device one is created
        # at start here, so readers see 0 rather than nothing before the first hit.
        self.cached_tokens.labels(**self._labels, cache_source="device")
        self.aborted = Counter(
            "sglang:num_aborted_requests",
            "Number of requests aborted.",
            list(self._labels),
            registry=registry,
        ).labels(**self._labels)
        self.retracted_requests = self._scheduler_counter(
            "sglang:num_retracted_requests", "Total number of retracted requests."
        )
        self.retracted_input_tokens = self._scheduler_counter(
            "sglang:num_retracted_input_tokens", "Total number of retracted input tokens."
        )
        self.retracted_output_tokens = self._scheduler_counter(
            "sglang:num_retracted_output_tokens", "Total number of retracted output tokens."
        )

    def _make_histograms(self) -> None:
        names = [*self._labels, "is_streaming"]
        registry = self.registry
        self.ttft = self._by_streaming(
            Histogram(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                names,
                buckets=TTFT_BUCKETS,
                registry=registry,
            )
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            list(self._labels),
            buckets=ITL_BUCKETS,
            registry=registry,
        ).labels(**self._labels)
        self.tpot = self._by_streaming(
            Histogram(
                "sglang:request_time_per_output_token_seconds",
                "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                "(completion_tokens - 1).",
                names,
                buckets=ITL_BUCKETS,
                registry=registry,
            )
        )
        self.e2e = self._by_streaming(
            Histogram(
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                names,
                buckets=E2E_BUCKETS,
                registry=registry,
            )
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
        model = Gauge(
            "workbench_sim:model_busy_seconds",
            "Model time the engine has worked: the sum of its steps' durations.",
            registry=self.registry,
        )
        model.set_function(lambda: max((rank.model_seconds for rank in self.engines), default=0.0))

    def emit_constants(self, max_total_num_tokens: int) -> None:
        """The gauges set once at start (the scheduler's `emit_constants`)."""
        self.max_total_num_tokens.set(max_total_num_tokens)

    def request_started(self) -> None:
        """A /generate HTTP request arrived."""
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)

    def request_ended(self) -> None:
        """A /generate HTTP request left (answered, dropped or abandoned)."""
        self.inflight -= 1

    def abort_sent(self) -> None:
        """The tokenizer manager sent an abort (`observe_one_aborted_request`)."""
        self.aborted.inc()

    def on_first_token(self, request: Request) -> None:
        if request.first_token_at is not None and not request.health:
            self.ttft[request.stream].observe(request.first_token_at - request.arrival)

    def on_tokens(self, request: Request, count: int, now: float) -> None:
        """An output batch of `count` new tokens (the first batch only sets the baseline)."""
        if request.published == 0 or request.last_output_at is None or request.health:
            return
        interval = now - request.last_output_at
        # metrics_collector `observe_inter_token_latency`: one bucket gets all the batch's
        # tokens at the per-token interval; the sum gets the whole interval.
        per_token = interval / count
        self.itl._sum.inc(interval)
        for index, bound in enumerate(self.itl._upper_bounds):
            if per_token <= bound:
                self.itl._buckets[index].inc(count)
                break

    def on_finish(self, request: Request) -> None:
        if request.health:
            return
        streaming = request.stream
        self.prompt_tokens[streaming].inc(request.prompt_len)
        self.generation_tokens[streaming].inc(request.generated)
        self._count_cached(request)
        self.num_requests[streaming].inc()
        if request.finished_at is None:
            return
        self.e2e[streaming].observe(request.finished_at - request.arrival)
        if request.first_token_at is not None and request.generated > 1 and not request.aborted:
            self.tpot[streaming].observe(
                (request.finished_at - request.first_token_at) / (request.generated - 1)
            )

    def _count_cached(self, request: Request) -> None:
        if request.cached_tokens <= 0:
            return
        device = request.cached_tokens - request.host_cached_tokens
        for source, value in (("device", device), ("host", request.host_cached_tokens)):
            if value > 0:
                self.cached_tokens.labels(**self._labels, cache_source=source).inc(value)

    def on_retract(self, requests: list[Request]) -> None:
        self.retracted_requests.inc(len(requests))
        self.retracted_input_tokens.inc(sum(request.prompt_len for request in requests))
        self.retracted_output_tokens.inc(sum(request.generated for request in requests))
        self.num_retracted_reqs.set(len(requests))

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
