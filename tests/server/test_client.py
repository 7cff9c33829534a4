"""SGLangClient against httpx.MockTransport handlers: reply shapes, errors, probes, secrets."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from workbench.errors import (
    BadRequest,
    ConnectionLost,
    ProtocolError,
    RequestAborted,
    RequestTimeout,
    ServerBusy,
    ServerUnreachable,
)
from workbench.server.client import SGLangClient, api_key_from_env, redact_url

pytestmark = pytest.mark.anyio

URL = "http://sglang.test:30000"


def reply(**meta: object) -> dict[str, object]:
    base = {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 2,
            "finish_reason": {"type": "stop", "matched": 163586}, "e2e_latency": 0.25,
            "reasoning_tokens": 1, "dp_rank": 0}
    base.update(meta)
    return {"text": "a b c", "output_ids": [163607, 7, 163586], "meta_info": base}


def client_for(handler: Callable[[httpx.Request], httpx.Response], **kwargs: object) -> SGLangClient:
    return SGLangClient(URL, transport=httpx.MockTransport(handler), **kwargs)  # type: ignore[arg-type]


async def test_generate_reads_meta_info_and_ignores_unknown_keys() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=reply())

    async with client_for(handler) as client:
        result = await client.generate({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}})
    assert seen[0]["input_ids"] == [1, 2, 3]
    assert result.output_ids == [163607, 7, 163586]
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (5, 3, 2)
    assert result.finish_reason == "stop" and result.matched_stop == 163586
    assert result.e2e_latency == 0.25


async def test_completion_tokens_come_from_meta_info_not_output_length() -> None:
    handler = lambda request: httpx.Response(200, json=reply(completion_tokens=2))
    async with client_for(handler) as client:
        result = await client.generate({"input_ids": [1]})
    assert result.completion_tokens == 2 and len(result.output_ids) == 3


async def test_length_finish_and_missing_latency_is_measured() -> None:
    data = reply(finish_reason={"type": "length", "length": 3})
    del data["meta_info"]["e2e_latency"]  # type: ignore[attr-defined]
    async with client_for(lambda r: httpx.Response(200, json=data)) as client:
        result = await client.generate({"input_ids": [1]})
    assert result.finish_reason == "length" and result.matched_stop is None
    assert 0 <= result.e2e_latency < 5


async def test_abort_in_a_200_reply_is_an_error() -> None:
    data = reply(finish_reason={"type": "abort", "message": "preempted", "status_code": 503})
    async with client_for(lambda r: httpx.Response(200, json=data)) as client:
        with pytest.raises(RequestAborted, match="preempted") as info:
            await client.generate({"input_ids": [1]})
    assert info.value.retryable and info.value.http_status == 503


@pytest.mark.parametrize(
    ("status", "body", "error", "retryable"),
    [
        (400, {"error": {"message": "prompt too long"}}, BadRequest, False),
        (422, {"detail": "bad"}, BadRequest, False),
        (429, {"error": {"message": "slow down"}}, ServerBusy, True),
        (503, {"error": {"message": "overloaded"}}, ServerBusy, True),
        (500, "<html><body>Internal error</body></html>", ServerBusy, True),
    ],
)
async def test_http_errors_are_classified(status: int, body: object, error: type, retryable: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    async with client_for(handler) as client:
        with pytest.raises(error) as info:
            await client.generate({"input_ids": [1]})
    assert info.value.retryable is retryable and info.value.http_status == status


async def test_bad_request_message_is_the_servers() -> None:
    body = {"error": {"message": "The input (5000 tokens) is longer than the model's context length"}}
    async with client_for(lambda r: httpx.Response(400, json=body)) as client:
        with pytest.raises(BadRequest, match="longer than the model's context length"):
            await client.generate({"input_ids": [1]})


async def test_html_page_with_200_is_a_protocol_error() -> None:
    async with client_for(lambda r: httpx.Response(200, text="<html>proxy login</html>")) as client:
        with pytest.raises(ProtocolError, match="not JSON"):
            await client.generate({"input_ids": [1]})


async def test_json_that_is_not_sglangs_shape_is_a_protocol_error() -> None:
    body = {"choices": [{"text": "hi"}]}
    async with client_for(lambda r: httpx.Response(200, json=body)) as client:
        with pytest.raises(ProtocolError, match="shape"):
            await client.generate({"input_ids": [1]})


async def test_transport_failures_are_retryable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with client_for(refuse) as client:
        with pytest.raises(ConnectionLost) as lost:
            await client.generate({"input_ids": [1]})
    async with client_for(slow) as client:
        with pytest.raises(RequestTimeout) as timeout:
            await client.generate({"input_ids": [1]})
    assert lost.value.retryable and timeout.value.retryable


async def test_server_info_falls_back_to_the_old_path_and_drops_keys() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/server_info":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json={"model_path": "m", "api_key": "sk-secret",
                                         "max_total_num_tokens": 1000})

    async with client_for(handler) as client:
        info = await client.server_info()
    assert paths == ["/server_info", "/get_server_info"]
    assert info == {"model_path": "m", "max_total_num_tokens": 1000}


async def test_unreachable_server_names_the_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client_for(refuse) as client:
        with pytest.raises(ServerUnreachable, match="sglang.test:30000"):
            await client.server_info()


async def test_api_key_is_sent_as_bearer() -> None:
    headers: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(200, text="ok")

    async with client_for(handler, api_key="k-123") as client:
        assert await client.health()
    assert headers == ["Bearer k-123"]


async def test_metrics_absent_is_none_and_flush_refused_is_false() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)
        return httpx.Response(400, json={"error": {"message": "requests running"}})

    async with client_for(handler) as client:
        assert await client.metrics() is None
        assert await client.flush_cache() is False


async def test_stream_yields_cumulative_chunks_then_result() -> None:
    chunks = [
        {"text": "a", "output_ids": [5], "meta_info": {"prompt_tokens": 2, "completion_tokens": 1}},
        {"text": "a b", "output_ids": [5, 163586], "meta_info": {
            "prompt_tokens": 2, "completion_tokens": 2, "finish_reason": {"type": "stop", "matched": 163586}}},
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async with client_for(handler) as client:
        seen = [c async for c in client.generate_stream({"input_ids": [1, 2]})]
    assert [c.output_ids for c in seen] == [[5], [5, 163586], [5, 163586]]
    assert seen[-1].result is not None and seen[-1].result.finish_reason == "stop"


def test_api_key_from_env_and_redaction() -> None:
    assert api_key_from_env({"SGLANG_API_KEY": "b"}) == "b"
    assert api_key_from_env({"WORKBENCH_API_KEY": "a", "SGLANG_API_KEY": "b"}) == "a"
    assert api_key_from_env({}) is None
    assert redact_url("http://user:pw@host:30000/x?token=1") == "http://host:30000/x"


# SGLang 0.5.23's error and abort shapes (srt/entrypoints/http_server.py, tokenizer_manager.py
# `_handle_abort_finish_reason`, sglang/api/v1/api_types.py) and how each is handled.
UNKNOWN_KEY = ("unknown field `top_z`, expected one of `max_new_tokens`, `stop`, "
               "`stop_token_ids`, `temperature`")
SGLANG_ERRORS = [
    # A non-streaming abort: HTTPException -> ErrorResponse, HTTP 503: retried as an abort.
    (503, {"object": "error", "message": "Abort request: timeout", "type": "503",
           "param": None, "code": 503}, RequestAborted, True, "Abort request: timeout"),
    # An abort at 500 (out of memory after retraction): retried.
    (500, {"object": "error", "message": "Out of memory even after retracting",
           "type": "500", "param": None, "code": 500}, RequestAborted, True, "Out of memory"),
    # The JSON contract's refusal of an unknown key: one line naming the key, not retried.
    (400, {"error": UNKNOWN_KEY}, BadRequest, False, "unknown parameter `top_z`"),
    # A ValueError (sampling verify): its message, not retried.
    (400, {"error": {"message": "top_p must be in (0, 1], got 0.0."}}, BadRequest, False,
     r"top_p must be in \(0, 1\]"),
]


@pytest.mark.parametrize(("status", "body", "error", "retryable", "needle"), SGLANG_ERRORS)
async def test_sglang_error_shapes(
    status: int, body: object, error: type, retryable: bool, needle: str
) -> None:
    async with client_for(lambda r: httpx.Response(status, json=body)) as client:
        with pytest.raises(error, match=needle) as info:
            await client.generate({"input_ids": [1]})
    assert info.value.retryable is retryable and info.value.http_status == status
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("finish", "error", "retryable"),
    [
        ({"type": "abort", "message": "bad logprob_start_len", "status_code": 400,
          "err_type": "BadRequestError"}, BadRequest, False),
        ({"type": "abort", "message": "Retracted without a KV backup", "status_code": 503,
          "err_type": None}, RequestAborted, True),
    ],
)
async def test_streamed_abort_chunks_by_status(
    finish: dict[str, object], error: type, retryable: bool
) -> None:
    chunk = {"text": "", "output_ids": [], "meta_info": {
        "prompt_tokens": 2, "completion_tokens": 0, "finish_reason": finish}}
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
    async with client_for(lambda r: httpx.Response(200, text=body)) as client:
        with pytest.raises(error, match=str(finish["message"])) as info:
            _ = [c async for c in client.generate_stream({"input_ids": [1]})]
    assert info.value.retryable is retryable


async def test_streamed_error_chunk_is_a_bad_request() -> None:
    """http_server `stream_results`: a ValueError mid-stream is an error chunk, then [DONE]."""
    error = {"error": {"message": "The input is empty.", "type": "invalid_request_error",
                       "code": 400, "retryable": False}}
    body = f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n"
    async with client_for(lambda r: httpx.Response(200, text=body)) as client:
        with pytest.raises(BadRequest, match="The input is empty."):
            _ = [c async for c in client.generate_stream({"input_ids": [1]})]


async def test_retraction_count_is_read_when_sent() -> None:
    async with client_for(lambda r: httpx.Response(200, json=reply(num_retractions=2))) as client:
        assert (await client.generate({"input_ids": [1]})).num_retractions == 2
    async with client_for(lambda r: httpx.Response(200, json=reply())) as client:
        assert (await client.generate({"input_ids": [1]})).num_retractions is None


async def test_idle_connections_are_dropped_before_the_servers_keep_alive_ends() -> None:
    """SGLang's uvicorn closes a connection idle for 5 s; the client must not reuse one idle
    that long (a request sent as the server closes it fails with "Server disconnected")."""
    import anyio

    from workbench.server.client import KEEPALIVE_SECONDS, default_transport

    accepted = 0

    async def serve(stream: anyio.abc.SocketStream) -> None:  # HTTP/1.1, never closes first
        nonlocal accepted
        accepted += 1
        async with stream:
            buffer = b""
            while True:
                try:
                    buffer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                while b"\r\n\r\n" in buffer:
                    _, buffer = buffer.split(b"\r\n\r\n", 1)
                    await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    assert KEEPALIVE_SECONDS < 5
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listener.serve, serve)
            async with httpx.AsyncClient(transport=default_transport()) as client:
                for pause in (0.0, 0.2, KEEPALIVE_SECONDS + 0.5):
                    await anyio.sleep(pause)
                    assert (await client.get(f"http://127.0.0.1:{port}/")).text == "ok"
            tasks.cancel_scope.cancel()
    assert accepted == 2  # the quick second request reused the connection, the late one did not


def test_the_chosen_tokens_logprobs_are_read_when_asked_for() -> None:
    from workbench.errors import ProtocolError
    from workbench.server.client import parse_generate_reply

    meta = {"prompt_tokens": 3, "completion_tokens": 2,
            "finish_reason": {"type": "length"}, "e2e_latency": 0.1}
    plain = parse_generate_reply({"output_ids": [5, 6], "meta_info": meta}, "u", elapsed=0.1)
    assert plain.output_logprobs is None
    with_logprobs = {"output_ids": [5, 6], "meta_info": {
        **meta, "output_token_logprobs": [[-0.5, 5, None], [-1.25, 6, "x"]]}}
    assert parse_generate_reply(with_logprobs, "u", elapsed=0.1).output_logprobs == [-0.5, -1.25]
    bad = {"output_ids": [5], "meta_info": {**meta, "output_token_logprobs": [["x", 5, None]]}}
    with pytest.raises(ProtocolError, match="output_token_logprobs are not"):
        parse_generate_reply(bad, "u", elapsed=0.1)
