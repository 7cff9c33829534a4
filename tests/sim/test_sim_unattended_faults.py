"""The simulator's faults for unattended runs, seen through the HTTP API as a client sees them:
a stalled scheduler that still answers /health, a throughput decay, a crash, silently cut
prompts, SGLang's --allow-auto-truncate, and aborts that free the running-requests gauge."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from conftest import wait_until, wait_until_async
from prometheus_client.parser import text_string_to_metric_families

from workbench.errors import ConfigError
from workbench.sim import SimConfig, add_sim_arguments, config_from_args, create_app
from workbench.sim.faults import TimedFaults, TruncationPlan

RUNNING = "sglang:num_running_reqs"
EXIT_LINE = "Injected fault: the server process exits with status 1 (--fault-exit-after {})"


@asynccontextmanager
async def serving(
    config: SimConfig, *, log: list[str] | None = None, exits: list[int] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process with its lifespan running (timers, loops stopped at the end)."""
    app = create_app(
        config,
        log=None if log is None else log.append,
        exit_process=(exits if exits is not None else []).append,
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=60) as client,
    ):
        yield client


def ids(count: int, start: int = 100) -> list[int]:
    return list(range(start, start + count))


def body(rid: str, count: int = 5, start: int = 100, **sampling: Any) -> dict[str, Any]:
    return {"input_ids": ids(count, start), "rid": rid, "sampling_params": sampling}


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def live_load(client: httpx.AsyncClient) -> tuple[int, int, float]:
    """(running, queued, token usage) read live from the engines in /server_info."""
    states = (await client.get("/server_info")).json()["internal_states"]
    return (
        sum(state["num_running_reqs"] for state in states),
        sum(state["num_queue_reqs"] for state in states),
        sum(state["token_usage"] for state in states),
    )


async def server_seconds(client: httpx.AsyncClient, speed: float) -> float:
    """Server time since start, from /server_info's startup_time (the fault clock's origin)."""
    started = (await client.get("/server_info")).json()["startup_time"]
    return (time.time() - started) * speed


async def wait_for_server_time(client: httpx.AsyncClient, seconds: float, speed: float) -> None:
    async def reached() -> bool:
        return await server_seconds(client, speed) >= seconds

    await wait_until_async(reached, 60, f"{seconds} server seconds since start")


async def post_into(
    client: httpx.AsyncClient, replies: dict[str, httpx.Response], one: dict[str, Any]
) -> None:
    replies[one["rid"]] = await client.post("/generate", json=one)


