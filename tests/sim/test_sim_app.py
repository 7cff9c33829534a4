"""The simulator's HTTP API in-process (httpx.ASGITransport) and on a real socket."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from conftest import wait_until, wait_until_async
from prometheus_client.parser import text_string_to_metric_families

from workbench.errors import ConfigError
from workbench.sim import SimConfig, add_sim_arguments, config_from_args, create_app
from workbench.sim.faults import FaultPlan
from workbench.sim.outputs import corpus
from workbench.sim.profiles import OutOfMemory, get_sim_profile

KIMI_END = 163586
KIMI_THINK_END = 163607


def client_for(config: SimConfig, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(config))
    return httpx.AsyncClient(transport=transport, base_url="http://sim", headers=headers)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(SimConfig(enable_metrics=True)) as one:
        yield one


def ids(count: int, start: int = 100) -> list[int]:
    return list(range(start, start + count))


async def generate(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/generate", json=body)


# --- /generate ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_generate_with_input_ids(client: httpx.AsyncClient) -> None:
    response = await generate(
        client,
        input_ids=ids(10),
        rid="r1",
        sampling_params={"max_new_tokens": 5000, "temperature": 0.0},
    )
    assert response.status_code == 200
    reply = response.json()
    meta = reply["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_tokens"] == 10
    assert meta["completion_tokens"] == len(reply["output_ids"])
    assert meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == KIMI_END == reply["output_ids"][-1]
        assert reply["output_ids"].count(KIMI_THINK_END) == 1
    assert reply["text"].split(" ")[0] == corpus().tokens[reply["output_ids"][0]]


@pytest.mark.anyio
async def test_greedy_outputs_repeat_and_prompt_prefixes_are_cached(
    client: httpx.AsyncClient,
) -> None:
    body = {"input_ids": ids(300), "sampling_params": {"max_new_tokens": 50, "temperature": 0}}
    first = (await generate(client, **body)).json()
    second = (await generate(client, **body)).json()
    assert first["output_ids"] == second["output_ids"]
    assert first["meta_info"]["id"] != second["meta_info"]["id"]
    assert second["meta_info"]["cached_tokens"] == 256


@pytest.mark.anyio
async def test_max_new_tokens_cut_finishes_with_length(client: httpx.AsyncClient) -> None:
    reply = (await generate(client, input_ids=ids(5), sampling_params={"max_new_tokens": 3})).json()
    assert reply["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert reply["meta_info"]["completion_tokens"] == 3


@pytest.mark.anyio
async def test_default_max_new_tokens_is_128(client: httpx.AsyncClient) -> None:
    reply = (await generate(client, input_ids=ids(5))).json()
    assert reply["meta_info"]["completion_tokens"] <= 128


@pytest.mark.anyio
async def test_text_prompts_and_batches(client: httpx.AsyncClient) -> None:
    single = (
        await generate(client, text="hello there", sampling_params={"max_new_tokens": 4})
    ).json()
    assert single["meta_info"]["prompt_tokens"] == 2
    texts = (await generate(client, text=["a b", "c d e"], rid=["x", "y"])).json()
    assert [reply["meta_info"]["id"] for reply in texts] == ["x", "y"]
    assert [reply["meta_info"]["prompt_tokens"] for reply in texts] == [2, 3]
    batch = await generate(
        client,
        input_ids=[ids(3), ids(4)],
        sampling_params=[{"max_new_tokens": 2}, {"max_new_tokens": 3}],
    )
    assert [reply["meta_info"]["completion_tokens"] for reply in batch.json()] == [2, 3]


def sse_events(body: str) -> list[str]:
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(event.startswith("data: ") for event in events)
    return [event.removeprefix("data: ") for event in events]


@pytest.mark.anyio
async def test_streaming_sends_cumulative_chunks_then_done(client: httpx.AsyncClient) -> None:
    response = await generate(
        client, input_ids=ids(8), stream=True, sampling_params={"max_new_tokens": 30}
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) >= 2
    for before, after in itertools.pairwise(chunks):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
        assert before["meta_info"]["finish_reason"] is None
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"] is not None
    assert final["meta_info"]["completion_tokens"] == len(final["output_ids"])
    plain = (
        await generate(client, input_ids=ids(8), sampling_params={"max_new_tokens": 30})
    ).json()
    assert final["output_ids"] == plain["output_ids"]


@pytest.mark.anyio
async def test_batch_streams_carry_an_index(client: httpx.AsyncClient) -> None:
    response = await generate(
        client, input_ids=[ids(3), ids(4)], stream=True, sampling_params={"max_new_tokens": 5}
    )
    chunks = [json.loads(event) for event in sse_events(response.text)[:-1]]
    finals = [chunk for chunk in chunks if chunk["meta_info"]["finish_reason"]]
    assert sorted(chunk["index"] for chunk in finals) == [0, 1]


def error_message(response: httpx.Response) -> str:
    """SGLang's two 400 bodies: `{"error": "<contract text>"}` (http_server `generate_request`,
    the api_types.py contract) and `{"error": {"message": ...}}` (`_create_error_response`)."""
    error = response.json()["error"]
    return error if isinstance(error, str) else error["message"]


# (body, contract error?, text) written from SGLang 0.5.23: sglang/api/v1/api_types.py
# (decode_GenerateRequest, decode_SamplingParams), srt/sampling/sampling_params.py (verify),
# srt/managers/io_struct.py and tokenizer_manager.py (input checks).
BAD_REQUESTS = [
    ({"input_ids": ids(40_000)}, False, "exceeds the maximum allowed length"),
    ({"input_ids": ids(100), "sampling_params": {"max_new_tokens": 32_700}}, False, "context length"),
    ({"text": "a", "input_ids": [1]}, False, "Either text or input_ids should be provided."),
    ({}, False, "Either text or input_ids should be provided."),
    ({"input_ids": []}, False, "The input is empty."),
    ({"input_ids": [1, "2"]}, True, "invalid type"),
    ({"input_ids": [10**9]}, False, "input_ids must be in"),
    ({"input_ids": [1], "sampling_params": {"temperature": -1}}, False,
     "temperature must be a non-negative finite number, got -1.0."),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, False, "top_p must be in (0, 1], got 0.0."),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, False,
     "top_k must be -1 (disable) or at least 1, got 0."),
    ({"input_ids": [1], "sampling_params": {"min_p": 2}}, False, "min_p must be in [0, 1], got 2.0."),
    ({"input_ids": [1], "sampling_params": {"presence_penalty": 3}}, False,
     "presence_penalty must be in [-2, 2], got 3.0."),
    ({"input_ids": [1], "sampling_params": {"repetition_penalty": 0}}, False,
     "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0.0."),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 5}}, False,
     "min_new_tokens must be in [0, max_new_tokens(4)], got 5."),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, False,
     "max_new_tokens must be at least 0, got -1."),
    ({"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": "b"}}, False,
     "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
    ({"input_ids": [1], "sampling_params": {"logit_bias": {"999999999": 1.0}}}, False,
     "logit_bias must has keys in [0, 163839], got 999999999."),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 1.5}}, True,
     "invalid type: floating point `1.5`, expected i64"),
    ({"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}, True,
     'invalid type: string "yes", expected a boolean'),
    ({"input_ids": [1], "sampling_params": {"stop": 3}}, True,
     "invalid type: integer `3`, expected a value or an array of values for StringOrList"),
    ({"input_ids": [1], "sampling_params": {"stop_token_ids": [1.5]}}, True,
     "invalid type: floating point `1.5`, expected i64"),
    ({"input_ids": [1], "sampling_params": {"unknown_knob": 3}}, True, (
     "unknown field `unknown_knob`, expected one of `max_new_tokens`, `stop`, "
     "`stop_token_ids`, `stop_regex`, `temperature`, `top_p`, `top_k`, `min_p`, "
     "`frequency_penalty`, `presence_penalty`, `repetition_penalty`, `min_new_tokens`, `n`, "
     "`json_schema`, `regex`, `ebnf`, `structural_tag`, `ignore_eos`, `skip_special_tokens`, "
     "`spaces_between_special_tokens`, `no_stop_trim`, `stream_interval`, `logit_bias`, "
     "`sampling_seed`, `custom_params`, `beam_width`, `watermark`, `choice`")),
    ({"input_ids": [1], "sampling_params": [{"n": 1}]}, True, "invalid type"),
    ({"input_ids": [[1], [2]], "sampling_params": [{"n": 1}, {"n": 2}]}, False,
     "The parallel_sample_num should be the same for all samples in sample params."),
    ({"input_ids": [1], "return_logprob": True, "logprob_start_len": 5}, False,
     "Please use a smaller logprob_start_len."),
    ({"input_ids": [[1], [2]], "rid": ["only-one"]}, False, "rid has 1 entries"),
    ({"input_ids": [1], "stream": "yes"}, True, 'invalid type: string "yes", expected a boolean'),
    ([1, 2], True, "invalid type: sequence, expected struct GenerateRequest"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "contract", "needle"), BAD_REQUESTS)
async def test_bad_requests_are_400(
    client: httpx.AsyncClient, body: Any, contract: bool, needle: str
) -> None:
    response = await client.post("/generate", json=body)
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str) == contract
    assert needle in error_message(response)


@pytest.mark.anyio
async def test_invalid_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", content=b"{not json")
    assert response.status_code == 400
    assert "Invalid JSON" in response.json()["error"]["message"]


@pytest.mark.anyio
async def test_many_concurrent_prompts_run_as_one_batch() -> None:
    async with client_for(SimConfig(enable_metrics=True)) as client:
        limiter = anyio.Semaphore(150)
        replies: list[dict[str, Any]] = []

        async def one(index: int) -> None:
            async with limiter:
                body = {
                    "input_ids": ids(50, 100 + index),
                    "sampling_params": {"max_new_tokens": 200},
                }
                replies.append((await client.post("/generate", json=body)).json())

        async with anyio.create_task_group() as group:
            for index in range(300):
                group.start_soon(one, index)
        metrics = await scrape(client)
    tokens = sum(reply["meta_info"]["completion_tokens"] for reply in replies)
    assert len(replies) == 300 and tokens > 300 * 100
    assert metrics["workbench_sim:peak_inflight_requests"] == 150
    assert metrics["workbench_sim:inflight_requests"] == 0
    # model time, which the host's speed does not move: a fraction of one request after another
    one_at_a_time = tokens * get_sim_profile("fast").step_base_ms / 1000
    assert 0 < metrics["workbench_sim:model_busy_seconds"] < one_at_a_time / 10


# --- info endpoints ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
async def test_server_info(client: httpx.AsyncClient, path: str) -> None:
    info = (await client.get(path)).json()
    for key in (
        "mem_fraction_static",
        "kv_cache_dtype",
        "tp_size",
        "dp_size",
        "model_path",
        "max_running_requests",
        "chunked_prefill_size",
        "enable_hierarchical_cache",
        "hicache_size",
        "hicache_ratio",
        "schedule_policy",
        "random_seed",
    ):
        assert key in info
    assert info["max_total_num_tokens"] > 1_000_000
    assert info["max_req_input_len"] == 32_767
    assert info["version"] == "0.5.23"
    assert info["launch_command"] and info["startup_time"] > 0
    state = info["internal_states"][0]
    assert state["last_gen_throughput"] == 0.0
    assert state["effective_max_running_requests_per_dp"] == info["max_running_requests"]
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert state["prefix_cache_tokens"] == {"device": 0, "host": 0}
    assert "api_key" not in info


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
async def test_model_info(client: httpx.AsyncClient, path: str) -> None:
    info = (await client.get(path)).json()
    # http_server.py `model_info`'s keys.
    assert set(info) >= {
        "model_path", "served_model_name", "tokenizer_path", "is_generation",
        "preferred_sampling_params", "weight_version", "load_format", "reasoning_parser",
        "tool_call_parser", "disaggregation_mode", "has_image_understanding",
        "has_audio_understanding", "model_type", "architectures",
    }
    assert info["model_path"] == info["served_model_name"] == "sim/kimi-k2.5"
    assert info["is_generation"] is True


@pytest.mark.anyio
async def test_openai_model_list_and_health(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "sim/kimi-k2.5"
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/health_generate")).status_code == 200


@pytest.mark.anyio
async def test_flush_cache_is_refused_while_requests_run(client: httpx.AsyncClient) -> None:
    assert (await client.post("/flush_cache")).status_code == 200
    # ignore_eos: 1,000 steps that cannot end early, while the flush comes at once
    long_request = {"input_ids": ids(5), "sampling_params": {"max_new_tokens": 1000,
                                                             "ignore_eos": True}}

    async def running() -> bool:
        return (await scrape(client))["sglang:num_running_reqs"] >= 1

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: client.post("/generate", json=long_request))
        await wait_until_async(running, 60, "the request to run in the engine")
        assert (await client.post("/flush_cache")).status_code == 400
    assert (await client.post("/flush_cache")).status_code == 200


@pytest.mark.anyio
async def test_data_parallel_ranks_share_the_work() -> None:
    async with client_for(SimConfig(dp_size=2)) as client:
        await generate(client, input_ids=[ids(3), ids(4), ids(5), ids(6)])
        info = (await client.get("/server_info")).json()
    assert [state["dp_rank"] for state in info["internal_states"]] == [0, 1]


# --- metrics -----------------------------------------------------------------------------


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


@pytest.mark.anyio
async def test_metrics_use_sglang_names(client: httpx.AsyncClient) -> None:
    await generate(client, input_ids=ids(300), sampling_params={"max_new_tokens": 20})
    await generate(client, input_ids=ids(300), sampling_params={"max_new_tokens": 20})
    samples = await scrape(client)
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:num_used_tokens",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_sum",
    ):
        assert name in samples
    assert samples["sglang:num_requests_total"] == 2
    assert samples["sglang:prompt_tokens_total"] == 600
    assert samples["sglang:generation_tokens_total"] == 40
    assert samples["sglang:cached_tokens_total"] == 256
    assert samples["workbench_sim:peak_inflight_requests"] == 1


@pytest.mark.anyio
async def test_metrics_are_404_unless_enabled() -> None:
    async with client_for(SimConfig()) as client:
        assert (await client.get("/metrics")).status_code == 404


# --- /abort_request ----------------------------------------------------------------------

# 100 ms a step: a 2,000-token request cannot end by itself while a test aborts it.
SLOW = SimConfig(enable_metrics=True, speed=0.01)


def long_body(rid: str, **body: Any) -> dict[str, Any]:
    """A request that runs 2,000 steps (ignore_eos) unless aborted."""
    sampling = {"max_new_tokens": 2000, "ignore_eos": True}
    return {"input_ids": ids(5), "rid": rid, "sampling_params": sampling, **body}


async def load(client: httpx.AsyncClient) -> tuple[int, int, float]:
    """(running, queued, token usage) read live from the engines in /server_info."""
    states = (await client.get("/server_info")).json()["internal_states"]
    return (
        sum(state["num_running_reqs"] for state in states),
        sum(state["num_queue_reqs"] for state in states),
        sum(state["token_usage"] for state in states),
    )


async def wait_for_load(client: httpx.AsyncClient, running: int, queued: int = 0) -> None:
    async def reached() -> bool:
        now = await load(client)
        return now[0] == running and now[1] == queued

    await wait_until_async(reached, 60, f"{running} running and {queued} queued requests")


async def post_into(
    client: httpx.AsyncClient, replies: dict[str, httpx.Response], body: dict[str, Any]
) -> None:
    replies[body["rid"]] = await client.post("/generate", json=body)


def replied(replies: dict[str, httpx.Response], count: int) -> Callable[[], Awaitable[bool]]:
    """A wait_until_async predicate: `count` /generate calls have their answer."""

    async def check() -> bool:
        return len(replies) >= count

    return check


async def abort(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/abort_request", json=body)


@pytest.mark.anyio
async def test_abort_request_ends_a_running_request_and_frees_its_kv() -> None:
    """scheduler `abort_request` marks it (`FINISH_ABORT()`: no status code) and it leaves at
    the next step; the waiting /generate gets an ordinary 200 reply (tokenizer_manager
    `_handle_abort_finish_reason` lets a status-less abort through)."""
    replies: dict[str, httpx.Response] = {}
    async with client_for(SLOW) as client, anyio.create_task_group() as group:
        group.start_soon(post_into, client, replies, long_body("long"))
        await wait_for_load(client, running=1)
        assert (await load(client))[2] > 0
        answer = await abort(client, rid="long")
        assert answer.status_code == 200 and answer.content == b""
        await wait_until_async(replied(replies, 1), 60, "the reply")
        assert await load(client) == (0, 0, 0.0)
        metrics = await scrape(client)
    reply = replies["long"]
    assert reply.status_code == 200
    meta = reply.json()["meta_info"]
    assert meta["id"] == "long"
    assert meta["finish_reason"] == {
        "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
    }
    assert 0 < meta["completion_tokens"] < 2000 and meta["prompt_tokens"] == 5
    assert metrics["sglang:num_aborted_requests_total"] == 1
    assert metrics["sglang:num_requests_total"] == 1


@pytest.mark.anyio
async def test_abort_request_takes_a_queued_request_out_at_once() -> None:
    """A waiting request leaves the queue with the tokenizer manager's `_handle_abort_req`
    reply (a short meta_info, "Abort in waiting queue") and no finished-request metrics."""
    replies: dict[str, httpx.Response] = {}
    config = SimConfig(enable_metrics=True, speed=0.01, max_running_requests=1)
    async with client_for(config) as client, anyio.create_task_group() as group:
        group.start_soon(post_into, client, replies, long_body("first"))
        await wait_for_load(client, running=1)
        group.start_soon(post_into, client, replies, long_body("second"))
        await wait_for_load(client, running=1, queued=1)
        assert (await abort(client, rid="second")).status_code == 200
        await wait_until_async(replied(replies, 1), 60, "the reply")
        assert (await load(client))[:2] == (1, 0) and "first" not in replies
        metrics = await scrape(client)
        await abort(client, rid="first")
    queued = replies["second"]
    assert queued.status_code == 200
    body = queued.json()
    assert body["text"] == "" and body["output_ids"] == []
    meta = body["meta_info"]
    assert list(meta) == ["id", "finish_reason", "weight_version", "e2e_latency",
                          "completion_tokens"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert meta["id"] == "second" and meta["completion_tokens"] == 0
    assert metrics["sglang:num_aborted_requests_total"] == 1
    assert metrics["sglang:num_requests_total"] == 0
    assert replies["first"].json()["meta_info"]["finish_reason"]["message"] == "Aborted"


@pytest.mark.anyio
async def test_abort_request_for_an_unknown_rid_changes_nothing() -> None:
    """tokenizer_manager `abort_request` returns at once for a rid it does not know (or an
    empty one); http_server answers 200 all the same."""
    replies: dict[str, httpx.Response] = {}
    async with client_for(SLOW) as client, anyio.create_task_group() as group:
        group.start_soon(post_into, client, replies, long_body("job-7"))
        await wait_for_load(client, running=1)
        for body in ({"rid": "nope"}, {"rid": "job-"}, {"rid": ""}, {}, {"rid": None}):
            answer = await abort(client, **body)
            assert answer.status_code == 200 and answer.content == b""
        assert (await load(client))[:2] == (1, 0) and not replies
        metrics = await scrape(client)
        await abort(client, rid="job-7")
    assert metrics["sglang:num_aborted_requests_total"] == 0
    assert replies["job-7"].json()["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.anyio
async def test_abort_request_matches_rids_by_prefix() -> None:
    """scheduler `abort_request`: `req.rid.startswith(recv_req.rid)`, once the tokenizer
    manager knows the rid exactly; so aborting "job-1" also aborts "job-10"."""
    replies: dict[str, httpx.Response] = {}
    async with client_for(SLOW) as client, anyio.create_task_group() as group:
        for rid in ("job-1", "job-10", "job-2"):
            group.start_soon(post_into, client, replies, long_body(rid))
        await wait_for_load(client, running=3)
        await abort(client, rid="job-1")
        await wait_until_async(replied(replies, 2), 60, "two replies")
        assert (await load(client))[:2] == (1, 0)
        await abort(client, rid="job-2")
    assert sorted(replies) == ["job-1", "job-10", "job-2"]


@pytest.mark.anyio
async def test_abort_all_ends_running_queued_and_streamed_requests() -> None:
    replies: dict[str, httpx.Response] = {}
    config = SimConfig(enable_metrics=True, speed=0.01, max_running_requests=2, dp_size=2)
    async with client_for(config) as client, anyio.create_task_group() as group:
        for rid in ("a", "b", "c", "d"):
            group.start_soon(post_into, client, replies, long_body(rid))
        group.start_soon(post_into, client, replies, long_body("s", stream=True))
        await wait_for_load(client, running=4, queued=1)
        answer = await abort(client, abort_all=True)
        assert answer.status_code == 200
        await wait_until_async(replied(replies, 5), 60, "five replies")
        assert await load(client) == (0, 0, 0.0)
        metrics = await scrape(client)
    assert all(reply.status_code == 200 for reply in replies.values())
    plain = [replies[rid].json()["meta_info"]["finish_reason"] for rid in "abcd"]
    assert all(finish["type"] == "abort" for finish in plain)
    messages = sorted(finish["message"] for finish in plain)
    events = sse_events(replies["s"].text)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])["meta_info"]["finish_reason"]
    messages = sorted([*messages, last["message"]])
    assert messages == ["Abort in waiting queue", *["Aborted"] * 4]
    assert metrics["sglang:num_aborted_requests_total"] == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "Field required"), (b"{nope", "JSON decode error"), (b"[1]", "valid dictionary"),
     (b'{"rid": 5}', "valid string"), (b'{"abort_all": "yes"}', "valid boolean")],
)
async def test_abort_request_bodies_that_are_not_an_abort_req_are_400(
    client: httpx.AsyncClient, content: bytes, needle: str
) -> None:
    """http_server's RequestValidationError handler: 400 with an `ErrorResponse`."""
    response = await client.post("/abort_request", content=content)
    assert response.status_code == 400
    body = response.json()
    assert body["object"] == "error" and body["type"] == "Bad Request" and body["code"] == 400
    assert needle in body["message"]


