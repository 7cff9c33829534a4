"""The monitor: statuses, alerts on planted problems, frames, server polling, the simulator."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, wait_until_async, write_manifest
from rich.console import Console

from workbench.analyze.stats import StatsCollector, collect_stats
from workbench.config import load_manifest
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.server.client import SGLangClient, default_transport
from workbench.server.launch import ServerProcess
from workbench.watch.alerts import build_state
from workbench.watch.monitor import Monitor, run_monitor
from workbench.watch.render import render_frame, render_rich
from workbench.watch.status import MonitorState, Thresholds

NOW = time.time()


# --- planted trees ---------------------------------------------------------------------------


def flat(sid: int, completion: int | None, *, ts: float, reason: str = "stop") -> dict[str, Any]:
    return {
        "sample_id": sid,
        "output_ids": [1],
        "prompt_tokens": 200,
        "completion_tokens": completion,
        "cached_tokens": 0,
        "finish_reason": reason,
        "matched_stop": None,
        "e2e_latency": 1.0,
        "ts": ts,
        "schema": 1,
    }


def legacy(sid: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{sid}",
        "choices": [{"finish_reason": "stop"}],
        "usage": {"prompt_tokens": 200, "total_tokens": 300},
    }


def plant(
    out: Path,
    name: str,
    records: Iterable[dict[str, Any]],
    *,
    written: float,
    errors: Iterable[dict[str, Any]] = (),
) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, objs in (("raw_responses.jsonl", records), ("errors.jsonl", errors)):
        path = folder / file
        path.write_text("".join(json.dumps(o) + "\n" for o in objs))
        os.utime(path, (written, written))


def run_json(out: Path, updated: float = NOW - 3600, **prompts: int) -> None:
    datasets = {
        name: {"prompts": n, "max_samples": None, "max_tokens": None} for name, n in prompts.items()
    }
    (out / "run.json").write_text(
        json.dumps({"updated": updated, "server_url": "http://gpu:30000", "datasets": datasets})
    )


def steady(
    count: int, *, every: float = 2.0, completion: int = 300, start: int = 0
) -> list[dict[str, Any]]:
    """count records, the last one just now, one every `every` seconds."""
    return [flat(start + i, completion, ts=NOW - every * (count - 1 - i)) for i in range(count)]


def state_of(out: Path, server: Any = None, thresholds: Thresholds | None = None) -> MonitorState:
    return build_state(StatsCollector(out).refresh(NOW), server, thresholds or Thresholds())


def row(frame: str, name: str) -> list[str]:
    """The cells of a dataset's row in a plain frame (columns are two spaces apart)."""
    line = next(line for line in frame.splitlines() if line.startswith(name + " "))
    return re.split(r"\s{2,}", line.strip())


def test_clean_run_numbers_and_no_alert(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(60), written=NOW - 1)
    plant(
        tmp_path,
        "B",
        steady(20, every=5.0, completion=100),
        written=NOW - 3,
        errors=[
            {
                "sample_id": 999,
                "attempt": 1,
                "error_type": "timeout",
                "http_status": None,
                "message": "timed out",
                "ts": NOW - 30,
            }
        ],
    )
    plant(tmp_path, "C", [], written=NOW - 3000)
    run_json(tmp_path, A=60, B=100, C=50)
    state = state_of(tmp_path)

    assert state.alerts == ()
    assert state.statuses == {"A": "done", "B": "running", "C": "waiting"}
    frame = render_frame(state)
    assert frame.splitlines()[-1] == "no alerts"
    # 59 records after the first one in 118 s, 300 tokens each: 150 tok/s
    assert row(frame, "A") == [
        "A",
        "done",
        "60/60",
        "0",
        "12,000",
        "200",
        "18,000",
        "300",
        "150",
        "done",
        "1s ago",
    ]
    b = row(frame, "B")
    # 19 records after the first one, in 95 s: 0.2 req/s, 20 tok/s; 80 - 1 failed id = 79 left
    assert b[:9] == ["B", "running", "20/100", "1", "4,000", "200", "2,000", "100", "20"]
    assert b[9:] == ["6.6m", "3s ago"]
    assert row(frame, "total")[:4] == ["total", "active", "80/210", "1"]
    assert "server: not polled (pass --server URL; the run used http://gpu:30000)" in frame


