"""The runner against httpx.MockTransport servers: retries, budgets, limits, resume, stop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest

from workbench.analyze.validate import validate_run
from workbench.config import Manifest, load_manifest
from workbench.errors import DataError, ResumeMismatch
from workbench.generate.plan import GenerateOptions
from workbench.generate.progress import RunSummary, format_progress_line
from workbench.generate.session import run_generation
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def write_manifest(tmp: Path, sizes: dict[str, list[int]], extra: str = "", sampling: str = "") -> Manifest:
    """A manifest with one input_ids dataset per entry; `sizes` lists each prompt's length."""
    lines = ["model_profile: kimi-k2.5", "sampling:", "  temperature: 0.0", "  max_new_tokens: 64"]
    lines += [f"  {sampling}"] if sampling else []
    lines.append("datasets:")
    for name, lengths in sizes.items():
        path = tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"sample_id": i, "input_ids": [7] * n}) + "\n"
                                for i, n in enumerate(lengths)))
        lines += [f"  - name: {name}", f"    path: {path.name}", "    input: input_ids"]
        lines += [f"    {extra}"] if extra else []
    manifest_path = tmp / "datasets.yaml"
    manifest_path.write_text("\n".join(lines) + "\n")
    return load_manifest(manifest_path)


def sglang_reply(request: httpx.Request, completion: int = 10) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={
        "text": "x", "output_ids": list(range(completion)),
        "meta_info": {"id": body["rid"], "prompt_tokens": len(body["input_ids"]),
                      "completion_tokens": completion, "cached_tokens": 0,
                      "finish_reason": {"type": "stop", "matched": 163586}, "e2e_latency": 0.01}})


class Server:
    """An async MockTransport handler that counts requests in flight.

    `hold=(n, m)`: no reply leaves before `n` requests are in flight at once, and no reply to a
    long prompt before `m` long ones are, so reaching the limits does not depend on the
    machine's speed. `arrived(k)`: an event set when the k-th request comes in."""

    def __init__(self, respond: Callable[[httpx.Request, int], httpx.Response], delay: float = 0.0,
                 hold: tuple[int, int] = (0, 0)):
        self.respond = respond
        self.delay = delay
        self.hold = hold
        self.calls = 0
        self.in_flight = 0
        self.peak = 0
        self.long_in_flight = 0
        self.long_peak = 0
        self._full, self._long_full = asyncio.Event(), asyncio.Event()
        self._arrivals: dict[int, asyncio.Event] = {}

    def arrived(self, calls: int) -> asyncio.Event:
        return self._arrivals.setdefault(calls, asyncio.Event())

    def _note_arrival(self) -> None:
        for calls, event in self._arrivals.items():
            if self.calls >= calls:
                event.set()
        if self.in_flight >= self.hold[0]:
            self._full.set()
        if self.long_in_flight >= self.hold[1]:
            self._long_full.set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "sim/kimi", "version": "test"})
        if request.url.path != "/generate":  # e.g. a chat dataset's rendering asked once
            return httpx.Response(404, json={"detail": "Not Found"})
        self.calls += 1
        number = self.calls
        long = len(json.loads(request.content)["input_ids"]) > 100
        self.in_flight += 1
        self.long_in_flight += long
        self.peak = max(self.peak, self.in_flight)
        self.long_peak = max(self.long_peak, self.long_in_flight)
        self._note_arrival()
        try:
            await self._full.wait()
            if long:
                await self._long_full.wait()
            await asyncio.sleep(self.delay)
            return self.respond(request, number)
        finally:
            self.in_flight -= 1
            self.long_in_flight -= long


async def run(manifest: Manifest, server: Server, out: Path, **options: object) -> RunSummary:
    options = {"seed": 1, **options}
    opts = GenerateOptions(backoff_base=0.001, progress_interval=60, **options)  # type: ignore[arg-type]
    async with SGLangClient("http://mock", transport=httpx.MockTransport(server)) as client:
        return await run_generation(manifest, client, out, opts)


