"""SGLang's /generate request and reply shapes: parsing, validation, reply building.

A request holds `input_ids` (a list of ids, or a list of such lists for a batch) or `text` (a
string, or a list of strings), optional `sampling_params` (one object, or one per prompt),
`rid` (a string, or one per prompt), `stream`, and the logprob keys (`return_logprob`,
`logprob_start_len`, `top_logprobs_num`, `return_text_in_logprobs`). `n` > 1 turns a prompt
into n samples and the reply into a list (`srt/managers/io_struct.py`, GenerateReqInput
`_normalize_batch_inputs`: the prompts repeated n times). Errors come in SGLang's two shapes:
ContractError (`{"error": "<text>"}`, the JSON contract of `sglang/api/v1/api_types.py`) and
InvalidRequest (`{"error": {"message": ...}}`, a ValueError in the tokenizer manager), both
HTTP 400. Unknown top-level keys are ignored; unknown sampling keys are refused.

Over-long inputs are refused with 400 unless `Limits.allow_auto_truncate` (SGLang's
--allow-auto-truncate), which cuts them as SGLang 0.5.23 does, each cut with its warning: the
tokenizer manager (`_validate_one_request`) keeps the first `context_length` tokens of an input
that long or longer, then lowers `max_new_tokens` to `context_length - input` when the two do not
fit together; the scheduler (`validate_input_length`) then keeps the first `max_req_input_len`
tokens of an input that long or longer. The start is kept; `meta_info.prompt_tokens` is the
length kept.

POST /abort_request takes io_struct's `AbortReq`: `rid` (a string, default empty) and
`abort_all` (a boolean, default false); other keys are ignored. A body that does not fit is
FastAPI's validation error, which http_server answers 400 with an `ErrorResponse` (type "Bad
Request"); its message is pydantic's, approximated here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from starlette.responses import Response

from workbench.profiles import ModelProfile
from workbench.sim.completion import LogprobRequest
from workbench.sim.outputs import tokenize_text
from workbench.sim.sampling import ContractError, Sampling, decode_sampling, unexpected, verify

__all__ = [
    "AbortBody",
    "BadAbort",
    "ContractError",
    "GenerateBatch",
    "GenerateItem",
    "InvalidRequest",
    "Limits",
    "abort_reason",
    "contract_error_body",
    "error_body",
    "json_response",
    "parse_abort",
    "parse_generate",
    "validation_error_body",
]


class InvalidRequest(ValueError):
    """A /generate request SGLang would refuse with HTTP 400 `{"error": {"message"}}`."""


class BadAbort(ValueError):
    """An /abort_request body that does not fit `AbortReq` (FastAPI's validation error)."""


class AbortBody(NamedTuple):
    """A parsed /abort_request body."""

    rid: str = ""
    abort_all: bool = False


class Limits(NamedTuple):
    """What the server accepts; `warn` receives the truncation warnings."""

    vocab_size: int
    max_req_input_len: int
    context_length: int
    allow_auto_truncate: bool = False
    warn: Callable[[str], None] | None = None


class GenerateItem(NamedTuple):
    """One sequence of a /generate request (a prompt, or one of its n samples), validated."""

    prompt: list[int] | str
    input_ids: list[int]
    rid: str
    sampling: Sampling = Sampling()
    logprob: LogprobRequest | None = None
    sample: int = 0

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens


class GenerateBatch(NamedTuple):
    """A parsed /generate request: its sequences, whether the reply is a list, whether to stream."""

    items: list[GenerateItem]
    is_batch: bool
    stream: bool


def error_body(message: str) -> dict[str, Any]:
    """SGLang's reply to a ValueError (`http_server._create_error_response`)."""
    return {"error": {"message": message}}


def contract_error_body(message: str) -> dict[str, Any]:
    """SGLang's reply to a body that breaks the JSON contract (`generate_request`)."""
    return {"error": message}


def validation_error_body(message: str) -> dict[str, Any]:
    """http_server's answer to a body FastAPI cannot validate (`ErrorResponse`, HTTP 400)."""
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }


def json_response(content: object, status_code: int = 200) -> Response:
    """A JSON reply encoded with msgspec."""
    return Response(msgspec.json.encode(content), status_code, media_type="application/json")


def parse_generate(body: object, model: ModelProfile, limits: Limits) -> GenerateBatch:
    """Validate a decoded /generate body; ContractError or InvalidRequest say what is wrong."""
    if not isinstance(body, dict):
        raise ContractError(f"invalid type: {unexpected(body)}, expected struct GenerateRequest")
    prompts, is_batch = _prompts(body)
    count = len(prompts)
    sampling = _per_prompt(body.get("sampling_params"), count, is_batch, "sampling_params")
    rids = _per_prompt(body.get("rid"), count, is_batch, "rid")
    stream = body.get("stream", False)
    if not isinstance(stream, bool | None):
        raise ContractError(f"invalid type: {unexpected(stream)}, expected a boolean")
    decoded = [_sampling(params, limits) for params in sampling]
    samples = decoded[0].n
    if any(one.n != samples for one in decoded):
        raise InvalidRequest(
            "The parallel_sample_num should be the same for all samples in sample params."
        )
    logprob = _logprob_request(body)
    items = [
        _item(prompt, params, rid, sample, logprob, model, limits)
        for sample in range(samples)
        for prompt, params, rid in zip(prompts, decoded, rids, strict=True)
    ]
    return GenerateBatch(items, is_batch or samples > 1, bool(stream))


