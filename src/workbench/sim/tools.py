"""Tool calls of simulated replies: what a prompt declares, and the call a reply makes.

Reading (`read_prompt`): the prompt ids, in the example tokenizer's chat layout
(`workbench.sim.markers`), declare tools when they hold the system message `tool_declare`.
The word-level tokenizer keeps the words of its JSON and loses most of its punctuation runs
(`{"`, `"}` and the like encode as [UNK]), so the tools are read from the words:

    a tool's name       the word(s) after `name ": "` (the function object's first key)
    its parameters      after the tool's `properties`, each key whose value is an object that
                        starts with `type` (`KEY ": {" type`), JSON Schema's `items` excepted
    a parameter's type  the word after that `type ": "` (string when absent)

The prompt asks for a call when it ends with the generation prompt right after a user
message; after a tool result (a system message named after the tool), or anything else, the
model answers. Text prompts are not read (no call).

Writing (`plan_call`): with tools declared and the user's turn last, a seeded share of the
replies (`rate`: the simulator profile's `tool_call_rate`, or `--tool-call-rate`) call a tool
instead of answering. The call picks the declared tool whose name's words (split at `_`, a
plural `s` ignored; the last word, the subject, counts twice) the last user message holds
most, a seeded one when none; a seeded PARALLEL_SHARE of the replies make two calls (the same
tool twice, or another declared one); a seeded PREFACE_SHARE say a few words first. The call
is written in the model profile's format (`workbench.sim.markers`) and takes the answer's
place (`workbench.sim.outputs.plan_output`): reasoning and the think-end id come first. Arguments are a JSON object over the tool's
parameters with short values: 1-3 words of the example text for strings, a number of its
vocabulary for numbers and integers, true or false, a one-word list, an empty object. The
ids decode (words space-separated, as the example tokenizer decodes) to JSON that
`json.loads` reads, keys and string values with a space on each side:
`{ " location ": " alice was " , " unit ": " down " }`. Kimi's call id decodes to
`functions . NAME : IDX`, IDX counting the calls already in the prompt (the example
vocabulary's numbers stop at 100: later calls are numbered 100). The draws come from the
reply's output seed, apart from the reply's own: a prompt without tools, and a reply that
does not call, is the reply it always was.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from typing import NamedTuple

from workbench.profiles import ModelProfile, ToolMarkers
from workbench.sim.markers import EXAMPLE_LAYOUT, CallFormat, ChatLayout, call_format
from workbench.sim.outputs import corpus, text_run

__all__ = ["PARALLEL_SHARE", "PREFACE_SHARE", "Tool", "ToolPrompt", "plan_call", "read_prompt"]

PARALLEL_SHARE = 0.2
PREFACE_SHARE = 0.3
_SCHEMA_KEYS = frozenset({"items", "properties", "parameters", "function"})


class Tool(NamedTuple):
    """A declared tool: its name's ids and its parameters (key ids, type word)."""

    name: tuple[int, ...]
    parameters: tuple[tuple[tuple[int, ...], str], ...]


class ToolPrompt(NamedTuple):
    """What a prompt says about tools: the declared ones, whether the user spoke last (and
    the words said), and how many calls its history holds."""

    tools: tuple[Tool, ...]
    user_last: bool
    user_words: frozenset[str]
    calls_before: int


class _Vocab(NamedTuple):
    """Ids of the words and punctuation the reading and the writing use."""

    quote: int
    colon_quote: int
    quote_comma: int
    comma: int
    colon: int
    dot: int
    open_brace: int
    close_brace: int
    open_bracket: int
    close_bracket: int
    name: int
    type: int
    properties: int
    tool_declare: int
    functions: int
    parameters: int
    true: int
    false: int
    numbers: tuple[int, ...]
    words: tuple[int, ...]


@functools.cache
def _vocab() -> _Vocab:
    text = corpus()
    get = text.by_token.__getitem__
    numbers = tuple(i for i, token in enumerate(text.tokens) if token.isdigit())
    words = tuple(i for i, token in enumerate(text.tokens) if token.isalpha())
    return _Vocab(
        get('"'), get('":'), get('",'), get(","), get(":"), get("."), get("{"), get("}"),
        get("["), get("]"), get("name"), get("type"), get("properties"), get("tool_declare"),
        get("functions"), get("parameters"), get("true"), get("false"), numbers, words,
    )  # fmt: skip


# ----------------------------------------------------------------------------- reading


