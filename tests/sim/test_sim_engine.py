"""The simulator's model: sizing formulas, the batching engine, the prefix cache, outputs."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import pytest

from workbench.errors import ConfigError
from workbench.profiles import get_profile
from workbench.sim.batch import POOL_FULL_MESSAGE
from workbench.sim.cache import BLOCK_TOKENS, PrefixCache, block_hashes
from workbench.sim.engine import (
    ABORT_MESSAGE,
    MAX_LAG_SECONDS,
    QUEUE_ABORT_MESSAGE,
    Engine,
    EngineLoop,
    Step,
)
from workbench.sim.outputs import (
    corpus,
    fixed_output,
    output_seed,
    plan_output,
    prompt_thinks,
    render_text,
    text_run,
    tokenize_text,
)
from workbench.sim.profiles import (
    OutOfMemory,
    OutputShape,
    Sizing,
    get_sim_profile,
    plan_sizing,
    prefill_budget,
    step_seconds,
)
from workbench.sim.request import Request

KIMI = get_profile("kimi-k2.5")
THINK_START, THINK_END, IM_END = 163606, 163607, 163586
FAST = get_sim_profile("fast")
KIMI_GPU = get_sim_profile("kimi-k2.5-8xrtx6000")


class FakeClock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sizing(capacity: int, *, host: int = 0, max_running: int = 1000, chunk: int = 8192) -> Sizing:
    return Sizing(
        kv_cache_dtype="bf16",
        kv_bytes_per_token=1,
        max_total_num_tokens=capacity,
        host_tokens=host,
        max_running_requests=max_running,
        max_req_input_len=capacity - 1,
        context_length=100_000,
        chunked_prefill_size=chunk,
    )


def make_engine(
    capacity: int,
    *,
    host: int = 0,
    max_running: int = 1000,
    chunk: int = 8192,
    log: Callable[[str], None] | None = None,
) -> tuple[Engine, FakeClock]:
    clock = FakeClock()
    engine = Engine(
        sizing(capacity, host=host, max_running=max_running, chunk=chunk),
        lambda running, prefilled, loaded: 0.001 + 0.0001 * running + 1e-6 * prefilled,
        clock=clock,
        log=log,
        log_interval=10,
    )
    return engine, clock


def request(prompt: int, output: int, max_new: int | None = None, start: int = 0) -> Request:
    ids = list(range(start, start + prompt))
    return Request(prompt, list(range(output)), max_new or output, hashes=block_hashes(ids))


def run_step(engine: Engine, clock: FakeClock) -> Step:
    step = engine.step()
    clock.now += step.duration
    engine.publish(step)
    return step


def run_all(engine: Engine, clock: FakeClock, limit: int = 100_000) -> int:
    steps = 0
    while engine.has_work and steps < limit:
        run_step(engine, clock)
        steps += 1
    return steps


# --- sizing formulas ---------------------------------------------------------------------


def kimi_sizing(fraction: float, dtype: str = "bf16", **kwargs: object) -> Sizing:
    options: dict[str, object] = {
        "tp_size": 8,
        "enable_hierarchical_cache": False,
        "hicache_size_gb": 0.0,
        "hicache_ratio": 2.0,
        "max_running_requests": None,
        "chunked_prefill_size": None,
    }
    options.update(kwargs)
    return plan_sizing(
        KIMI_GPU,
        mem_fraction_static=fraction,
        kv_cache_dtype=dtype,
        **options,  # type: ignore[arg-type]
    )


def test_kimi_pool_sizes_match_the_design() -> None:
    assert KIMI_GPU.kv_bytes_per_token_bf16 == 70_272
    assert 38_000 < kimi_sizing(0.80).max_total_num_tokens < 42_000
    assert 140_000 < kimi_sizing(0.88).max_total_num_tokens < 155_000
    fp8 = kimi_sizing(0.80, "fp8_e4m3")
    assert fp8.kv_bytes_per_token == 70_272 // 2
    assert fp8.max_total_num_tokens == pytest.approx(
        2 * kimi_sizing(0.80).max_total_num_tokens, rel=1e-3
    )


def test_auto_kv_dtype_is_the_profiles_choice() -> None:
    assert kimi_sizing(0.80, "auto").kv_cache_dtype == KIMI_GPU.auto_kv_dtype
    fast = plan_sizing(
        FAST,
        mem_fraction_static=0.8,
        kv_cache_dtype="auto",
        tp_size=1,
        enable_hierarchical_cache=False,
        hicache_size_gb=0,
        hicache_ratio=2.0,
        max_running_requests=None,
        chunked_prefill_size=None,
    )
    assert fast.kv_cache_dtype == "bf16"
    assert fast.max_total_num_tokens > 1_000_000


def test_hierarchical_cache_sizes() -> None:
    by_size = kimi_sizing(0.88, enable_hierarchical_cache=True, hicache_size_gb=48.0)
    assert by_size.host_tokens == int(48e9 / 70_272)
    by_ratio = kimi_sizing(0.88, enable_hierarchical_cache=True)
    assert by_ratio.host_tokens == 2 * by_ratio.max_total_num_tokens
    assert kimi_sizing(0.88, hicache_size_gb=48.0).host_tokens == 0


@pytest.mark.parametrize(
    ("fraction", "tp_size", "needle"),
    [(0.95, 8, "activations"), (0.70, 8, "weights"), (0.88, 4, "weights")],
)
def test_impossible_memory_is_out_of_memory(fraction: float, tp_size: int, needle: str) -> None:
    with pytest.raises(OutOfMemory, match="out of memory") as caught:
        kimi_sizing(fraction, tp_size=tp_size)
    assert needle in str(caught.value)
    assert isinstance(caught.value, ConfigError)


def test_prefill_budget_defaults_to_the_profile_and_minus_one_turns_chunking_off() -> None:
    assert prefill_budget(None, KIMI_GPU) == 8192
    assert prefill_budget(-1, KIMI_GPU) == KIMI_GPU.context_length
    assert prefill_budget(512, KIMI_GPU) == 512


def test_step_time_grows_with_batch_and_prefill() -> None:
    base = step_seconds(KIMI_GPU, "bf16", 0, 0, 0)
    assert base == pytest.approx(0.025)
    assert step_seconds(KIMI_GPU, "bf16", 100, 0, 0) == pytest.approx(0.065)
    assert step_seconds(KIMI_GPU, "bf16", 10, 1000, 0) > step_seconds(KIMI_GPU, "bf16", 10, 0, 0)
    assert step_seconds(KIMI_GPU, "fp8_e4m3", 50, 0, 0) > step_seconds(KIMI_GPU, "bf16", 50, 0, 0)


def test_unknown_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown simulator profile"):
        get_sim_profile("nope")


# --- engine ------------------------------------------------------------------------------


def test_more_pool_runs_more_requests() -> None:
    running = {}
    for capacity in (3_000, 30_000):
        engine, clock = make_engine(capacity)
        for index in range(40):
            engine.submit(request(200, 300, start=index * 1000))
        run_step(engine, clock)
        running[capacity] = len(engine.running)
    assert 0 < running[3_000] < running[30_000]


def test_requests_queue_when_the_pool_is_full_and_all_finish() -> None:
    engine, clock = make_engine(4_000)
    requests = [request(300, 200, start=index * 1000) for index in range(30)]
    for one in requests:
        engine.submit(one)
    run_step(engine, clock)
    assert engine.waiting and engine.running
    assert engine.used_tokens <= engine.capacity
    run_all(engine, clock)
    assert all(one.finished and one.generated == 200 for one in requests)
    assert engine.used_tokens == 0


def test_max_running_requests_is_respected() -> None:
    engine, clock = make_engine(1_000_000, max_running=5)
    for index in range(20):
        engine.submit(request(10, 50, start=index * 100))
    run_step(engine, clock)
    assert len(engine.running) == 5
    assert len(engine.waiting) == 15


def test_chunked_prefill_budget_limits_admission_per_step() -> None:
    engine, clock = make_engine(1_000_000, chunk=1_000)
    for index in range(10):
        engine.submit(request(400, 20, start=index * 1000))
    step = run_step(engine, clock)
    assert len(step.admitted) == 3


def test_retraction_keeps_progress_and_everything_finishes() -> None:
    engine, clock = make_engine(2_000)
    requests = [request(100, 600, max_new=4000, start=index * 1000) for index in range(8)]
    for one in requests:
        engine.submit(one)
    run_all(engine, clock)
    assert engine.retractions > 0
    assert all(one.generated == 600 and not one.aborted for one in requests)


def test_a_request_alone_that_outgrows_the_pool_is_aborted() -> None:
    engine, clock = make_engine(1_100)
    alone = request(100, 5_000)
    engine.submit(alone)
    run_all(engine, clock)
    assert alone.finished and alone.abort_message == POOL_FULL_MESSAGE
    assert alone.generated == 1_000


def test_each_step_generates_one_token_per_running_request() -> None:
    engine, clock = make_engine(100_000)
    first, second = request(10, 5), request(10, 3, start=500)
    engine.submit(first)
    engine.submit(second)
    step = run_step(engine, clock)
    assert step.tokens == 2 and step.started == [first, second]
    run_step(engine, clock)
    finished = run_step(engine, clock).finished
    assert finished == [second]
    assert first.generated == 3 and second.generated == 3
    assert second.finished_at == pytest.approx(clock.now)
    assert first.first_token_at is not None and first.first_token_at > first.arrival


def test_step_duration_grows_with_the_batch() -> None:
    engine, clock = make_engine(1_000_000)
    engine.submit(request(10, 100))
    run_step(engine, clock)
    small = run_step(engine, clock).duration
    for index in range(50):
        engine.submit(request(10, 100, start=100 + index * 100))
    run_step(engine, clock)
    assert run_step(engine, clock).duration > small  # the modelled step cost, not wall time


def test_prefix_cache_hit_skips_prefill_and_reports_cached_tokens() -> None:
    engine, clock = make_engine(100_000)
    first = request(300, 5)
    engine.submit(first)
    run_all(engine, clock)
    again = request(300, 5)
    engine.submit(again)
    run_all(engine, clock)
    assert first.cached_tokens == 0
    assert again.cached_tokens == (300 // BLOCK_TOKENS) * BLOCK_TOKENS


def test_cached_tokens_leave_at_least_one_prompt_token_to_compute() -> None:
    engine, clock = make_engine(100_000)
    for _ in range(2):
        last = request(2 * BLOCK_TOKENS, 3)
        engine.submit(last)
        run_all(engine, clock)
    assert last.cached_tokens == 2 * BLOCK_TOKENS - 1


def test_hierarchical_cache_keeps_prefixes_the_device_evicts() -> None:
    hits = {}
    for host in (0, 100_000):
        engine, clock = make_engine(1_000, host=host)
        target = request(256, 2)
        engine.submit(target)
        run_all(engine, clock)
        for index in range(10):
            engine.submit(request(256, 2, start=10_000 + index * 1000))
            run_all(engine, clock)
        again = request(256, 2)
        engine.submit(again)
        run_all(engine, clock)
        hits[host] = again.cached_tokens
    assert hits[0] == 0
    assert hits[100_000] == 255


def test_flush_cache_is_refused_while_busy() -> None:
    engine, clock = make_engine(100_000)
    engine.submit(request(300, 5))
    assert engine.flush_cache() is False
    run_all(engine, clock)
    assert engine.flush_cache() is True
    again = request(300, 5)
    engine.submit(again)
    run_all(engine, clock)
    assert again.cached_tokens == 0


def test_cancelled_requests_leave_the_engine() -> None:
    engine, clock = make_engine(100_000)
    running, waiting = request(10, 1000), request(10, 1000, start=100)
    engine.submit(running)
    run_step(engine, clock)
    engine.submit(waiting)
    engine.cancel(running, "gone")
    engine.cancel(waiting, "gone")
    run_all(engine, clock)
    assert running.finished and waiting.finished
    assert running.generated == 1 and waiting.generated == 0
    assert engine.used_tokens == 0


def test_abort_takes_queued_requests_at_once_and_running_ones_at_the_next_step() -> None:
    """scheduler.py `abort_request`: pop from the queue (answered at once), or `to_finish`."""
    engine, clock = make_engine(100_000, max_running=1)
    running, queued, other = request(10, 1000), request(10, 1000, start=100), request(10, 5)
    told: list[str] = []
    queued.on_update = lambda: told.append("queued")
    for one in (running, queued, other):
        engine.submit(one)
    run_step(engine, clock)
    assert engine.abort(lambda one: one is running or one is queued) == 2
    assert told == ["queued"] and queued.done and queued.aborted_in_queue
    assert queued.abort_message == QUEUE_ABORT_MESSAGE and list(engine.waiting) == [other]
    assert running.aborted and not running.finished and engine.used_tokens == 11
    step = run_step(engine, clock)
    assert running in step.finished and running.abort_message == ABORT_MESSAGE
    assert running.abort_status is None and running.generated == 1
    assert engine.used_tokens == 0 and not engine.running
    run_all(engine, clock)
    assert other.finished and not other.aborted and engine.used_tokens == 0


def test_a_marked_request_that_retraction_picks_finishes_instead() -> None:
    engine, clock = make_engine(2_000)
    first, second = request(100, 3000, max_new=4000), request(100, 3000, max_new=4000, start=1000)
    engine.submit(first)
    engine.submit(second)
    for _ in range(10_000):
        if len(engine.running) == 2 and engine.used_tokens + 2 > engine.capacity:
            break
        run_step(engine, clock)
    victim = min(engine.running, key=lambda one: (one.generated, -one.prompt_len))
    assert victim is second
    engine.abort(lambda one: one is victim)
    step = run_step(engine, clock)
    assert victim in step.finished and victim.retractions == 0 and victim not in engine.waiting
    assert victim.done and victim.abort_message == ABORT_MESSAGE
    assert engine.used_tokens == first.kv_tokens


def test_decode_log_lines_every_interval() -> None:
    lines: list[str] = []
    engine, clock = make_engine(100_000, log=lines.append)
    engine.submit(request(10, 25))
    run_all(engine, clock)
    assert len(lines) == 2
    fields = dict(part.split(": ") for part in lines[0].removeprefix("Decode batch, ").split(", "))
    assert set(fields) == {
        "#running-req",
        "#token",
        "token usage",
        "cuda graph",
        "gen throughput (token/s)",
        "#queue-req",
    }
    assert float(fields["gen throughput (token/s)"]) > 0
    assert engine.last_gen_throughput > 0


class SleepingClock(FakeClock):
    """The engine loop's clock and sleep: a sleep moves the clock by its seconds, plus
    `overshoot` (an event loop that wakes late) and, on the `stall`-th sleep, `stalled`
    seconds (a busy process)."""

    def __init__(self, overshoot: float = 0.0, stall: int = 0, stalled: float = 0.0) -> None:
        super().__init__()
        self.overshoot, self.stall, self.stalled = overshoot, stall, stalled
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.overshoot
        if len(self.sleeps) == self.stall:
            self.now += self.stalled
        await asyncio.sleep(0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("late", "took"),
    [
        ({}, 0.1),  # 20 steps of 10 ms at speed 2
        ({"overshoot": 0.002}, 0.102),  # late wake-ups are caught up: only the last one shows
        ({"stall": 5, "stalled": 1.0}, 0.1 + 1.0 - MAX_LAG_SECONDS),  # caught up this far only
    ],
)
async def test_engine_loop_paces_steps_at_their_duration_over_the_speed(
    late: dict[str, Any], took: float
) -> None:
    clock = SleepingClock(**late)
    engine = Engine(sizing(100_000), lambda running, prefilled, loaded: 0.01, clock=clock)
    loop = EngineLoop(engine, speed=2.0, clock=clock, sleep=clock.sleep)
    done = anyio.Event()
    one = Request(10, list(range(20)), 20, on_update=done.set)
    loop.submit(one)
    with anyio.fail_after(60):
        await done.wait()
    await loop.close()
    assert one.generated == 20 and len(clock.sleeps) == 20
    assert clock.sleeps[0] == pytest.approx(0.01 / 2)
    assert engine.model_seconds == pytest.approx(20 * 0.01)
    assert one.finished_at is not None and one.finished_at - one.arrival == pytest.approx(took)


def lines_run(call: Callable[[], object]) -> int:
    """Lines of the simulator's modules that `call()` executes: work, whatever the host's speed."""
    package = str(Path(Engine.__init__.__code__.co_filename).parent) + os.sep
    count = 0

    def line(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal count
        count += event == "line"
        return line

    def call_event(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        return line if frame.f_code.co_filename.startswith(package) else None

    previous = sys.gettrace()  # a coverage tracer, say: put back afterwards
    sys.settrace(call_event)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count


def test_engine_work_per_step_grows_with_the_running_requests_only() -> None:
    """O(running requests) per step: three times the batch, about the same work per request
    and step (O(running^2) per step would triple it)."""

    def work_per_request_step(count: int) -> float:
        engine, clock = make_engine(10_000_000)
        for index in range(count):
            engine.submit(request(100, 200, start=index * 1000))
        steps: list[int] = []
        lines = lines_run(lambda: steps.append(run_all(engine, clock)))
        assert steps[0] >= 200 and not engine.has_work
        return lines / (count * 200)

    small, large = work_per_request_step(100), work_per_request_step(300)
    assert large < 1.3 * small, (small, large)


# --- prefix cache ------------------------------------------------------------------------


def test_block_hashes_chain_over_the_whole_prefix() -> None:
    ids = list(range(200))
    other = [999, *ids[1:]]
    assert len(block_hashes(ids)) == 200 // BLOCK_TOKENS
    assert block_hashes(ids)[:2] == block_hashes(ids[:128])
    assert not set(block_hashes(ids)) & set(block_hashes(other))


def test_prefix_cache_matches_the_longest_cached_prefix() -> None:
    cache = PrefixCache(device_tokens=10_000, host_tokens=0)
    ids = list(range(256))
    cache.insert(block_hashes(ids[:128]))
    assert cache.match(block_hashes(ids)).tokens == 128
    cache.shrink(0)
    assert cache.match(block_hashes(ids)).tokens == 0


# --- outputs -----------------------------------------------------------------------------

SHAPE = FAST.output


def plan(seed: int, max_new: int = 100_000, model: object = KIMI) -> list[int]:
    return plan_output(model, SHAPE, seed, max_new).output_ids  # type: ignore[arg-type]


def test_outputs_are_deterministic_and_depend_on_the_prompt() -> None:
    seed = output_seed(0, [1, 2, 3], 0.7, 0.9, 20)
    assert plan(seed) == plan(output_seed(0, [1, 2, 3], 0.7, 0.9, 20))
    assert plan(seed) != plan(output_seed(0, [1, 2, 4], 0.7, 0.9, 20))
    assert plan(seed) != plan(output_seed(1, [1, 2, 3], 0.7, 0.9, 20))
    assert output_seed(0, "a b", 0.0, 0.5, 5) == output_seed(0, "a b", 0.0, 1.0, -1)
    assert output_seed(0, "a b", 0.0, 1.0, -1) != output_seed(0, [1, 2], 0.0, 1.0, -1)


def test_stop_finished_outputs_are_well_formed_reasoning() -> None:
    for seed in range(200):
        result = plan_output(KIMI, SHAPE, seed, 100_000)
        if result.finish == "length":
            continue
        ids = result.output_ids
        assert result.matched == IM_END == ids[-1]
        assert ids.count(THINK_END) == 1 and THINK_START not in ids
        think_end = ids.index(THINK_END)
        assert 0 < think_end < len(ids) - 2
        low, high = KIMI.sim_content_ids
        assert all(low <= token < high for token in ids[:think_end] + ids[think_end + 1 : -1])


def test_a_prompt_that_closed_the_reasoning_gets_an_answer_only() -> None:
    qwen = get_profile("qwen3")
    assert prompt_thinks(KIMI, [5, 6, THINK_START])
    assert not prompt_thinks(KIMI, [5, 6, THINK_START, THINK_END])  # Kimi, thinking off
    assert not prompt_thinks(qwen, [5, qwen.think_start, 198, 198, qwen.think_end, 198, 198])
    assert not prompt_thinks(KIMI, "question <think></think> ") and prompt_thinks(KIMI, "a b")
    for seed in range(200):
        ids = plan_output(KIMI, SHAPE, seed, 100_000, thinking=False).output_ids
        assert THINK_END not in ids and THINK_START not in ids and ids[-1] == IM_END


def test_output_lengths_follow_the_shape() -> None:
    lengths = sorted(len(plan(seed, 10_000)) for seed in range(400))
    median = lengths[len(lengths) // 2]
    expected = SHAPE.reasoning_median + SHAPE.answer_median
    assert 0.6 * expected < median < 1.4 * expected


def test_a_few_outputs_never_close_their_reasoning() -> None:
    unclosed = [seed for seed in range(1000) if KIMI.think_end not in plan(seed, 5_000)]
    assert 5 <= len(unclosed) <= 40
    cut = plan_output(KIMI, SHAPE, unclosed[0], 5_000)
    assert cut.finish == "length" and len(cut.output_ids) == 5_000


def test_max_new_tokens_cuts_a_prefix_and_finishes_with_length() -> None:
    full = plan_output(KIMI, SHAPE, 7, 100_000)
    cut = plan_output(KIMI, SHAPE, 7, 10)
    assert cut.finish == "length" and cut.matched is None
    assert cut.output_ids == full.output_ids[:10]
    assert plan_output(KIMI, SHAPE, 7, 0).output_ids == []


def test_profiles_without_reasoning_in_the_template_open_it() -> None:
    qwen = get_profile("qwen3")
    ids = plan(3, model=qwen)
    assert ids[0] == qwen.think_start and qwen.think_end in ids
    plain = get_profile("plain")
    ids = plan(3, model=plain)
    assert ids[-1] == plain.end_ids[0]
    assert all(plain.sim_content_ids[0] <= token < plain.sim_content_ids[1] for token in ids[:-1])


def test_text_rendering_round_trips() -> None:
    words = tokenize_text("Alice was beginning", KIMI)
    ids = [*words, THINK_END, words[0], IM_END]
    text = render_text(ids, KIMI)
    assert text == "alice was beginning </think> alice <|im_end|>"
    assert tokenize_text(text, KIMI) == ids
    hashed = tokenize_text("zyzzyva quux", KIMI)
    assert len(hashed) == 2 and hashed == tokenize_text("Zyzzyva  quux\n", KIMI)


def _reply_parts(seed: int) -> list[list[int]]:
    """The reasoning and the answer of a fast-profile reply (none when it never closes)."""
    ids = plan_output(KIMI, SHAPE, seed, 100_000).output_ids
    if THINK_END not in ids:
        return []
    cut = ids.index(THINK_END)
    return [ids[:cut], ids[cut + 1 : -1]]


def test_replies_read_as_the_example_text_over_a_few_words() -> None:
    text = corpus()
    assert KIMI.sim_content_ids == (0, len(text.tokens))
    pairs = set(zip(text.ids, text.ids[1:], strict=False))
    sentence_openers = {text.ids[start] for start in text.starts}
    held = total = 0
    for seed in range(40):
        for part in _reply_parts(seed):
            assert part[0] in sentence_openers
            held += sum(pair in pairs for pair in itertools.pairwise(part))
            total += len(part) - 1
    assert total > 2000 and held / total > 0.95  # only the walk's jumps leave the text's pairs


def _shingles(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[at : at + 3]) for at in range(len(ids) - 2)}


def _most_alike(replies: list[list[int]]) -> float:
    """The largest exact Jaccard of two replies' 3-id shingle sets."""
    sets = [_shingles(reply) for reply in replies]
    return max(len(a & b) / len(a | b) for index, a in enumerate(sets) for b in sets[:index])