async def test_every_prompt_written_once_with_the_contract_keys(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 20, "b": [3] * 7})
    summary = await run(manifest, Server(lambda r, n: sglang_reply(r)), tmp_path / "out")
    assert {n: p.done for n, p in summary.datasets.items()} == {"a": 20, "b": 7}
    raw = (tmp_path / "out/a/raw_responses.jsonl").read_text().splitlines()
    record = json.loads(raw[0])
    assert list(record) == ["sample_id", "output_ids", "prompt_tokens", "completion_tokens",
                            "cached_tokens", "finish_reason", "matched_stop", "e2e_latency", "ts", "schema"]
    assert sorted(json.loads(line)["sample_id"] for line in raw) == list(range(20))
    prompts = [json.loads(line) for line in (tmp_path / "out/a/prompts.jsonl").read_text().splitlines()]
    assert prompts[3] == {"sample_id": 3, "input_ids": [7] * 5}
    run_json = json.loads((tmp_path / "out/run.json").read_text())
    assert run_json["model"] == "sim/kimi" and run_json["datasets"]["b"]["prompts"] == 7
    assert run_json["datasets"]["a"]["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1,
                                                     "max_new_tokens": 64}


async def test_sampling_is_sent_explicitly(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5]})
    bodies: list[dict[str, object]] = []

    def respond(request: httpx.Request, n: int) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sglang_reply(request)

    await run(manifest, Server(respond), tmp_path / "out", max_new_tokens=9)
    assert bodies[0]["sampling_params"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 9}


async def test_retryable_errors_are_retried_and_recorded(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 10})

    def flaky(request: httpx.Request, n: int) -> httpx.Response:
        if n % 3 == 0:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        return sglang_reply(request)

    summary = await run(manifest, Server(flaky), tmp_path / "out")
    progress = summary.datasets["a"]
    assert progress.done == 10 and progress.failed_ids == 0 and progress.errors > 0
    assert summary.retries == progress.errors
    errors = [json.loads(line) for line in (tmp_path / "out/a/errors.jsonl").read_text().splitlines()]
    assert len(errors) == progress.errors
    assert {e["error_type"] for e in errors} == {"server_error"} and errors[0]["http_status"] == 503
    assert set(errors[0]) == {"sample_id", "attempt", "error_type", "http_status", "message", "ts"}


async def test_bad_request_is_not_retried(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5, 500, 5]})
    server = Server(lambda r, n: httpx.Response(400, json={"error": {"message": "too long"}})
                    if len(json.loads(r.content)["input_ids"]) > 100 else sglang_reply(r))
    summary = await run(manifest, server, tmp_path / "out")
    assert summary.datasets["a"].done == 2 and summary.datasets["a"].failed_ids == 1
    assert server.calls == 3
    errors = (tmp_path / "out/a/errors.jsonl").read_text().splitlines()
    assert len(errors) == 1 and json.loads(errors[0])["message"] == "too long"


async def test_attempts_are_capped(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5]})
    server = Server(lambda r, n: httpx.Response(502, text="bad gateway"))
    summary = await run(manifest, server, tmp_path / "out", max_attempts=3)
    assert server.calls == 3 and summary.datasets["a"].failed_ids == 1
    attempts = [json.loads(line)["attempt"] for line in (tmp_path / "out/a/errors.jsonl").read_text().splitlines()]
    assert attempts == [1, 2, 3]


async def test_concurrency_limits_hold_and_are_reached(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 60 + [200] * 30, "b": [5] * 60})
    server = Server(lambda r, n: sglang_reply(r), hold=(20, 4))
    with anyio.fail_after(120):  # a runner that never reaches a limit would wait for ever
        await run(manifest, server, tmp_path / "out", concurrency=20, long_concurrency=4,
                  long_threshold=100)
    assert server.peak == 20
    assert server.long_peak == 4


async def test_token_budget_stops_new_requests(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 100}, extra="max_tokens: 100")
    server = Server(lambda r, n: sglang_reply(r, completion=10), delay=0.01)
    summary = await run(manifest, server, tmp_path / "out", concurrency=4)
    progress = summary.datasets["a"]
    # it stops when the next reply is not expected to fit (max_new_tokens is 64)
    assert 100 - 64 < progress.completion_tokens <= 100 + 4 * 10
    assert progress.overshoot == max(0, progress.completion_tokens - 100)
    assert server.calls == progress.done < 100
    assert "budget reached" in format_progress_line(progress)
    run_json = json.loads((tmp_path / "out/run.json").read_text())
    assert run_json["datasets"]["a"]["budget_reached"] is True
    findings = {f.rule: f for f in validate_run(tmp_path / "out", workers=1).datasets["a"].findings}
    assert "missing_response" not in findings
    assert findings["unsent_budget"].severity == "info"
    assert findings["unsent_budget"].count == 100 - progress.done


