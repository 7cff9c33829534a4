"""Each turn's prompt of a conversation regenerated turn by turn, checked against its history.

Turn k of a ``turns: each`` conversation was sent the chat template's rendering of the
history after the model's turns 0..k-1 (:mod:`workbench.chat.render`). This check renders it
again, from the data row (:mod:`workbench.analyze.chat_data`) and the records of turns
0..k-1 (their output ids and finish reasons, each reply read once), with the tokenizer and
chat template arguments run.json names (in a dataset that mixes modes, those of the mode
the conversation's records name over the dataset's), and compares it with the turn's
``input_ids`` in prompts.jsonl. A turn whose ids differ is a ``turn_prompt_mismatch`` (an error): the example
names the sample id and turn and says how they differ (lengths, the first differing position
and the ids there). So is a turn sent although the records before it end the conversation,
and every turn of a conversation the data file no longer holds (the file changed since).

Only the turns whose records and prompts are all there are compared: a conversation is read
up to its first gap (``missing_turn`` says where), and a record without a prompt is an
``orphan_response``. A dataset whose prompts the server rendered (``render: server``) is
not checked (a note says so). The check needs the tokenizer (transformers) and the data file: without
either, the dataset is not checked and :attr:`TurnCheck.note` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from workbench.analyze.chat_data import ChatData, data_path
from workbench.chat.render import TurnPrompt, turn_prompts
from workbench.errors import ConfigError, DataError
from workbench.profiles import ModelProfile
from workbench.rundir.columns import Tally
from workbench.rundir.layout import DatasetDir
from workbench.rundir.line_index import Key, LineSpan, index_keys, span_reader
from workbench.rundir.records import SampleId
from workbench.tokenizer import load_tokenizer

__all__ = ["RULE", "TurnCheck", "check_turn_prompts", "conversations", "describe_difference",
           "is_turns_dataset"]

RULE = "turn_prompt_mismatch"


class TurnCheck(NamedTuple):
    """What the check found in one dataset (`tally`: None when it did not run) and, when it
    could not run, why (`note`); `turns` compared."""

    tally: Tally | None
    note: str | None = None
    turns: int = 0


class _Output(msgspec.Struct):
    output_ids: list[int] | None = None
    finish_reason: str | None = None
    mode: str | None = None


class _Input(msgspec.Struct):
    input_ids: list[int] | None = None


_OUTPUT = msgspec.json.Decoder(_Output)
_INPUT = msgspec.json.Decoder(_Input)


def is_turns_dataset(ds: DatasetDir) -> bool:
    """Whether the dataset's conversations were regenerated turn by turn (run.json)."""
    return ds.settings.get("turns") == "each"


def conversations(keys: dict[Key, LineSpan]) -> dict[SampleId, list[LineSpan]]:
    """Per conversation (in order of its first record), its turns' spans from turn 0 up to
    the first turn missing."""
    turns: dict[SampleId, dict[int, LineSpan]] = {}
    for (sample_id, turn), span in sorted(keys.items(), key=lambda item: item[1].line):
        if turn is not None:
            turns.setdefault(sample_id, {})[turn] = span
    found: dict[SampleId, list[LineSpan]] = {}
    for sample_id, spans in turns.items():
        found[sample_id] = []
        while len(found[sample_id]) in spans:
            found[sample_id].append(spans[len(found[sample_id])])
    return {sample_id: spans for sample_id, spans in found.items() if spans}


def check_turn_prompts(ds: DatasetDir, profile: ModelProfile, max_examples: int) -> TurnCheck:
    """Every turn's prompt of dataset `ds` against its rendering (module docstring); a
    dataset that is not ``turns: each`` is not checked and gets no note."""
    if not is_turns_dataset(ds) or not ds.raw_path.is_file() or not ds.prompts_path.is_file():
        return TurnCheck(None)
    if ds.settings.get("render") == "server":
        return TurnCheck(None, f"{ds.name}: {RULE} not checked: its prompts were rendered by "
                               "the server's chat template (render: server)")
    try:
        tokenizer = _tokenizer(ds)
        data_path(ds)
    except (ConfigError, DataError) as exc:
        return TurnCheck(None, f"{ds.name}: {RULE} not checked: {exc}")
    records = conversations(index_keys(ds.raw_path))
    prompts = index_keys(ds.prompts_path)
    data = ChatData(ds, records)
    tally = Tally(max_examples)
    checked = 0
    with span_reader(ds.raw_path) as read_raw, span_reader(ds.prompts_path) as read_prompt:
        for sample_id, spans in records.items():
            checked += _check_conversation(_Conversation(sample_id, spans, prompts, read_raw,
                                                         read_prompt), data, profile,
                                           tokenizer, ds.template_kwargs, tally)
    return TurnCheck(tally, None, checked)


