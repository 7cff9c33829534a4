"""Context fit: a request refused because its prompt plus ``max_new_tokens`` exceed the
model's context, sent again once with fewer new tokens (a dataset's
``context_fit: reduce_generation``).

SGLang (0.5.x, tokenizer_manager ``_validate_one_request``) refuses such a request with
HTTP 400 in one of two shapes::

    The input (5916 tokens) is longer than the model's context length (4096 tokens).
    Requested token count exceeds the model's maximum context length of 4096 tokens. You
    requested a total of 5000 tokens: 1000 tokens from the input messages and 4000 tokens
    for the completion. Please reduce ...

The first is the prompt alone (refused when input >= context): no cut helps, and neither
does it for the scheduler's "Input length (N tokens) exceeds the maximum allowed length (M
tokens)". The second is refused when input + max_new_tokens > context (the simulator
refuses at >=), and the scheduler caps max_new_tokens at ``max_req_len - input - 1`` with
``max_req_len <= context - 1`` anyway. So the request is sent again with

    max_new_tokens = context - input - 1

which both accept, when that is at least the dataset's ``context_fit_min_tokens`` (fewer new
tokens would make a reply cut short by design) and below what was asked. ``input`` is the
count the message gives (SGLang's, which includes the tokens a speculative algorithm
reserves), else the ids sent; ``context`` the message's, else the ``context_length`` of the
server's ``/server_info`` or ``/model_info``. A message that says neither, or a text prompt
whose count the message does not give, fails as any 400 does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config import DatasetSpec
from workbench.errors import BadRequest, RequestFailed
from workbench.generate.plan import ServerFacts
from workbench.generate.prompts import Prompt

__all__ = ["ContextRefusal", "context_cut", "fitted_max_new_tokens", "parse_context_refusal",
           "server_context_length"]

_NUMBER = r"(\d[\d,_]*)"
_FLAGS = re.IGNORECASE | re.DOTALL
_INPUT_ALONE = (
    re.compile(rf"input \(\s*{_NUMBER} tokens?\s*\) is longer than the model'?s context length"
               rf"(?: \(\s*{_NUMBER} tokens?\s*\))?", _FLAGS),
    re.compile(rf"input length \(\s*{_NUMBER} tokens?\s*\) exceeds the maximum allowed length",
               _FLAGS),
)
_TOTAL = re.compile(r"requested token count exceeds|tokens? for the completion", _FLAGS)
_CONTEXT = re.compile(rf"maximum context length (?:of|is) {_NUMBER}", _FLAGS)
_PROMPT = re.compile(rf"{_NUMBER} tokens? from the input", _FLAGS)
_COMPLETION = re.compile(rf"{_NUMBER} tokens? for the completion", _FLAGS)
_REQUESTED = re.compile(rf"requested a total of {_NUMBER}", _FLAGS)


@dataclass(frozen=True, slots=True)
class ContextRefusal:
    """What a refusal for length says: the prompt alone is too long (`input_alone`), or the
    prompt plus the new tokens are; each count None when the message does not give it."""

    input_alone: bool
    context_length: int | None = None
    prompt_tokens: int | None = None
    max_new_tokens: int | None = None


def _number(pattern: re.Pattern[str], text: str, group: int = 1) -> int | None:
    found = pattern.search(text)
    if found is None or found.group(group) is None:
        return None
    return int(re.sub(r"[,_]", "", found.group(group)))


def parse_context_refusal(message: str) -> ContextRefusal | None:
    """The refusal `message` (a 400's, possibly wrapped in more text) as a ContextRefusal;
    None when it is no refusal for length."""
    for pattern in _INPUT_ALONE:
        if pattern.search(message):
            context = _number(pattern, message, 2) if pattern.groups > 1 else None
            return ContextRefusal(True, context, _number(pattern, message))
    if not _TOTAL.search(message):
        return None
    prompt, completion = _number(_PROMPT, message), _number(_COMPLETION, message)
    requested = _number(_REQUESTED, message)
    if prompt is None and requested is not None and completion is not None:
        prompt = requested - completion
    return ContextRefusal(False, _number(_CONTEXT, message), prompt, completion)


def server_context_length(server: ServerFacts | None) -> int | None:
    """The model's context length as the server's /server_info or /model_info gives it."""
    if server is None:
        return None
    for info in (server.info, server.model_info):
        value = _positive(info, "context_length")
        if value is not None:
            return value
    return None


def _positive(info: Mapping[str, Any], key: str) -> int | None:
    value = info.get(key)
    return value if type(value) is int and value > 0 else None


def fitted_max_new_tokens(refusal: ContextRefusal | None, *, max_new_tokens: int,
                          min_tokens: int, sent_ids: int | None = None,
                          server_context: int | None = None) -> int | None:
    """The max_new_tokens to send again after `refusal` (see the module docstring), or None
    when no cut helps: the prompt alone is too long, a count is unknown, or what fits is
    under `min_tokens` or not below the `max_new_tokens` asked."""
    if refusal is None or refusal.input_alone:
        return None
    context = refusal.context_length or server_context
    prompt = refusal.prompt_tokens if refusal.prompt_tokens is not None else sent_ids
    if context is None or prompt is None:
        return None
    fitted = context - prompt - 1
    return fitted if min_tokens <= fitted < max_new_tokens else None


def context_cut(spec: DatasetSpec, max_new_tokens: int, prompt: Prompt, error: RequestFailed,
                server: ServerFacts | None) -> int | None:
    """The max_new_tokens to send `prompt` again with after `error`, when the dataset says
    ``context_fit: reduce_generation`` and the error is a refusal a cut helps; else None."""
    if spec.context_fit != "reduce_generation" or not isinstance(error, BadRequest):
        return None
    return fitted_max_new_tokens(
        parse_context_refusal(str(error)), max_new_tokens=max_new_tokens,
        min_tokens=spec.min_generation_tokens(),
        sent_ids=None if prompt.input_ids is None else len(prompt.input_ids),
        server_context=server_context_length(server))
