"""A dataset of conversations regenerated turn by turn (``turns: each``) exported as
conversations: one row per conversation, every generated assistant turn in it.

A row is the conversation as the model lived it: the data's system and user messages, the
model's own assistant turns (reasoning, content and tool calls as
:func:`~workbench.chat.assistant_message` gives them) and the data's tool results paired
with its calls, exactly the history :func:`~workbench.chat.next_turn` built for the last
turn, then the last turn's assistant message::

    {"id": "<dataset>/<sample_id>", "turns": N, "dataset"[, "mode"], "conversations"[, "tools"]}

`turns` is the number of assistant turns in it; `mode` the mode the conversation drew (a
dataset that mixes modes: its records name it), whose chat-template arguments over the
dataset's read its replies and render it. The conversation's records are planned in
one pass (:func:`plan_threads`): each record gets the verdict of the single-turn export (the
drop rules; ``truncated`` unless ``keep_truncated``), and a conversation is written up to
its first turn dropped or missing, the turns after it counted as ``earlier_turn_dropped``; a
conversation whose turn 0 is dropped writes no row. The limit and the shuffle count
conversations.

The data row is read where run.json says (:class:`~workbench.analyze.chat_data.ChatData`);
a row that is gone, or whose history no longer renders to the last turn's prompt as sent,
is a DataError naming the data file (it changed since the run; a run whose prompts the server
rendered, ``render: server``, is not compared). As in the single-turn
format, the system prompt the chat template put in is written out when the messages have
none, `reasoning` says where the reasoning goes (``reasoning_content``, or inline between
the think tags, in every assistant turn alike; ``auto``: the first that renders back to
the generated ids), and the summary counts the rows that do (``exact``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from workbench.analyze.chat_data import CHANGED, ChatData
from workbench.chat import ChatRow, Reply, assistant_message, counted_finishes, next_turn
from workbench.chat.render import read_reply, render_turn
from workbench.errors import DataError
from workbench.export.conversations import render_ids
from workbench.export.options import SampleId
from workbench.export.sinks import ThreadLine
from workbench.export.sources import READ_BLOCK_BYTES, Lines, Source, trim_prompt_suffix
from workbench.rundir.reader import iter_blocks, parse_lines
from workbench.rundir.records import Row

__all__ = ["EARLIER_DROPPED", "Thread", "ThreadWriter", "plan_threads",
           "thread_records"]

EARLIER_DROPPED = "earlier_turn_dropped"


class Thread(NamedTuple):
    """One conversation to write: its sample id and the raw lines of its turns 0..n-1."""

    sample_id: SampleId
    lines: list[int]


def plan_threads(source: Source) -> list[Thread]:
    """The conversations of the source's raw file to write, in the order of their first
    record; the records left out counted in `source.stats` by reason."""
    kept: dict[SampleId, dict[int, int]] = {}
    for block in iter_blocks(source.ds.raw_path, with_output_ids=True,
                             block_bytes=READ_BLOCK_BYTES):
        source.count_problems(block.problems)
        for row, reason in zip(block.rows, source.verdicts(block.rows), strict=True):
            if reason is None and row.turn is None:
                reason = "missing_field"
            if row.sample_id is not None:
                turns = kept.setdefault(row.sample_id, {})
                if reason is None:
                    assert row.turn is not None
                    turns[row.turn] = row.line
            if reason is not None:
                source.stats.drop(reason)
    return [thread for sample_id, turns in kept.items()
            if (thread := _thread(source, sample_id, turns)) is not None]


def _thread(source: Source, sample_id: SampleId, turns: dict[int, int]) -> Thread | None:
    """The conversation's turns from 0 up to its first turn not kept (the later ones
    counted as dropped); None when turn 0 is not kept."""
    count = 0
    while count in turns:
        count += 1
    if len(turns) > count:
        source.stats.drop(EARLIER_DROPPED, len(turns) - count)
    return Thread(sample_id, [turns[turn] for turn in range(count)]) if count else None


def thread_records(threads: Sequence[Thread]) -> int:
    """The records the conversations hold."""
    return sum(len(thread.lines) for thread in threads)


class _Turn(NamedTuple):
    """One turn of a conversation: its prompt as sent, its reply's ids, its finish, and the
    mode its record names."""

    prompt: list[int]
    output: list[int]
    finish: str
    mode: str | None = None


class ThreadWriter:
    """Renders the planned conversations of one source as rows."""

    def __init__(self, source: Source, threads: Sequence[Thread]) -> None:
        self.source = source
        self.threads = list(threads)
        self.data = ChatData(source.ds, [thread.sample_id for thread in threads])
        self.tokenizer: Any = source.tokenizer
        self._lines = Lines(source.ds.raw_path)
        self._tags = _think_tags(source, self.tokenizer)

    def close(self) -> None:
        self._lines.close()

    def write(self, index: int) -> ThreadLine:
        """The row of the conversation `threads[index]` (with its mode's chat-template
        arguments)."""
        thread = self.threads[index]
        turns = [self._turn(thread.sample_id, line) for line in thread.lines]
        mode = turns[0].mode
        kwargs = self.source.ds.template_kwargs(mode)
        row = self.data.row(thread.sample_id)
        replies = [read_reply(turn.output, self.source.profile, self.tokenizer, kwargs)
                   for turn in turns]
        history = self._history(thread.sample_id, row, replies, turns, kwargs)
        history = self.source.with_seen_system(history, row.tools, turns[-1].prompt, mode)
        messages = self._carried([*history, assistant_message(replies[-1])],
                                 row.tools, turns[-1].prompt + turns[-1].output, kwargs)
        return ThreadLine(id=f"{self.source.name}/{thread.sample_id}", turns=len(turns),
                          dataset=self.source.name, mode=mode, conversations=messages,
                          tools=row.tools)

    def _turn(self, sample_id: SampleId, line: int) -> _Turn:
        rows, _ = parse_lines(self._lines.read(line), first_line=line, with_output_ids=True)
        record: Row = rows[0]
        assert record.output_ids is not None and record.turn is not None
        prompt = self.source.prompts.get((sample_id, record.turn)).input_ids or []
        output = trim_prompt_suffix(prompt, record.output_ids, record.completion_tokens)
        if len(output) != len(record.output_ids):
            self.source.stats.trimmed += 1
        return _Turn(prompt, output, record.finish_reason or "", record.mode)

    def _history(self, sample_id: SampleId, row: ChatRow, replies: list[Reply],
                 turns: list[_Turn], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The history of the last turn; DataError when the data row no longer gives back
        the prompt it was sent."""
        last = len(turns) - 1
        finishes = counted_finishes([t.finish for t in turns[:last]], self.data.truncated)
        history = next_turn(row, replies[:last], finish_reasons=finishes)
        ids = (render_turn(self.tokenizer, row, history, kwargs)
               if isinstance(history, list) else None)
        server = self.source.ds.settings.get("render") == "server"  # its template, not ours
        if not isinstance(history, list) or (ids != turns[-1].prompt and not server):
            raise DataError(self.data.path, f"sample_id {sample_id!r} turn {last}: the row "
                                            f"no longer renders to the prompt sent: {CHANGED} "
                                            "(workbench validate compares every turn)")
        return history

    def _carried(self, messages: list[dict[str, Any]], tools: list[Any] | None,
                 ids: list[int], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages with the reasoning where the options put it (auto: the first way
        that renders back to `ids`, else the field); exact rows counted."""
        inline = [_inline(message, self._tags) for message in messages]
        carries = {"field": [messages], "inline": [inline]}
        choices = carries.get(self.source.options.reasoning) or [messages, inline]
        for choice in choices:
            if render_ids(self.tokenizer, choice, tools, kwargs) == ids:
                self.source.stats.exact = (self.source.stats.exact or 0) + 1
                return choice
        return choices[0]


def _think_tags(source: Source, tokenizer: Any) -> tuple[str, str] | None:
    """The model's think-start and think-end tags as text (None without them)."""
    profile = source.profile
    if profile.think_start is None or profile.think_end is None:
        return None
    start, end = tokenizer.convert_ids_to_tokens([profile.think_start, profile.think_end])
    return str(start), str(end)


def _inline(message: dict[str, Any], tags: tuple[str, str] | None) -> dict[str, Any]:
    """An assistant message with its reasoning in `content` between the think tags."""
    if tags is None or message.get("role") != "assistant" or "reasoning_content" not in message:
        return message
    inline = {key: value for key, value in message.items() if key != "reasoning_content"}
    inline["content"] = f"{tags[0]}{message['reasoning_content']}{tags[1]}{message['content']}"
    return inline
