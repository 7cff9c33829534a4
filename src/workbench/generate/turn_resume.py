"""What an earlier session left of a ``turns: each`` dataset, and where each conversation goes on.

A conversation's records are its turns 0, 1, ... (``(sample_id, turn)`` unique; the first
record of a pair counts). :func:`read_turn_resume` reads, before anything is written:

- each conversation's finished turns: the records of turns 0..j-1 without a gap (a record
  past a gap, or one that is no finished record, is ``rejected``: put aside and sent again);
- whether it is over: its last turn generated, or its last record says why it ``ended``;
  then it is ``done`` (with the completion tokens of all its turns);
- else where it goes on: the model's replies are read back from their records' output ids
  and the next turn's prompt is built from them, as the session that wrote them would have
  (:class:`~workbench.generate.conversations.Conversations`); the conversation is pending
  from that turn;
- the prompts.jsonl line of every finished turn, kept byte for byte when prompts.jsonl is
  written again; each is compared with the prompt built now (turn 0 from the data file, a
  later turn from the data and the replies before it): a finished turn sent another prompt
  (an edited row, tool result, template argument or tokenizer) is ``changed``.

A record without a turn (a ``turns: last`` session of the same dataset) makes its sample
``changed`` too: the run was made another way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import msgspec

from workbench.chat import Ended, Reply, generation_points
from workbench.config import DatasetSpec
from workbench.generate.conversations import Conversations, TurnRenderer
from workbench.generate.prompts import Prompt
from workbench.generate.resume import (
    DatasetResume,
    TurnResume,
    finished_rows,
    prompt_line,
    same_prompt,
)
from workbench.rundir.layout import DatasetDir
from workbench.rundir.line_index import LineSpan, span_reader
from workbench.rundir.reader import iter_blocks
from workbench.rundir.records import Row, SampleId

__all__ = ["read_turn_resume"]


class _Key(msgspec.Struct, gc=False):
    sample_id: SampleId | None = None
    turn: int | None = None


_KEY = msgspec.json.Decoder(_Key)


def read_turn_resume(folder: DatasetDir, spec: DatasetSpec, prompts: list[Prompt],
                     complete: bool, conversations: Conversations) -> DatasetResume:
    """What `folder` holds of dataset `spec` (module docstring), against this run's turn-0
    `prompts` (`complete`: every row of the data file). OSError when a file cannot be read."""
    state = DatasetResume(turns=TurnResume())
    if not folder.raw_path.is_file():
        return state
    records = _finished_turns(folder.raw_path, state)
    if not records:
        return state
    spans = _prompt_spans(folder.prompts_path) if folder.prompts_path.is_file() else {}
    ids = _output_ids(folder.raw_path, {row.line for rows in records.values() for row in rows})
    renderer = conversations.renderer(spec)
    now = {p.sample_id: p for p in prompts}
    with _reader(folder.prompts_path) as read:
        for sample_id, rows in records.items():
            prompt = now.get(sample_id)
            if prompt is None:
                if complete:
                    state.removed.append(sample_id)
                continue
            _go_on(state, sample_id, prompt, rows, ids, spans, read, renderer, conversations)
    return state


def _finished_turns(path: Path, state: DatasetResume) -> dict[SampleId, list[Row]]:
    """Each conversation's finished records of turns 0..j-1 (no gap); the other lines
    rejected; samples with a record without a turn changed."""
    found: dict[SampleId, dict[int, Row]] = {}
    for row in finished_rows(path, state):
        assert row.sample_id is not None
        if row.turn is None:
            if row.sample_id not in state.changed:
                state.changed.append(row.sample_id)
        else:
            found.setdefault(row.sample_id, {}).setdefault(row.turn, row)
    records: dict[SampleId, list[Row]] = {}
    for sample_id, turns in found.items():
        if sample_id in state.changed:
            continue
        prefix: list[Row] = []
        while len(prefix) in turns:
            prefix.append(turns[len(prefix)])
        state.rejected |= {row.line for k, row in turns.items() if k >= len(prefix)}
        if prefix:
            records[sample_id] = prefix
    return records


def _output_ids(path: Path, lines: set[int]) -> dict[int, list[int]]:
    """The output ids of the records on `lines`."""
    ids: dict[int, list[int]] = {}
    for block in iter_blocks(path, with_output_ids=True):
        for row in block.rows:
            if row.line in lines and row.output_ids is not None:
                ids[row.line] = row.output_ids
    return ids


def _prompt_spans(path: Path) -> dict[tuple[SampleId, int], LineSpan]:
    """Where the first prompts.jsonl line of each (sample_id, turn) is."""
    spans: dict[tuple[SampleId, int], LineSpan] = {}
    offset = 0
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if line.endswith(b"\n"):
                try:
                    key = _KEY.decode(line)
                except msgspec.DecodeError:
                    key = _Key()
                if key.sample_id is not None and key.turn is not None:
                    spans.setdefault((key.sample_id, key.turn), LineSpan(number, offset, len(line)))
            offset += len(line)
    return spans


def _reader(path: Path) -> AbstractContextManager[Callable[[LineSpan], bytes]]:
    """span_reader(path), or for no file a reader of nothing (no span is asked for then)."""
    return span_reader(path) if path.is_file() else contextlib.nullcontext(lambda span: b"")


def _go_on(state: DatasetResume, sample_id: SampleId, prompt: Prompt, rows: list[Row],
           ids: dict[int, list[int]], spans: dict[tuple[SampleId, int], LineSpan],
           read: Callable[[LineSpan], bytes], renderer: TurnRenderer,
           conversations: Conversations) -> None:
    """One conversation with finished turns: its prompts compared, then done or its next
    turn built."""
    assert prompt.chat is not None
    turns = state.turns
    assert turns is not None
    replies: list[Reply] = []
    finishes: list[str] = []
    built: Prompt | None = prompt
    kept: list[LineSpan] = []
    for k, row in enumerate(rows):
        span = spans.get((sample_id, k))
        if span is not None and built is not None:
            if not same_prompt(read(span), prompt_line(built)):
                state.changed.append(sample_id)
                return
            kept.append(span)
        replies.append(renderer.reply(ids.get(row.line, []), prompt.mode))
        finishes.append(row.finish_reason or "stop")
        history = renderer.after(prompt.chat, replies, finishes) if not row.ended else None
        built = _built(renderer, prompt, history, k + 1)
    turns.spans[sample_id] = kept
    turns.turns[sample_id] = len(rows)
    turns.tokens[sample_id] = sum(row.completion_tokens or 0 for row in rows)
    over = built is None or len(rows) >= generation_points(prompt.chat, "each")
    if over:
        state.done[sample_id] = turns.tokens[sample_id]
        return
    assert built is not None
    turns.next[sample_id] = built
    conversations.resume(renderer.spec, sample_id, prompt.chat, replies, finishes)


def _built(renderer: TurnRenderer, first: Prompt,
           history: list[dict[str, Any]] | Ended | None, turn: int) -> Prompt | None:
    """Turn `turn`'s prompt of the conversation whose turn 0 is `first`, from its history;
    None when there is none (the conversation is over) or the template refuses it (as the
    session that wrote the turn before found)."""
    if not isinstance(history, list):
        return None
    assert first.chat is not None
    built = renderer.prompt(first.sample_id, first.chat, history, turn, first.mode)
    return built if isinstance(built, Prompt) else None