def test_schema_drift_alert(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10) + [legacy(100 + i) for i in range(428)], written=NOW - 1)
    run_json(tmp_path, A=1000)
    alerts = [str(a) for a in state_of(tmp_path).alerts]
    assert alerts == [
        "ALERT A: completion_tokens missing in 428/438 records (most recent; layout mixed)"
    ]

    plant(tmp_path, "A", [legacy(i) for i in range(428)], written=NOW - 1)
    state = state_of(tmp_path)
    assert [str(a) for a in state.alerts] == [
        "ALERT A: completion_tokens missing in 428/428 records (most recent; layout legacy)"
    ]
    assert state.stats.datasets["A"].completion_tokens == 0
    assert row(render_frame(state), "A")[6:8] == ["0", "-"]  # no average from missing counts


def test_stalled_writer_alert_while_the_run_is_active(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(30, every=10.0), written=NOW - 600)  # stopped 10 minutes ago
    plant(tmp_path, "B", steady(30), written=NOW - 2)
    run_json(tmp_path, updated=NOW - 3600, A=100, B=100)
    state = state_of(tmp_path)
    assert state.statuses == {"A": "stale", "B": "running"}
    assert [str(a) for a in state.alerts] == [
        "ALERT A: writer stopped: no append for 10.0m while the run is active (30/100 done)"
    ]
    assert row(render_frame(state), "A")[-1] == "10.0m ago"


def test_no_stale_alert_when_the_run_ended_or_the_dataset_waits(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(30), written=NOW - 900)
    plant(tmp_path, "B", steady(30), written=NOW - 800)
    run_json(tmp_path, updated=NOW - 3600, A=100, B=100)
    ended = state_of(tmp_path)
    assert (
        ended.statuses == {"A": "idle", "B": "idle"} and not ended.run_active and ended.alerts == ()
    )

    # a resumed run works on B; A holds records of an earlier run only: waiting, not stale
    plant(tmp_path, "B", steady(40), written=NOW - 1)
    run_json(tmp_path, updated=NOW - 300, A=100, B=100)
    resumed = state_of(tmp_path)
    assert resumed.statuses == {"A": "idle", "B": "running"} and resumed.alerts == ()


def test_error_burst_alert(tmp_path: Path) -> None:
    errors = [
        {
            "sample_id": 1000 + i,
            "attempt": 1,
            "error_type": "server_error",
            "http_status": 503,
            "message": "busy",
            "ts": NOW - 60 + i,
        }
        for i in range(40)
    ]
    plant(tmp_path, "A", steady(60, every=4.0), written=NOW - 1, errors=errors)
    run_json(tmp_path, A=1000)
    state = state_of(tmp_path)
    assert state.stats.datasets["A"].recent.window_errors == 40
    assert [str(a) for a in state.alerts] == [
        "ALERT A: error rate 40% in the last 5.0m (40 errors, 60 records)"
    ]
    # the same errors an hour ago are not recent
    for e in errors:
        e["ts"] -= 3600
    plant(tmp_path, "A", steady(60, every=4.0), written=NOW - 1, errors=errors)
    assert state_of(tmp_path).alerts == ()


def test_truncation_and_bad_line_alerts(tmp_path: Path) -> None:
    records = [
        flat(i, 1024, ts=NOW - 100 + i, reason="length" if i % 2 else "stop") for i in range(40)
    ]
    plant(tmp_path, "A", records, written=NOW - 1)
    with open(tmp_path / "A" / "raw_responses.jsonl", "a") as file:
        file.write("{not json\n")
    run_json(tmp_path, A=100)
    assert [str(a) for a in state_of(tmp_path).alerts] == [
        "ALERT A: 1 unreadable lines in raw_responses.jsonl",
        "ALERT A: truncation rate 50% (finish_reason length in 20/40 recent records)",
    ]
    relaxed = Thresholds(truncation_rate=0.6)
    assert [a.cause for a in state_of(tmp_path, thresholds=relaxed).alerts] == ["bad_lines"]


# --- the server ------------------------------------------------------------------------------


def metrics_text(
    running: int, queued: int, usage: float, prompt: int, cached: int, generated: int
) -> str:
    return "\n".join(
        [
            "# TYPE sglang:num_running_reqs gauge",
            f'sglang:num_running_reqs{{model_name="m"}} {running}',
            "# TYPE sglang:num_queue_reqs gauge",
            f'sglang:num_queue_reqs{{model_name="m"}} {queued}',
            "# TYPE sglang:token_usage gauge",
            f'sglang:token_usage{{model_name="m"}} {usage}',
            "# TYPE sglang:gen_throughput gauge",
            'sglang:gen_throughput{model_name="m"} 777',
            "# TYPE sglang:prompt_tokens_total counter",
            f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}',
            "# TYPE sglang:cached_tokens_total counter",
            f'sglang:cached_tokens_total{{model_name="m"}} {cached}',
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{model_name="m"}} {generated}',
            "",
        ]
    )


