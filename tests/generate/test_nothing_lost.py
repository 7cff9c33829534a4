"""Nothing lost outside the happy path: failed writes, changed inputs, replies that are not
replies, and the limits a run promises (the request deadline, the grace period)."""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from test_dispatch import Server, sglang_reply, write_manifest

from workbench.analyze.stats import collect_stats
from workbench.analyze.validate import validate_run
from workbench.cli.generate import generate_exit_code
from workbench.config import Manifest
from workbench.errors import ProtocolError, ResumeMismatch, StorageError
from workbench.generate import dispatch
from workbench.generate.concurrency import ServerReading, Slots
from workbench.generate.plan import GenerateOptions
from workbench.generate.progress import RunSummary
from workbench.generate.session import run_generation
from workbench.generate.views import summary_lines
from workbench.rundir.appender import JsonlAppender
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import read_rows
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.anyio


class FailingWrites:
    """`os.write` for the appenders: from the `at`-th call on, each failing call writes part of
    its bytes (a short write, as a disk that fills mid-line does) and the next raises
    `error`, until :meth:`heal` (the space is back)."""

    def __init__(self, at: int, error: int = errno.ENOSPC, short: bool = True,
                 heal_after: int | None = None) -> None:
        self.at = at
        self.error = error
        self.short = short
        self.heal_after = heal_after  # failures after which the space comes back by itself
        self.calls = 0
        self.failures = 0
        self.healed = False
        self._cut = False

    def heal(self) -> None:
        self.healed = True

    def __call__(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        if self.healed or self.calls < self.at:
            return os.write(fd, data)
        if self.short and not self._cut and len(data) > 1:
            self._cut = True
            return os.write(fd, data[: len(data) // 2])
        self._cut = False
        self.failures += 1
        self.healed = self.failures == self.heal_after
        raise OSError(self.error, os.strerror(self.error))


async def generate(manifest: Manifest, handler: Callable[..., Any], out: Path,
                   events: list[str] | None = None, on_start: Callable[..., None] | None = None,
                   **options: Any) -> RunSummary:
    opts = GenerateOptions(**{"seed": 1, "backoff_base": 0.001, "progress_interval": 60,
                              **options})
    say = (events.append if events is not None else None)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(handler)) as client:
        return await run_generation(manifest, client, out, opts, on_event=say, on_start=on_start)


def only_whole_lines(path: Path) -> list[Any]:
    """Every line of path parsed (the file ends with a newline, no line is partial)."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def exactly_once(out: Path, name: str, count: int) -> None:
    """Every sample of dataset `name` has one record, and the readers agree on them."""
    raw = out / name / "raw_responses.jsonl"
    ids, repeats = read_sample_ids(raw)
    assert ids == set(range(count)) and repeats == []
    rows, problems = read_rows(raw, with_output_ids=True)
    assert len(rows) == count and problems == []
    report = validate_run(out, workers=1).datasets[name]
    assert report.records == count
    assert collect_stats(out).datasets[name].records == count


# --- a write that fails ----------------------------------------------------------------------


async def test_a_full_disk_pauses_sending_and_loses_nothing_once_space_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FailingWrites(at=12)
    monkeypatch.setattr(dispatch, "JsonlAppender", functools.partial(JsonlAppender, write=faults))
    events: list[str] = []

    def say(message: str) -> None:
        events.append(message)
        if "sending paused" in message:
            faults.heal()  # someone frees space; the writer's next try succeeds

    server = Server(lambda r, n: sglang_reply(r))
    manifest = write_manifest(tmp_path, {"a": [5] * 40})
    out = tmp_path / "out"
    opts = GenerateOptions(seed=1, progress_interval=60, concurrency=4)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(server)) as client:
        summary = await run_generation(manifest, client, out, opts, on_event=say)
    assert faults.failures >= 1
    assert any("raw_responses.jsonl: cannot write: No space left on device (" in e for e in events)
    assert any("held lines written, sending resumes" in e for e in events)
    assert not summary.interrupted and summary.storage_error is None and summary.unwritten == 0
    assert summary.datasets["a"].done == 40 and server.calls == 40  # none lost, none sent twice
    assert len(only_whole_lines(out / "a/raw_responses.jsonl")) == 40
    exactly_once(out, "a", 40)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
async def test_a_disk_that_stays_full_stops_the_run_and_a_resume_completes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    faults = FailingWrites(at=8, error=error)
    monkeypatch.setattr(dispatch, "JsonlAppender", functools.partial(JsonlAppender, write=faults))
    manifest = write_manifest(tmp_path, {"a": [5] * 30})
    out = tmp_path / "out"
    events: list[str] = []
    summary = await generate(manifest, Server(lambda r, n: sglang_reply(r)), out, events,
                             concurrency=4, disk_wait=0.2)
    written = only_whole_lines(out / "a/raw_responses.jsonl")
    progress = summary.datasets["a"]
    assert summary.interrupted and summary.unwritten >= 1
    assert summary.storage_error is not None
    assert f"raw_responses.jsonl: cannot write: {os.strerror(error)} (" in summary.storage_error
    assert "free)" in summary.storage_error
    assert progress.done == len(written) < 30  # what the summary says is what the file holds
    assert generate_exit_code(summary) == 74
    lines = summary_lines(summary, out, "workbench generate ...")
    assert any(line.startswith("stopped: ") and "could not be written" in line for line in lines)
    assert any("to resume, run: workbench generate ..." in line for line in lines)
    assert any("stopping with" in e for e in events)

    monkeypatch.setattr(dispatch, "JsonlAppender", JsonlAppender)  # space is back
    server = Server(lambda r, n: sglang_reply(r))
    resumed = await generate(manifest, server, out)
    assert server.calls == 30 - len(written) and resumed.datasets["a"].done == 30
    exactly_once(out, "a", 30)


async def test_failed_error_lines_are_held_and_counted_once_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FailingWrites(at=1, short=False)
    monkeypatch.setattr(dispatch, "JsonlAppender", functools.partial(JsonlAppender, write=faults))
    events: list[str] = []

    def say(message: str) -> None:
        events.append(message)
        if "sending paused" in message:
            faults.heal()

    def flaky(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "busy"}}) if n <= 3 else sglang_reply(request)

    manifest = write_manifest(tmp_path, {"a": [5] * 6})
    opts = GenerateOptions(seed=1, progress_interval=60, backoff_base=0.001, concurrency=1)
    out = tmp_path / "out"
    async with SGLangClient("http://mock", transport=httpx.MockTransport(Server(flaky))) as client:
        summary = await run_generation(manifest, client, out, opts, on_event=say)
    assert any("errors.jsonl: cannot write" in e for e in events)
    errors = only_whole_lines(out / "a/errors.jsonl")
    assert summary.datasets["a"].errors == len(errors) == 3
    exactly_once(out, "a", 6)


# --- what was sent is what resume trusts -----------------------------------------------------


def rewrite_rows(path: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    rows = [change(json.loads(line)) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows if row is not None))


async def test_resume_refuses_finished_samples_whose_prompt_changed_and_force_resends_them(
    tmp_path: Path,
) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 8})
    out = tmp_path / "out"
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)
    raw, prompts = out / "a/raw_responses.jsonl", out / "a/prompts.jsonl"
    before = raw.read_bytes(), prompts.read_bytes()
    rewrite_rows(tmp_path / "a.jsonl",
                 lambda row: {**row, "input_ids": [8] * 5} if row["sample_id"] in (2, 6) else row)
    server = Server(lambda r, n: sglang_reply(r))
    with pytest.raises(ResumeMismatch) as refused:
        await generate(manifest, server, out)
    message = str(refused.value)
    assert message.startswith("dataset a: 2 finished samples were sent another prompt")
    assert "sample_id 2" in message and "--force" in message and "\n" not in message
    assert (raw.read_bytes(), prompts.read_bytes()) == before and server.calls == 0

    events: list[str] = []
    summary = await generate(manifest, server, out, events, force=True)
    assert server.calls == 2 and summary.datasets["a"].done == 8
    backup = next((out / "a").glob("raw_responses.jsonl.*.bak"))
    assert sorted(row["sample_id"] for row in only_whole_lines(backup)) == [2, 6]
    assert next((out / "a").glob("prompts.jsonl.*.bak")).read_bytes() == before[1]
    sent = {row["sample_id"]: row["input_ids"] for row in only_whole_lines(prompts)}
    assert sent[2] == [8] * 5 and sent[3] == [7] * 5
    assert any("--force: 2 finished samples" in e for e in events)
    exactly_once(out, "a", 8)


async def test_resume_refuses_finished_samples_removed_from_the_data_file(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 6})
    out = tmp_path / "out"
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)
    rewrite_rows(tmp_path / "a.jsonl", lambda row: None if row["sample_id"] == 4 else row)
    with pytest.raises(ResumeMismatch, match=r"1 finished samples are no longer in .*a\.jsonl "
                                             r"\(e\.g\. sample_id 4\)"):
        await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)
    summary = await generate(manifest, Server(lambda r, n: sglang_reply(r)), out, force=True)
    assert summary.datasets["a"].done == 5
    report = validate_run(out, workers=1).datasets["a"]
    assert report.records == 5 and "orphan_response" not in {f.rule for f in report.findings}


async def test_prompts_of_finished_samples_are_kept_when_a_cap_leaves_them_out(tmp_path: Path) -> None:
    """A smaller cap in file order does not turn finished records into orphans: their
    prompts.jsonl lines stay as they were sent."""
    manifest = write_manifest(tmp_path, {"a": [5] * 10}, extra="order: file")
    out = tmp_path / "out"
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out, max_samples=8)
    server = Server(lambda r, n: sglang_reply(r))
    await generate(manifest, server, out, max_samples=4)
    assert server.calls == 0
    assert len(only_whole_lines(out / "a/prompts.jsonl")) == 8
    findings = {f.rule for f in validate_run(out, workers=1).datasets["a"].findings}
    assert "orphan_response" not in findings


async def test_a_line_no_reader_takes_is_put_aside_and_its_sample_sent_again(tmp_path: Path) -> None:
    """NUL bytes inside an id array (a crash's zero-filled page): stats, validate, export and
    resume all see no record, so the sample is generated again and exported."""
    manifest = write_manifest(tmp_path, {"a": [5] * 6})
    out = tmp_path / "out"
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)
    raw = out / "a/raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    victim = json.loads(lines[2])["sample_id"]
    lines[2] = lines[2].replace(b"[0,1,2", b"[0,\x00\x00,2")
    lines.insert(4, b'{"sample_id": 99}\n')  # a record without its fields
    raw.write_bytes(b"".join(lines))
    assert collect_stats(out).datasets["a"].records == 6  # the NUL line is not one; {99} is
    server = Server(lambda r, n: sglang_reply(r))
    events: list[str] = []
    await generate(manifest, server, out, events)
    assert server.calls == 1
    assert any("2 lines are no finished record" in e for e in events)
    rejected = (out / "a/raw_responses.jsonl.rejected").read_bytes()
    assert b"\x00" in rejected and b'{"sample_id": 99}' in rejected
    assert victim in read_sample_ids(raw)[0]
    exactly_once(out, "a", 6)


# --- a reply that is not a reply -------------------------------------------------------------


def reply_with(output_ids: list[int] | None = None, drop: tuple[str, ...] = (),
               meta: dict[str, Any] | None = None) -> Callable[[httpx.Request, int], httpx.Response]:
    """A handler whose replies are SGLang's with these changes."""
    def respond(request: httpx.Request, n: int) -> httpx.Response:
        body = json.loads(sglang_reply(request).content)
        body["meta_info"].update(meta or {})
        if output_ids is not None:
            body["output_ids"] = output_ids
        for key in drop:
            body.pop(key)
        return httpx.Response(200, json=body)
    return respond


BROKEN_REPLIES: dict[str, dict[str, Any]] = {
    "no output_ids": {"drop": ("output_ids",)},
    "no finish_reason": {"meta": {"finish_reason": None}},
    "unknown finish_reason": {"meta": {"finish_reason": {"type": "weird"}}},
    "negative completion_tokens": {"meta": {"completion_tokens": -3}},
    "negative output id": {"output_ids": [1, -2, 3]},
    "output id past the vocabulary": {"output_ids": [1, 163840]},
    "no ids for its tokens": {"output_ids": []},
}


@pytest.mark.parametrize("broken", list(BROKEN_REPLIES))
async def test_a_reply_that_breaks_the_contract_is_a_protocol_error_never_a_record(
    tmp_path: Path, broken: str
) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 3})
    server = Server(reply_with(**BROKEN_REPLIES[broken]))
    out = tmp_path / "out"
    summary = await generate(manifest, server, out, max_attempts=2)
    assert summary.datasets["a"].done == 0 and summary.failed == 3 and server.calls == 6
    assert (out / "a/raw_responses.jsonl").read_bytes() == b""
    errors = only_whole_lines(out / "a/errors.jsonl")
    assert len(errors) == 6 and {e["error_type"] for e in errors} == {"protocol"}


async def test_the_preflight_refuses_a_server_whose_replies_have_no_output_ids(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 3})
    with pytest.raises(ProtocolError, match="output_ids"):
        await generate(manifest, Server(reply_with(drop=("output_ids",))), tmp_path / "out",
                       preflight=True)
    assert not (tmp_path / "out").exists()