# --- api key -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_api_key_guards_everything_but_health() -> None:
    config = SimConfig(api_key="s3cret", enable_metrics=True)
    async with client_for(config) as anonymous:
        assert (await anonymous.get("/health")).status_code == 200
        for path in ("/server_info", "/model_info", "/v1/models", "/metrics"):
            assert (await anonymous.get(path)).status_code == 401
        assert (await generate(anonymous, input_ids=[1])).status_code == 401
        wrong = await anonymous.get("/server_info", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    async with client_for(config, Authorization="Bearer s3cret") as client:
        info = await client.get("/server_info")
        assert info.status_code == 200 and "s3cret" not in info.text
        assert (await generate(client, input_ids=[1])).status_code == 200


# --- faults and modes --------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_fault_answers_a_server_error() -> None:
    async with client_for(SimConfig(fault_error_rate=1.0)) as client:
        statuses = {(await generate(client, input_ids=[1])).status_code for _ in range(10)}
        response = await generate(client, input_ids=[1])
    assert statuses <= {500, 503} and statuses
    assert "message" in response.json()["error"]


@pytest.mark.anyio
async def test_abort_fault_answers_503_or_an_abort_chunk() -> None:
    """tokenizer_manager `_handle_abort_finish_reason`: a non-streaming abort is an
    HTTPException (http_server's ErrorResponse body); a streamed one is the final chunk."""
    async with client_for(SimConfig(fault_abort_rate=1.0)) as client:
        response = await generate(client, input_ids=[1], rid="a")
        streamed = await generate(client, input_ids=[1], rid="b", stream=True)
    assert response.status_code == 503
    assert response.json() == {
        "object": "error", "message": "Abort request: injected fault", "type": "503",
        "param": None, "code": 503,
    }
    assert streamed.status_code == 200
    chunk = json.loads(streamed.text.split("\n\n")[0].removeprefix("data: "))
    finish = chunk["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and finish["status_code"] == 503 and "err_type" in finish
    assert chunk["meta_info"]["id"] == "b" and chunk["output_ids"] == []


@pytest.mark.anyio
async def test_drop_fault_in_process_raises_a_disconnect() -> None:
    async with client_for(SimConfig(fault_drop_rate=1.0)) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await generate(client, input_ids=[1])


@pytest.mark.anyio
async def test_hang_fault_never_answers() -> None:
    async with client_for(SimConfig(fault_hang_rate=1.0)) as client:
        with anyio.move_on_after(0.3) as scope:
            await generate(client, input_ids=[1])
    assert scope.cancelled_caught


async def status_of(client: httpx.AsyncClient) -> int:
    response = await generate(client, input_ids=[1], sampling_params={"max_new_tokens": 1})
    return response.status_code


@pytest.mark.anyio
async def test_faults_follow_the_seed() -> None:
    config = SimConfig(fault_error_rate=0.3, fault_abort_rate=0.3, fault_seed=5)
    seen = []
    for _ in range(2):
        async with client_for(config) as client:
            seen.append([await status_of(client) for _ in range(20)])
    assert seen[0] == seen[1] and len(set(seen[0])) > 1


@pytest.mark.anyio
async def test_fixed_latency_bypasses_the_engine() -> None:
    async with client_for(SimConfig(fixed_latency=0.05, enable_metrics=True)) as client:
        replies = (await generate(client, input_ids=[ids(3), ids(9)])).json()
        metrics = await scrape(client)
    assert [reply["meta_info"]["e2e_latency"] for reply in replies] == [0.05, 0.05]
    assert metrics["sglang:num_requests_total"] == 0
    assert metrics["workbench_sim:model_busy_seconds"] == 0
    assert replies[0]["output_ids"] == replies[1]["output_ids"]
    assert replies[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_END}


def test_impossible_memory_fails_at_creation() -> None:
    config = SimConfig(profile="kimi-k2.5-8xrtx6000", mem_fraction_static=0.95)
    with pytest.raises(OutOfMemory, match="out of memory"):
        create_app(config)


# --- configuration -----------------------------------------------------------------------


def parse(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser(prog="sim")
    add_sim_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_flags_use_sglang_spellings_and_defaults() -> None:
    assert parse() == SimConfig()
    config = parse(
        "--port",
        "31000",
        "--mem-fraction-static",
        "0.88",
        "--kv-cache-dtype",
        "bf16",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "48",
        "--max-running-requests",
        "150",
        "--tp-size",
        "8",
        "--profile",
        "kimi-k2.5-8xrtx6000",
        "--speed",
        "50",
        "--fault-drop-rate",
        "0.1",
        "--api-key",
        "k",
    )
    assert config.mem_fraction_static == 0.88 and config.hicache_size == 48.0
    assert config.enable_hierarchical_cache and config.tp_size == 8 and config.speed == 50
    assert config.fault_drop_rate == 0.1 and config.api_key == "k"
    assert parse("--chunked-prefill-size", "-1").chunked_prefill_size == -1
    assert parse("--tensor-parallel-size", "2").tp_size == 2


def test_direct_configs_are_checked() -> None:
    with pytest.raises(ConfigError, match="dp_size"):
        SimConfig(dp_size=0)
    with pytest.raises(ConfigError, match="profile"):
        SimConfig(profile="nope")


@pytest.mark.parametrize(
    "argv",
    [
        ["--trust-remote-code"],
        ["--mem-fraction-static", "1.5"],
        ["--kv-cache-dtype", "fp4"],
        ["--speed", "0"],
        ["--chunked-prefill-size", "0"],
        ["--dp-size", "0"],
        ["--fault-error-rate", "2"],
        ["--profile", "nope"],
    ],
)
def test_bad_flags_are_argparse_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(*argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_fault_rates_must_add_up_to_at_most_one() -> None:
    with pytest.raises(ConfigError, match="fault rates"):
        parse("--fault-error-rate", "0.6", "--fault-drop-rate", "0.6")


# --- real socket -------------------------------------------------------------------------


def seed_for(sequence: list[str | None], **rates: float) -> int:
    """A fault seed whose first draws are `sequence`."""
    for seed in range(10_000):
        plan = FaultPlan(
            seed=seed, **{name: rates.get(name, 0.0) for name in ("error", "drop", "hang", "abort")}
        )
        if [plan.draw() for _ in sequence] == sequence:
            return seed
    raise AssertionError("no seed found")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_sim(*flags: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m workbench.sim` on a free port, and its URL from the ready line."""
    argv = [sys.executable, "-m", "workbench.sim", "--port", "0", *flags]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.fullmatch(r"workbench sim ready on (http://127\.0\.0\.1:\d+)\n", line)
    if match is None:
        process.kill()
        raise AssertionError(f"unexpected first line {line!r}")
    return process, match.group(1)


def stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM, then the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    process.communicate(timeout=10)
    return process.returncode


@pytest.fixture
def sim_process(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], str]]:
    process, url = spawn_sim(*request.param)
    try:
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


DROP_SECOND = seed_for([None, "drop"], drop=0.5)


@pytest.mark.integration
@pytest.mark.parametrize(
    "sim_process",
    [["--fault-drop-rate", "0.5", "--fault-seed", str(DROP_SECOND)]],
    indirect=True,
)
def test_real_socket_generate_drop_and_sigterm(
    sim_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, url = sim_process
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/health").status_code == 200
        reply = client.post(
            "/generate", json={"input_ids": ids(5), "sampling_params": {"max_new_tokens": 8}}
        )
        assert reply.json()["meta_info"]["completion_tokens"] == 8
        # Closed without a reply: a clean close (h11) or a reset (httptools), never a response.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            client.post("/generate", json={"input_ids": ids(5)})
    assert stop(process) == 0


@pytest.mark.integration
def test_out_of_memory_exits_non_zero() -> None:
    argv = [
        sys.executable,
        "-m",
        "workbench.sim",
        "--profile",
        "kimi-k2.5-8xrtx6000",
        "--mem-fraction-static",
        "0.95",
        "--port",
        "0",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "out of memory" in result.stderr


@pytest.mark.integration
def test_behind_sglang_router() -> None:
    sims = [spawn_sim(), spawn_sim()]
    port = free_port()
    argv = [
        *(sys.executable, "-m", "sglang_router.launch_router", "--policy", "round_robin"),
        *("--worker-urls", *(url for _, url in sims)),
        *("--port", str(port), "--prometheus-port", str(free_port()), "--log-level", "warn"),
    ]
    router = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        replies = route_generates(f"http://127.0.0.1:{port}", count=4)
        assert all(reply["meta_info"]["completion_tokens"] == 4 for reply in replies)
    finally:
        for process in (router, *(process for process, _ in sims)):
            stop(process)


def both_workers_healthy(client: httpx.Client) -> bool:
    try:
        workers = client.get("/workers").json()["workers"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return len(workers) == 2 and all(worker["is_healthy"] for worker in workers)


def route_generates(url: str, count: int) -> list[dict[str, Any]]:
    with httpx.Client(base_url=url, timeout=10) as client:
        wait_until(lambda: both_workers_healthy(client), 60, "the router's two healthy workers")
        body = {"input_ids": ids(5), "sampling_params": {"max_new_tokens": 4}}
        return [client.post("/generate", json=body).json() for _ in range(count)]