def read_prompt(ids: list[int], layout: ChatLayout = EXAMPLE_LAYOUT) -> ToolPrompt | None:
    """The tools a prompt declares and who spoke last, None when it declares none."""
    block = _declaration(ids, layout)
    if block is None:
        return None
    tools = _tools(block)
    if not tools:
        return None
    user = _last_user_message(ids, layout)
    words = frozenset(_token(token) for token in user or ()) - {""}
    return ToolPrompt(tools, user is not None, words, ids.count(layout.call_begin))


def _declaration(ids: list[int], layout: ChatLayout) -> list[int] | None:
    """The ids of the `tool_declare` message's content, None when there is none."""
    declare = _vocab().tool_declare
    at = _find(ids, declare, 1)
    while at < len(ids) - 1:
        if ids[at - 1] == layout.system and ids[at + 1] == layout.middle:
            return ids[at + 2 : _find(ids, layout.end, at + 2)]
        at = _find(ids, declare, at + 1)
    return None


def _find(ids: list[int], token: int, start: int) -> int:
    try:
        return ids.index(token, start)
    except ValueError:
        return len(ids)


def _token(token: int) -> str:
    """A content id's word; an id outside the vocabulary ([UNK], a marker) reads as ""."""
    tokens = corpus().tokens
    return tokens[token] if 0 <= token < len(tokens) else ""


def _opaque(token: int) -> bool:
    """An id the JSON's punctuation became: [UNK], or a run holding a brace."""
    word = _token(token)
    return not word or "{" in word


def _tools(block: list[int]) -> tuple[Tool, ...]:
    """The tools of a declaration: one per `name ": "` key, parameters up to the next."""
    v = _vocab()
    starts = [
        at for at in range(len(block) - 3)
        if block[at] == v.name and block[at + 1] == v.colon_quote and block[at + 2] == v.quote
    ]  # fmt: skip
    tools = []
    for index, at in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(block)
        name = _string_at(block, at + 3)
        if name:
            tools.append(Tool(name, _parameters(block[at:end])))
    return tuple(tools)


def _string_at(block: list[int], at: int) -> tuple[int, ...]:
    """The ids of a JSON string's words from `at` to its closing quote run."""
    v = _vocab()
    out = []
    for token in block[at:]:
        if token in (v.quote, v.quote_comma) or _opaque(token):
            break
        out.append(token)
    return tuple(out)


def _parameters(segment: list[int]) -> tuple[tuple[tuple[int, ...], str], ...]:
    """(key ids, type word) of the keys after `properties` whose value opens with `type`."""
    v = _vocab()
    if v.properties not in segment:
        return ()
    found: dict[tuple[int, ...], str] = {}
    for at in range(segment.index(v.properties) + 1, len(segment) - 2):
        if segment[at] != v.colon_quote or not _opaque(segment[at + 1]):
            continue
        if segment[at + 2] != v.type:
            continue
        key = _key_before(segment, at)
        if key and " ".join(map(_token, key)) not in _SCHEMA_KEYS:
            found.setdefault(key, _type_after(segment, at + 2))
    return tuple(found.items())


def _key_before(segment: list[int], at: int) -> tuple[int, ...]:
    """The words of the key that ends just before `at` (back to its opening quote run)."""
    v = _vocab()
    start = at
    while start > 0:
        token = segment[start - 1]
        if token in (v.quote, v.quote_comma, v.colon_quote) or _opaque(token):
            break
        start -= 1
    return tuple(segment[start:at])


def _type_after(segment: list[int], at: int) -> str:
    """The word after `type ": "` at `at`, "string" when it is not there."""
    v = _vocab()
    if segment[at + 1 : at + 3] == [v.colon_quote, v.quote] and at + 3 < len(segment):
        return _token(segment[at + 3]) or "string"
    return "string"


def _last_user_message(ids: list[int], layout: ChatLayout) -> list[int] | None:
    """The content of the last message when it is the user's and the generation prompt
    follows it; None otherwise."""
    ended = _last(ids, lambda token: token == layout.end, len(ids))
    if ended < 0 or _last(ids, lambda token: token == layout.assistant, len(ids)) < ended:
        return None
    starts = (layout.user, layout.system, layout.assistant)
    start = _last(ids, lambda token: token in starts, ended)
    if start < 0 or ids[start] != layout.user:
        return None
    middle = _find(ids, layout.middle, start)
    return ids[middle + 1 : ended]


def _last(ids: list[int], match: Callable[[int], bool], before: int) -> int:
    """The last position before `before` whose id matches, -1 when none does."""
    return next((at for at in range(before - 1, -1, -1) if match(ids[at])), -1)


# ----------------------------------------------------------------------------- writing