async def test_budget_holds_back_requests_in_flight_but_not_other_datasets(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 300, "b": [5] * 300}, extra="max_tokens: 200")
    server = Server(lambda r, n: sglang_reply(r, completion=10), delay=0.02)
    summary = await run(manifest, server, tmp_path / "out", concurrency=150)
    for progress in summary.datasets.values():
        assert 200 - 64 < progress.completion_tokens <= 200 + 3 * 10
    assert server.peak > 3  # both datasets were in flight together (3 fit each budget at first)


async def test_resume_skips_done_and_repairs_a_torn_tail(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 10})
    out = tmp_path / "out"
    await run(manifest, Server(lambda r, n: sglang_reply(r)), out, max_samples=6)
    raw = out / "a/raw_responses.jsonl"
    with raw.open("ab") as fh:
        fh.write(b'{"sample_id": 9, "output_ids": [1, 2')
    server = Server(lambda r, n: sglang_reply(r))
    summary = await run(manifest, server, out)
    assert server.calls == 4 and summary.datasets["a"].done == 10
    ids, duplicates = read_sample_ids(raw)
    assert ids == set(range(10)) and duplicates == []
    assert (out / "a/raw_responses.jsonl.torn").read_bytes() == b'{"sample_id": 9, "output_ids": [1, 2\n'
    rows, problems = read_rows(raw)
    assert len(rows) == 10 and problems == []


async def test_resume_refuses_changed_sampling(tmp_path: Path) -> None:
    out = tmp_path / "out"
    await run(write_manifest(tmp_path, {"a": [5] * 3}), Server(lambda r, n: sglang_reply(r)), out)
    changed = write_manifest(tmp_path, {"a": [5] * 3}, sampling="top_p: 0.5")
    with pytest.raises(ResumeMismatch, match="sampling changed"):
        await run(changed, Server(lambda r, n: sglang_reply(r)), out)
    summary = await run(changed, Server(lambda r, n: sglang_reply(r)), out, force=True)
    assert summary.datasets["a"].done == 3


async def test_run_json_keeps_one_history_entry_per_session(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 6, "b": [5] * 2})
    out = tmp_path / "out"
    await run(manifest, Server(lambda r, n: sglang_reply(r)), out, max_samples=3)
    first = json.loads((out / "run.json").read_text())
    await run(manifest, Server(lambda r, n: sglang_reply(r)), out, only=("a",))
    second = json.loads((out / "run.json").read_text())
    assert [entry["server_url"] for entry in second["history"]] == ["http://mock", "http://mock"]
    assert second["history"][0] == first["history"][0]
    assert second["history"][1]["started"] > first["history"][0]["started"]
    assert second["history"][-1]["updated"] == second["updated"]
    assert second["created"] == first["created"] and second["order_seed"] == first["order_seed"]
    assert second["datasets"]["b"] == first["datasets"]["b"]  # not sent again, still described


async def test_run_json_keeps_its_creation_time_across_the_writes_of_a_session(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 3})
    out = tmp_path / "out"
    opened: list[dict[str, object]] = []
    opts = GenerateOptions(seed=1, progress_interval=60)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(
            Server(lambda r, n: sglang_reply(r)))) as client:
        await run_generation(manifest, client, out, opts, on_start=lambda runner: opened.append(
            json.loads((out / "run.json").read_text())))
    closed = json.loads((out / "run.json").read_text())
    assert closed["updated"] > opened[0]["updated"]  # written again when the run ended
    assert closed["created"] == opened[0]["created"] <= opened[0]["updated"]
    assert closed["history"][0]["started"] == opened[0]["history"][0]["started"]


async def test_a_corrupt_run_json_stops_a_resume_before_anything_is_written(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 3})
    out = tmp_path / "out"
    await run(manifest, Server(lambda r, n: sglang_reply(r)), out, max_samples=2)
    (out / "run.json").write_text('{"order_seed": 1,\n oops')
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    server = Server(lambda r, n: sglang_reply(r))
    with pytest.raises(DataError, match=r"run.json: invalid JSON: .*line 2"):
        await run(manifest, server, out)
    assert server.calls == 0
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


async def test_no_resume_moves_old_outputs_aside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = write_manifest(tmp_path, {"a": [5] * 3})
    await run(manifest, Server(lambda r, n: sglang_reply(r)), out)
    server = Server(lambda r, n: sglang_reply(r))
    await run(manifest, server, out, resume=False)
    assert server.calls == 3
    backups = list((out / "a").glob("raw_responses.jsonl.*.bak"))
    assert len(backups) == 1 and len(backups[0].read_text().splitlines()) == 3