class FakeServer:
    """A MockTransport handler whose /metrics text the test changes between polls."""

    def __init__(self, metrics: str | None = None, *, down: bool = False) -> None:
        self.metrics, self.down = metrics, down

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            if self.metrics is None:
                return httpx.Response(404, text="Not Found")
            return httpx.Response(200, text=self.metrics)
        if request.url.path == "/server_info":
            return httpx.Response(
                200,
                json={
                    "max_total_num_tokens": 40000,
                    "max_running_requests": 48,
                    "version": "0.5.2",
                    "internal_states": [
                        {"last_gen_throughput": 600.5},
                        {"last_gen_throughput": 20},
                    ],
                },
            )
        return httpx.Response(404)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def monitor_for(out: Path, server: FakeServer, clock: Clock) -> Monitor:
    client = SGLangClient("http://gpu:30000", transport=httpx.MockTransport(server))
    return Monitor(out, client=client, clock=clock)


@pytest.mark.anyio
async def test_server_line_from_metrics_and_counter_rates(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10), written=NOW - 1)
    server, clock = FakeServer(metrics_text(12, 0, 0.42, 10_000, 1_000, 50_000)), Clock(NOW)
    monitor = monitor_for(tmp_path, server, clock)
    first = await monitor.poll()
    assert (
        "server http://gpu:30000: 12 running, 0 queued, token usage 42%, server gen 777 tok/s, "
        "cache hit 10%" in render_frame(first)
    )
    clock.now += 10
    server.metrics = metrics_text(14, 2, 0.50, 20_000, 7_000, 62_000)
    second = await monitor.poll()
    # over the 10 s since the first reading: 12,000 tokens generated, and 6,000 of the
    # 10,000 new prompt tokens cached
    assert "14 running, 2 queued, token usage 50%, server gen 1,200 tok/s, cache hit 60%" in render_frame(
        second
    )
    assert second.alerts == ()


@pytest.mark.anyio
async def test_token_usage_pinned_while_the_queue_grows(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10), written=NOW - 1)
    server, clock = FakeServer(metrics_text(48, 12, 0.99, 1, 0, 1)), Clock(NOW)
    monitor = monitor_for(tmp_path, server, clock)
    assert (await monitor.poll()).alerts == ()  # one reading shows no trend
    clock.now += 2
    server.metrics = metrics_text(48, 30, 0.99, 1, 0, 1)
    assert [str(a) for a in (await monitor.poll()).alerts] == [
        "ALERT server: token usage 99% pinned at the top while the queue grows (12 -> 30 queued)"
    ]
    clock.now += 2
    server.metrics = metrics_text(48, 20, 0.99, 1, 0, 1)
    assert (await monitor.poll()).alerts == ()  # the queue shrinks


@pytest.mark.anyio
async def test_server_info_fallback_and_unreachable(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10), written=NOW - 1)
    server = FakeServer(None)
    monitor = monitor_for(tmp_path, server, Clock(NOW))
    state = await monitor.poll()
    assert state.alerts == ()
    assert (
        "server http://gpu:30000: metrics off (start it with --enable-metrics); /server_info: "
        "gen 620 tok/s (last logged), KV pool 40,000 tokens, max running 48, version 0.5.2"
    ) in render_frame(state)
    server.down = True
    state = await monitor.poll()
    assert (
        "server http://gpu:30000: UNREACHABLE (connection failed: connection refused)"
        in render_frame(state)
    )
    assert [str(a) for a in state.alerts] == [
        "ALERT server: unreachable at http://gpu:30000: connection failed: connection refused"
    ]


@pytest.mark.anyio
async def test_a_working_server_makes_the_run_active_its_lingering_gauges_do_not(
    tmp_path: Path,
) -> None:
    plant(tmp_path, "A", steady(30, every=10.0), written=NOW - 600)
    run_json(tmp_path, updated=NOW - 3600, A=100)
    server, clock = FakeServer(metrics_text(3, 0, 0.2, 1000, 0, 5000)), Clock(NOW - 10)
    monitor = monitor_for(tmp_path, server, clock)
    await monitor.poll()
    clock.now = NOW
    idle = await monitor.poll()  # the same counters: an idle server still showing "3 running"
    assert idle.statuses == {"A": "idle"} and idle.alerts == ()
    clock.now = NOW + 10
    server.metrics = metrics_text(3, 0, 0.2, 2000, 0, 9000)
    working = await monitor.poll()
    assert working.statuses == {"A": "stale"}
    assert [a.cause for a in working.alerts] == ["stale_writer"]


