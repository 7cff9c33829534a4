"""The OpenAI routes SGLang serves: /v1/completions and /v1/chat/completions.

Shapes follow `srt/entrypoints/openai/` (protocol.py, serving_completions.py,
serving_chat.py): OpenAI's request keys map onto the same sampling parameters as /generate
(`max_tokens` -> `max_new_tokens`, `min_tokens` -> `min_new_tokens`, `stop`, `n`, and
SGLang's extras `top_k`, `ignore_eos`, `stop_token_ids`, `no_stop_trim`,
`skip_special_tokens`) and `rid`; replies carry `usage` (UsageProcessor: counts, reasoning
tokens among them, from the /generate meta_info) and SGLang's `matched_stop`, and their `id`
is the first sequence's rid, as SGLang's `meta_info.id`. Streams send text deltas, then a
`usage` chunk with no choices when `stream_options.include_usage` is set, then `[DONE]`.

Chat prompts are rendered as SGLang renders them (`workbench.sim.templates`: the tools and
messages as its pydantic models dump them, with the request's `chat_template_kwargs`); with
tools the reply keeps its special tokens (serving_chat sets `skip_special_tokens` false). A
non-streamed chat choice carries `prompt_token_ids` with `return_prompt_token_ids` or
`return_token_ids`, `response_token_ids` (the raw output ids) with `return_token_ids` and
`meta_info` (the /generate meta_info) with `return_meta_info`; streaming with any of the three
is a 400. With `--reasoning-parser` the reasoning before the think-end id comes back as
`reasoning_content`. Errors use SGLang's OpenAI `ErrorResponse`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from workbench.sim.calls import DONE, abort_response, run_jobs, stream_jobs
from workbench.sim.completion import reply_text
from workbench.sim.job import Job
from workbench.sim.outputs import render_text
from workbench.sim.protocol import GenerateItem, InvalidRequest, json_response, parse_generate
from workbench.sim.sampling import ContractError
from workbench.sim.server import SimServer
from workbench.sim.templates import ChatPrompt, RenderError, chat_prompt, refusal

__all__ = ["chat_completions", "completions"]

# OpenAI key -> sampling_params key (serving_completions / serving_chat `_build_sampling_params`).
_SAMPLING_KEYS = {
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "n": "n",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "no_stop_trim": "no_stop_trim",
    "skip_special_tokens": "skip_special_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "seed": "sampling_seed",
}
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# serving_chat `_convert_to_internal_request`: what a streamed chat cannot return.
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


def openai_error(message: str, status: int = 400, err_type: str = "BadRequestError") -> Response:
    """serving_base `create_error_response`."""
    body = {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return json_response(body, status)


def _sampling(body: dict[str, Any], default_max_tokens: int | None) -> dict[str, Any]:
    params = {
        target: body[key] for key, target in _SAMPLING_KEYS.items() if body.get(key) is not None
    }
    if "max_new_tokens" not in params and default_max_tokens is not None:
        params["max_new_tokens"] = default_max_tokens
    return params


async def completions(request: Request) -> Response:
    """POST /v1/completions."""
    server: SimServer = request.app.state.server
    started = time.perf_counter()
    body = await _body(request)
    if isinstance(body, Response):
        return body
    prompt = body.get("prompt")
    key = "text" if isinstance(prompt, str) or _strings(prompt) else "input_ids"
    native = {key: prompt, "sampling_params": _sampling(body, COMPLETIONS_MAX_TOKENS)}
    return await _serve(request, server, body, _with_rid(native, body), started)


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions (serving_chat: `_validate_request`, then the streaming
    refusals, then the chat template)."""
    server: SimServer = request.app.state.server
    started = time.perf_counter()
    body = await _body(request)
    if isinstance(body, Response):
        return body
    prompt = _chat_prompt(server, body)
    if isinstance(prompt, Response):
        return prompt
    sampling = _sampling(body, None)
    if prompt.with_tools:
        sampling["skip_special_tokens"] = False
    key = "text" if isinstance(prompt.prompt, str) else "input_ids"
    native = {key: prompt.prompt, "sampling_params": sampling}
    return await _serve(request, server, body, _with_rid(native, body), started, chat=True)


