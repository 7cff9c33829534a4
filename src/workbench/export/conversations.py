"""A reply as the assistant turn of a conversation, and whether the chat template gives
back the ids the model saw.

The reasoning is the ids before the first think-end id (a leading think-start id removed),
the content the ids after it; end ids at the end are removed, and newlines around both texts
stripped (chat templates put them back). ``inline`` moves the reasoning into ``content``
between the model's think tags. :func:`renders_exactly` decodes, re-renders and re-encodes a
conversation, as a trainer that applies the template itself will; :func:`default_system`
finds the system prompt a template puts in when the messages have none.
"""

from __future__ import annotations

from typing import Any

from workbench.profiles import ModelProfile

__all__ = ["UNSET", "assistant_turn", "default_system", "inline_reasoning", "render_ids",
           "renders_exactly"]


def assistant_turn(
    output: list[int], profile: ModelProfile, reasoning: bool, tokenizer: Any
) -> dict[str, str]:
    """The assistant message of output ids: reasoning and content split at the think-end id."""
    ends = {*profile.end_ids, *(() if profile.eos_id is None else (profile.eos_id,))}
    ids = list(output)
    while ids and ids[-1] in ends:
        ids.pop()
    thought: list[int] = []
    if reasoning:
        cut = ids.index(profile.think_end) if profile.think_end in ids else len(ids)
        thought, ids = ids[:cut], ids[cut + 1:]
        if thought and thought[0] == profile.think_start:
            thought = thought[1:]

    def text(part: list[int]) -> str:
        return str(tokenizer.decode(part, skip_special_tokens=False)).strip("\n") if part else ""

    return {"role": "assistant", "content": text(ids), "reasoning_content": text(thought)}


def inline_reasoning(turn: dict[str, str], profile: ModelProfile, tokenizer: Any
                      ) -> dict[str, str]:
    """The turn with its reasoning moved into `content` between the model's think tags."""
    if profile.think_start is None or profile.think_end is None:
        return turn
    start, end = tokenizer.convert_ids_to_tokens([profile.think_start, profile.think_end])
    content = f"{start}{turn['reasoning_content']}{end}{turn['content']}"
    return {"role": "assistant", "content": content}


def renders_exactly(tokenizer: Any, conversation: list[Any], tools: list[Any] | None,
                     kwargs: dict[str, Any], ids: list[int]) -> bool:
    """Whether the chat template renders `conversation` back to exactly `ids` (decode,
    re-render, re-encode: what a trainer that applies the template itself will train on)."""
    return render_ids(tokenizer, conversation, tools, kwargs) == ids


def render_ids(tokenizer: Any, messages: list[Any], tools: list[Any] | None,
            kwargs: dict[str, Any], *, generation_prompt: bool = False) -> list[int] | None:
    """The ids of `messages` rendered with the chat template; None when it cannot render them."""
    text = _render_text(tokenizer, messages, tools, kwargs, generation_prompt)
    return None if text is None else list(tokenizer.encode(text, add_special_tokens=False))


def _render_text(tokenizer: Any, messages: list[Any], tools: list[Any] | None,
                 kwargs: dict[str, Any], generation_prompt: bool = False) -> str | None:
    try:
        return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                 add_generation_prompt=generation_prompt,
                                                 **kwargs))
    except Exception:  # noqa: BLE001 (a template that cannot render the row is not exact)
        return None


UNSET = object()

_MARK = "\ufffcsystem\ufffc"


def default_system(tokenizer: Any, messages: list[Any], tools: list[Any] | None,
                    kwargs: dict[str, Any]) -> str | None:
    """The system prompt the chat template puts in when the messages have none (Kimi-K2.5's
    "You are Kimi, ..."), found by rendering a marked system message in its place; None when
    the template puts in none."""
    plain = _render_text(tokenizer, messages, tools, kwargs)
    marked = _render_text(tokenizer, [{"role": "system", "content": _MARK}, *messages], tools,
                          kwargs)
    if plain is None or marked is None or marked.count(_MARK) != 1:
        return None
    head, tail = marked.split(_MARK)
    if len(plain) <= len(head) + len(tail) or not (plain.startswith(head) and plain.endswith(tail)):
        return None
    return plain[len(head): len(plain) - len(tail)]