# --- run_monitor -----------------------------------------------------------------------------


def test_run_monitor_once_prints_one_plain_frame(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10) + [legacy(i) for i in range(3)], written=NOW - 1)
    run_json(tmp_path, A=20)
    buffer = io.StringIO()
    code = run_monitor(
        tmp_path,
        server="http://gpu:30000",
        once=True,
        console=Console(file=buffer, width=80),
        transport=httpx.MockTransport(FakeServer(down=True)),
        clock=lambda: NOW,
    )
    text = buffer.getvalue()
    assert code == 1 and "\x1b[" not in text  # plain text, no escape codes; exit 1: it alerted
    assert row(text, "A")[:3] == ["A", "running", "13/20"]
    assert [line for line in text.splitlines() if line.startswith("ALERT")] == [
        "ALERT A: completion_tokens missing in 3/13 records (most recent; layout mixed)",
        "ALERT server: unreachable at http://gpu:30000: connection failed: connection refused",
    ]


def test_without_a_terminal_no_interval_means_once(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(5), written=NOW - 1)
    buffer = io.StringIO()
    assert run_monitor(tmp_path, console=Console(file=buffer), clock=lambda: NOW) == 0
    assert buffer.getvalue().count("workbench monitor") == 1
    with pytest.raises(Exception, match="not a run directory"):
        run_monitor(tmp_path / "missing", once=True, console=Console(file=io.StringIO()))


