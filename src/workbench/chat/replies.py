"""The model's own turn read from its output ids: reasoning, answer and tool calls.

A reply is split at the id level, never on decoded text, with the ids of the model profile:

    [think_start] REASONING think_end ANSWER [TOOL CALLS] end_id ...

The reasoning is the ids before the profile's think-end id (a leading think-start dropped).
With a reasoning profile, thinking on and no think-end id, the whole output is reasoning and
the answer is empty (the reasoning never closed). Everything from the first end id
(`end_ids`, `eos_id`) on is not part of the reply. The tool calls are read in the profile's
format (`ModelProfile.tool_markers`, named after SGLang's tool-call parsers):

    kimi_k2   CONTENT <|tool_calls_section_begin|>
                (<|tool_call_begin|> functions.NAME:INDEX <|tool_call_argument_begin|>
                 ARGUMENTS <|tool_call_end|>)*
              <|tool_calls_section_end|>
    qwen25    CONTENT (<tool_call> {"name": ..., "arguments": {...}} </tool_call>)*

Each part is decoded by the caller's `decode` (special tokens skipped) and stripped. A kimi_k2
call keeps the id the model wrote (whitespace removed) and its arguments as written (not
parsed, as SGLang's parser keeps them); a qwen25 call is numbered ``call_K`` and its arguments
object dumped to JSON. A call section that cannot be read sets `Reply.problem` (``"tool call
2: no <|tool_call_end|>"``) and keeps the calls read before it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from workbench.profiles import TOOL_MARKER_TEXT, ModelProfile, ToolMarkers

__all__ = ["Reply", "ToolCall", "assistant_message", "parse_reply"]

Decode = Callable[[list[int]], str]

KIMI_CALL_ID = re.compile(r"functions\.(?P<name>.+):(?P<index>\d+)")


class ToolCall(NamedTuple):
    """One call the model made: its id, the function's name, the arguments as JSON text."""

    id: str
    name: str
    arguments: str


class Reply(NamedTuple):
    """The model's turn: `reasoning` (None: the reply has no reasoning part), the answer's
    `content`, its `tool_calls`, and what could not be read of the calls (or None)."""

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    problem: str | None


class _Calls(NamedTuple):
    """What a format's reader found in an answer: the content's ids, the calls, a problem."""

    content_ids: list[int]
    calls: list[ToolCall]
    problem: str | None


def parse_reply(
    output_ids: Sequence[int],
    profile: ModelProfile,
    decode: Decode,
    *,
    thinking: bool = True,
) -> Reply:
    """The turn `output_ids` hold, read with the profile's ids and the tokenizer's `decode`."""
    ids = _until_end(list(output_ids), profile)
    reasoning_ids, answer = _split_reasoning(ids, profile, thinking)
    reasoning = None if reasoning_ids is None else decode(reasoning_ids).strip()
    if answer is None:
        return Reply(reasoning, "", (), None)
    markers = profile.tool_markers
    found = _Calls(answer, [], None) if markers is None else _read_calls(answer, markers, decode)
    content = decode(found.content_ids).strip()
    return Reply(reasoning, content, tuple(found.calls), found.problem)


