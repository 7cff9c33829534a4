"""Which assistant turns of a conversation are generated, and the history each one is sent.

A dataset's ``turns`` says which turns of a row are generated:

    last    one: the row's history (its trailing assistant answers dropped) gets a new answer
    each    every assistant turn of the row in order, plus one when the row ends with a user
            or tool message, each against the model's own earlier turns (on-policy)

With ``turns: each``, turn k replaces the data's k-th assistant message. Its history is the
data's system, user and tool messages with the model's own replies in place of the data's
assistant answers: between model turn k-1 and turn k come the data's non-assistant messages
that followed the data's (k-1)-th assistant message. The tool messages right after it are the
results of its calls, and they answer the model's calls instead: each call takes the first
unpaired result of the same name (a result's name is its ``name``, else that of the data call
its ``tool_call_id`` names, else that of the data call at its position), and the result gets
the model's call id and name. A conversation the data cannot carry on ends with a reason of
END_REASONS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from workbench.chat.replies import Reply, ToolCall, assistant_message
from workbench.chat.rows import ChatRow

__all__ = [
    "END_REASONS",
    "TRUNCATED",
    "Ended",
    "counted_finishes",
    "generation_points",
    "history_digest",
    "last_turn_messages",
    "next_turn",
]

Message = dict[str, Any]

END_REASONS: dict[str, str] = {
    "no_call": "the data answers this turn with tool results but the model called no tool",
    "no_result": "the model called a tool and the data has no result left for it",
    "name_mismatch": "the model called a tool that none of the data's results left is for",
    "more_calls": "the model made more calls than the data has results",
    "fewer_calls": "the model made fewer calls than the data has results",
    "unparseable": "the model's tool-call section could not be read",
    "truncated": "the turn was cut at max_new_tokens",
    "failed": "the turn's request failed for good",
    "unrenderable": "the chat template refused the history holding the model's own turns",
}


TRUNCATED = ("end", "continue")  # what a turn cut at max_new_tokens does to its conversation


def counted_finishes(finishes: Sequence[str | None], truncated: str | None) -> list[str]:
    """The finish reasons `next_turn` reads: as they are when a cut turn ends its
    conversation (``truncated: end``, the default); a cut taken as any other finish with
    ``continue`` (the cut turn stays in the history as it was cut)."""
    if truncated == "continue":
        return ["stop" if f == "length" else (f or "") for f in finishes]
    return [f or "" for f in finishes]


class Ended(NamedTuple):
    """Why a conversation cannot go on: an END_REASONS name and one sentence about this turn."""

    reason: str
    detail: str


class _Segment(NamedTuple):
    """One assistant message of the data and the non-assistant messages after it."""

    answer: Message
    following: list[Message]


def generation_points(row: ChatRow, turns: str) -> int:
    """How many turns the row asks for: 1 for ``last``; for ``each``, one per assistant
    message, plus one when the row ends with a user or tool message."""
    if turns == "last":
        return 1
    answers = sum(1 for message in row.messages if message["role"] == "assistant")
    trailing = bool(row.messages) and row.messages[-1]["role"] in ("user", "tool")
    return answers + int(trailing)


def last_turn_messages(row: ChatRow) -> list[Message]:
    """The history of ``turns: last``: the row without its trailing assistant messages."""
    messages = list(row.messages)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return messages


def next_turn(
    row: ChatRow, replies: Sequence[Reply], *, finish_reasons: Sequence[str] | None = None
) -> list[Message] | Ended | None:
    """The messages to render for turn ``len(replies)`` of ``turns: each``.

    `replies` are the model's turns 0..k-1 and `finish_reasons` their finish reasons. Ended
    when one of them leaves the data unable to go on (cut at max_new_tokens, an unreadable
    call section, calls the data's tool results do not answer); None when the row has no
    turn k.
    """
    if len(replies) >= generation_points(row, "each"):
        return None
    opening, segments = _segments(row.messages)
    history = list(opening)
    for index, reply in enumerate(replies):
        finish = finish_reasons[index] if finish_reasons and index < len(finish_reasons) else None
        ended = _unusable(reply, finish, index)
        if ended is not None:
            return ended
        following = _answer_calls(reply, segments[index])
        if isinstance(following, Ended):
            return following
        history.append(assistant_message(reply))
        history.extend(following)
    return history


def _segments(messages: list[Message]) -> tuple[list[Message], list[_Segment]]:
    """The messages before the first assistant message, and one segment per assistant one."""
    opening: list[Message] = []
    segments: list[_Segment] = []
    for message in messages:
        if message["role"] == "assistant":
            segments.append(_Segment(message, []))
        else:
            (segments[-1].following if segments else opening).append(message)
    return opening, segments


def _unusable(reply: Reply, finish: str | None, index: int) -> Ended | None:
    """Ended when the reply to turn `index` cannot be carried on from, whatever the data."""
    if finish == "length":
        return Ended("truncated", f"turn {index} was cut at max_new_tokens")
    if reply.problem is not None:
        return Ended("unparseable", f"turn {index}: {reply.problem}")
    return None


# --------------------------------------------------------------------------- pairing


def _answer_calls(reply: Reply, segment: _Segment) -> list[Message] | Ended:
    """The data's messages after the reply, its tool results answering the model's calls."""
    following = segment.following
    count = next((i for i, m in enumerate(following) if m["role"] != "tool"), len(following))
    results, rest = following[:count], following[count:]
    calls = reply.tool_calls
    if not calls and not results:
        return list(following)
    names = _result_names(results, segment.answer.get("tool_calls", []))
    if not results:
        return Ended("no_result", f"the model called {calls[0].name} and the data has no "
                                  "result for it")
    if not calls:
        return Ended("no_call", f"the data answers with the result of {_listed(names)} but the "
                                "model called no tool")
    paired = _pair(calls, results, names)
    return paired if isinstance(paired, Ended) else paired + rest


def _pair(calls: Sequence[ToolCall], results: list[Message],
          names: list[str | None]) -> list[Message] | Ended:
    """The results in the order of the calls they answer, each with its call's id and name."""
    free = list(range(len(results)))
    paired: list[Message] = []
    for call in calls:
        match = next((i for i in free if names[i] == call.name), None)
        if match is None:
            if not free:
                return Ended("more_calls", f"the model made {len(calls)} calls and the data "
                                           f"has {len(results)} results")
            left = _listed([names[i] for i in free])
            return Ended("name_mismatch", f"the model called {call.name} and the data's "
                                          f"results left are for {left}")
        free.remove(match)
        paired.append({**results[match], "tool_call_id": call.id, "name": call.name})
    if free:
        left = _listed([names[i] for i in free])
        return Ended("fewer_calls", f"the model made {len(calls)} calls and the data has "
                                    f"{len(results)} results (none for {left})")
    return paired


def _result_names(results: list[Message], data_calls: list[Message]) -> list[str | None]:
    """Each result's tool name: its own, else its data call's by id, else by position."""
    by_id = {call["id"]: call["function"]["name"] for call in data_calls}
    names: list[str | None] = []
    for position, result in enumerate(results):
        name = result.get("name") or by_id.get(result.get("tool_call_id"))
        if name is None and position < len(data_calls):
            name = data_calls[position]["function"]["name"]
        names.append(name)
    return names


def _listed(names: Sequence[str | None]) -> str:
    return ", ".join(name or "an unnamed tool" for name in names)


def history_digest(messages: Sequence[Message], tools: Sequence[Message] | None,
                   kwargs: Mapping[str, Any]) -> str:
    """A short digest of what a server renders a turn from (its messages, tools and chat
    template arguments): the same history gives the same digest, whatever the key order."""
    body = msgspec.json.encode({"messages": messages, "tools": tools, "kwargs": kwargs},
                               order="sorted")
    return hashlib.sha256(body).hexdigest()[:16]