def test_rich_frame_renders(tmp_path: Path) -> None:
    plant(tmp_path, "A", [legacy(1)], written=NOW - 1)
    console = Console(file=io.StringIO(), width=160, force_terminal=True)
    console.print(render_rich(state_of(tmp_path)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "ALERT A: completion_tokens missing in 1/1 records" in re.sub(
        r"\x1b\[[0-9;]*m", "", text
    )


# --- against the simulator -------------------------------------------------------------------


class HeldReplies(httpx.AsyncBaseTransport):
    """The client's transport, handing over /generate replies after the first `count` only
    once `release` is set: the run cannot finish before the test has seen it running."""

    def __init__(self, count: int) -> None:
        self.inner = default_transport()
        self.count = count
        self.answered = 0
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/generate":
            self.answered += 1
            if self.answered > self.count:
                await self.release.wait()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.integration
def test_monitor_follows_a_generation_on_the_simulator(
    tmp_path: Path, start_sim: Callable[..., ServerProcess]
) -> None:
    server = start_sim()
    data = str(EXAMPLES / "data/pretokenized.jsonl")
    manifest = load_manifest(
        write_manifest(
            tmp_path,
            [
                {"name": "first", "path": data, "input": "input_ids", "max_samples": 24},
                {"name": "second", "path": data, "input": "input_ids", "max_samples": 12},
            ],
            sampling={"temperature": 0.0, "max_new_tokens": 1024},
        )
    )
    out = tmp_path / "out"

    async def generate_and_watch() -> tuple[list[MonitorState], MonitorState]:
        held = HeldReplies(4)
        async with (
            SGLangClient(server.url, transport=held) as client,
            SGLangClient(server.url, timeout=5.0) as watcher,
        ):
            monitor = Monitor(out, client=watcher)
            options = GenerateOptions(concurrency=6, progress_interval=60.0)
            run = asyncio.create_task(run_generation(manifest, client, out, options))
            seen: list[MonitorState] = []

            async def first_is_running() -> bool:
                if run.done():
                    await run
                    raise AssertionError("the run ended while its replies were held")
                if (out / "run.json").exists():
                    seen.append(await monitor.poll())
                return bool(seen) and seen[-1].statuses.get("first") == "running"

            await wait_until_async(first_is_running, 120, "the monitor to see 'first' running")
            held.release.set()
            while not run.done():  # keep following it to the end (alerts must stay quiet)
                await asyncio.sleep(0.05)
                seen.append(await monitor.poll())
            await run
            return seen, await monitor.poll()

    seen, final = asyncio.run(generate_and_watch())
    assert any(state.statuses.get("first") == "running" for state in seen)
    assert [str(a) for state in [*seen, final] for a in state.alerts] == []
    assert final.statuses == {"first": "done", "second": "done"}
    stats = collect_stats(out, now=final.now)
    assert final.stats.to_dict() == stats.to_dict()
    assert stats.total.records == 36 and stats.total.missing_completion_tokens == 0
    frame = render_frame(final)
    assert row(frame, "first")[:3] == ["first", "done", "24/24"]
    assert row(frame, "second")[:3] == ["second", "done", "12/12"]
    # gauges move only when the server logs statistics: check the line's shape, not their values
    pattern = (
        rf"server {re.escape(server.url)}: \d+ running, \d+ queued, token usage \d+%, "
        r"server gen [\d,]+ tok/s, cache hit \d+%"
    )
    assert re.search(pattern, frame), frame


@pytest.mark.integration
def test_error_burst_from_the_simulator_raises_an_alert(
    tmp_path: Path, start_sim: Callable[..., ServerProcess]
) -> None:
    server = start_sim(fault_error_rate=0.5, fault_seed=3)
    manifest = load_manifest(
        write_manifest(
            tmp_path,
            [
                {
                    "name": "flaky",
                    "path": str(EXAMPLES / "data/pretokenized.jsonl"),
                    "input": "input_ids",
                    "max_samples": 30,
                },
            ],
            sampling={"temperature": 0.0, "max_new_tokens": 1024},
        )
    )
    out = tmp_path / "out"

    async def generate() -> None:
        async with SGLangClient(server.url) as client:
            await run_generation(
                manifest,
                client,
                out,
                GenerateOptions(concurrency=6, max_attempts=1, progress_interval=60.0),
            )

    asyncio.run(generate())
    buffer = io.StringIO()
    run_monitor(out, server=server.url, once=True, console=Console(file=buffer, width=200))
    text = buffer.getvalue()
    ds = collect_stats(out).datasets["flaky"]
    assert ds.errors == ds.failed_missing > 5 and ds.records + ds.failed_missing == 30
    share = ds.errors / (ds.errors + ds.records)
    assert (
        f"ALERT flaky: error rate {share:.0%} in the last 5.0m "
        f"({ds.errors} errors, {ds.records} records)" in text
    )
    assert row(text, "flaky")[:4] == ["flaky", "done", f"{ds.records}/30", str(ds.errors)]


class InterruptAfter:
    """Counts calls and raises KeyboardInterrupt (Ctrl-C) on the n-th."""

    def __init__(self, n: int, wrapped: Callable[..., Any]) -> None:
        self.n, self.calls, self.wrapped = n, 0, wrapped

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.wrapped(*args, **kwargs)


def test_interval_without_a_terminal_prints_frames_until_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workbench.watch.monitor as monitor_module

    plant(tmp_path, "A", steady(5), written=NOW - 1)
    stop = InterruptAfter(3, monitor_module.render_frame)
    monkeypatch.setattr(monitor_module, "render_frame", stop)
    buffer = io.StringIO()
    assert (
        run_monitor(tmp_path, interval=0.01, console=Console(file=buffer), clock=lambda: NOW) == 0
    )
    assert buffer.getvalue().count("workbench monitor") == 2


def test_live_dashboard_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.watch.monitor as monitor_module

    plant(tmp_path, "A", steady(5), written=NOW - 1)
    stop = InterruptAfter(3, monitor_module.render_rich)
    monkeypatch.setattr(monitor_module, "render_rich", stop)
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    assert run_monitor(tmp_path, interval=0.01, console=console, clock=lambda: NOW) == 0
    assert stop.calls == 3 and "5/?" in console.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_the_runs_concurrency_beside_the_server_line(tmp_path: Path) -> None:
    plant(tmp_path, "A", steady(10), written=NOW - 1)
    (tmp_path / "run.json").write_text(json.dumps({
        "updated": NOW - 1, "datasets": {"A": {"prompts": 20}},
        "concurrency": {"setting": "auto", "mode": "metrics", "current": 96,
                        "history": [[0.0, 32], [4.0, 48], [8.0, 96]]}}))
    monitor = monitor_for(tmp_path, FakeServer(metrics_text(90, 6, 0.9, 1, 0, 1)), Clock(NOW))
    frame = render_frame(await monitor.poll())
    assert "90 running, 6 queued" in frame and "| concurrency 96 (auto, metrics)" in frame