# --- limits that hold ------------------------------------------------------------------------


class Trickle:
    """A server whose replies trickle in 8 bytes at a time, for ever; it records aborts."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.rids: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "sim/kimi"})
        if request.url.path == "/abort_request":
            self.aborted.append(json.loads(request.content)["rid"])
            return httpx.Response(200, json={})
        self.rids.append(json.loads(request.content)["rid"])

        async def body() -> AsyncIterator[bytes]:
            while True:
                await asyncio.sleep(0.05)
                yield b" " * 8

        return httpx.Response(200, content=body())


async def test_the_request_timeout_is_a_deadline_for_the_whole_reply(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5]})
    server = Trickle()
    with anyio.fail_after(60):
        summary = await generate(manifest, server, tmp_path / "out", max_attempts=2,
                                 request_timeout=0.3)
    assert summary.failed == 1
    errors = only_whole_lines(tmp_path / "out/a/errors.jsonl")
    assert [e["error_type"] for e in errors] == ["timeout", "timeout"]
    assert "request timeout" in errors[0]["message"]
    assert sorted(server.aborted) == sorted(server.rids)  # the server stops what was given up


async def test_a_stop_ends_within_the_grace_period_while_requests_wait_for_a_slot(
    tmp_path: Path,
) -> None:
    """Requests that never finish hold every slot; the producers wait for one. A stop still
    ends the run once the grace period is over, and the cut requests are aborted."""
    manifest = write_manifest(tmp_path, {"a": [5] * 20 + [200] * 5})
    server = Trickle()
    started: list[dispatch.Runner] = []
    task = asyncio.create_task(generate(manifest, server, tmp_path / "out", on_start=started.append,
                                        concurrency=3, long_concurrency=1, long_threshold=100,
                                        grace_period=0.2))
    with anyio.fail_after(60):
        while len(server.rids) < 3:
            await asyncio.sleep(0.01)
        started[0].request_stop()
        summary = await task
    assert summary.interrupted and summary.dropped == 3 and len(server.rids) == 3
    assert sorted(server.aborted) == sorted(server.rids)


async def test_auto_concurrency_freezes_once_the_run_stops() -> None:
    readings = [ServerReading(url="s", running=1.0, queued=0.0, token_usage=0.1, retracted=None)]

    async def read() -> list[ServerReading]:
        return readings

    slots = Slots("auto", 16, read, interval=0.01)
    steering = slots.start()
    assert steering is not None
    slots.freeze()
    limit = slots.limit
    slots.failed()  # would back off
    with anyio.fail_after(10):
        await steering  # the loop ends by itself
    assert slots.limit == limit


async def test_a_resume_with_nothing_to_send_keeps_the_concurrency_of_the_run(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 4})
    out = tmp_path / "out"
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out, concurrency=3)
    first = json.loads((out / "run.json").read_text())
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)  # auto, nothing to send
    second = json.loads((out / "run.json").read_text())
    assert second["concurrency"] == first["concurrency"]
    assert first["concurrency"]["mode"] == "fixed"
    assert [entry["concurrency"] is None for entry in second["history"]] == [False, True]
    assert second["history"][0] == first["history"][0]


# --- a real file system that fills -----------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 2 MiB tmpfs mounted for the test (root only: skipped where mounting is refused): room
    for a whole run of the tests below (records, prompts, the reply-figure stores: about
    600 KiB) once the filler is gone."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """A file that takes every free byte of folder's file system but `leave`."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


