"""Conversations regenerated turn by turn (a dataset's ``turns: each``) while a run sends them.

A conversation's turn k is one request: its prompt is the chat template's rendering of the
history the model would see at serving time (:func:`workbench.chat.next_turn`: the data's
user and system messages, the model's own turns 0..k-1, the data's tool results paired with
the model's calls). :class:`Conversations` keeps, per conversation of the run, the model's
replies so far, and after each reply builds what comes next (:meth:`Conversations.follow`):

- the next turn's :class:`~workbench.generate.prompts.Prompt` (sent as soon as this turn's
  record is on disk, ahead of new conversations: turns of one conversation are sequential,
  conversations are many);
- or the reason the conversation ends here (an :data:`~workbench.chat.END_REASONS` name,
  written as the record's ``ended``): a tool call the data cannot answer, a turn cut at
  ``max_new_tokens``, ...;
- or nothing: that was its last turn.

The same functions rebuild a resumed conversation from its records
(:mod:`workbench.generate.turn_resume`), so a turn's prompt is the same bytes whichever
session builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workbench.chat import (
    ChatRow,
    Ended,
    Reply,
    counted_finishes,
    generation_points,
    history_digest,
    next_turn,
)
from workbench.chat.render import read_reply, render_turn
from workbench.config import DatasetSpec
from workbench.generate.prompts import Prompt
from workbench.profiles import ModelProfile
from workbench.rundir.records import SampleId
from workbench.tokenizer import load_tokenizer

__all__ = ["Conversations", "Next", "TurnRenderer"]


class Next(NamedTuple):
    """What follows a turn: the next turn's prompt, or why the conversation ends (`ended`),
    or neither (it was the last turn). `dropped`: the turns the row asked for that will not
    be generated because it ended."""

    prompt: Prompt | None
    ended: str | None = None
    dropped: int = 0


@dataclass(slots=True)
class _State:
    """One conversation of the run: its row and the model's replies to its turns so far."""

    row: ChatRow
    replies: list[Reply] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)


class TurnRenderer:
    """A dataset's turns as token ids: its tokenizer, chat template arguments and profile."""

    def __init__(self, spec: DatasetSpec, profile: ModelProfile) -> None:
        assert spec.tokenizer is not None  # a chat input always has one (load_manifest)
        self.spec = spec
        self.profile = profile
        self.tokenizer: Any = load_tokenizer(spec.tokenizer,
                                             trust_remote_code=spec.trust_remote_code)

    def reply(self, output_ids: Sequence[int], mode: str | None) -> Reply:
        """The model's turn (in the conversation's `mode`) as a client reads it: reasoning,
        content, tool calls."""
        return read_reply(output_ids, self.profile, self.tokenizer,
                          self.spec.template_kwargs(mode))

    def prompt(self, sample_id: SampleId, row: ChatRow, messages: list[dict[str, Any]],
               turn: int, mode: str | None) -> Prompt | Ended:
        """Turn `turn`'s prompt: `messages` through the chat template (tools declared, the
        arguments of the conversation's `mode`), or Ended ``unrenderable`` when the template
        refuses them."""
        kwargs = self.spec.template_kwargs(mode)
        ids = render_turn(self.tokenizer, row, messages, kwargs)
        if isinstance(ids, Ended):
            return ids
        digest = (history_digest(messages, row.tools, kwargs)
                  if self.spec.render == "server" else None)
        return Prompt(sample_id, ids, None, len(ids), chat=row, turn=turn, messages=messages,
                      tools=row.tools, digest=digest, mode=mode)

    def after(self, row: ChatRow, replies: Sequence[Reply],
              finishes: Sequence[str]) -> list[dict[str, Any]] | Ended | None:
        """The history of the turn after `replies` (see :func:`workbench.chat.next_turn`)."""
        return next_turn(row, replies,
                         finish_reasons=counted_finishes(finishes, self.spec.truncated))


class Conversations:
    """The conversations of a run's ``turns: each`` datasets (module docstring)."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        self._renderers: dict[str, TurnRenderer] = {}
        self._states: dict[tuple[str, SampleId], _State] = {}

    def renderer(self, spec: DatasetSpec) -> TurnRenderer:
        """The dataset's renderer (made once)."""
        if spec.name not in self._renderers:
            self._renderers[spec.name] = TurnRenderer(spec, self.profile)
        return self._renderers[spec.name]

    def resume(self, spec: DatasetSpec, sample_id: SampleId, row: ChatRow,
               replies: list[Reply], finishes: list[str]) -> None:
        """A conversation an earlier session started: its replies so far."""
        self._states[spec.name, sample_id] = _State(row, replies, finishes)

    def follow(self, spec: DatasetSpec, prompt: Prompt, output_ids: Sequence[int],
               finish_reason: str) -> Next:
        """After the reply to `prompt` (turn k of its conversation): the next turn, or why
        the conversation ends, or nothing when it was its last turn."""
        assert prompt.chat is not None and prompt.turn is not None
        key = (spec.name, prompt.sample_id)
        state = self._states.setdefault(key, _State(prompt.chat))
        renderer = self.renderer(spec)
        state.replies.append(renderer.reply(output_ids, prompt.mode))
        state.finishes.append(finish_reason)
        history = renderer.after(state.row, state.replies, state.finishes)
        if isinstance(history, list):
            following = renderer.prompt(prompt.sample_id, state.row, history, prompt.turn + 1,
                                        prompt.mode)
            if isinstance(following, Prompt):
                return Next(following)
            history = following
        del self._states[key]
        if history is None:
            return Next(None)
        points = generation_points(state.row, "each")
        return Next(None, history.reason, max(0, points - len(state.replies)))

    def failed(self, spec: DatasetSpec, prompt: Prompt) -> int:
        """Turn `prompt.turn` failed for good: the conversation ends (sent again from that
        turn on resume). Returns the turns it will not generate in this run."""
        assert prompt.chat is not None and prompt.turn is not None
        self._states.pop((spec.name, prompt.sample_id), None)
        return max(0, generation_points(prompt.chat, "each") - prompt.turn)
