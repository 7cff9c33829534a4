"""Prompt loading: JSONL or Parquet datasets in four input modes.

Each row holds an id (`DatasetSpec.id_field`, int or str, unique) and one input field named
after the dataset's input mode:

    input_ids      a non-empty list of token ids in [0, vocab_size) of the model profile
    text           a non-empty string, sent as is (the server tokenizes it)
    messages       a conversation in the OpenAI chat layout (tool calls and tool results too)
    conversations  a conversation in the ShareGPT layout ({from, value} items)

A conversation (:mod:`workbench.chat.rows`) is rendered here by the tokenizer's chat template,
with add_generation_prompt=True, the dataset's chat_template_kwargs (e.g. {thinking: true})
and the row's tool schemas (its `DatasetSpec.tools_field`, when present), and the ids are
sent. With ``turns: last`` the prompt is the row without its trailing assistant answers; with
``turns: each`` it is the conversation's first turn (`Prompt.turn` 0), and the row is kept
(`Prompt.chat`) for the runner to build the later turns from the model's own replies.

A bad row raises a DataError naming the file and the line (JSONL) or the row (Parquet, 1-based).
Where the manifest chose what a row must hold (the id field, the input field), the message
also names that key and its line; a conversation that cannot be read names its key path:

    code_instruct.jsonl:1: missing 'id' (datasets[2].id_field: id, params/datasets.yaml:12)
    glaive.jsonl:7: messages[2].tool_calls[0].function.name: expected a string, got null

Ids must stay distinct as text (the export writes ``<dataset>/<id>``): ``1`` and ``"1"`` in
one file are refused like a repeated id.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import msgspec

from workbench.chat import (
    ChatRow,
    RowError,
    history_digest,
    last_turn_messages,
    next_turn,
    parse_conversations,
    parse_messages,
)
from workbench.chat.rows import json_kind
from workbench.config import CHAT_INPUTS, DatasetSpec
from workbench.errors import ConfigError, DataError
from workbench.profiles import ModelProfile
from workbench.tokenizer import encode_messages, load_tokenizer

__all__ = ["Prompt", "estimate_text_tokens", "load_prompts"]

PARQUET_SUFFIXES = (".parquet", ".pq")
MAX_LINE_BYTES = 32 << 20  # far above any prompt; a longer line is not read into memory


class Prompt(msgspec.Struct):
    """One prepared prompt: token ids, or text for the `text` input mode.

    `prompt_tokens` is len(input_ids), or for text an estimate (`estimate_text_tokens`); the
    runner uses it only to send long prompts under the long-prompt concurrency limit. For a
    dataset with ``turns: each``, `chat` is the row's conversation and `turn` the turn the
    prompt asks for (0 here); both are None otherwise. For a chat dataset, `messages` and
    `tools` are the history `input_ids` render (what a server renders for ``render: server``,
    or is asked to render once to compare); `digest` is ``history_digest`` of it for
    ``render: server`` (what prompts.jsonl keeps of it, as the server's ids are kept).
    `mode` is the mode a dataset that mixes modes drew for it (its chat-template arguments
    rendered `input_ids`; its sampling overrides go with the request).
    """

    sample_id: int | str
    input_ids: list[int] | None
    text: str | None
    prompt_tokens: int
    chat: ChatRow | None = None
    turn: int | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    digest: str | None = None  # render: server: history_digest of messages, tools, kwargs
    mode: str | None = None  # a dataset that mixes modes: the mode the prompt drew


class _Row(msgspec.Struct):
    """A decoded row and where it came from, for error messages."""

    path: str
    number: int
    unit: str  # "line" (JSONL) or "row" (Parquet)
    data: Mapping[str, Any]

    def error(self, message: str) -> DataError:
        prefix = f"row {self.number}: " if self.unit == "row" else ""
        return DataError(self.path, prefix + message, self.number)


def estimate_text_tokens(text: str) -> int:
    """A rough token count for text: one token per four UTF-8 bytes, plus one."""
    return len(text.encode()) // 4 + 1


ModeDraw = Callable[[list[int | str]], Mapping[int | str, str]]


def load_prompts(
    spec: DatasetSpec, profile: ModelProfile, *, limit: int | None = None,
    modes: ModeDraw | None = None,
) -> list[Prompt]:
    """The dataset's prompts in file order.

    At most `limit` prompts are read, or `spec.max_samples` when `limit` is None; rows after
    the last one needed are not read. For a dataset that mixes modes, `modes` is given every
    sample id (file order) and says each one's mode, whose chat-template arguments render it.
    """
    limit = spec.max_samples if limit is None else limit
    make = _PromptMaker(spec, profile)
    inputs: list[tuple[int | str, Any, _Row]] = []
    first_seen: dict[str, tuple[int | str, int]] = {}  # id as text -> (id, its line or row)
    for row in itertools.islice(_iter_rows(spec), limit):
        sample_id = _sample_id(row, spec)
        _check_distinct(sample_id, row, spec.id_field, first_seen)
        if spec.input not in row.data:
            raise row.error(f"missing {spec.input!r}{_setting(spec, 'input')}")
        inputs.append((sample_id, make.read(row.data[spec.input], row), row))
    if not inputs and limit != 0:
        raise DataError(spec.path, "no prompts: the file holds no rows")
    drawn = modes([sample_id for sample_id, _, _ in inputs]) if modes is not None else {}
    return [make(sample_id, value, row, drawn.get(sample_id)) for sample_id, value, row in inputs]


def _sample_id(row: _Row, spec: DatasetSpec) -> int | str:
    id_field = spec.id_field
    if id_field not in row.data:
        raise row.error(f"missing {id_field!r}{_setting(spec, 'id_field')}")
    value = row.data[id_field]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise row.error(f"{id_field} must be an int or a string, got {json_kind(value)}"
                        f"{_setting(spec, 'id_field')}")
    return value


def _check_distinct(sample_id: int | str, row: _Row, id_field: str,
                    first_seen: dict[str, tuple[int | str, int]]) -> None:
    """DataError when sample_id repeats an earlier id, or equals one as text (``1`` and
    ``"1"``); else sample_id is remembered in first_seen."""
    text = str(sample_id)
    if text not in first_seen:
        first_seen[text] = (sample_id, row.number)
        return
    first_id, first_number = first_seen[text]
    if first_id == sample_id and type(first_id) is type(sample_id):
        raise row.error(f"duplicate {id_field} {sample_id!r} (first at {row.unit} {first_number})")
    raise row.error(f"{id_field} {sample_id!r} collides with {id_field} {first_id!r} at "
                    f"{row.unit} {first_number} (ids must stay distinct as text)")


def _setting(spec: DatasetSpec, key: str) -> str:
    """`` (datasets[2].id_field: id, params/datasets.yaml:12)``: the manifest key that asked
    for what a row lacks; "" for a spec that no manifest wrote."""
    if spec.origin is None:
        return ""
    return f" ({spec.origin.setting(key, getattr(spec, key))})"


# --------------------------------------------------------------------------- input modes


class _PromptMaker:
    """Turns a row's input field into a Prompt, for the dataset's input mode."""

    def __init__(self, spec: DatasetSpec, profile: ModelProfile) -> None:
        self.mode = spec.input
        self.spec = spec
        self.profile = profile
        self.each_turn = spec.turns == "each"  # None (a spec no manifest wrote): last
        self.server_renders = spec.render == "server"  # the history is sent as messages
        self.tools_field = spec.tools_field
        self.tokenizer: Any = None
        if spec.input in CHAT_INPUTS:
            if spec.tokenizer is None:
                message = f"dataset {spec.name!r} has input {spec.input!r} but no tokenizer"
                raise ConfigError("tokenizer", message)
            self.tokenizer = load_tokenizer(
                spec.tokenizer, trust_remote_code=spec.trust_remote_code
            )

    def read(self, value: Any, row: _Row) -> Any:
        """The row's input checked: a conversation read into a ChatRow, else as it is."""
        if self.mode == "text":
            if not isinstance(value, str) or not value:
                raise row.error(f"text must be a non-empty string, got {json_kind(value)}")
        elif self.mode in CHAT_INPUTS:
            return self._chat_row(value, row)
        else:
            _check_ids(value, row, self.profile, self.mode)
        return value

    def __call__(self, sample_id: int | str, value: Any, row: _Row, mode: str | None) -> Prompt:
        """The prompt of a row's input (as :meth:`read` gives it) in `mode`."""
        if self.mode == "text":
            return Prompt(sample_id, None, value, estimate_text_tokens(value), mode=mode)
        if self.mode in CHAT_INPUTS:
            return self._chat_prompt(sample_id, value, row, mode)
        return Prompt(sample_id, value, None, len(value), mode=mode)

    def _chat_row(self, value: Any, row: _Row) -> ChatRow:
        """The row's conversation and tools; a DataError naming the key path when bad."""
        parse = parse_messages if self.mode == "messages" else parse_conversations
        try:
            return parse(value, row.data.get(self.tools_field), self.mode, self.tools_field)
        except RowError as exc:
            raise row.error(str(exc)) from None

    def _chat_prompt(self, sample_id: int | str, chat: ChatRow, row: _Row,
                     mode: str | None) -> Prompt:
        """The prompt of turns: last (the row's history), or turn 0 of turns: each."""
        history = last_turn_messages(chat) if not self.each_turn else next_turn(chat, [])
        if not isinstance(history, list):
            raise row.error(f"{self.mode}: no turn to generate (turns: each needs an assistant "
                            "message, or a user or tool message last)")
        kwargs = self.spec.template_kwargs(mode)
        ids = self._encode(history, chat.tools, kwargs, row)
        _check_ids(ids, row, self.profile, self.mode)
        server = self.server_renders
        return Prompt(sample_id, ids, None, len(ids),
                      chat=chat if self.each_turn else None, turn=0 if self.each_turn else None,
                      messages=history, tools=chat.tools,
                      digest=history_digest(history, chat.tools, kwargs) if server else None,
                      mode=mode)

    def _encode(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any], row: _Row
    ) -> list[int]:
        from jinja2 import TemplateError

        try:
            return encode_messages(self.tokenizer, messages, kwargs, tools=tools)
        except (TemplateError, ValueError, TypeError) as exc:
            raise row.error(f"the chat template failed: {exc}") from None