# --- stall -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_stalled_scheduler_makes_no_progress_but_answers_health_and_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From --fault-stall-after on: no token (the running request's KV stops growing), a new
    request queues and stays unanswered (an abort waits too, as a hung scheduler reads
    nothing), /metrics answers with the generated tokens frozen and the gauges as they were,
    /health answers 200 and /health_generate 503."""
    monkeypatch.setattr("workbench.sim.app.HEALTH_CHECK_TIMEOUT", 0.3)
    config = SimConfig(enable_metrics=True, fault_stall_after=2.0)
    replies: dict[str, httpx.Response] = {}
    async with serving(config) as client, anyio.create_task_group() as group:
        before = await client.post("/generate", json=body("before", max_new_tokens=8))
        assert before.json()["meta_info"]["completion_tokens"] == 8
        # 20,000 steps of about 1 ms: still running when the stall starts.
        long = body("long", max_new_tokens=20_000, ignore_eos=True)
        group.start_soon(post_into, client, replies, long)

        async def admitted() -> bool:
            metrics = await scrape(client)
            return (await live_load(client))[:2] == (1, 0) and metrics[RUNNING] == 1

        await wait_until_async(admitted, 60, "the long request to run")
        first = await scrape(client)
        assert first["sglang:generation_tokens_total"] == 8
        await wait_for_server_time(client, 2.0, speed=1.0)
        group.start_soon(post_into, client, replies, body("stuck", max_new_tokens=8))

        async def queued() -> bool:
            return (await live_load(client))[:2] == (1, 1)

        await wait_until_async(queued, 60, "the request to wait in the queue")
        usage = (await live_load(client))[2]
        assert (await client.post("/abort_request", json={"rid": "stuck"})).status_code == 200
        second = await scrape(client)
        assert (await client.get("/health")).status_code == 200
        assert await live_load(client) == (1, 1, usage) and replies == {}
        assert (await client.get("/health_generate")).status_code == 503
        third = await scrape(client)
        assert await live_load(client) == (1, 2, usage)  # the health check's token waits too
        assert replies == {}
        for name in ("sglang:generation_tokens_total", "sglang:num_requests_total",
                     "sglang:num_queue_reqs", RUNNING):
            assert first[name] == second[name] == third[name]
        assert third["workbench_sim:inflight_requests"] == 2
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_stall_with_a_duration_ends_and_the_queued_request_is_served() -> None:
    """--fault-stall-for D: the stall lasts D server seconds (10 at --speed 10: one second of
    wall-clock time), then the queue moves again."""
    config = SimConfig(enable_metrics=True, speed=10, fault_stall_after=0, fault_stall_for=10)
    replies: dict[str, httpx.Response] = {}
    async with serving(config) as client, anyio.create_task_group() as group:
        group.start_soon(post_into, client, replies, body("held", max_new_tokens=4))

        async def queued() -> bool:
            return (await live_load(client))[:2] == (0, 1)

        await wait_until_async(queued, 60, "the request to wait in the queue")
        assert await server_seconds(client, speed=10) < 10 and replies == {}

        async def answered() -> bool:
            return "held" in replies

        await wait_until_async(answered, 60, "the reply after the stall")
        assert await server_seconds(client, speed=10) >= 10
        assert (await client.get("/health_generate")).status_code == 200
        metrics = await scrape(client)
    assert replies["held"].json()["meta_info"]["completion_tokens"] == 4
    assert metrics["sglang:generation_tokens_total"] == 4


# --- decay -------------------------------------------------------------------------------


async def model_time_per_token(client: httpx.AsyncClient, one: dict[str, Any]) -> float:
    """Server seconds the engine worked per generated token for one request, from /metrics."""
    before = await scrape(client)
    reply = await client.post("/generate", json=one)
    assert reply.status_code == 200
    after = await scrape(client)
    busy = after["workbench_sim:model_busy_seconds"] - before["workbench_sim:model_busy_seconds"]
    tokens = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    assert tokens == one["sampling_params"]["max_new_tokens"]
    return busy / tokens


@pytest.mark.anyio
async def test_decay_makes_every_step_factor_times_longer_from_its_start() -> None:
    """Tokens per second of server time fall F-fold at --fault-decay-after and stay there."""
    config = SimConfig(enable_metrics=True, fault_decay_after=2.5, fault_decay_factor=8)
    sampling = {"max_new_tokens": 40, "ignore_eos": True}
    async with serving(config) as client:
        # Different prompts of one length: the same prefill work, no prefix cache hit.
        normal = await model_time_per_token(client, body("a", 20, 100, **sampling))
        assert await server_seconds(client, speed=1.0) < 2.5  # it ran before the decay
        await wait_for_server_time(client, 2.5, speed=1.0)
        slow = await model_time_per_token(client, body("b", 20, 1000, **sampling))
        slower = await model_time_per_token(client, body("c", 20, 2000, **sampling))
    assert slow == pytest.approx(8 * normal)
    assert slower == pytest.approx(slow)


@pytest.mark.anyio
async def test_decay_from_the_start_against_a_plain_server() -> None:
    sampling = {"max_new_tokens": 30, "ignore_eos": True}
    per_token = []
    for faults in ({}, {"fault_decay_after": 0.0}):
        async with serving(SimConfig(enable_metrics=True, **faults)) as client:
            per_token.append(await model_time_per_token(client, body("x", 12, **sampling)))
    assert per_token[1] == pytest.approx(10 * per_token[0])  # the default factor


def test_timed_faults_follow_server_time() -> None:
    """Server time is wall-clock time times the speed; stall windows and exits in it."""
    now = [0.0]
    faults = TimedFaults(speed=4, stall_after=8, stall_for=4, decay_after=2, decay_factor=3,
                         exit_after=20, clock=lambda: now[0])
    assert (faults.stall_left(), faults.step_factor(), faults.exit_in()) == (0, 1.0, 5.0)
    now[0] = 0.5  # 2 server seconds
    assert faults.step_factor() == 3 and not faults.stalled()
    now[0] = 2.5  # 10 server seconds: the stall ends at 12, half a wall-clock second on
    assert faults.stall_left() == pytest.approx(0.5) and faults.exit_in() == pytest.approx(2.5)
    now[0] = 3.0
    assert not faults.stalled()
    lasting = TimedFaults(stall_after=1, clock=lambda: now[0])
    assert not lasting.stalled()
    now[0] = 4.0
    assert lasting.stall_left() == float("inf") and lasting.exit_in() is None


# --- exit --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_exit_fault_calls_the_exit_hook_once_due() -> None:
    """In-process the exit goes through `exit_process` (os._exit in a real server)."""
    log: list[str] = []
    exits: list[int] = []
    async with serving(SimConfig(speed=4, fault_exit_after=2), log=log, exits=exits) as client:
        assert (await client.get("/health")).status_code == 200

        async def exited() -> bool:
            return bool(exits)

        await wait_until_async(exited, 60, "the exit hook")
        assert await server_seconds(client, speed=4) >= 2
    assert exits == [1]
    assert log == [EXIT_LINE.format(2)]


@pytest.mark.integration
def test_exit_fault_kills_the_server_process_with_a_log_line() -> None:
    argv = [sys.executable, "-m", "workbench.sim", "--port", "0", "--speed", "2",
            "--fault-exit-after", "3"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = re.fullmatch(r"workbench sim ready on (http://\S+)\n", process.stdout.readline())
        assert ready is not None
        with httpx.Client(base_url=ready.group(1), timeout=10) as client:
            reply = client.post("/generate", json={"input_ids": ids(5)})
        assert reply.status_code == 200
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == 1
    lines = [line.split("] ", 1)[-1] for line in stderr.splitlines()]
    assert EXIT_LINE.format(3) in lines


# --- truncation --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_truncate_fault_keeps_the_first_half_of_prompts() -> None:
    async with serving(SimConfig(fault_truncate_rate=1.0)) as client:
        replies = [
            (await client.post("/generate", json=body(f"r{count}", count, max_new_tokens=2)))
            for count in (1, 2, 9, 300)
        ]
        chat = await client.post("/v1/completions", json={"prompt": ids(10), "max_tokens": 2})
    assert [reply.json()["meta_info"]["prompt_tokens"] for reply in replies] == [1, 1, 4, 150]
    assert chat.json()["usage"]["prompt_tokens"] == 5


async def prompt_lengths(config: SimConfig, count: int) -> list[int]:
    async with serving(config) as client:
        reply = await client.post(
            "/generate", json={"input_ids": [ids(8)] * count, "sampling_params": {"max_new_tokens": 1}}
        )
    return [one["meta_info"]["prompt_tokens"] for one in reply.json()]


async def statuses(config: SimConfig, count: int) -> list[int]:
    async with serving(config) as client:
        return [
            (await client.post("/generate", json=body(f"s{index}", max_new_tokens=1))).status_code
            for index in range(count)
        ]


@pytest.mark.anyio
async def test_truncate_draws_follow_the_seed_on_a_stream_of_their_own() -> None:
    config = SimConfig(fault_truncate_rate=0.5, fault_seed=7)
    first, second = await prompt_lengths(config, 20), await prompt_lengths(config, 20)
    assert first == second and set(first) == {4, 8}
    # Adding the truncation fault leaves the other faults' draws as they were.
    plain = SimConfig(fault_error_rate=0.5, fault_seed=7)
    both = SimConfig(fault_error_rate=0.5, fault_truncate_rate=0.5, fault_seed=7)
    assert await statuses(plain, 12) == await statuses(both, 12)


def test_truncation_plan_skips_one_token_prompts_without_a_draw() -> None:
    plan, twin = TruncationPlan(rate=0.5, seed=1), TruncationPlan(rate=0.5, seed=1)
    cuts = [plan.cut(ids(6)) for _ in range(10)]
    assert all(plan.cut([5]) is None for _ in range(5))
    assert [twin.cut(ids(6)) for _ in range(10)] == cuts
    assert plan.cut(ids(6)) == twin.cut(ids(6))


TOO_LONG = {"input_ids": ids(40_000), "sampling_params": {"max_new_tokens": 8}}
TOO_MANY_NEW = {"input_ids": ids(100), "sampling_params": {"max_new_tokens": 32_700}}


@pytest.mark.anyio
async def test_allow_auto_truncate_cuts_what_would_be_a_400() -> None:
    """SGLang's --allow-auto-truncate: the input's start is kept (context length, then the
    scheduler's max_req_input_len) and max_new_tokens is cut to fit, each with a warning."""
    async with serving(SimConfig()) as client:
        assert (await client.post("/generate", json=TOO_LONG)).status_code == 400
        assert (await client.post("/generate", json=TOO_MANY_NEW)).status_code == 400
    log: list[str] = []
    async with serving(SimConfig(allow_auto_truncate=True), log=log) as client:
        cut = await client.post("/generate", json=TOO_LONG)
        fitted = await client.post("/generate", json=TOO_MANY_NEW)
        limit = (await client.get("/server_info")).json()["max_req_input_len"]
    meta = cut.json()["meta_info"]
    assert cut.status_code == 200 and meta["prompt_tokens"] == limit < 40_000
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert fitted.status_code == 200 and fitted.json()["meta_info"]["prompt_tokens"] == 100
    assert [line for line in log if not line.startswith("Decode batch")] == [
        (
            "The input (40000 tokens) is longer than the model's context length (32768 "
            "tokens). Truncating the input."
        ),
        (
            "Requested token count (32768 input + 8 new) exceeds the model's context length "
            "(32768 tokens). Truncating max_new_tokens."
        ),
        (
            "Request length is longer than the KV cache pool size or the max context length. "
            f"Truncated. len(req.origin_input_ids)=32768, max_req_input_len={limit}."
        ),
        (
            "Requested token count (100 input + 32700 new) exceeds the model's context length "
            "(32768 tokens). Truncating max_new_tokens."
        ),
    ]


# --- aborts free the running-requests gauge ----------------------------------------------

# 100 ms a step: a 2,000-token request cannot end by itself while a test aborts it.
SLOW = SimConfig(enable_metrics=True, speed=0.01)
LONG = {"max_new_tokens": 2000, "ignore_eos": True}


async def wait_for_gauge(client: httpx.AsyncClient, running: int) -> None:
    async def reached() -> bool:
        return (await scrape(client))["sglang:num_running_reqs"] == running

    await wait_until_async(reached, 60, f"sglang:num_running_reqs == {running}")


@pytest.mark.anyio
async def test_abort_request_brings_the_running_gauge_down() -> None:
    """The last request leaving makes the engine idle: the gauges are published then, as
    SGLang's scheduler does from `on_idle` when its running-requests gauge is stale."""
    replies: dict[str, httpx.Response] = {}
    async with serving(SLOW) as client, anyio.create_task_group() as group:
        group.start_soon(post_into, client, replies, body("long", **LONG))
        await wait_for_gauge(client, 1)
        assert (await client.post("/abort_request", json={"rid": "long"})).status_code == 200
        await wait_for_gauge(client, 0)
    assert replies["long"].json()["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.anyio
async def test_a_client_that_gives_up_in_process_frees_its_request() -> None:
    async with serving(SLOW) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(post_into, client, {}, body("gone", **LONG))
            await wait_for_gauge(client, 1)
            group.cancel_scope.cancel()
        await wait_for_gauge(client, 0)
        assert await live_load(client) == (0, 0, 0.0)
        assert (await scrape(client))["sglang:num_aborted_requests_total"] == 1


@pytest.mark.integration
def test_a_client_timeout_on_a_real_socket_frees_its_request() -> None:
    """The client's read timeout closes the connection; the server aborts the request."""
    argv = [sys.executable, "-m", "workbench.sim", "--port", "0", "--speed", "0.01",
            "--enable-metrics"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        ready = re.fullmatch(r"workbench sim ready on (http://\S+)\n", process.stdout.readline())
        assert ready is not None
        url = ready.group(1)

        def running() -> float:
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            for family in text_string_to_metric_families(metrics):
                if family.name == "sglang:num_running_reqs":
                    return sum(sample.value for sample in family.samples)
            raise AssertionError("no sglang:num_running_reqs")

        failures: list[Exception] = []

        def post() -> None:
            try:
                httpx.post(f"{url}/generate", json=body("timed-out", **LONG),
                           timeout=httpx.Timeout(10, read=3))
            except httpx.ReadTimeout as exc:
                failures.append(exc)

        client = threading.Thread(target=post)
        client.start()
        wait_until(lambda: running() == 1, 60, "sglang:num_running_reqs == 1")
        client.join(timeout=60)
        assert len(failures) == 1  # the client timed out and closed its connection
        wait_until(lambda: running() == 0, 60, "sglang:num_running_reqs == 0")
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert re.search(r"^sglang:num_aborted_requests_total\{[^}]*\} 1\.0$", metrics,
                         re.MULTILINE)
    finally:
        process.kill()
        process.communicate(timeout=10)


# --- configuration -----------------------------------------------------------------------


def parse(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser(prog="sim")
    add_sim_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_fault_flags_parse() -> None:
    config = parse(
        "--fault-stall-after", "30", "--fault-stall-for", "5", "--fault-decay-after", "60",
        "--fault-decay-factor", "4", "--fault-exit-after", "90", "--fault-truncate-rate", "0.1",
        "--allow-auto-truncate",
    )
    assert (config.fault_stall_after, config.fault_stall_for) == (30, 5)
    assert (config.fault_decay_after, config.fault_decay_factor) == (60, 4)
    assert (config.fault_exit_after, config.fault_truncate_rate) == (90, 0.1)
    assert config.allow_auto_truncate
    assert parse() == SimConfig()


@pytest.mark.parametrize(
    "argv",
    [
        ["--fault-stall-after", "-1"],
        ["--fault-stall-for", "0"],
        ["--fault-decay-after", "nan"],
        ["--fault-decay-factor", "1"],
        ["--fault-exit-after", "inf"],
        ["--fault-truncate-rate", "1.5"],
    ],
)
def test_bad_fault_flags_are_argparse_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(*argv)
    assert caught.value.code == 2
    assert f"argument {argv[0]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"fault_stall_after": -1.0}, "fault_stall_after"),
        ({"fault_stall_after": 1.0, "fault_stall_for": 0.0}, "fault_stall_for"),
        ({"fault_stall_for": 3.0}, "fault_stall_for"),
        ({"fault_decay_after": float("nan")}, "fault_decay_after"),
        ({"fault_decay_factor": 0.5}, "fault_decay_factor"),
        ({"fault_exit_after": float("inf")}, "fault_exit_after"),
        ({"fault_truncate_rate": 2.0}, "fault_truncate_rate"),
    ],
)
def test_bad_fault_settings_are_config_errors_naming_the_key(
    fields: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        SimConfig(**fields)


def test_a_stall_duration_needs_its_start() -> None:
    with pytest.raises(ConfigError, match="fault_stall_for: needs fault_stall_after"):
        parse("--fault-stall-for", "3")
