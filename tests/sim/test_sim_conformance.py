"""The simulator against SGLang 0.5.23's behaviour, parameter by parameter.

Each expectation is written from SGLang's source (file named per test): sampling semantics from
srt/managers/schedule_batch.py (`Req.check_finished`), reply text from
srt/managers/detokenizer_manager.py, meta_info and streaming from
srt/managers/tokenizer_manager.py and scheduler_components/output_streamer.py, metrics from
srt/observability/metrics_collector.py.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from workbench.sim import SimConfig, create_app
from workbench.sim.engine import Engine
from workbench.sim.request import Request

KIMI_END = 163586
KIMI_EOS = 163585
KIMI_THINK_END = 163607


def client_for(config: SimConfig) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(config))
    return httpx.AsyncClient(transport=transport, base_url="http://sim")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(SimConfig(enable_metrics=True, speed=20.0)) as one:
        yield one


def prompt(seed: int, count: int = 40) -> list[int]:
    return [100 + (seed * 7919 + index * 31) % 7000 for index in range(count)]


async def generate(client: httpx.AsyncClient, **body: Any) -> Any:
    response = await client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chunks(text: str) -> list[Any]:
    """SSE data payloads up to [DONE] (which must end the stream)."""
    payloads = [part.removeprefix("data: ") for part in text.split("\n\n") if part]
    assert payloads[-1] == "[DONE]"
    return [json.loads(one) for one in payloads[:-1]]


async def natural(client: httpx.AsyncClient, seed: int, limit: int = 400) -> dict[str, Any]:
    """A greedy reply that stops on its own before `limit` tokens."""
    reply: dict[str, Any] = await generate(
        client, input_ids=prompt(seed), sampling_params={"max_new_tokens": limit, "temperature": 0}
    )
    return reply


@pytest.mark.anyio
async def test_ignore_eos_gives_exactly_max_new_tokens(client: httpx.AsyncClient) -> None:
    for seed in range(6):
        reply = await generate(
            client,
            input_ids=prompt(seed),
            sampling_params={"max_new_tokens": 256, "ignore_eos": True, "temperature": 0},
        )
        assert len(reply["output_ids"]) == reply["meta_info"]["completion_tokens"] == 256
        assert reply["meta_info"]["finish_reason"] == {"type": "length", "length": 256}


@pytest.mark.anyio
async def test_ignore_eos_also_ignores_stop_token_ids(client: httpx.AsyncClient) -> None:
    base = await natural(client, 1)
    stop_id = base["output_ids"][3]
    reply = await generate(
        client,
        input_ids=prompt(1),
        sampling_params={"max_new_tokens": 64, "temperature": 0, "ignore_eos": True,
                         "stop_token_ids": [stop_id]},
    )
    assert len(reply["output_ids"]) == 64


@pytest.mark.anyio
async def test_stop_token_ids_end_at_the_first_match_and_keep_it(client: httpx.AsyncClient) -> None:
    base = await natural(client, 2)
    stop_id = base["output_ids"][5]
    first = base["output_ids"].index(stop_id)
    reply = await generate(
        client,
        input_ids=prompt(2),
        sampling_params={"max_new_tokens": 400, "temperature": 0, "stop_token_ids": [stop_id]},
    )
    assert reply["output_ids"] == base["output_ids"][: first + 1]
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


@pytest.mark.anyio
async def test_min_new_tokens_masks_the_end_until_reached(client: httpx.AsyncClient) -> None:
    base = await natural(client, 3)
    short = len(base["output_ids"])
    assert base["meta_info"]["finish_reason"]["matched"] == KIMI_END
    reply = await generate(
        client,
        input_ids=prompt(3),
        sampling_params={"max_new_tokens": short + 200, "min_new_tokens": short + 50,
                         "temperature": 0},
    )
    assert len(reply["output_ids"]) == short + 51
    assert reply["output_ids"][-1] == KIMI_END and KIMI_END not in reply["output_ids"][:-1]
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": KIMI_END}


@pytest.mark.anyio
async def test_stop_strings_match_decoded_text_and_are_trimmed(client: httpx.AsyncClient) -> None:
    base = await natural(client, 4)
    words = base["text"].split()
    stop = words[4]
    reply = await generate(
        client,
        input_ids=prompt(4),
        sampling_params={"max_new_tokens": 400, "temperature": 0, "stop": [stop]},
    )
    assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in reply["text"]
    assert len(reply["output_ids"]) < len(base["output_ids"])
    kept = await generate(
        client,
        input_ids=prompt(4),
        sampling_params={"max_new_tokens": 400, "temperature": 0, "stop": stop,
                         "no_stop_trim": True},
    )
    assert kept["text"].endswith(stop) and kept["output_ids"] == reply["output_ids"]


@pytest.mark.anyio
async def test_matched_stop_id_and_special_tokens_leave_the_text(client: httpx.AsyncClient) -> None:
    reply = await natural(client, 5)
    assert reply["output_ids"][-1] == KIMI_END
    assert "<|im_end|>" not in reply["text"] and "</think>" not in reply["text"]
    raw = await generate(
        client,
        input_ids=prompt(5),
        sampling_params={"max_new_tokens": 400, "temperature": 0, "no_stop_trim": True,
                         "skip_special_tokens": False},
    )
    assert raw["text"].endswith("<|im_end|>") and "</think>" in raw["text"]


@pytest.mark.anyio
async def test_n_returns_a_list_of_distinct_samples(client: httpx.AsyncClient) -> None:
    """io_struct.py: n > 1 makes a single prompt a batch of n (prompts repeated n times)."""
    replies = await generate(
        client, input_ids=prompt(6), sampling_params={"max_new_tokens": 32, "n": 3}
    )
    assert isinstance(replies, list) and len(replies) == 3
    assert len({tuple(one["output_ids"]) for one in replies}) == 3
    batch = await generate(
        client,
        input_ids=[prompt(6), prompt(7)],
        sampling_params={"max_new_tokens": 8, "n": 2},
    )
    assert len(batch) == 4
    assert batch[0]["meta_info"]["prompt_tokens"] == len(prompt(6))


@pytest.mark.anyio
async def test_logprobs_have_sglangs_shapes(client: httpx.AsyncClient) -> None:
    """tokenizer_manager `add_logprob_to_meta_info`: [logprob, id, text or None] entries."""
    ids = prompt(8, 10)
    reply = await generate(
        client,
        input_ids=ids,
        sampling_params={"max_new_tokens": 5, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        return_text_in_logprobs=True,
    )
    meta = reply["meta_info"]
    assert [entry[1] for entry in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None
    assert all(entry[0] <= 0 for entry in meta["input_token_logprobs"][1:])
    assert [entry[1] for entry in meta["output_token_logprobs"]] == reply["output_ids"]
    assert meta["output_token_logprobs_length"] == 5
    assert all(isinstance(entry[2], str) for entry in meta["output_token_logprobs"])
    assert meta["input_top_logprobs"][0] is None
    top = meta["output_top_logprobs"][0]
    assert len(top) == 3 and top[0][1] == reply["output_ids"][0]
    assert top[0][0] >= top[1][0] >= top[2][0]
    default = await generate(
        client, input_ids=ids, sampling_params={"max_new_tokens": 5}, return_logprob=True
    )
    assert default["meta_info"]["input_token_logprobs"] == []
    assert default["meta_info"]["output_token_logprobs"][0][2] is None
    assert "output_top_logprobs" not in default["meta_info"]


@pytest.mark.anyio
async def test_meta_info_keys(client: httpx.AsyncClient) -> None:
    reply = await natural(client, 9)
    meta = reply["meta_info"]
    for key in ("id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
                "reasoning_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                "queue_time", "forward_entry_time", "prefill_finished_time",
                "request_received_ts", "first_token_latency", "request_finished_ts"):
        assert key in meta
    assert meta["num_retractions"] == 0
    assert meta["reasoning_tokens"] == reply["output_ids"].index(KIMI_THINK_END) + 1


@pytest.mark.anyio
async def test_stream_first_chunk_has_one_token_and_latency_is_final(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/generate",
        json={"input_ids": prompt(10), "stream": True,
              "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}},
    )
    parts = chunks(response.text)
    assert len(parts[0]["output_ids"]) == 1
    assert [len(one["output_ids"]) for one in parts] == list(range(1, 31))
    assert all("e2e_latency" not in one["meta_info"] for one in parts[:-1])
    assert "e2e_latency" in parts[-1]["meta_info"]
    assert parts[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    assert all(parts[-1]["text"].startswith(one["text"]) for one in parts)
    assert len({one["text"] for one in parts}) == len(parts)


@pytest.mark.anyio
@pytest.mark.parametrize("interval", [4, 7])
async def test_stream_interval_chunks(client: httpx.AsyncClient, interval: int) -> None:
    """output_streamer.py: the first token at once, then at least `interval` unsent tokens."""
    response = await client.post(
        "/generate",
        json={"input_ids": prompt(11), "stream": True,
              "sampling_params": {"max_new_tokens": 30, "ignore_eos": True,
                                  "stream_interval": interval}},
    )
    sizes = [len(one["output_ids"]) for one in chunks(response.text)]
    assert sizes[0] == 1 and sizes[-1] == 30
    steps = [after - before for before, after in itertools.pairwise(sizes)]
    assert all(step == interval for step in steps[:-1]) and 0 < steps[-1] <= interval


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    text = (await client.get("/metrics")).text
    return {
        (sample.name, sample.labels.get("is_streaming", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.anyio
async def test_metrics_labels_per_token_itl_and_health_checks(client: httpx.AsyncClient) -> None:
    await generate(client, input_ids=prompt(12),
                   sampling_params={"max_new_tokens": 120, "ignore_eos": True})
    response = await client.post(
        "/generate",
        json={"input_ids": prompt(13), "stream": True,
              "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}},
    )
    assert response.status_code == 200
    assert (await client.get("/health_generate")).status_code == 200
    samples = await scrape(client)
    assert samples[("sglang:num_requests_total", "false")] == 1
    assert samples[("sglang:num_requests_total", "true")] == 1
    assert samples[("sglang:generation_tokens_total", "false")] == 120
    assert samples[("sglang:generation_tokens_total", "true")] == 40
    # Streamed: 39 tokens after the first; non-streamed: batches at 100 and 120 after the first
    # output at 50 (every 50 tokens, output_streamer's force interval).
    assert samples[("sglang:inter_token_latency_seconds_count", "")] == 39 + 70
    assert samples[("sglang:request_time_per_output_token_seconds_count", "true")] == 1
    text = (await client.get("/metrics")).text
    assert 'engine_type="unified"' in text and 'model_name="sim/kimi-k2.5"' in text


@pytest.mark.anyio
async def test_counters_move_before_the_final_chunk_is_sent() -> None:
    app = create_app(SimConfig(enable_metrics=True, speed=20.0))
    server = app.state.server
    seen: list[float] = []
    body = {
        "input_ids": prompt(14),
        "stream": True,
        "sampling_params": {"max_new_tokens": 10, "ignore_eos": True},
    }
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://s") as c,
        c.stream("POST", "/generate", json=body) as response,
    ):
        async for line in response.aiter_lines():
            if '"finish_reason":{' in line:
                seen.append(server.metrics.num_requests[True]._value.get())
    assert seen == [1.0]


def test_retraction_under_an_overfull_pool_loses_no_request() -> None:
    """retract_decode: fewest output tokens first (then longest prompt); retracted requests
    are recomputed later and every one finishes with its full output."""
    from workbench.sim.profiles import Sizing

    lines: list[str] = []
    sizing = Sizing(
        max_total_num_tokens=400, max_running_requests=16, chunked_prefill_size=8192,
        max_req_input_len=300, context_length=1024, kv_cache_dtype="bf16",
        kv_bytes_per_token=1, host_tokens=0,
    )
    engine = Engine(sizing, lambda running, prefilled, loaded: 0.01, log=lines.append)
    requests = [Request(20 + index, list(range(120)), 120) for index in range(8)]
    for request in requests:
        engine.submit(request)
    for _ in range(5000):
        if not engine.has_work:
            break
        engine.publish(engine.step())
    assert all(request.finished and not request.aborted for request in requests)
    assert all(request.generated == 120 for request in requests)
    assert engine.retractions > 0 and sum(request.retractions for request in requests) == (
        engine.retractions
    )
    assert any(line.startswith("KV cache pool is full. Retract requests. #retracted_reqs: ")
               for line in lines)


@pytest.mark.anyio
async def test_openai_completions_with_usage_and_stream(client: httpx.AsyncClient) -> None:
    """serving_completions.py: choices with text and matched_stop, usage; a stream of text
    deltas, then a usage chunk without choices (stream_options.include_usage), then [DONE]."""
    body = {"model": "m", "prompt": "hello there", "max_tokens": 12, "ignore_eos": True}
    reply = (await client.post("/v1/completions", json=body)).json()
    assert reply["object"] == "text_completion" and reply["model"] == "m"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 12
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + 12
    streamed = await client.post(
        "/v1/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    parts = chunks(streamed.text)
    assert "".join(part["choices"][0]["text"] for part in parts[:-1]) == reply["choices"][0]["text"]
    assert parts[-1]["choices"] == [] and parts[-1]["usage"]["completion_tokens"] == 12
    bad = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400 and bad.json()["object"] == "error"


@pytest.mark.anyio
async def test_openai_chat_splits_reasoning_with_a_parser() -> None:
    """serving_chat.py with a reasoning parser: reasoning_content before the think-end id."""
    async with client_for(SimConfig(reasoning_parser="kimi_k2", speed=20.0)) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000}
        reply = (await client.post("/v1/chat/completions", json=body)).json()
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
        models = (await client.get("/v1/models")).json()
    message = reply["choices"][0]["message"]
    assert reply["object"] == "chat.completion" and message["role"] == "assistant"
    assert message["reasoning_content"] and message["content"]
    assert "</think>" not in message["content"] and "<|im_end|>" not in message["content"]
    deltas = [part["choices"][0]["delta"] for part in chunks(streamed.text)]
    assert "".join(delta["content"] for delta in deltas) == message["content"]
    assert "".join(delta["reasoning_content"] or "" for delta in deltas) == (
        message["reasoning_content"]
    )
    assert models["data"][0]["id"] == "sim/kimi-k2.5"


@pytest.mark.anyio
async def test_model_info_tokenizer_path_loads(client: httpx.AsyncClient) -> None:
    """Clients load `tokenizer_path` (bench_serving, RuntimeEndpoint): it must be a tokenizer."""
    import transformers  # the [test] extra carries it

    info = (await client.get("/model_info")).json()
    tokenizer = transformers.AutoTokenizer.from_pretrained(info["tokenizer_path"])
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == KIMI_END


@pytest.mark.anyio
async def test_retracted_requests_finish_and_are_counted() -> None:
    """A 1,708-token pool and eight requests that each grow to 400 tokens: decoding overflows
    the pool, requests are retracted and recomputed, every one ends with its full output, and
    meta_info.num_retractions adds up to sglang:num_retracted_requests_total."""
    lines: list[str] = []
    config = SimConfig(enable_metrics=True, speed=50.0, mem_fraction_static=0.022)
    app = create_app(config, log=lines.append)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as c:
        replies = (await c.post("/generate", json={
            "input_ids": [prompt(seed, 100) for seed in range(8)],
            "sampling_params": {"max_new_tokens": 300, "ignore_eos": True},
        })).json()
        samples = await scrape(c)
    assert [len(one["output_ids"]) for one in replies] == [300] * 8
    retractions = sum(one["meta_info"]["num_retractions"] for one in replies)
    assert retractions > 0
    assert samples[("sglang:num_retracted_requests_total", "")] == retractions
    assert any("KV cache pool is full. Retract requests." in line for line in lines)