def _chat_prompt(server: SimServer, body: dict[str, Any]) -> ChatPrompt | Response:
    """The rendered prompt, or SGLang's 400: `_validate_request`'s (BadRequestError), then
    the ValueErrors of the streaming checks and of the rendering (BadRequest)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return openai_error("messages must be a list")
    trust = server.config.trust_request_chat_template
    refused = "Messages cannot be empty." if not messages else refusal(
        body, trust_chat_template=trust
    )
    if refused is not None:
        return openai_error(refused)
    refused = _stream_refusal(body)
    if refused is not None:
        return openai_error(refused, err_type="BadRequest")
    try:
        return chat_prompt(server.tokenizer_path, body)
    except RenderError as exc:
        return openai_error(str(exc), err_type="BadRequest")


def _stream_refusal(body: dict[str, Any]) -> str | None:
    if not body.get("stream"):
        return None
    return next((message for key, message in STREAM_REFUSALS.items() if body.get(key)), None)


def _with_rid(native: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The native request with the client's `rid`, when it sent one."""
    return native if body.get("rid") is None else {**native, "rid": body["rid"]}


def _strings(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(one, str) for one in value)


async def _body(request: Request) -> dict[str, Any] | Response:
    try:
        body = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        return openai_error(f"Invalid JSON: {exc}")
    if not isinstance(body, dict):
        return openai_error("the request body must be a JSON object")
    return body


async def _serve(
    request: Request,
    server: SimServer,
    body: dict[str, Any],
    native: dict[str, Any],
    started: float,
    *,
    chat: bool = False,
) -> Response:
    """Run the native request; `started` (time.perf_counter) is when the call came in, the
    start of its meta_info's `e2e_latency`."""
    try:
        items = parse_generate(native, server.model, server.limits).items
    except (ContractError, InvalidRequest) as exc:
        return openai_error(str(exc))
    reply = _Reply(server, body, chat, items[0].rid)
    if body.get("stream"):
        return StreamingResponse(reply.stream(items), media_type="text/event-stream")
    jobs = await run_jobs(server, items, request.receive)
    if jobs is None:
        return Response(status_code=499)
    aborted = next((job for job in jobs if job.request.aborted), None)
    if aborted is not None:
        return abort_response(
            {"message": aborted.request.abort_message, "status_code": aborted.request.abort_status}
        )
    return json_response(reply.complete(jobs, time.perf_counter() - started))