def assistant_message(reply: Reply) -> dict[str, Any]:
    """The reply as an OpenAI assistant message, as the chat template takes it back."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in reply.tool_calls
        ]
    return message


# --------------------------------------------------------------------------- reasoning


def _until_end(ids: list[int], profile: ModelProfile) -> list[int]:
    """The ids before the first end id."""
    ends = set(profile.end_ids)
    if profile.eos_id is not None:
        ends.add(profile.eos_id)
    cut = next((i for i, token in enumerate(ids) if token in ends), len(ids))
    return ids[:cut]


def _split_reasoning(
    ids: list[int], profile: ModelProfile, thinking: bool
) -> tuple[list[int] | None, list[int] | None]:
    """(reasoning ids or None, answer ids or None for a reasoning that never closed)."""
    if profile.think_end is not None and profile.think_end in ids:
        cut = ids.index(profile.think_end)
        return _drop_think_start(ids[:cut], profile), ids[cut + 1 :]
    if profile.is_reasoning and thinking:
        return _drop_think_start(ids, profile), None
    return None, ids


def _drop_think_start(ids: list[int], profile: ModelProfile) -> list[int]:
    return ids[1:] if ids and ids[0] == profile.think_start else ids


# --------------------------------------------------------------------------- tool calls


def _read_calls(answer: list[int], markers: ToolMarkers, decode: Decode) -> _Calls:
    """The answer's content and calls in the markers' format."""
    names = TOOL_MARKER_TEXT[markers.format]
    if markers.section_begin is None:  # qwen25: the calls follow the content
        start = _index(answer, markers.call_begin)
        if start is None:
            return _Calls(answer, [], None)
        calls, problem = _read_region(answer[start:], markers, decode)
        return _Calls(answer[:start], calls, problem)
    start = _index(answer, markers.section_begin)
    if start is None:
        stray = next((i for i, token in enumerate(answer) if token in _marker_ids(markers)), None)
        if stray is None:
            return _Calls(answer, [], None)
        return _Calls(answer[:stray], [], f"a tool-call marker outside a {names['section_begin']}"
                                         " section")
    section = answer[start + 1 :]
    end = _index(section, markers.section_end)
    calls, problem = _read_region(section if end is None else section[:end], markers, decode)
    if problem is None and end is None:
        problem = f"the tool-call section has no {names['section_end']}"
    return _Calls(answer[:start], calls, problem)


def _read_region(
    region: list[int], markers: ToolMarkers, decode: Decode
) -> tuple[list[ToolCall], str | None]:
    """The calls of a region of consecutive ``call_begin ... call_end`` spans, and the problem
    that stopped the reading (or None)."""
    names = TOOL_MARKER_TEXT[markers.format]
    calls: list[ToolCall] = []
    position = 0
    while position < len(region):
        number = len(calls) + 1
        begin = _index(region, markers.call_begin, position)
        if begin is None:
            if _is_text(region[position:], markers, decode):
                return calls, f"tool call {number}: no {names['call_begin']}"
            break
        if _is_text(region[position:begin], markers, decode):
            return calls, f"tool call {number}: text before {names['call_begin']}"
        end = _index(region, markers.call_end, begin + 1)
        following = _index(region, markers.call_begin, begin + 1)
        if end is None or (following is not None and following < end):
            return calls, f"tool call {number}: no {names['call_end']}"
        call = _read_call(region[begin + 1 : end], len(calls), markers, decode)
        if isinstance(call, str):
            return calls, f"tool call {number}: {call}"
        calls.append(call)
        position = end + 1
    return calls, None


def _read_call(
    span: list[int], index: int, markers: ToolMarkers, decode: Decode
) -> ToolCall | str:
    """One call from the ids between its markers, or what is wrong with it."""
    if markers.format == "qwen25":
        return _qwen_call(decode(span).strip(), index)
    assert markers.argument_begin is not None  # a kimi_k2 profile names it
    cut = _index(span, markers.argument_begin)
    if cut is None:
        return f"no {TOOL_MARKER_TEXT['kimi_k2']['argument_begin']}"
    call_id = "".join(decode(span[:cut]).split())
    match = KIMI_CALL_ID.fullmatch(call_id)
    if match is None:
        return f"id {call_id!r} is not functions.NAME:INDEX"
    return ToolCall(call_id, match["name"], decode(span[cut + 1 :]).strip())


def _qwen_call(text: str, index: int) -> ToolCall | str:
    """A qwen25 call from its JSON text (``parameters`` read like ``arguments``, as SGLang)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    if isinstance(data, dict):  # keys as written, or spaced as a word-level tokenizer decodes
        data = {str(key).strip(): value for key, value in data.items()}
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return "not an object with a string 'name'"
    arguments = data.get("arguments", data.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{index}", data["name"].strip(), arguments)


def _index(ids: list[int], token: int | None, start: int = 0) -> int | None:
    """The first position of `token` in ids from `start`, or None."""
    if token is None:
        return None
    try:
        return ids.index(token, start)
    except ValueError:
        return None


def _is_text(ids: list[int], markers: ToolMarkers, decode: Decode) -> bool:
    """Whether ids hold more than whitespace: text or a marker."""
    if not ids:
        return False
    return bool(set(ids) & _marker_ids(markers)) or bool(decode(ids).strip())


def _marker_ids(markers: ToolMarkers) -> set[int]:
    ids = (markers.call_begin, markers.call_end, markers.section_begin, markers.section_end,
           markers.argument_begin)
    return {token for token in ids if token is not None}
