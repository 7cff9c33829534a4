"""/v1/chat/completions as a runner that lets the server render each turn uses it: the prompt
ids, reply ids and meta_info of a choice (SGLang 0.5.23 serving_chat.py, protocol.py), and the
prompt rendered from the tools and messages as SGLang's pydantic models dump them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from workbench.sim import SimConfig, create_app
from workbench.sim.templates import template_tools
from workbench.tokenizer import encode_messages, load_tokenizer

EXAMPLE_TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "tokenizer"
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# SGLang's own messages (serving_chat `_convert_to_internal_request`).
STREAM_REFUSALS = {
    "return_prompt_token_ids": (
        "return_prompt_token_ids is not supported with streaming. "
        "Please set stream=false when using return_prompt_token_ids=true."
    ),
    "return_token_ids": (
        "return_token_ids is not supported with streaming on /v1/chat/completions. "
        "Please set stream=false when using return_token_ids=true."
    ),
    "return_meta_info": (
        "return_meta_info is not supported with streaming. "
        "Please set stream=false when using return_meta_info=true."
    ),
}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(SimConfig(speed=50.0))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as one:
        yield one


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(EXAMPLE_TOKENIZER)


async def chat(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/chat/completions", json={"model": "m", **body})
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def dumped(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as SGLang 0.5.23 hands it to the template: the Tool level keeps its None."""
    return {"type": "function", "function": tool["function"], "defer_loading": None}