class _Reply:
    """Formats jobs as OpenAI replies and stream chunks."""

    def __init__(self, server: SimServer, body: dict[str, Any], chat: bool, rid: str) -> None:
        self.server = server
        self.chat = chat
        self.rid = rid
        self.model = body.get("model") or server.served_model_name
        self.created = int(time.time())
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.split = (
            chat and server.config.reasoning_parser is not None and server.model.is_reasoning
        )
        self.returns = _Returns.of(body) if chat else _Returns()

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def _finish(self, job: Job) -> tuple[str | None, int | str | None]:
        if not job.request.done:
            return None, None
        if job.request.aborted:
            return "abort", None
        completion = job.completion
        return completion.finish, completion.matched

    def _texts(self, job: Job, upto: int) -> tuple[str, str]:
        """(reasoning, content) text of the first `upto` ids (reasoning empty unless split)."""
        ids = job.completion.output_ids[:upto]
        finish, matched = self._finish(job)
        matched = matched if finish == "stop" else None
        model = self.server.model
        if not self.split:
            return "", reply_text(ids, matched, job.item.sampling, model)
        think_end = model.think_end
        if think_end not in ids:
            reasoning = [token for token in ids if token != model.think_start]
            return render_text(reasoning, model), ""
        cut = ids.index(think_end)
        reasoning = [token for token in ids[:cut] if token != model.think_start]
        answer = reply_text(ids[cut + 1 :], matched, job.item.sampling, model)
        return render_text(reasoning, model), answer

    def _choice(self, index: int, job: Job, reply: dict[str, Any]) -> dict[str, Any]:
        finish, matched = self._finish(job)
        reasoning, content = self._texts(job, job.request.published)
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            choice["message"] = {
                "role": "assistant",
                "content": content,
                "reasoning_content": reasoning or None,
            }
        else:
            choice["text"] = content
        choice.update(logprobs=None, finish_reason=finish, matched_stop=matched)
        return {**choice, **self.returns.fields(job, reply)}

    def complete(self, jobs: list[Job], e2e_latency: float) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        replies = [self.server.job_reply(job, e2e_latency) for job in jobs]
        return {
            **self._head(kind),
            "choices": [
                self._choice(index, job, reply)
                for index, (job, reply) in enumerate(zip(jobs, replies, strict=True))
            ],
            "usage": _usage(jobs, [reply["meta_info"] for reply in replies]),
            "metadata": {"weight_version": "default"},
        }

    async def stream(self, items: list[GenerateItem]) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        sent = [("", "")] * len(items)
        jobs: dict[int, Job] = {}
        async with contextlib.aclosing(stream_jobs(self.server, items)) as events:
            async for index, job in events:
                jobs[index] = job
                if job.request.done and job.request.aborted:
                    yield _sse(self._stream_error(job))
                    break
                chunk = {**self._head(kind), "choices": [self._delta(index, job, sent)]}
                yield _sse(chunk)
        if self.include_usage:
            done = list(jobs.values())
            metas = [self.server.job_reply(job)["meta_info"] for job in done]
            yield _sse({**self._head(kind), "choices": [], "usage": _usage(done, metas)})
        yield DONE

    def _delta(self, index: int, job: Job, sent: list[tuple[str, str]]) -> dict[str, Any]:
        reasoning, content = self._texts(job, job.request.published)
        old_reasoning, old_content = sent[index]
        sent[index] = (reasoning, content)
        finish, matched = self._finish(job)
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": content[len(old_content) :]}
            if self.split:
                delta["reasoning_content"] = reasoning[len(old_reasoning) :] or None
            choice["delta"] = delta
        else:
            choice["text"] = content[len(old_content) :]
        choice.update(logprobs=None, finish_reason=finish, matched_stop=matched)
        return choice

    def _stream_error(self, job: Job) -> dict[str, Any]:
        """serving_base `create_streaming_error_response`."""
        status = job.request.abort_status
        message = job.request.abort_message or "Generation aborted."
        return {
            "error": {
                "object": "error",
                "message": message,
                "type": str(status),
                "param": None,
                "code": status,
            }
        }


class _Returns(NamedTuple):
    """The ids and meta_info a chat request asked its choices to carry."""

    prompt_ids: bool = False
    output_ids: bool = False
    meta_info: bool = False

    @classmethod
    def of(cls, body: dict[str, Any]) -> _Returns:
        both = bool(body.get("return_token_ids"))
        return cls(
            bool(body.get("return_prompt_token_ids")) or both,
            both,
            bool(body.get("return_meta_info")),
        )

    def fields(self, job: Job, reply: dict[str, Any]) -> dict[str, Any]:
        """protocol.py `ChatCompletionResponseChoice`: each key only when asked for."""
        fields: dict[str, Any] = {}
        if self.prompt_ids:
            fields["prompt_token_ids"] = list(job.item.input_ids)
        if self.output_ids:
            fields["response_token_ids"] = reply["output_ids"]
        if self.meta_info:
            fields["meta_info"] = reply["meta_info"]
        return fields


def _usage(jobs: list[Job], metas: list[dict[str, Any]]) -> dict[str, Any]:
    """UsageProcessor `calculate_response_usage` over the replies' meta_info: prompt tokens
    once per prompt (its first sample), completion and reasoning tokens of every sequence."""
    prompt = sum(
        meta.get("prompt_tokens", 0)
        for job, meta in zip(jobs, metas, strict=True)
        if job.item.sample == 0
    )
    completion = sum(meta.get("completion_tokens", 0) for meta in metas)
    reasoning = sum(meta.get("reasoning_tokens", 0) for meta in metas)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"