def _prompts(body: dict[str, Any]) -> tuple[list[list[int] | str], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise InvalidRequest("Either text or input_ids should be provided.")
    if isinstance(text, str):
        return [text], False
    if isinstance(text, list) and text and all(isinstance(one, str) for one in text):
        return list(text), True
    if text is not None:
        raise ContractError(
            f"invalid type: {unexpected(text)}, expected a value or an array of values for "
            "StringOrList"
        )
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        return list(input_ids), True
    if isinstance(input_ids, list):
        return [input_ids], False
    raise ContractError(
        f"invalid type: {unexpected(input_ids)}, expected a value or an array of values for "
        "TokenIdsOrList"
    )


def _per_prompt(value: object, count: int, is_batch: bool, name: str) -> list[Any]:
    if is_batch and isinstance(value, list):
        if len(value) != count:
            raise InvalidRequest(f"{name} has {len(value)} entries for {count} prompts")
        return list(value)
    return [value] * count


def _sampling(params: object, limits: Limits) -> Sampling:
    sampling, given = decode_sampling(params)
    try:
        verify(sampling, given, limits.vocab_size)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return sampling


def _logprob_request(body: dict[str, Any]) -> LogprobRequest | None:
    wanted = body.get("return_logprob")
    if isinstance(wanted, list):
        wanted = any(wanted)
    if not wanted:
        return None
    start = _int_key(body, "logprob_start_len", -1)
    top = _int_key(body, "top_logprobs_num", 0)
    return LogprobRequest(start, top, bool(body.get("return_text_in_logprobs")))


def _int_key(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ContractError(f"invalid type: {unexpected(value)}, expected i64")
    return value


def _item(
    prompt: object,
    sampling: Sampling,
    rid: object,
    sample: int,
    logprob: LogprobRequest | None,
    model: ModelProfile,
    limits: Limits,
) -> GenerateItem:
    if isinstance(prompt, str):
        ids = tokenize_text(prompt, model)
        sent: list[int] | str = prompt
    else:
        ids = _token_ids(prompt, limits.vocab_size)
        sent = ids
    if rid is not None and not isinstance(rid, str):
        raise InvalidRequest("rid must be a string (or one string per prompt)")
    if limits.allow_auto_truncate:
        cut, sampling = _auto_truncate(ids, sampling, limits)
        if len(cut) < len(ids):
            ids = cut
            sent = cut
    else:
        _check_lengths(len(ids), sampling.max_new_tokens, limits)
    if logprob is not None and logprob.start >= len(ids):  # the scheduler's check: >=
        raise InvalidRequest(
            f"req.logprob_start_len={logprob.start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len."
        )
    name = rid if isinstance(rid, str) else uuid.uuid4().hex
    if sample:
        name = f"{name}-{sample}"
    return GenerateItem(sent, ids, name, sampling, logprob, sample)


def _token_ids(value: object, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not all(type(token) is int for token in value):
        raise ContractError("invalid type: sequence, expected u32")
    if value and (min(value) < 0 or max(value) >= vocab_size):
        raise InvalidRequest(f"input_ids must be in [0, {vocab_size})")
    return value


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


def _auto_truncate(
    ids: list[int], sampling: Sampling, limits: Limits
) -> tuple[list[int], Sampling]:
    """--allow-auto-truncate: the input and max_new_tokens cut as SGLang cuts them."""
    if not ids:
        raise InvalidRequest("The input is empty.")
    context = limits.context_length
    if len(ids) >= context:
        _warn(
            limits,
            f"The input ({len(ids)} tokens) is longer than the model's context length "
            f"({context} tokens). Truncating the input.",
        )
        ids = ids[:context]
    if len(ids) + sampling.max_new_tokens > context:
        _warn(
            limits,
            f"Requested token count ({len(ids)} input + {sampling.max_new_tokens} new) exceeds "
            f"the model's context length ({context} tokens). Truncating max_new_tokens.",
        )
        room = max(0, context - len(ids))
        sampling = msgspec.structs.replace(
            sampling, max_new_tokens=room, min_new_tokens=min(sampling.min_new_tokens, room)
        )
    if len(ids) >= limits.max_req_input_len:
        _warn(
            limits,
            "Request length is longer than the KV cache pool size or the max context length. "
            f"Truncated. len(req.origin_input_ids)={len(ids)}, "
            f"max_req_input_len={limits.max_req_input_len}.",
        )
        ids = ids[: limits.max_req_input_len]
    return ids, sampling


def _warn(limits: Limits, message: str) -> None:
    if limits.warn is not None:
        limits.warn(message)


def abort_reason(
    message: str, status_code: int | None = 503, err_type: str | None = None
) -> dict[str, Any]:
    """SGLang's finish_reason of an aborted request (schedule_batch `FINISH_ABORT.to_json`)."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


def parse_abort(raw: bytes) -> AbortBody:
    """Validate an /abort_request body; BadAbort says what does not fit."""
    body = _abort_object(raw)
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    if rid is not None and not isinstance(rid, str):
        raise BadAbort(
            _validation_message("string_type", ("rid",), "Input should be a valid string", rid)
        )
    if not isinstance(abort_all, bool):
        raise BadAbort(
            _validation_message(
                "bool_type", ("abort_all",), "Input should be a valid boolean", abort_all
            )
        )
    return AbortBody(rid or "", abort_all)


def _abort_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or BadAbort."""
    if not raw.strip():
        raise BadAbort(_validation_message("missing", (), "Field required", None))
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise BadAbort(_validation_message("json_invalid", (0,), "JSON decode error", {})) from None
    if not isinstance(body, dict):
        raise BadAbort(
            _validation_message("dict_type", (), "Input should be a valid dictionary", body)
        )
    return body


def _validation_message(kind: str, loc: tuple[Any, ...], msg: str, value: object) -> str:
    """FastAPI's `RequestValidationError` text for one error, as http_server joins it."""
    error = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    return f"1 validation error:\n  {error}\n [{error}]"