async def test_stop_lets_in_flight_finish_and_sends_nothing_new(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 50})
    server = Server(lambda r, n: sglang_reply(r), delay=0.2)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(server)) as client:
        runners: list[object] = []
        task = asyncio.create_task(run_generation(
            manifest, client, tmp_path / "out", GenerateOptions(concurrency=5, progress_interval=60),
            on_start=runners.append))
        with anyio.fail_after(120):
            await server.arrived(8).wait()  # the second wave of five is in flight
        in_flight = server.in_flight
        runners[0].request_stop()  # type: ignore[attr-defined]
        summary = await task
    assert summary.interrupted and in_flight > 0
    assert server.calls == summary.datasets["a"].done < 50
    assert len((tmp_path / "out/a/raw_responses.jsonl").read_text().splitlines()) == server.calls


async def test_bad_prompt_file_fails_before_the_server_is_asked(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5, 5]})
    (tmp_path / "a.jsonl").write_text('{"sample_id": 0, "input_ids": [1]}\n{"sample_id": 1, "input_ids": [\n')
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={"model_path": "m"})

    async with SGLangClient("http://mock", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(DataError, match=r"a\.jsonl:2"):
            await run_generation(manifest, client, tmp_path / "out", GenerateOptions())
    assert asked == [] and not (tmp_path / "out").exists()


def sent_order(server_bodies: list[dict[str, object]]) -> list[object]:
    return [str(body["rid"]).split("-")[1] for body in server_bodies]


async def test_prompts_go_in_a_seeded_random_order_kept_on_resume(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 40})
    bodies: list[dict[str, object]] = []

    def respond(request: httpx.Request, n: int) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sglang_reply(request)

    out = tmp_path / "out"
    await run(manifest, Server(respond), out, concurrency=1, max_samples=10)
    first = sent_order(bodies)
    assert len(first) == 10 and first != [str(i) for i in range(10)]  # drawn from all 40
    assert max(int(i) for i in first) >= 10
    assert json.loads((out / "run.json").read_text())["order_seed"] == 1
    bodies.clear()
    await run(manifest, Server(respond), out, concurrency=1, max_samples=20, seed=7)
    second = sent_order(bodies)
    assert json.loads((out / "run.json").read_text())["order_seed"] == 1  # kept, not 7
    bodies.clear()
    await run(manifest, Server(respond), tmp_path / "fresh", concurrency=1, max_samples=20)
    assert sent_order(bodies) == first + second  # the same order as one run of 20


async def test_order_file_sends_the_head_of_the_file(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 40}, extra="order: file")
    bodies: list[dict[str, object]] = []

    def respond(request: httpx.Request, n: int) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sglang_reply(request)

    await run(manifest, Server(respond), tmp_path / "out", concurrency=1, max_samples=10)
    assert sent_order(bodies) == [str(i) for i in range(10)]
    assert json.loads((tmp_path / "out/run.json").read_text())["datasets"]["a"]["order"] == "file"


async def test_budget_counts_long_requests_still_running(tmp_path: Path) -> None:
    """Replies take time in proportion to their length (exponential, mean 600 tokens), so
    the short ones finish first: their mean must not let the budget admit a crowd."""
    rng = __import__("random").Random(3)
    lengths: dict[str, int] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "sim/kimi"})
        body = json.loads(request.content)
        sample = str(body["rid"]).split("-")[1]
        completion = lengths.setdefault(sample, min(2048, int(rng.expovariate(1 / 600)) + 20))
        await asyncio.sleep(completion / 20000)
        return sglang_reply(request, completion=completion)

    manifest = write_manifest(tmp_path, {"a": [5] * 500}, extra="max_tokens: 20000")
    opts = GenerateOptions(concurrency=150, max_new_tokens=2048, seed=1, progress_interval=60)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(handler)) as client:
        summary = await run_generation(manifest, client, tmp_path / "out", opts)
    progress = summary.datasets["a"]
    assert progress.budget_reached and not progress.in_flight
    # the mean-of-finished rule sent about 40 requests and overshot by 40% to 100%
    assert progress.completion_tokens <= 20000 + 2048
    assert progress.completion_tokens >= 20000 - 3 * 2048
