"""SGLang's /generate request and reply shapes: parsing, validation, reply building.

A request holds `input_ids` (a list of ids, or a list of such lists for a batch) or `text` (a
string, or a list of strings), optional `sampling_params` (one object, or one per prompt),
`rid` (a string, or one per prompt) and `stream`. Invalid requests raise InvalidRequest, which
the app answers with HTTP 400 `{"error": {"message": ...}}`; unknown keys are ignored.
"""

from __future__ import annotations

import math
import uuid
from typing import Any, NamedTuple

import msgspec
from starlette.responses import Response

from workbench.profiles import ModelProfile
from workbench.sim.outputs import PlannedOutput, render_text, tokenize_text

__all__ = [
    "GenerateBatch",
    "GenerateItem",
    "InvalidRequest",
    "Limits",
    "abort_reason",
    "error_body",
    "finish_reason",
    "json_response",
    "parse_generate",
    "reply",
]

DEFAULT_MAX_NEW_TOKENS = 128


class InvalidRequest(ValueError):
    """A /generate request SGLang would refuse with HTTP 400."""


class Limits(NamedTuple):
    """What the server accepts."""

    vocab_size: int
    max_req_input_len: int
    context_length: int


class GenerateItem(NamedTuple):
    """One prompt of a /generate request, validated."""

    prompt: list[int] | str
    input_ids: list[int]
    rid: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int


class GenerateBatch(NamedTuple):
    """A parsed /generate request: its prompts, whether it was a batch, whether to stream."""

    items: list[GenerateItem]
    is_batch: bool
    stream: bool


def error_body(message: str) -> dict[str, Any]:
    """SGLang's error reply."""
    return {"error": {"message": message}}


def json_response(content: object, status_code: int = 200) -> Response:
    """A JSON reply encoded with msgspec."""
    return Response(msgspec.json.encode(content), status_code, media_type="application/json")


def parse_generate(body: object, model: ModelProfile, limits: Limits) -> GenerateBatch:
    """Validate a decoded /generate body; InvalidRequest says what is wrong."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    prompts, is_batch = _prompts(body)
    count = len(prompts)
    sampling = _per_prompt(body.get("sampling_params"), count, is_batch, "sampling_params")
    rids = _per_prompt(body.get("rid"), count, is_batch, "rid")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false")
    items = [
        _item(prompt, params, rid, model, limits)
        for prompt, params, rid in zip(prompts, sampling, rids, strict=True)
    ]
    return GenerateBatch(items, is_batch, stream)


def _prompts(body: dict[str, Any]) -> tuple[list[list[int] | str], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise InvalidRequest("Either text or input_ids should be provided.")
    if isinstance(text, str):
        return [text], False
    if isinstance(text, list) and text and all(isinstance(one, str) for one in text):
        return list(text), True
    if text is not None:
        raise InvalidRequest("text must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        return list(input_ids), True
    if isinstance(input_ids, list):
        return [input_ids], False
    raise InvalidRequest("input_ids must be a list of token ids or a list of such lists")


def _per_prompt(value: object, count: int, is_batch: bool, name: str) -> list[Any]:
    if is_batch and isinstance(value, list):
        if len(value) != count:
            raise InvalidRequest(f"{name} has {len(value)} entries for {count} prompts")
        return list(value)
    return [value] * count


def _item(
    prompt: object, params: object, rid: object, model: ModelProfile, limits: Limits
) -> GenerateItem:
    if isinstance(prompt, str):
        ids = tokenize_text(prompt, model)
        sent: list[int] | str = prompt
    else:
        ids = _token_ids(prompt, limits.vocab_size)
        sent = ids
    if rid is not None and not isinstance(rid, str):
        raise InvalidRequest("rid must be a string (or one string per prompt)")
    max_new_tokens, temperature, top_p, top_k = _sampling(params)
    _check_lengths(len(ids), max_new_tokens, limits)
    return GenerateItem(
        sent, ids, rid or uuid.uuid4().hex, max_new_tokens, temperature, top_p, top_k
    )


def _token_ids(value: object, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not all(type(token) is int for token in value):
        raise InvalidRequest("input_ids must be a list of integers")
    if value and (min(value) < 0 or max(value) >= vocab_size):
        raise InvalidRequest(f"input_ids must be in [0, {vocab_size})")
    return value


def _sampling(params: object) -> tuple[int, float, float, int]:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidRequest("sampling_params must be an object (or one object per prompt)")
    max_new_tokens = params.get("max_new_tokens")
    max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    temperature = _number(params.get("temperature", 1.0), "temperature")
    top_p = _number(params.get("top_p", 1.0), "top_p")
    top_k = params.get("top_k", -1)
    if type(max_new_tokens) is not int or max_new_tokens < 0:
        raise InvalidRequest("max_new_tokens must be a non-negative integer")
    if temperature < 0:
        raise InvalidRequest(f"temperature must be non-negative, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}.")
    if type(top_k) is not int or not (top_k == -1 or top_k >= 1):
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    return max_new_tokens, temperature, top_p, top_k


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number")
    return float(value)


def _check_lengths(prompt_tokens: int, max_new_tokens: int, limits: Limits) -> None:
    if prompt_tokens == 0:
        raise InvalidRequest("The input is empty.")
    if prompt_tokens > limits.max_req_input_len:
        raise InvalidRequest(
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
            f"({limits.max_req_input_len} tokens). Use a shorter input."
        )
    if prompt_tokens + max_new_tokens >= limits.context_length:
        raise InvalidRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{limits.context_length} tokens. You requested a total of "
            f"{prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the number "
            f"of tokens in the input messages or the completion to fit within the limit."
        )


def finish_reason(
    plan: PlannedOutput, generated: int, max_new_tokens: int
) -> dict[str, Any] | None:
    """SGLang's finish_reason object, or None while the request is unfinished."""
    if generated < len(plan.output_ids):
        return None
    if plan.finish == "stop":
        return {"type": "stop", "matched": plan.matched}
    return {"type": "length", "length": max_new_tokens}


def abort_reason(message: str) -> dict[str, Any]:
    """SGLang's finish_reason object of an aborted request."""
    return {"type": "abort", "message": message, "status_code": 503}


def reply(
    item: GenerateItem,
    output_ids: list[int],
    finish: dict[str, Any] | None,
    *,
    model: ModelProfile,
    cached_tokens: int,
    e2e_latency: float,
) -> dict[str, Any]:
    """One prompt's /generate reply (also one streamed chunk: text and ids are cumulative)."""
    return {
        "text": render_text(output_ids, model),
        "output_ids": output_ids,
        "meta_info": {
            "id": item.rid,
            "finish_reason": finish,
            "prompt_tokens": len(item.input_ids),
            "completion_tokens": len(output_ids),
            "cached_tokens": cached_tokens,
            "e2e_latency": e2e_latency,
        },
    }
