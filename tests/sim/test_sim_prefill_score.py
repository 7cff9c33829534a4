"""The simulator answers a scoring request (`max_new_tokens` 0 with input logprobs) as SGLang
does: nothing generated, `length` 0, and input logprobs from `logprob_start_len` whose first
entry has no value; a reply the simulator generated itself scores as more likely than random
ids."""

from __future__ import annotations

import random
import statistics
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from workbench.sim import SimConfig, create_app

CONTENT_IDS = (0, 1294)  # the simulator's vocabulary (kimi-k2.5's sim_content_ids)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(SimConfig()))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as one:
        yield one


def prompt(seed: int, count: int = 24) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*CONTENT_IDS) for _ in range(count)]


async def post(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


async def reply_of(client: httpx.AsyncClient, ids: list[int]) -> list[int]:
    reply = await post(client, input_ids=ids,
                       sampling_params={"max_new_tokens": 120, "temperature": 0.6})
    output: list[int] = reply["output_ids"]
    return output


async def scored(client: httpx.AsyncClient, ids: list[int], start: int, top: int = 0,
                 text: bool = False) -> dict[str, Any]:
    return await post(client, input_ids=ids, sampling_params={"max_new_tokens": 0},
                      return_logprob=True, logprob_start_len=start, top_logprobs_num=top,
                      return_text_in_logprobs=text)


@pytest.mark.anyio
async def test_max_new_tokens_0_generates_nothing_and_ends_with_length_0(
    client: httpx.AsyncClient,
) -> None:
    ids = prompt(1)
    reply = await scored(client, ids, len(ids) - 1)
    meta = reply["meta_info"]
    assert reply["output_ids"] == [] and reply["text"] == ""
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(ids), 0)
    assert meta["output_token_logprobs"] == []


@pytest.mark.anyio
@pytest.mark.parametrize("start", [0, 5, 23])
async def test_input_logprobs_run_from_logprob_start_len_the_first_without_a_value(
    client: httpx.AsyncClient, start: int,
) -> None:
    ids = prompt(2)
    meta = (await scored(client, ids, start, top=4, text=True))["meta_info"]
    entries, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert [entry[1] for entry in entries] == ids[start:]
    assert entries[0][0] is None and tops[0] is None
    assert len(tops) == len(entries) == len(ids) - start
    for entry, top in zip(entries[1:], tops[1:], strict=True):
        assert isinstance(entry[0], float) and entry[0] < 0 and isinstance(entry[2], str)
        assert len(top) == 4
        values = [item[0] for item in top]
        assert values == sorted(values, reverse=True)
        assert entry[0] <= values[0]  # no token beats the best of the top
        assert all(isinstance(item[2], str) for item in top)


@pytest.mark.anyio
async def test_logprobs_are_deterministic(client: httpx.AsyncClient) -> None:
    ids = prompt(3)
    first = await scored(client, ids, 3, top=5)
    again = await scored(client, ids, 3, top=5)
    for key in ("input_token_logprobs", "input_top_logprobs"):
        assert first["meta_info"][key] == again["meta_info"][key]


@pytest.mark.anyio
async def test_a_reply_it_generated_is_more_likely_than_random_ids(
    client: httpx.AsyncClient,
) -> None:
    rng = random.Random(4)
    own, other = [], []
    for seed in range(6):
        ids = prompt(10 + seed)
        reply = await reply_of(client, ids)
        noise = [rng.randrange(*CONTENT_IDS) for _ in reply]
        for tokens, found in ((reply, own), (noise, other)):
            meta = (await scored(client, ids + tokens, len(ids) - 1))["meta_info"]
            values = [entry[0] for entry in meta["input_token_logprobs"][1:]]
            assert len(values) == len(tokens)
            found.append(-statistics.fmean(values))
    assert max(own) + 2 < min(other)


@pytest.mark.anyio
async def test_logprob_start_len_must_be_below_the_input_length(
    client: httpx.AsyncClient,
) -> None:
    ids = prompt(5)
    response = await client.post("/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
        "logprob_start_len": len(ids)})
    assert response.status_code == 400
    assert "Please use a smaller logprob_start_len" in response.json()["error"]["message"]