async def test_a_real_full_file_system_pauses_the_run_until_space_is_freed(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 300})
    out = small_tmpfs / "out"
    fillers: list[Path] = []
    events: list[str] = []

    def say(message: str) -> None:
        events.append(message)
        if "sending paused" in message:
            fillers[0].unlink()

    def big(request: httpx.Request, n: int) -> httpx.Response:
        return sglang_reply(request, completion=300)  # ~1.5 KiB a record

    opts = GenerateOptions(seed=1, progress_interval=60, concurrency=4)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(Server(big))) as client:
        summary = await run_generation(manifest, client, out, opts, on_event=say,
                                       on_start=lambda runner: fillers.append(fill(small_tmpfs)))
    assert any("No space left on device" in e for e in events)
    assert summary.datasets["a"].done == 300 and summary.unwritten == 0
    exactly_once(out, "a", 300)


async def test_a_full_file_system_at_the_start_is_one_line_and_leaves_no_temp_file(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    manifest = write_manifest(tmp_path, {"a": [5] * 30000})
    out = small_tmpfs / "out"
    out.mkdir()
    fill(small_tmpfs)
    with pytest.raises(StorageError) as failed:
        await generate(manifest, Server(lambda r, n: sglang_reply(r)), out)
    assert "cannot write: No space left on device (0 B free)" in str(failed.value)
    assert "\n" not in str(failed.value)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.integration
def test_a_read_only_out_is_one_line_and_exit_74(
    tmp_path: Path, small_tmpfs: Path, shared_sim: ServerProcess
) -> None:
    import subprocess

    from conftest import workbench

    manifest = write_manifest(tmp_path, {"a": [5] * 4})
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    server = shared_sim
    done = workbench("generate", "--datasets", str(manifest.source), "--server", server.url,
                     "--out", str(small_tmpfs / "out"))
    assert done.returncode == 74, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("workbench: error: ") and "Read-only file system" in lines[-1]
    assert "Traceback" not in done.stderr


async def test_a_changed_chat_template_argument_refuses_the_resume(tmp_path: Path) -> None:
    """thinking: true -> false changes the prompt of every finished sample: the records
    would be paired with a prompt that was never sent."""
    from conftest import EXAMPLES
    from conftest import write_manifest as write_json_manifest

    from workbench.config import load_manifest

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q{i}"}]})
                            + "\n" for i in range(4)))
    dataset = {"name": "chat", "path": str(data), "input": "messages", "id_field": "id",
               "tokenizer": str(EXAMPLES / "tokenizer")}

    def manifest(thinking: bool) -> Manifest:
        return load_manifest(write_json_manifest(
            tmp_path, [{**dataset, "chat_template_kwargs": {"thinking": thinking}}]))

    out = tmp_path / "out"
    await generate(manifest(True), Server(lambda r, n: sglang_reply(r)), out)
    with pytest.raises(ResumeMismatch, match=r"^dataset chat: 4 finished samples were sent another "
                                             r"prompt .*chat template argument"):
        await generate(manifest(False), Server(lambda r, n: sglang_reply(r)), out)
    server = Server(lambda r, n: sglang_reply(r))
    await generate(manifest(True), server, out)  # as it was: nothing to send, nothing refused
    assert server.calls == 0


