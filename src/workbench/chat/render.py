"""A conversation's turns as token ids: each turn's prompt rebuilt from the model's replies.

The one rendering of ``turns: each`` that the runner sends, validate checks and the export
writes out: turn k's prompt is the chat template's rendering (generation prompt added, the
row's tool schemas declared) of :func:`~workbench.chat.next_turn`'s history after the model's
turns 0..k-1, each read from its output ids once (:func:`read_reply`). The tokenizer object
is the caller's; nothing here reads a file.

    read_reply      a reply's reasoning, content and tool calls, read with the tokenizer
    render_turn     a history's prompt ids, or Ended ("unrenderable") when the template refuses it
    turn_prompts    every turn's prompt of a conversation from its replies, in one pass
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from workbench.chat.replies import Reply, parse_reply
from workbench.chat.rows import ChatRow
from workbench.chat.turns import Ended, counted_finishes, next_turn
from workbench.profiles import ModelProfile, reasoning_expected
from workbench.tokenizer import decode, encode_messages

__all__ = ["TurnPrompt", "read_reply", "render_turn", "turn_prompts"]

TurnPrompt: TypeAlias = list[int] | Ended  # a turn's prompt ids, or why it cannot be sent


def read_reply(output_ids: Sequence[int], profile: ModelProfile, tokenizer: Any,
               kwargs: Mapping[str, Any]) -> Reply:
    """The model's turn as a client reads it (reasoning expected unless `kwargs` switch
    thinking off)."""
    return parse_reply(output_ids, profile, lambda ids: decode(tokenizer, ids),
                       thinking=reasoning_expected(profile, kwargs))


def render_turn(tokenizer: Any, row: ChatRow, messages: list[dict[str, Any]],
                kwargs: Mapping[str, Any]) -> TurnPrompt:
    """The prompt ids of `messages` (the row's tools declared), or Ended ``unrenderable``
    with the template's message when the chat template refuses them."""
    from jinja2 import TemplateError

    try:
        return encode_messages(tokenizer, messages, kwargs, tools=row.tools)
    except (TemplateError, ValueError, TypeError) as exc:
        return Ended("unrenderable", f"the chat template failed: {exc}")


def turn_prompts(row: ChatRow, outputs: Sequence[Sequence[int]], finishes: Sequence[str | None],
                 profile: ModelProfile, tokenizer: Any, kwargs: Mapping[str, Any],
                 truncated: str | None = None) -> list[TurnPrompt]:
    """The prompts of turns 0..len(outputs): turn k's from the replies `outputs[:k]` (their
    finish reasons `finishes`, read as the dataset's `truncated` says). The list stops at the
    first turn that cannot be sent (its entry the Ended saying why) or at the row's last turn
    (no entry after it)."""
    finishes = counted_finishes(finishes, truncated)
    replies: list[Reply] = []
    prompts: list[TurnPrompt] = []
    for turn in range(len(outputs) + 1):
        if turn:
            replies.append(read_reply(outputs[turn - 1], profile, tokenizer, kwargs))
        history = next_turn(row, replies, finish_reasons=finishes[:turn])
        if history is None:
            break
        prompt = history if isinstance(history, Ended) else render_turn(tokenizer, row,
                                                                         history, kwargs)
        prompts.append(prompt)
        if isinstance(prompt, Ended):
            break
    return prompts