def test_different_seeds_replies_are_not_near_duplicates() -> None:
    replies = [plan_output(KIMI, SHAPE, seed, 100_000).output_ids for seed in range(150)]
    assert _most_alike([reply for reply in replies if len(reply) >= 32]) < 0.35
    long = [text_run(random.Random(seed), 3000) for seed in range(12)]
    assert _most_alike(long) < 0.45  # the text holds about 2,000 ids: long walks share more


def test_a_longer_text_run_extends_a_shorter_one_with_one_draw() -> None:
    longest = text_run(random.Random(7), 500)
    after = random.Random(7)
    text_run(after, 500)
    for count in (0, 1, 5, 50, 499):
        rng = random.Random(7)
        assert text_run(rng, count) == longest[:count]
        assert rng.getstate() == after.getstate()
    assert text_run(random.Random(8), 50) != longest[:50]


def test_fixed_output_is_small_and_well_formed() -> None:
    fixed = fixed_output(KIMI, 128)
    assert fixed.finish == "stop" and fixed.output_ids[-1] == KIMI.end_ids[0]
    assert len(fixed.output_ids) == 5
    assert fixed_output(KIMI, 2).finish == "length"


def test_output_shape_is_lognormal_around_its_median() -> None:
    shape = OutputShape(
        reasoning_median=50, reasoning_sigma=0.01, answer_median=20, answer_sigma=0.01
    )
    lengths = [len(plan_output(KIMI, shape, seed, 10_000).output_ids) for seed in range(50)]
    typical = [length for length in lengths if length < 1000]
    assert all(math.isclose(length, 50 + 20 + 2, abs_tol=3) for length in typical)