async def test_readers_on_a_full_disk_give_their_numbers_and_leave_no_temp_file(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    """stats and validate keep their reads in caches beside the run: on a full disk the cache
    is skipped, never left half-written."""
    out = small_tmpfs / "out"
    await generate(write_manifest(tmp_path, {"a": [5] * 20}), Server(lambda r, n: sglang_reply(r)),
                   out)
    fill(small_tmpfs)
    assert validate_run(out, workers=1).datasets["a"].records == 20
    assert collect_stats(out).datasets["a"].records == 20
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".tmp")]


async def test_a_resume_needs_no_room_for_a_second_copy_of_its_prompts(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    """prompts.jsonl is left as it is when it already holds this run's prompts."""
    out = small_tmpfs / "out"
    manifest = write_manifest(tmp_path, {"a": [700] * 60})  # prompts.jsonl: about 70 KiB
    await generate(manifest, Server(lambda r, n: sglang_reply(r)), out, max_samples=50)
    prompts = out / "a/prompts.jsonl"
    inode, size = prompts.stat().st_ino, prompts.stat().st_size
    fill(small_tmpfs, leave=32 << 10)
    assert size > 32 << 10
    server = Server(lambda r, n: sglang_reply(r))
    summary = await generate(manifest, server, out, max_samples=50)
    assert server.calls == 0 and summary.datasets["a"].done == 50
    assert prompts.stat().st_ino == inode  # not rewritten


async def test_replies_held_when_the_last_request_ends_wait_for_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request sent and answered while the disk is full: the run does not end with
    replies in hand, it waits for space (up to --disk-wait) and writes them. Here the space
    comes back after the writer's fourth failed try (the pause's second retry)."""
    faults = FailingWrites(at=3, short=False, heal_after=4)
    monkeypatch.setattr(dispatch, "JsonlAppender", functools.partial(JsonlAppender, write=faults))
    events: list[str] = []
    manifest = write_manifest(tmp_path, {"a": [5] * 6})
    out = tmp_path / "out"
    server = Server(lambda r, n: sglang_reply(r), hold=(6, 0))  # all six in flight at once
    summary = await generate(manifest, server, out, events, concurrency=8)
    assert summary.unwritten == 0 and summary.datasets["a"].done == 6 and not summary.interrupted
    assert any("sending resumes" in e for e in events)
    exactly_once(out, "a", 6)