@pytest.mark.anyio
async def test_return_token_ids_gives_the_prompt_and_the_generate_output(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    reply = await chat(
        client, messages=QUESTION, max_completion_tokens=60, **SAMPLING, seed=7,
        skip_special_tokens=False, rid="turn-0", return_token_ids=True, return_meta_info=True,
    )
    choice = reply["choices"][0]
    prompt = encode_messages(tokenizer, QUESTION, {})
    assert choice["prompt_token_ids"] == prompt
    native = (await client.post("/generate", json={
        "input_ids": prompt, "rid": "native-0",
        "sampling_params": {"max_new_tokens": 60, **SAMPLING, "sampling_seed": 7,
                            "skip_special_tokens": False},
    })).json()
    assert choice["response_token_ids"] == native["output_ids"]
    meta = choice["meta_info"]
    assert set(meta) == set(native["meta_info"])
    assert meta["id"] == reply["id"] == "turn-0"
    assert meta["prompt_tokens"] == len(prompt) == reply["usage"]["prompt_tokens"]
    assert meta["completion_tokens"] == len(choice["response_token_ids"])
    assert reply["usage"]["completion_tokens"] == meta["completion_tokens"]
    assert reply["usage"]["reasoning_tokens"] == meta["reasoning_tokens"]
    assert choice["finish_reason"] == meta["finish_reason"]["type"]
    assert choice["matched_stop"] == meta["finish_reason"].get("matched")
    assert list(choice)[-3:] == ["prompt_token_ids", "response_token_ids", "meta_info"]


@pytest.mark.anyio
async def test_return_prompt_token_ids_alone_gives_only_the_prompt(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    body = {"messages": QUESTION, "max_tokens": 8, **SAMPLING}
    choice = (await chat(client, **body, return_prompt_token_ids=True))["choices"][0]
    assert choice["prompt_token_ids"] == encode_messages(tokenizer, QUESTION, {})
    assert "response_token_ids" not in choice and "meta_info" not in choice
    plain = (await chat(client, **body))["choices"][0]
    assert not {"prompt_token_ids", "response_token_ids", "meta_info"} & set(plain)


@pytest.mark.anyio
@pytest.mark.parametrize("flag", sorted(STREAM_REFUSALS))
async def test_streaming_refuses_the_ids_and_meta_info(
    client: httpx.AsyncClient, flag: str
) -> None:
    body = {"model": "m", "messages": QUESTION, "max_tokens": 8, "stream": True, flag: True}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json() == {
        "object": "error", "message": STREAM_REFUSALS[flag], "type": "BadRequest",
        "param": None, "code": 400,
    }


@pytest.mark.anyio
async def test_tools_render_as_sglang_dumps_them(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    """With tools the prompt differs from the tokenizer's rendering of the client's tools
    (seen on a real 0.5.23: 148 ids against 143), exactly by the dumped `defer_loading`."""
    body = {"messages": QUESTION, "max_tokens": 8, **SAMPLING, "return_prompt_token_ids": True}
    with_tools = (await chat(client, **body, tools=[WEATHER]))["choices"][0]["prompt_token_ids"]
    assert with_tools == encode_messages(tokenizer, QUESTION, {}, [dumped(WEATHER)])
    plain_tools = encode_messages(tokenizer, QUESTION, {}, [WEATHER])
    assert with_tools != plain_tools and len(with_tools) > len(plain_tools)
    without = (await chat(client, **body))["choices"][0]["prompt_token_ids"]
    assert without == encode_messages(tokenizer, QUESTION, {})
    declined = await chat(client, **body, tools=[WEATHER], tool_choice="none")
    assert declined["choices"][0]["prompt_token_ids"] == without


def test_tool_dumps_keep_the_client_order_and_sglang_fields() -> None:
    """protocol.py `Tool`/`Function` dumps, as SGLang 0.5.23's pydantic models make them: the
    client's keys in its order, a missing description or parameters back as None after them,
    strict and defer_loading only when set, unknown keys dropped."""
    tools = [
        {"type": "function", "function": {
            "parameters": {"type": "object"}, "name": "get_weather", "strict": None, "extra": 1,
        }},
        {"function": {"description": "d", "name": "x", "strict": True}, "defer_loading": True},
    ]
    assert template_tools(tools, None) == [
        {"type": "function",
         "function": {"parameters": {"type": "object"}, "name": "get_weather",
                      "description": None},
         "defer_loading": None},
        {"type": "function",
         "function": {"description": "d", "name": "x", "strict": True, "parameters": None,
                      "defer_loading": True},
         "defer_loading": True},
    ]
    assert [list(tool["function"]) for tool in template_tools(tools, "auto") or []] == [
        ["parameters", "name", "description"],
        ["description", "name", "strict", "parameters", "defer_loading"],
    ]
    assert template_tools(tools, "none") is None
    named = template_tools(tools, {"type": "function", "function": {"name": "x"}})
    assert [tool["function"]["name"] for tool in named or []] == ["x"]


def history(arguments: str, reasoning: str | None) -> list[dict[str, Any]]:
    call = {"id": "functions.get_weather:0", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        *QUESTION,
        assistant,
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny and warm"},
    ]


@pytest.mark.anyio
async def test_a_tool_calling_history_renders_as_the_template_renders_it(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    arguments = json.dumps({"city": "Paris"})
    messages = history(arguments, "I should look up the weather first.")
    kwargs = {"thinking": True}
    body = {"messages": messages, "tools": [WEATHER], "chat_template_kwargs": kwargs,
            "max_tokens": 8, **SAMPLING, "return_prompt_token_ids": True}
    prompt = (await chat(client, **body))["choices"][0]["prompt_token_ids"]
    assert prompt == encode_messages(tokenizer, messages, kwargs, [dumped(WEATHER)])
    reasoning = tokenizer.encode("I should look up the weather first.", add_special_tokens=False)
    assert any(prompt[at : at + len(reasoning)] == reasoning for at in range(len(prompt)))
    unreasoned = history(arguments, None)
    assert prompt != encode_messages(tokenizer, unreasoned, kwargs, [dumped(WEATHER)])


@pytest.mark.anyio
async def test_call_arguments_reach_the_template_as_an_object(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    """serving_chat parses an assistant call's arguments string: the template's `tojson`
    renders the object, whatever the client's spacing; a string that is not a JSON object
    is a 400."""
    body = {"max_tokens": 8, **SAMPLING, "return_prompt_token_ids": True}
    compact = history('{"city":"Paris"}', None)
    prompt = (await chat(client, messages=compact, **body))["choices"][0]["prompt_token_ids"]
    assert prompt == encode_messages(tokenizer, history(json.dumps({"city": "Paris"}), None), {})
    assert prompt != encode_messages(tokenizer, compact, {})
    for arguments, message in (
        ("{city", "Assistant tool call function.arguments must be valid JSON."),
        ("[1]", "Assistant tool call function.arguments must be a JSON object."),
    ):
        bad = {"model": "m", "messages": history(arguments, None), **body}
        response = await client.post("/v1/chat/completions", json=bad)
        assert response.status_code == 400 and response.json()["message"] == message


@pytest.mark.anyio
async def test_a_request_template_needs_the_trust_flag(
    client: httpx.AsyncClient, tokenizer: Any
) -> None:
    body = {"model": "m", "messages": QUESTION, "max_tokens": 8, **SAMPLING,
            "return_prompt_token_ids": True,
            "chat_template_kwargs": {"chat_template": "{{ messages[0]['content'] }}"}}
    refused = await client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json() == {
        "object": "error",
        "message": "Request-supplied chat_template is not allowed. Start the server with "
        "--trust-request-chat-template to permit it.",
        "type": "BadRequestError", "param": None, "code": 400,
    }
    app = create_app(SimConfig(speed=50.0, trust_request_chat_template=True))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as trusted:
        choice = (await chat(trusted, **body))["choices"][0]
    own = tokenizer.encode(QUESTION[0]["content"], add_special_tokens=False)
    assert choice["prompt_token_ids"] == own
