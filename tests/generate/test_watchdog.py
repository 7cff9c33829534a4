"""The watchdog: its detector on a fake clock, its loop, the runner's wiring (run.json events,
the printed line, the hook), the CLI flags, and a stalled simulator end to end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, jsonl, workbench
from conftest import write_manifest as write_dataset_manifest

from workbench.cli import main
from workbench.config import Manifest, load_manifest
from workbench.errors import ConfigError
from workbench.generate.concurrency import ServerReading, read_servers
from workbench.generate.dispatch import Runner
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.generate.watchdog import (
    Detection,
    Detector,
    Reading,
    RunCounts,
    Watchdog,
    WatchdogSettings,
    reading_from,
)
from workbench.rundir.manifest import EVENTS_LIMIT, with_events
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess
from workbench.sim import SimConfig, create_app

SERVER = {"running": 48.0, "queued": 10.0, "token_usage": 0.97}


def at(t: float, tokens: float | None, *, in_flight: int = 48, finished: int = 0,
       retracted: float = 0.0, **server: Any) -> Reading:
    """One server "s" (its gauges SERVER unless given), or no /metrics (tokens None)."""
    if tokens is None:
        return Reading(t, in_flight=in_flight, finished=finished, **server)
    return Reading(t, {"s": tokens}, retracted={"s": retracted}, in_flight=in_flight,
                   finished=finished, **{**SERVER, **server})


def feed(detector: Detector, readings: list[Reading]) -> list[tuple[float, Detection]]:
    return [(r.at, d) for r in readings if (d := detector.feed(r)) is not None]


# --------------------------------------------------------------------------- stalled
def test_a_stall_is_told_exactly_after_stall_seconds_with_requests_in_flight() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=300))
    readings = [at(0, 100), at(10, 200)] + [at(t, 200) for t in range(15, 310, 5)]
    assert feed(detector, readings) == []
    assert detector.feed(at(309.9, 200)) is None
    stalled = detector.feed(at(310, 200))
    assert stalled is not None and stalled.kind == "stalled"
    assert stalled.message == ("server stalled: no token generated for 300 s with 48 requests "
                               "running, 10 queued, token usage 0.97")
    assert stalled.figures == {"seconds": 300, "in_flight": 48, "running": 48, "queued": 10,
                               "token_usage": 0.97}
    assert detector.feed(at(400, 200)) is None  # told once
    assert detector.state == "stalled"


def test_no_stall_while_nothing_is_in_flight_or_the_run_is_paused() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=300))
    idle = [at(t, 100, in_flight=0) for t in range(0, 1000, 5)]
    paused = [Reading(t, None, in_flight=8, paused=True) for t in range(1000, 2000, 5)]
    assert feed(detector, idle + paused) == []
    # the clock starts when requests are in flight again, the run no longer paused
    found = feed(detector, [at(t, 100, in_flight=3) for t in range(2000, 2400, 5)])
    assert [(t, d.kind) for t, d in found] == [(2295, "stalled")]  # paused until 1995


def test_without_metrics_a_finished_reply_is_the_progress() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=60))
    replies = [at(t, None, in_flight=3, finished=t // 20) for t in range(0, 200, 5)]
    assert feed(detector, replies) == []  # a reply every 20 s
    found = feed(detector, [at(t, None, in_flight=3, finished=9) for t in range(200, 300, 5)])
    assert [t for t, _ in found] == [240]  # the last reply came at 180
    assert found[0][1].message == ("server stalled: no reply finished for 60 s with 3 requests "
                                   "in flight (no /metrics to see tokens)")


def test_progress_after_a_stall_is_a_recovery() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=30))
    found = feed(detector, [at(t, 500) for t in range(0, 50, 5)] + [at(50, 520)])
    assert [(t, d.kind) for t, d in found] == [(30, "stalled"), (50, "recovered")]
    recovered = found[1][1]
    assert recovered.message == "server recovered: progress again after 50 s without"
    assert recovered.figures["after"] == "stalled" and detector.state == "ok"


def test_stall_off_with_zero() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=0))
    assert feed(detector, [at(t, 100) for t in range(0, 5000, 5)]) == []


def test_counters_are_summed_over_servers_and_a_restarted_one_counts_nothing() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=100))

    def two(t: float, a: float, b: float) -> Reading:
        return Reading(t, {"a": a, "b": b}, running=20, queued=0, in_flight=20)

    # worker a hangs, b goes on: the servers together make progress
    assert feed(detector, [two(t, 50, 10 * t) for t in range(0, 300, 5)]) == []
    # b restarts (its counter falls to 0) and then a and b stay put: no progress since 295
    found = feed(detector, [two(300, 50, 0)] + [two(t, 50, 0) for t in range(305, 400, 5)])
    assert [(t, d.kind) for t, d in found] == [(395, "stalled")]


def test_one_hung_worker_among_working_ones_is_told_and_its_recovery() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=100))

    def two(t: float, a: float, b: float, busy_a: float = 8, paused: bool = False) -> Reading:
        return Reading(t, None if paused else {"http://a:1": a, "http://b:2": b}, running=16,
                       queued=0, busy={"http://a:1": busy_a, "http://b:2": 8}, in_flight=16,
                       paused=paused)

    # a's counter stops at 50 while 8 requests run on it; b goes on: the sum moves, a is told
    found = feed(detector, [two(t, min(50, t), 10 * t) for t in range(0, 300, 5)])
    assert [(t, d.kind) for t, d in found] == [(150, "stalled")]
    stalled = found[0][1]
    assert stalled.message == ("worker http://a:1 stalled: no token generated for 100 s with 8 "
                               "requests running on it, while the other servers progress")
    assert stalled.figures["worker"] == "http://a:1" and stalled.figures["seconds"] == 100
    assert detector.state == "stalled"
    found = feed(detector, [two(300, 51, 3000)])
    assert [d.message for _, d in found] == [
        "worker http://a:1 recovered: progress again after 250 s without"]
    assert detector.state == "ok"
    # a worker with nothing running on it is not waited on, and a pause starts the clocks again
    assert feed(detector, [two(t, 51, 10 * t, busy_a=0) for t in range(305, 600, 5)]) == []
    assert feed(detector, [two(t, 51, 0, paused=True) for t in range(600, 700, 5)]) == []
    found = feed(detector, [two(t, 51, 10 * t) for t in range(700, 900, 5)])
    assert [(t, d.kind) for t, d in found] == [(800, "stalled")]


def test_reading_from_server_readings_prefers_the_live_token_counter() -> None:
    servers = [ServerReading("a", 10, 2, 0.5, 3, generated=1000, decoded=5000),
               ServerReading("b", 5, 0, 0.9, None, generated=700, decoded=None)]
    reading = reading_from(servers, 1.0, in_flight=15, finished=4)
    assert reading.tokens == {"a": 5000, "b": 700}
    assert (reading.running, reading.queued, reading.token_usage) == (15, 2, 0.9)
    assert reading.retracted == {"a": 3} and reading.busy == {"a": 10, "b": 5}
    assert reading_from(None, 1.0, 3, 0).tokens is None


@pytest.mark.anyio
async def test_the_simulators_metrics_give_both_token_counters() -> None:
    app = create_app(SimConfig(profile="fast", enable_metrics=True, speed=20.0))
    async with SGLangClient("http://sim", transport=httpx.ASGITransport(app=app)) as client:
        result = await client.generate({"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 120, "temperature": 0.0}})
        servers = await read_servers(client, lambda url: client)
    assert servers is not None
    [server] = servers
    assert server.generated == result.completion_tokens
    # the tokens after a request's first output, counted while it runs
    assert server.decoded is not None and 0 < server.decoded < result.completion_tokens


# --------------------------------------------------------------------------- degraded
def degrading_run(*, usage: float = 0.97, retracting: bool = True, in_flight: int = 48,
                  recover: bool = False) -> list[Reading]:
    """1,000 tokens/s for 300 s (token usage 0.5), then 70 tokens/s (a 14x fall) with token
    usage `usage` and, when `retracting`, 1 retraction a reading; with `recover`, 1,000
    tokens/s again from 400 s."""
    readings, tokens, retracted = [], 0.0, 0.0
    for t in range(0, 600, 5):
        slow = 300 <= t - 5 and not (recover and t - 5 >= 400)
        tokens += 5 * (70 if slow else 1000) if t else 0
        retracted += 1 if slow and retracting else 0
        readings.append(at(t, tokens, retracted=retracted, in_flight=in_flight, finished=t,
                           token_usage=usage if slow else 0.5))
    return readings


def test_degraded_when_the_rate_falls_under_the_fraction_of_the_best_with_usage_and_retractions(
) -> None:
    detector = Detector(WatchdogSettings(degrade_fraction=0.25))
    found = feed(detector, degrading_run())
    # the 60 s window at 350 s: (10 s at 1,000 + 50 s at 70) / 60 = 225 tokens/s < 250
    assert [(t, d.kind) for t, d in found] == [(350, "degraded")]
    degraded = found[0][1]
    assert degraded.message == (
        "server degraded: 225 tokens/s over the last 60 s, 22% of this run's best "
        "(1,000 tokens/s), 10 retractions in the last 350 s, with 48 requests running, "
        "10 queued, token usage 0.97")
    assert degraded.figures["tok_s"] == 225.0 and degraded.figures["best_tok_s"] == 1000.0
    assert degraded.figures["retractions"] == 10


@pytest.mark.parametrize("run", [
    {"usage": 0.85},  # the KV cache is not full
    {"retracting": False},  # nothing retracted
    {"in_flight": 0},  # nothing in flight
])
def test_not_degraded_unless_every_condition_holds(run: dict[str, Any]) -> None:
    assert feed(Detector(WatchdogSettings(degrade_fraction=0.25)), degrading_run(**run)) == []


def test_degraded_off_with_zero() -> None:
    assert feed(Detector(WatchdogSettings(degrade_fraction=0)), degrading_run()) == []


def test_recovered_when_the_rate_is_back_over_the_recover_fraction() -> None:
    detector = Detector(WatchdogSettings(degrade_fraction=0.25, recover_fraction=0.5))
    found = feed(detector, degrading_run(recover=True))
    # 1,000 again after 400 s: the window at 430 s holds 30 s at 70 and 30 s at 1,000
    assert [(t, d.kind) for t, d in found] == [(350, "degraded"), (430, "recovered")]
    assert found[1][1].message == ("server recovered: 535 tokens/s over the last 60 s (54% of "
                                   "the best) after 80 s degraded")


def test_a_degraded_server_that_stalls_is_told_stalled() -> None:
    detector = Detector(WatchdogSettings(stall_seconds=120, degrade_fraction=0.25))
    readings = degrading_run()[:80]  # up to 395 s
    last = readings[-1]
    flat = [at(t, last.tokens["s"], retracted=80, finished=395)  # type: ignore[index]
            for t in range(400, 600, 5)]
    found = feed(detector, readings + flat)
    assert [(t, d.kind) for t, d in found] == [(350, "degraded"), (515, "stalled")]


# --------------------------------------------------------------------------- settings
@pytest.mark.parametrize(("key", "value"), [("stall_seconds", -1), ("degrade_fraction", 1.0),
                                            ("window", 0), ("usage_high", 1.5)])
def test_bad_settings_name_their_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"^{key}: expected"):
        WatchdogSettings(**{key: value})


@pytest.mark.parametrize(("flag", "value"), [("--stall-timeout", "-1"), ("--stall-timeout", "x"),
                                             ("--degrade-fraction", "1.5")])
def test_bad_flags_are_named(flag: str, value: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "--datasets", "d.yaml", "--server", "http://127.0.0.1:1",
              "--out", str(tmp_path / "out"), flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: expected" in capsys.readouterr().err


# --------------------------------------------------------------------------- the loop
@pytest.mark.anyio
async def test_the_loop_reuses_a_fresh_reading_and_says_whether_health_answers() -> None:
    now = [0.0]
    reads: list[float] = []
    seen: list[Detection] = []
    servers = [ServerReading("s", 4, 0, 0.5, 0, generated=10, decoded=100)]

    async def read() -> list[ServerReading]:
        reads.append(now[0])
        return servers

    async def health() -> bool:
        return True

    watchdog = Watchdog(WatchdogSettings(stall_seconds=20, interval=5), read,
                        lambda: RunCounts(4, 0, False), health, seen.append, clock=lambda: now[0])
    assert watchdog.settings.every == 5
    await watchdog.tick()
    watchdog.offer(servers)  # auto concurrency read the servers just now
    now[0] = 4.0
    await watchdog.tick()
    assert reads == [0.0]
    for now[0] in (10.0, 20.0, 30.0):
        await watchdog.tick()
    assert reads == [0.0, 10.0, 20.0, 30.0]
    assert [d.kind for d in seen] == ["stalled"]
    assert seen[0].message.endswith("token usage 0.50; /health answers")
    assert seen[0].figures["health"] is True


# --------------------------------------------------------------------------- the runner
def small_manifest(tmp: Path, n: int = 4) -> Manifest:
    path = tmp / "d.jsonl"
    path.write_text("".join(json.dumps({"sample_id": i, "input_ids": [7, 8, 9]}) + "\n"
                            for i in range(n)))
    manifest = tmp / "datasets.yaml"
    manifest.write_text("model_profile: kimi-k2.5\nsampling:\n  temperature: 0.0\n"
                        "  max_new_tokens: 16\ndatasets:\n  - name: d\n    path: d.jsonl\n"
                        "    input: input_ids\n")
    return load_manifest(manifest)


METRICS = ("sglang:num_running_reqs 4\nsglang:num_queue_reqs 0\nsglang:token_usage 0.5\n"
           "sglang:generation_tokens_total 100\nsglang:inter_token_latency_seconds_count 900\n")


def mock_server(generate: Callable[[httpx.Request], Any]) -> Callable[..., Any]:
    async def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "sim/kimi", "version": "test"})
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path == "/generate":
            return await generate(request)
        return httpx.Response(200, json={})  # /health, /abort_request

    return handler


async def hang(request: httpx.Request) -> httpx.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def reply(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={
        "text": "x", "output_ids": [1, 2], "meta_info": {
            "id": body["rid"], "prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0,
            "finish_reason": {"type": "stop", "matched": 163586}, "e2e_latency": 0.01}})


@pytest.mark.anyio
async def test_the_runner_says_a_stall_writes_it_to_run_json_and_calls_its_hook(
        tmp_path: Path) -> None:
    manifest, out = small_manifest(tmp_path), tmp_path / "out"
    said: list[str] = []
    hooked: list[Detection] = []
    runners: list[Runner] = []

    def on_watchdog(detection: Detection) -> None:
        hooked.append(detection)
        runners[0].request_stop()
        runners[0].request_stop()  # the stuck requests are cut at once

    options = GenerateOptions(concurrency=4, seed=1, progress_interval=60, grace_period=0.1)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(mock_server(hang))) as c:
        summary = await run_generation(
            manifest, c, out, options, on_start=runners.append, on_event=said.append,
            watchdog=WatchdogSettings(stall_seconds=0.3, interval=0.05), on_watchdog=on_watchdog)
    assert summary.interrupted and summary.dropped == 4
    assert [d.kind for d in hooked] == ["stalled"]
    message = hooked[0].message
    assert message.startswith("server stalled: no token generated for 0 s with 4 requests "
                              "running, 0 queued, token usage 0.50; /health answers")
    assert message in said
    run_json = json.loads((out / "run.json").read_text())
    [event] = run_json["events"]
    assert event["kind"] == "stalled" and event["message"] == message
    assert isinstance(event["ts"], float) and event["in_flight"] == 4 and event["health"] is True
    assert run_json["history"][-1]["watchdog"] == {"stall_timeout": 0.3, "degrade_fraction": 0.25}

    # a resumed run keeps the earlier sessions' events (and adds its own)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(mock_server(reply))) as c:
        summary = await run_generation(manifest, c, out, options)
    assert summary.datasets["d"].done == 4
    resumed = json.loads((out / "run.json").read_text())
    assert resumed["events"] == [event] and len(resumed["history"]) == 2


@pytest.mark.anyio
async def test_a_run_that_progresses_has_no_events(tmp_path: Path) -> None:
    options = GenerateOptions(concurrency=2, seed=1, progress_interval=60)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(mock_server(reply))) as c:
        await run_generation(small_manifest(tmp_path, 20), c, tmp_path / "out", options,
                             watchdog=WatchdogSettings(stall_seconds=1, interval=0.01))
    assert json.loads((tmp_path / "out/run.json").read_text())["events"] == []


def test_events_append_to_the_earlier_sessions_and_keep_the_latest() -> None:
    earlier = {"events": [{"ts": 1.0, "kind": "stalled", "message": "m"}, "not an event"]}
    mine = [{"ts": 2.0, "kind": "recovered", "message": "r"}]
    assert with_events({"a": 1}, earlier, mine) == {
        "a": 1, "events": [{"ts": 1.0, "kind": "stalled", "message": "m"}, *mine]}
    assert with_events({}, {"events": "oops"}, mine)["events"] == mine
    many = [{"ts": float(i), "kind": "stalled", "message": ""} for i in range(EVENTS_LIMIT + 5)]
    assert with_events({}, earlier, many)["events"] == many[5:]


# --------------------------------------------------------------------------- end to end
@pytest.mark.integration
def test_a_stalled_simulator_is_told_and_the_run_still_ends_cleanly(
        tmp_path: Path, start_sim: Callable[..., ServerProcess]) -> None:
    """The simulator's scheduler stops for good a few seconds in (/health and /metrics still
    answer): the stall is printed and in run.json, the stuck requests time out, and every
    sample ends as a record or an errors line."""
    server = start_sim(speed=0.1, fault_stall_after=0.4)  # 4 s of wall-clock time
    n = 48
    manifest = write_dataset_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": n}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--server", server.url,
                     "--out", str(out), "--concurrency", "16", "--stall-timeout", "1",
                     "--request-timeout", "3", "--max-attempts", "1", "--progress-interval", "1")
    assert done.returncode == 1, done.stderr  # the stuck prompts failed (timeouts)
    stalled = [e for e in json.loads((out / "run.json").read_text())["events"]
               if e["kind"] == "stalled"]
    assert stalled, "no stalled event in run.json"
    message = stalled[0]["message"]
    assert message.startswith("server stalled: no token generated for ")
    assert message.endswith("; /health answers") and stalled[0]["in_flight"] > 0
    assert message in done.stdout.splitlines()
    assert "run finished" in done.stdout
    records = {r["sample_id"] for r in jsonl(out / "ids/raw_responses.jsonl")} \
        if (out / "ids/raw_responses.jsonl").exists() else set()
    errors = [e["sample_id"] for e in jsonl(out / "ids/errors.jsonl")]
    prompts = {p["sample_id"] for p in jsonl(out / "ids/prompts.jsonl")}
    assert len(prompts) == n and records | set(errors) == prompts
    assert not records & set(errors) and len(errors) == len(set(errors))