def _tokenizer(ds: DatasetDir) -> Any:
    """The tokenizer run.json names for the dataset; ConfigError when it names none or it
    cannot be loaded (transformers missing, the directory gone)."""
    path = ds.settings.get("tokenizer")
    if not isinstance(path, str) or not path:
        raise ConfigError("tokenizer", "run.json names no tokenizer for the dataset")
    return load_tokenizer(path, trust_remote_code=ds.settings.get("trust_remote_code") is True)


class _Conversation(NamedTuple):
    """One conversation's records (turns 0..n-1) and where its prompts are."""

    sample_id: SampleId
    spans: list[LineSpan]
    prompts: dict[Key, LineSpan]
    read_raw: Callable[[LineSpan], bytes]
    read_prompt: Callable[[LineSpan], bytes]

    def sent(self, turn: int) -> list[int] | None:
        span = self.prompts.get((self.sample_id, turn))
        if span is None:
            return None
        try:
            return _INPUT.decode(self.read_prompt(span)).input_ids
        except msgspec.MsgspecError:  # a bad line: the prompts.jsonl rules report it
            return None


def _check_conversation(conversation: _Conversation, data: ChatData, profile: ModelProfile,
                        tokenizer: Any, kwargs_of: Callable[[str | None], dict[str, Any]],
                        tally: Tally) -> int:
    """Tally the turns of one conversation whose prompt is not its rendering (with the
    chat-template arguments `kwargs_of` its mode); the turns compared."""
    spans = conversation.spans
    try:
        row = data.row(conversation.sample_id)
    except DataError as exc:
        for span in spans:
            tally.add(RULE, span.line, f"not rebuilt: {exc}")
        return len(spans)
    history = _history(conversation, len(spans) - 1)
    if history is None:
        return 0
    rendered = turn_prompts(row, history.outputs, history.finishes, profile, tokenizer,
                            kwargs_of(history.mode), data.truncated)
    for turn, span in enumerate(spans):
        sent = conversation.sent(turn)
        if sent is not None:
            _compare(rendered, turn, sent, span, tally)
    return len(spans)


class _History(NamedTuple):
    """The output ids and finish reasons of a conversation's first turns, and the mode its
    records name (None outside a dataset that mixes modes)."""

    outputs: list[list[int]]
    finishes: list[str | None]
    mode: str | None


def _history(conversation: _Conversation, count: int) -> _History | None:
    """The first `count` turns' replies and the conversation's mode, from its first
    record's (None when one of those records cannot be read: the record rules report it)."""
    outputs: list[list[int]] = []
    finishes: list[str | None] = []
    mode = None
    for index, span in enumerate(conversation.spans[:max(count, 1)]):
        record = _output(conversation, span)
        if index == 0:
            mode = None if record is None else record.mode
        if index >= count:
            break
        if record is None or record.output_ids is None:
            return None
        outputs.append(record.output_ids)
        finishes.append(record.finish_reason)
    return _History(outputs, finishes, mode)


def _output(conversation: _Conversation, span: LineSpan) -> _Output | None:
    """The record at span (None when it is not one)."""
    try:
        return _OUTPUT.decode(conversation.read_raw(span))
    except msgspec.MsgspecError:
        return None


def _compare(rendered: list[TurnPrompt], turn: int, sent: list[int], span: LineSpan,
             tally: Tally) -> None:
    """Tally turn `turn` when the ids sent are not its rendering."""
    if turn >= len(rendered):
        tally.add(RULE, span.line, "sent, but the data row has no turn this far")
        return
    expected = rendered[turn]
    if isinstance(expected, list):
        if expected != sent:
            tally.add(RULE, span.line, describe_difference(expected, sent))
        return
    tally.add(RULE, span.line, f"sent, but the turns before it end the conversation "
                               f"({expected.reason}: {expected.detail})")


def describe_difference(rendered: list[int], sent: list[int]) -> str:
    """How the ids sent differ from the rendering: lengths, the first differing position."""
    first = next((i for i, (a, b) in enumerate(zip(rendered, sent)) if a != b),
                 min(len(rendered), len(sent)))
    head = f"sent {len(sent):,} ids, the history renders to {len(rendered):,}"
    if first < min(len(rendered), len(sent)):
        return f"{head}; first difference at position {first:,} (sent {sent[first]}, " \
               f"rendered {rendered[first]})"
    return f"{head}; one is the other's prefix (they part at position {first:,})"