def _check_ids(value: Any, row: _Row, profile: ModelProfile, mode: str) -> None:
    """A non-empty list of ints within the profile's vocabulary (C-speed on the good path)."""
    what = "input_ids" if mode == "input_ids" else "the chat template's output"
    if not isinstance(value, list) or not value:
        raise row.error(f"{what} must be a non-empty list of ints, got {json_kind(value)}")
    try:
        msgspec.convert(value, list[int])
        in_range = min(value) >= 0 and max(value) < profile.vocab_size
    except msgspec.ValidationError:
        in_range = False
    if in_range:
        return
    for i, token in enumerate(value):
        if type(token) is not int:
            raise row.error(f"{what}[{i}] must be an int, got {json_kind(token)}")
        if not 0 <= token < profile.vocab_size:
            raise row.error(
                f"{what}[{i}]: token id {token} is outside [0, {profile.vocab_size}) "
                f"of model profile {profile.name!r}"
            )


# --------------------------------------------------------------------------- file readers


def _iter_rows(spec: DatasetSpec) -> Iterator[_Row]:
    if spec.path.endswith(PARQUET_SUFFIXES):
        return _parquet_rows(spec)
    return _jsonl_rows(spec.path)


def _jsonl_rows(path: str) -> Iterator[_Row]:
    """Objects of a JSONL file with their line numbers; blank lines are skipped."""
    with _open(path) as handle:
        number = 0
        while line := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES:
                limit = f"{MAX_LINE_BYTES >> 20} MiB"
                raise DataError(path, f"line longer than {limit}: not a prompt", number)
            if not line.strip():
                continue
            try:
                data = msgspec.json.decode(line)
            except msgspec.DecodeError as exc:
                raise DataError(path, f"invalid JSON: {exc}", number) from None
            if not isinstance(data, dict):
                raise DataError(path, f"expected a JSON object, got {json_kind(data)}", number)
            yield _Row(path, number, "line", data)


def _open(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise DataError(path, f"cannot read the file: {exc.strerror or exc}") from None


def _parquet_rows(spec: DatasetSpec) -> Iterator[_Row]:
    """Rows of the dataset's Parquet file (the id and input columns only, and the tools
    column of a chat input when the file has one), numbered from 1."""
    import pyarrow.parquet as pq

    path = spec.path
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(path, f"cannot read the Parquet file: {exc}") from None
    names = parquet.schema_arrow.names
    columns = {spec.id_field: "id_field", spec.input: "input"}
    for name, key in columns.items():
        if name not in names:
            raise DataError(path, f"missing column {name!r} (columns: {', '.join(names)})"
                                  f"{_setting(spec, key)}")
    if spec.input in CHAT_INPUTS and spec.tools_field in names:
        columns.setdefault(spec.tools_field, "tools_field")
    number = 0
    for batch in parquet.iter_batches(batch_size=1024, columns=list(columns)):
        for data in batch.to_pylist():
            number += 1
            yield _Row(path, number, "row", data)