def plan_call(model: ModelProfile, prompt: list[int] | str, seed: int, rate: float
              ) -> list[int] | None:
    """The ids of the tool call that replaces the answer to `prompt`, None when the reply
    answers (module docstring)."""
    calls = call_format(model)
    if calls is None or isinstance(prompt, str) or rate <= 0:
        return None
    read = read_prompt(prompt)
    if read is None or not read.user_last:
        return None
    rng = random.Random(_call_seed(seed))
    if rng.random() >= rate:
        return None
    chosen = _choose(rng, read)
    preface = text_run(rng, rng.randint(3, 12)) if rng.random() < PREFACE_SHARE else []
    arguments = [_arguments(rng, tool) for tool in chosen]
    return preface + _write(calls, chosen, arguments, read.calls_before)


def _call_seed(seed: int) -> int:
    digest = hashlib.blake2b(b"tool-call:%d" % seed, digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _choose(rng: random.Random, read: ToolPrompt) -> list[Tool]:
    """The called tool (by the user's words, else seeded), and a second one for a share."""
    scores = [_score(tool, read.user_words) for tool in read.tools]
    best = max(scores)
    first = read.tools[scores.index(best)] if best > 0 else rng.choice(read.tools)
    if rng.random() >= PARALLEL_SHARE:
        return [first]
    return [first, rng.choice(read.tools) if rng.random() < 0.5 else first]


def _score(tool: Tool, words: frozenset[str]) -> int:
    """How well the user's words name the tool: 2 for the last word of its name (split at
    `_`: the subject, as `weather` of get_weather), 1 for each other word."""
    said = {word.removesuffix("s") for word in words}
    parts = [part for token in tool.name for part in _token(token).split("_") if part]
    return sum(1 + (at == len(parts) - 1) for at, part in enumerate(parts)
               if part.removesuffix("s") in said)


def _arguments(rng: random.Random, tool: Tool) -> list[int]:
    """A JSON object over the tool's parameters: `{ " key ": value , ... }`."""
    v = _vocab()
    out = [v.open_brace]
    for index, (key, kind) in enumerate(tool.parameters):
        if index:
            out.append(v.comma)
        out += [v.quote, *key, v.colon_quote, *_value(rng, kind)]
    return [*out, v.close_brace]


def _value(rng: random.Random, kind: str) -> list[int]:
    """A short JSON value of a JSON Schema type."""
    v = _vocab()
    if kind in ("number", "integer"):
        return [rng.choice(v.numbers)]
    if kind == "boolean":
        return [rng.choice((v.true, v.false))]
    if kind == "array":
        return [v.open_bracket, v.quote, rng.choice(v.words), v.quote, v.close_bracket]
    if kind == "object":
        return [v.open_brace, v.close_brace]
    words = [token for token in text_run(rng, 8) if _token(token).isalpha()]
    return [v.quote, *(words[: rng.randint(1, 3)] or [rng.choice(v.words)]), v.quote]


def _write(calls: CallFormat, tools: list[Tool], arguments: list[list[int]], before: int
           ) -> list[int]:
    """The calls in the model's format."""
    if calls.style == "kimi_k2":
        return _kimi(calls.markers, tools, arguments, before)
    return _qwen(calls.markers, tools, arguments)


def _kimi(markers: ToolMarkers, tools: list[Tool], arguments: list[list[int]], before: int
          ) -> list[int]:
    """`<|tool_calls_section_begin|>`, per call `<|tool_call_begin|> functions . NAME : IDX
    <|tool_call_argument_begin|> {...} <|tool_call_end|>`, `<|tool_calls_section_end|>`."""
    v = _vocab()
    by_token = corpus().by_token
    assert markers.section_begin and markers.section_end and markers.argument_begin
    out = [markers.section_begin]
    for offset, (tool, args) in enumerate(zip(tools, arguments, strict=True)):
        index = by_token.get(str(before + offset), by_token["100"])
        out += [markers.call_begin, v.functions, v.dot, *tool.name, v.colon, index,
                markers.argument_begin, *args, markers.call_end]
    return [*out, markers.section_end]


def _qwen(markers: ToolMarkers, tools: list[Tool], arguments: list[list[int]]) -> list[int]:
    """Per call `<tool_call> { " name ": " NAME ", " parameters ": {...} } </tool_call>`."""
    v = _vocab()
    out: list[int] = []
    for tool, args in zip(tools, arguments, strict=True):
        out += [markers.call_begin, v.open_brace, v.quote, v.name, v.colon_quote, v.quote,
                *tool.name, v.quote_comma, v.quote, v.parameters, v.colon_quote, *args,
                v.close_brace, markers.call_end]
    return out
