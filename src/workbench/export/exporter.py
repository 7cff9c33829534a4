"""Training-ready export of a run: exact token ids with a loss mask, or conversations.

Formats (one row per exported record; `id` is ``"<dataset>/<sample_id>"``, unique across the
datasets of a run):

    tokens          {"id", "dataset", "input_ids", "loss_mask"}: the prepared prompt's ids
                    followed by the record's output_ids; loss_mask is 0 over the prompt and 1
                    over the output (the layout vLLM speculators' regeneration writes).
                    JSONL (.jsonl) or Parquet (.parquet, .pq: input_ids list<int32>,
                    loss_mask list<int8>, one row group per 1,024 rows).
    conversations   {"id", "dataset", "conversations"[, "tools"]}: the source file's messages
                    (and tools, when the prompt was rendered with them) and an assistant turn {"role", "content", "reasoning_content"}
                    split at the model profile's think-end id and decoded with the dataset's
                    tokenizer (for trainers that apply the chat template themselves). JSONL
                    only, from datasets whose input is ``messages`` in a JSONL source file.
    --for TRAINER   tokens rows as that trainer reads them, {"input_ids", "loss_mask"} only,
                    JSONL only, with a manifest beside the file (trainers.py).

`tokens` is exact: the ids are the ones the server saw and produced. When ``len(output_ids)``
exceeds ``completion_tokens`` by k and the first k output ids repeat the prompt's last k ids
(some SGLang versions prepend a prompt suffix), those k ids are dropped from the output.
Text prompts (input ``text``) are tokenized with the dataset's tokenizer as SGLang does
(``tokenizer.encode(text)``); a record whose ``prompt_tokens`` disagrees is dropped as
``prompt_tokens_mismatch``. The tokenizer is ``ExportOptions.tokenizer``, else the one the
run's manifest (run.json ``manifest_file``) names for the dataset.

Conversations: the reasoning is the ids before the first think-end id (a leading think-start
id removed), the content the ids after it; end ids at the end are removed, and newlines
around both texts stripped (chat templates put them back). Without a think-end id a reply
of a thinking dataset is all reasoning (cut short); with thinking off, all content.
Replies cut at max_new_tokens are dropped (``truncated``) unless ``keep_truncated``. When the
messages have no system message and the chat template put in a default one (Kimi-K2.5's), it
is written out, so a trainer renders the prompt the model saw. Each row is rendered back with
the chat template and the generation's ``chat_template_kwargs``; the summary counts the rows
that give back the generated ids (``exact``), and ``reasoning`` says where the reasoning goes.

Records dropped, by reason (the summary counts each record once, under the first):

    parse_error, torn_line       unreadable lines
    missing_field                no sample_id or no output_ids
    duplicate_sample_id          a sample_id seen before in the file (the first is kept)
    orphan_response              no prepared prompt for the sample_id
    <rule>                       a rule of ``ExportOptions.drop`` (validate.RECORD_RULES, e.g.
                                 truncated, reasoning_unclosed, empty_answer), in that order
    prompt_tokens_mismatch       a text prompt that tokenizes to another length
    limit                        beyond ``limit`` rows of the dataset: in file order, the
                                 records after the limit (not checked further); shuffled, the
                                 kept records not drawn

Memory stays bounded: records stream in blocks; prompts and source messages are read back by
byte offset; a shuffle permutes an index of (dataset, line) pairs, not rows. The output is
written to a temporary file in the target's directory and renamed at the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias

import msgspec
import numpy as np

from workbench.analyze.validate import (
    RECORD_RULES,
    DatasetDir,
    RecordChecker,
    RunInfo,
    load_run,
    paused_gc,
    reasoning_expected,
)
from workbench.config import DatasetSpec, load_manifest
from workbench.errors import ConfigError, DataError, WorkbenchError
from workbench.export.trainers import (
    TRAINERS,
    RowEntry,
    Trainer,
    TrainerReport,
    row_digest,
    trainer_report,
    write_manifest,
)
from workbench.profiles import ModelProfile
from workbench.rundir.records import (
    ERRORS_FILE,
    MANIFEST_FILE,
    PROMPTS_FILE,
    RAW_FILE,
    LineProblem,
    PromptRecord,
    Row,
    iter_blocks,
    parse_lines,
)

__all__ = [
    "DROP_REASONS",
    "DatasetExport",
    "ExportFormat",
    "ExportOptions",
    "ExportSummary",
    "export_run",
    "format_summary",
]

ExportFormat: TypeAlias = Literal["tokens", "conversations"]
ReasoningCarry: TypeAlias = Literal["auto", "field", "inline"]
SampleId: TypeAlias = int | str

DROP_REASONS: tuple[str, ...] = (
    "parse_error", "torn_line", "missing_field", "duplicate_sample_id", "orphan_response",
    *(rule for rule in RECORD_RULES if rule != "missing_field"),
    "prompt_tokens_mismatch", "limit",
)
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")
ROW_GROUP_ROWS = 1024
READ_BLOCK_BYTES = 1 << 20
_PROBLEM_REASONS = {"malformed": "parse_error", "not_object": "parse_error", "torn": "torn_line"}


class ExportOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What to export; the CLI flags map one to one onto these fields.

    `drop`: ids of validate.RECORD_RULES whose failing records are left out ("truncated"
    for --drop-truncated). `limit`: rows per dataset at most. `shuffle`: mix the rows of all
    datasets in an order drawn from `seed`. `tokenizer` overrides the manifest's (text
    prompts, conversations); `trust_remote_code` lets it run the directory's own code.
    `trainer` (--for): write the rows that trainer reads plus a manifest (trainers.py);
    `max_length`: count the rows it would cut instead of proposing one that fits.
    `reasoning`: conversations carry the reasoning as `reasoning_content` ("field"), in
    `content` between the model's think tags ("inline"), or per row the first of these two
    whose rendering with the chat template gives back the generated ids, else "field"
    ("auto"); `keep_truncated` keeps replies cut at max_new_tokens in conversations.
    """

    format: ExportFormat = "tokens"
    only: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    model_profile: str | None = None
    tokenizer: str | None = None
    trust_remote_code: bool = False
    trainer: str | None = None
    max_length: int | None = None
    reasoning: ReasoningCarry = "auto"
    keep_truncated: bool = False

    def drop_rules(self) -> tuple[str, ...]:
        """The rules whose failing records are left out: conversations also leave out
        truncated replies (they cannot be a finished turn) unless `keep_truncated`."""
        if self.format == "conversations" and not self.keep_truncated:
            return tuple(dict.fromkeys((*self.drop, "truncated")))
        return self.drop


class DatasetExport(msgspec.Struct):
    """Rows written and records dropped (by reason) for one dataset; `trimmed` counts
    outputs whose prepended prompt-suffix ids were removed; `exact` (conversations) the rows
    whose re-rendering with the tokenizer's chat template gives back the generated ids."""

    written: int = 0
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    trimmed: int = 0
    exact: int | None = None

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


class ExportSummary(msgspec.Struct):
    path: str
    format: ExportFormat
    rows: int
    seconds: float
    datasets: dict[str, DatasetExport]
    trainer: TrainerReport | None = None

    def to_builtins(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


# --- output rows and sinks -------------------------------------------------------------------


class _TokensLine(msgspec.Struct):
    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]


class _ConversationLine(msgspec.Struct, omit_defaults=True):
    id: str
    dataset: str
    conversations: list[Any]
    tools: list[Any] | None = None


class _Tokens(NamedTuple):
    id: str
    dataset: str
    prompt_ids: list[int]
    output_ids: list[int]


_Out: TypeAlias = _Tokens | _ConversationLine


class _Sink(Protocol):
    def write(self, row: Any) -> None: ...
    def close(self) -> None: ...


class _JsonlSink:
    """Rows as JSON lines; a tokens row gets its input_ids and loss_mask built here."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in close)
        self._encode = msgspec.json.Encoder().encode

    def write(self, row: _Out) -> None:
        line: _TokensLine | _ConversationLine
        if isinstance(row, _Tokens):
            prompt, output = row.prompt_ids, row.output_ids
            line = _TokensLine(row.id, row.dataset, prompt + output,
                               [0] * len(prompt) + [1] * len(output))
        else:
            line = row
        self._file.write(self._encode(line) + b"\n")

    def close(self) -> None:
        self._file.close()


class _TrainerSink(_JsonlSink):
    """Rows as a trainer reads them ({input_ids, loss_mask} only); each row's id, lengths
    and digest go to `entries` (row number = position) for the manifest."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entries: list[RowEntry] = []

    def write(self, row: _Out) -> None:
        assert isinstance(row, _Tokens)
        ids = row.prompt_ids + row.output_ids
        line = _TrainerLine(ids, [0] * len(row.prompt_ids) + [1] * len(row.output_ids))
        self._file.write(self._encode(line) + b"\n")
        self.entries.append(RowEntry(row.id, row.dataset, len(row.prompt_ids), len(ids),
                                     row_digest(ids)))


class _TrainerLine(msgspec.Struct):
    input_ids: list[int]
    loss_mask: list[int]


class _ParquetSink:
    """Tokens rows in Parquet row groups of ROW_GROUP_ROWS rows (zstd-compressed)."""

    def __init__(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self._schema = pa.schema([("id", pa.string()), ("dataset", pa.string()),
                                  ("input_ids", pa.list_(pa.int32())),
                                  ("loss_mask", pa.list_(pa.int8()))])
        self._writer = pq.ParquetWriter(  # ids: zstd; dictionaries only where values repeat
            path, self._schema, compression="zstd",
            use_dictionary=["dataset", "loss_mask.list.element"])
        self._rows: list[_Tokens] = []

    def write(self, row: _Out) -> None:
        assert isinstance(row, _Tokens)
        self._rows.append(row)
        if len(self._rows) >= ROW_GROUP_ROWS:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        pa = self._pa
        prompt = np.fromiter((len(r.prompt_ids) for r in rows), dtype=np.int64, count=len(rows))
        output = np.fromiter((len(r.output_ids) for r in rows), dtype=np.int64, count=len(rows))
        offsets = pa.array(np.concatenate([[0], np.cumsum(prompt + output)]).astype(np.int32))
        flat: list[int] = []
        for r in rows:
            flat.extend(r.prompt_ids)
            flat.extend(r.output_ids)
        ids = pa.array(np.fromiter(flat, dtype=np.int32, count=len(flat)))
        mask = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), len(rows)),
                         np.column_stack([prompt, output]).ravel())
        table = pa.Table.from_arrays(
            [pa.array([r.id for r in rows]), pa.array([r.dataset for r in rows]),
             pa.ListArray.from_arrays(offsets, ids),
             pa.ListArray.from_arrays(offsets, pa.array(mask))],
            schema=self._schema)
        self._writer.write_table(table, row_group_size=len(rows))


def _sink_factory(target: Path, fmt: ExportFormat,
                  trainer: str | None = None) -> Callable[[Path], _Sink]:
    suffix = target.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _TrainerSink if trainer else _JsonlSink
    if suffix in PARQUET_SUFFIXES:
        if trainer:
            raise ConfigError("--to", f"{trainer}'s file loader reads JSON/JSONL only, not "
                                      f"Parquet: write {target.with_suffix('.jsonl').name}")
        if fmt == "conversations":
            raise ConfigError("--to", "the conversations format writes JSONL (.jsonl); "
                                      "Parquet is for the tokens format")
        return _ParquetSink
    known = ", ".join((*JSONL_SUFFIXES, *PARQUET_SUFFIXES))
    raise ConfigError("--to", f"unknown file type {suffix or '(none)'!r} of {target} "
                              f"(known: {known})")


@contextlib.contextmanager
def _atomic_sink(target: Path, options: ExportOptions) -> Iterator[_Sink]:
    """A sink on a temporary file next to target, renamed over it only on success."""
    make = _sink_factory(target, options.format, options.trainer)
    if not target.parent.is_dir():
        raise ConfigError("--to", f"directory not found: {target.parent}")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    sink = make(tmp)
    try:
        yield sink
        sink.close()
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(Exception):
            sink.close()
        tmp.unlink(missing_ok=True)


# --- reading lines back by offset ------------------------------------------------------------


def _line_starts(path: Path) -> np.ndarray:
    """Byte offsets where each line starts, then the end of the file (line n is the bytes
    from entry n - 1 to entry n; a last line without newline counts)."""
    parts = [np.zeros(1, dtype=np.int64)]
    offset = 0
    with open(path, "rb") as file:
        while data := file.read(8 << 20):
            newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
            parts.append(newlines.astype(np.int64) + (offset + 1))
            offset += len(data)
    starts = np.concatenate(parts)
    return starts if starts[-1] == offset else np.append(starts, offset)


class _Lines:
    """Whole lines of a file read back by 1-based line number (pread, no shared position)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._starts = _line_starts(path)
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def read(self, line: int) -> bytes:
        start, end = int(self._starts[line - 1]), int(self._starts[line])
        return os.pread(self._fd, end - start, start)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_PROMPT_DECODER = msgspec.json.Decoder(PromptRecord)


class _Prompts:
    """prompts.jsonl indexed by sample_id; each prompt is read back when its record is."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(path, "not found: the export needs the prepared prompts "
                                  "that `workbench generate` writes next to the records")
        self.path = path
        self.line_of = _index_prompts(path)
        self._lines = _Lines(path)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.line_of

    def get(self, sample_id: SampleId) -> PromptRecord:
        line = self.line_of[sample_id]
        try:
            prompt = _PROMPT_DECODER.decode(self._lines.read(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DataError(self.path, f"bad prompt: {exc}", line) from None
        if not prompt.input_ids and not prompt.text:
            raise DataError(self.path, "prompt has neither input_ids nor text", line)
        return prompt

    def close(self) -> None:
        self._lines.close()


def _index_prompts(path: Path) -> dict[SampleId, int]:
    """sample_id -> line of prompts.jsonl; DataError for a bad line or a repeated id."""
    line_of: dict[SampleId, int] = {}
    for block in iter_blocks(path):
        problem = min(block.problems, key=lambda p: p.line, default=None)
        for row in block.rows:
            if problem is not None and problem.line <= row.line:
                break
            if row.sample_id is None:
                raise DataError(path, "missing sample_id", row.line)
            first = line_of.setdefault(row.sample_id, row.line)
            if first != row.line:
                raise DataError(path, f"duplicate sample_id {row.sample_id!r} "
                                      f"(first at line {first})", row.line)
        if problem is not None:
            raise DataError(path, f"{problem.kind} line: {problem.detail}", problem.line)
    return line_of


class _Messages:
    """A JSONL source file's `messages` by sample id, read back by line."""

    def __init__(self, path: Path, id_field: str) -> None:
        self.path = path
        id_line = msgspec.defstruct("_IdLine", [(id_field, int | str | None, None)])
        decoder = msgspec.json.Decoder(id_line)
        self.line_of: dict[SampleId, int] = {}
        with open(path, "rb") as file:
            for number, text in enumerate(file, start=1):
                if text.strip():
                    self._index(decoder, text, number, id_field)
        self._lines = _Lines(path)

    def _index(self, decoder: Any, text: bytes, number: int, id_field: str) -> None:
        try:
            sample_id = getattr(decoder.decode(text), id_field)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DataError(self.path, f"bad line: {exc}", number) from None
        if sample_id is not None:
            self.line_of.setdefault(sample_id, number)

    def get(self, sample_id: SampleId) -> tuple[list[Any], list[Any] | None] | None:
        """The row's messages and its `tools` (None when it has none)."""
        line = self.line_of.get(sample_id)
        if line is None:
            return None
        data = msgspec.json.decode(self._lines.read(line))
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise DataError(self.path, "messages must be a list of objects", line)
        tools = data.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise DataError(self.path, "tools must be a list", line)
        return messages, tools

    def close(self) -> None:
        self._lines.close()


# --- one dataset -----------------------------------------------------------------------------


class _Source:
    """One dataset being exported: its prompts, filters, tokenizer and counters."""

    def __init__(self, run: RunInfo, ds: DatasetDir, profile: ModelProfile,
                 options: ExportOptions) -> None:
        if not ds.raw_path.is_file():
            reason = "not a regular file" if ds.raw_path.exists() else "not found"
            raise DataError(ds.raw_path, f"{reason}: the dataset has no records")
        self.run = run
        self.ds = ds
        self.name = ds.name
        self.profile = profile
        self.options = options
        self.reasoning = reasoning_expected(profile, ds.chat_template_kwargs)
        self.checker = RecordChecker(profile, reasoning=self.reasoning)
        self.drop = options.drop_rules()
        self.stats = DatasetExport()
        self.seen: set[SampleId] = set()
        self.tokenizer: Any = None
        self.messages: _Messages | None = None
        self.default_system: str | None | object = _UNSET
        self.prompts = _Prompts(ds.prompts_path)

    def close(self) -> None:
        self.prompts.close()
        if self.messages is not None:
            self.messages.close()

    def count_problems(self, problems: Sequence[LineProblem]) -> None:
        for problem in problems:
            reason = _PROBLEM_REASONS.get(problem.kind)
            if reason is not None:
                self.stats.drop(reason)

    def verdicts(self, rows: Sequence[Row]) -> list[str | None]:
        """Per row: the reason it is dropped, or None when it is kept."""
        failures = self.checker.check_rows(rows) if self.drop else None
        return [self._verdict(row, failures[i] if failures else ())
                for i, row in enumerate(rows)]

    def _verdict(self, row: Row, problems: Sequence[tuple[str, str]]) -> str | None:
        if row.sample_id is None or row.output_ids is None:
            return "missing_field"
        if row.sample_id in self.seen:
            return "duplicate_sample_id"
        self.seen.add(row.sample_id)
        if row.sample_id not in self.prompts:
            return "orphan_response"
        failed = {rule for rule, _ in problems}
        return next((rule for rule in self.drop if rule in failed), None)

    def render(self, row: Row) -> _Out | str:
        """The output row of a kept record, or the reason it is dropped after all."""
        assert row.sample_id is not None and row.output_ids is not None
        row_id = f"{self.name}/{row.sample_id}"
        prompt = self.prompts.get(row.sample_id)
        if self.options.format == "conversations":
            output = self._output(prompt.input_ids or [], row)
            return self._conversation(row_id, row.sample_id, prompt.input_ids or [], output)
        prompt_ids = self._prompt_ids(prompt, row)
        if prompt_ids is None:
            return "prompt_tokens_mismatch"
        return _Tokens(row_id, self.name, prompt_ids, self._output(prompt_ids, row))

    def _prompt_ids(self, prompt: PromptRecord, row: Row) -> list[int] | None:
        """The prompt's ids (text tokenized), None when they disagree with prompt_tokens."""
        if prompt.input_ids:
            return prompt.input_ids
        ids = list(self._tokenizer().encode(prompt.text))
        if row.prompt_tokens is not None and len(ids) != row.prompt_tokens:
            return None
        return ids

    def _output(self, prompt_ids: list[int], row: Row) -> list[int]:
        assert row.output_ids is not None
        output = _trim_prompt_suffix(prompt_ids, row.output_ids, row.completion_tokens)
        if len(output) != len(row.output_ids):
            self.stats.trimmed += 1
        return output

    def _conversation(self, row_id: str, sample_id: SampleId, prompt_ids: list[int],
                      output: list[int]) -> _Out:
        assert self.messages is not None
        source = self.messages.get(sample_id)
        if source is None:
            raise DataError(self.messages.path, f"no row with sample id {sample_id!r} "
                                                f"(prompt of {row_id})")
        messages, tools = source
        tokenizer = self._tokenizer()
        if tools and _render(tokenizer, messages, tools, self.ds.chat_template_kwargs,
                             generation_prompt=True) != prompt_ids:
            tools = None  # the prompt was rendered without them: the model never saw them
        messages = self._with_seen_system(messages, tools, prompt_ids)
        field = _assistant_turn(output, self.profile, self.reasoning, tokenizer)
        carries = {"field": [field], "inline": [_inline_reasoning(field, self.profile, tokenizer)]}
        turns = carries.get(self.options.reasoning) or carries["field"] + carries["inline"]
        for turn in turns:
            conversation = [*messages, turn]
            if _renders_exactly(tokenizer, conversation, tools, self.ds.chat_template_kwargs,
                                prompt_ids + output):
                self.stats.exact = (self.stats.exact or 0) + 1
                return _ConversationLine(row_id, self.name, conversation, tools)
        return _ConversationLine(row_id, self.name, [*messages, turns[0]], tools)

    def _with_seen_system(self, messages: list[Any], tools: list[Any] | None,
                          prompt_ids: list[int]) -> list[Any]:
        """The messages with the system prompt the template put in when they had none, when
        that gives back the prompt's ids: the model saw it, and a trainer would otherwise put
        in its own."""
        if messages and messages[0].get("role") == "system":
            return messages
        if self.default_system is _UNSET:
            self.default_system = _default_system(self._tokenizer(), messages, tools,
                                                  self.ds.chat_template_kwargs)
        if not isinstance(self.default_system, str):
            return messages
        explicit = [{"role": "system", "content": self.default_system}, *messages]
        rendered = _render(self._tokenizer(), explicit, tools, self.ds.chat_template_kwargs,
                           generation_prompt=True)
        return explicit if rendered == prompt_ids else messages

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            self.tokenizer = _load_dataset_tokenizer(self.ds, self.run, self.options)
        return self.tokenizer

    def prepare(self) -> None:
        """Load what the format needs (messages, tokenizer) before any row is written."""
        if self.options.format == "conversations":
            self.messages = _open_messages(self.ds, self.run)
            self._tokenizer()
            self.stats.exact = 0
        elif self.ds.settings.get("input") == "text":
            self._tokenizer()


def _trim_prompt_suffix(prompt: list[int], output: list[int], completion: int | None) -> list[int]:
    """output without the k leading ids that repeat the prompt's last k ids, when
    len(output) exceeds completion by exactly such a k; else output unchanged."""
    if completion is None:
        return output
    extra = len(output) - completion
    if 0 < extra <= len(prompt) and output[:extra] == prompt[-extra:]:
        return output[extra:]
    return output


def _assistant_turn(
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


def _inline_reasoning(turn: dict[str, str], profile: ModelProfile, tokenizer: Any
                      ) -> dict[str, str]:
    """The turn with its reasoning moved into `content` between the model's think tags."""
    if profile.think_start is None or profile.think_end is None:
        return turn
    start, end = tokenizer.convert_ids_to_tokens([profile.think_start, profile.think_end])
    content = f"{start}{turn['reasoning_content']}{end}{turn['content']}"
    return {"role": "assistant", "content": content}


def _renders_exactly(tokenizer: Any, conversation: list[Any], tools: list[Any] | None,
                     kwargs: dict[str, Any], ids: list[int]) -> bool:
    """Whether the chat template renders `conversation` back to exactly `ids` (decode,
    re-render, re-encode: what a trainer that applies the template itself will train on)."""
    return _render(tokenizer, conversation, tools, kwargs) == ids


def _render(tokenizer: Any, messages: list[Any], tools: list[Any] | None,
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


_UNSET = object()
_MARK = "\ufffcsystem\ufffc"


def _default_system(tokenizer: Any, messages: list[Any], tools: list[Any] | None,
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


# --- tokenizers and source messages ----------------------------------------------------------


def _manifest_spec(run: RunInfo, name: str) -> DatasetSpec:
    """The dataset's spec in the run's manifest; ConfigError saying why it is unavailable."""
    source = run.manifest.get("manifest_file")
    if not isinstance(source, str):
        raise ConfigError("tokenizer", f"dataset {name}: run.json names no manifest_file; "
                                       "pass a tokenizer directory (--tokenizer)")
    try:
        return load_manifest(source).dataset(name)
    except (ConfigError, DataError) as exc:
        raise ConfigError("tokenizer", f"dataset {name}: the run's manifest cannot be used "
                                       f"({exc}); pass a tokenizer directory (--tokenizer)") from None


def _load_dataset_tokenizer(ds: DatasetDir, run: RunInfo, options: ExportOptions) -> Any:
    from workbench.generate.prompts import load_tokenizer

    if options.tokenizer is not None:
        return load_tokenizer(options.tokenizer, trust_remote_code=options.trust_remote_code)
    spec = _manifest_spec(run, ds.name)
    if spec.tokenizer is None:
        raise ConfigError("tokenizer", f"dataset {ds.name}: its manifest names no tokenizer; "
                                       "pass a tokenizer directory (--tokenizer)")
    trust = spec.trust_remote_code or options.trust_remote_code
    return load_tokenizer(spec.tokenizer, trust_remote_code=trust)


def _open_messages(ds: DatasetDir, run: RunInfo) -> _Messages:
    """The dataset's source messages (path from run.json, id field from the manifest when it
    loads, else sample_id); ConfigError unless its input mode is messages."""
    mode = ds.settings.get("input")
    if mode != "messages":
        raise ConfigError("--format", f"dataset {ds.name} has input {mode!r}: the "
                                      "conversations format needs input 'messages' "
                                      "(leave it out with --only, or export tokens)")
    path, id_field = ds.settings.get("path"), "sample_id"
    with contextlib.suppress(ConfigError):
        spec = _manifest_spec(run, ds.name)
        path, id_field = spec.path, spec.id_field
    if not isinstance(path, str) or not Path(path).is_file():
        raise DataError(path or ds.name, "source file not found: it holds the messages")
    if path.lower().endswith((".parquet", ".pq")):
        raise ConfigError("--format", f"dataset {ds.name}: conversations from a Parquet "
                                      "source are not supported; convert it to JSONL")
    return _Messages(Path(path), id_field)


def _open_source(run: RunInfo, ds: DatasetDir, profile: ModelProfile,
                 options: ExportOptions) -> _Source:
    """A dataset ready to export: everything it needs is checked before any row is written."""
    source = _Source(run, ds, profile, options)
    try:
        source.prepare()
    except BaseException:
        source.close()
        raise
    return source


# --- the two orders --------------------------------------------------------------------------


def _export_in_order(sources: Sequence[_Source], sink: _Sink, limit: int | None) -> None:
    """Each dataset in file order, up to limit rows; the rest counted, not checked."""
    for source in sources:
        blocks = iter_blocks(source.ds.raw_path, with_output_ids=True, block_bytes=READ_BLOCK_BYTES)
        for block in blocks:
            source.count_problems(block.problems)
            for row, reason in zip(block.rows, source.verdicts(block.rows), strict=True):
                if limit is not None and source.stats.written >= limit:
                    source.stats.drop("limit")
                elif reason is None:
                    _emit(source, row, sink)
                else:
                    source.stats.drop(reason)
            if limit is not None and source.stats.written >= limit:
                _count_rest(source, block.end_offset, block.first_line + block.lines)
                break


def _emit(source: _Source, row: Row, sink: _Sink) -> None:
    result = source.render(row)
    if isinstance(result, str):
        source.stats.drop(result)
    else:
        sink.write(result)
        source.stats.written += 1


def _count_rest(source: _Source, offset: int, first_line: int) -> None:
    """Count the records after offset as dropped by the limit (fast scan, no ids)."""
    for block in iter_blocks(source.ds.raw_path, offset=offset, first_line=first_line):
        source.count_problems(block.problems)
        if block.rows:
            source.stats.drop("limit", len(block.rows))


def _export_shuffled(
    sources: Sequence[_Source], sink: _Sink, limit: int | None, seed: int
) -> None:
    """All datasets mixed in an order drawn from seed; limit draws rows per dataset."""
    rng = np.random.default_rng(seed)
    picks = []
    for index, source in enumerate(sources):
        kept = _kept_lines(source)
        if limit is not None and len(kept) > limit:
            source.stats.drop("limit", len(kept) - limit)
            kept = rng.permutation(kept)[:limit]
        picks.append(np.column_stack([np.full(len(kept), index, dtype=np.int64), kept]))
    order = np.concatenate(picks) if picks else np.zeros((0, 2), dtype=np.int64)
    order = order[rng.permutation(len(order))]
    lines = [_Lines(source.ds.raw_path) for source in sources]
    try:
        for index, line in order.tolist():
            rows, _ = parse_lines(lines[index].read(line), first_line=line, with_output_ids=True)
            _emit(sources[index], rows[0], sink)
    finally:
        for reader in lines:
            reader.close()


def _kept_lines(source: _Source) -> np.ndarray:
    """Line numbers of the records that pass the filters, in file order."""
    kept: list[int] = []
    for block in iter_blocks(source.ds.raw_path, with_output_ids=True,
                             block_bytes=READ_BLOCK_BYTES):
        source.count_problems(block.problems)
        for row, reason in zip(block.rows, source.verdicts(block.rows), strict=True):
            if reason is None:
                kept.append(row.line)
            else:
                source.stats.drop(reason)
    return np.array(kept, dtype=np.int64)


# --- entry point -----------------------------------------------------------------------------


def _check_options(options: ExportOptions) -> None:
    if options.format not in ("tokens", "conversations"):
        raise ConfigError("--format", f"unknown format {options.format!r} "
                                      "(known: tokens, conversations)")
    unknown = [rule for rule in options.drop if rule not in RECORD_RULES]
    if unknown:
        raise ConfigError("--drop", f"unknown rule {unknown[0]!r} "
                                    f"(known: {', '.join(RECORD_RULES)})")
    if options.limit is not None and options.limit < 1:
        raise ConfigError("--limit", f"expected a number of at least 1, got {options.limit}")
    if options.reasoning not in ("auto", "field", "inline"):
        raise ConfigError("--reasoning", f"unknown value {options.reasoning!r} "
                                         "(known: auto, field, inline)")
    _check_trainer_options(options)


def _check_trainer_options(options: ExportOptions) -> None:
    if options.trainer is None:
        if options.max_length is not None:
            raise ConfigError("--max-length", "goes with --for specforge|speculators")
        return
    if options.trainer not in TRAINERS:
        raise ConfigError("--for", f"unknown trainer {options.trainer!r} "
                                   f"(known: {', '.join(TRAINERS)})")
    if options.format != "tokens":
        raise ConfigError("--format", f"--for {options.trainer} writes token rows; the "
                                      "conversations format is re-rendered by the trainer "
                                      "and is not exact (leave --format out)")
    if options.max_length is not None and options.max_length < 1:
        raise ConfigError("--max-length", f"expected a number of at least 1, "
                                          f"got {options.max_length}")


def export_run(
    out: str | os.PathLike[str], to: str | os.PathLike[str],
    options: ExportOptions | None = None,
) -> ExportSummary:
    """Export run directory `out` to file `to` (format and filters in the module docstring).

    ConfigError for bad options or a missing tokenizer, DataError for bad run files
    (missing prompts.jsonl, bad lines); nothing is written at `to` unless the export ends.
    """
    options = options or ExportOptions()
    started = time.perf_counter()
    _check_options(options)
    target = Path(to)
    _sink_factory(target, options.format, options.trainer)
    run = load_run(out, options.only)
    _check_target_outside(target, run)
    profile = run.profile(options.model_profile)
    with contextlib.ExitStack() as stack:
        sources: list[_Source] = []
        for ds in run.datasets:
            sources.append(_open_source(run, ds, profile, options))
            stack.callback(sources[-1].close)
        sink = _write(sources, target, options)
    report = None
    if isinstance(sink, _TrainerSink) and options.trainer is not None:
        report = _trainer_outputs(TRAINERS[options.trainer], target, sink.entries, run,
                                  sources, options)
    rows = sum(source.stats.written for source in sources)
    return ExportSummary(str(target), options.format, rows, time.perf_counter() - started,
                         {source.name: source.stats for source in sources}, report)


def _trainer_outputs(trainer: Trainer, target: Path, entries: list[RowEntry], run: RunInfo,
                     sources: Sequence[_Source], options: ExportOptions) -> TrainerReport:
    """The trainer's length figures and command; the manifest written beside the file."""
    model = _model_facts(run)
    names = [source.name for source in sources]
    tokenizer = options.tokenizer or _manifest_tokenizer(run, names)
    report = trainer_report(trainer, target, entries, names, options.max_length,
                            tokenizer or str(model.get("model_path") or "MODEL"))
    datasets = {source.name: _dataset_facts(source) for source in sources}
    write_manifest(target, report, entries, model, datasets)
    return report


def _model_facts(run: RunInfo) -> dict[str, Any]:
    """The model as run.json records it (path, profile, server version)."""
    info = run.manifest.get("server_info")
    info = info if isinstance(info, dict) else {}
    return {"model_path": info.get("model_path"), "model_profile": run.profile_name,
            "server_version": info.get("version"), "server_url": run.manifest.get("server_url")}


def _manifest_tokenizer(run: RunInfo, names: Sequence[str]) -> str | None:
    """The tokenizer directory the run's manifest names for its datasets, when one is named."""
    for name in names:
        with contextlib.suppress(ConfigError):
            tokenizer = _manifest_spec(run, name).tokenizer
            if tokenizer:
                return str(tokenizer)
    return None


def _dataset_facts(source: _Source) -> dict[str, Any]:
    """What the generation of one dataset used: input mode, source, template arguments,
    sampling (the prompts are rendered without a `tools` argument: tool schemas travel in
    the messages)."""
    settings = source.ds.settings
    return {"rows": source.stats.written, "dropped": dict(source.stats.dropped),
            "input": settings.get("input"), "source": settings.get("path"),
            "chat_template_kwargs": source.ds.chat_template_kwargs,
            "sampling": settings.get("sampling")}


def _check_target_outside(target: Path, run: RunInfo) -> None:
    """ConfigError when target would replace a file the run wrote (or sit in a dataset folder)."""
    where, root = target.resolve(), run.out.resolve()
    names = (MANIFEST_FILE, RAW_FILE, PROMPTS_FILE, ERRORS_FILE)
    in_dataset = where.parent != root and any((where.parent / name).exists() for name in names)
    if where.is_relative_to(root) and (where.name in names or in_dataset):
        raise ConfigError("--to", f"{target} would replace or join the run's own files; "
                                  "write the export outside the dataset folders")


def _write(sources: Sequence[_Source], target: Path, options: ExportOptions) -> _Sink:
    try:
        with _atomic_sink(target, options) as sink, paused_gc():
            if options.shuffle:
                _export_shuffled(sources, sink, options.limit, options.seed)
            else:
                _export_in_order(sources, sink, options.limit)
        return sink
    except WorkbenchError:
        raise
    except OSError as exc:
        raise DataError(exc.filename or target, f"cannot read or write: {exc.strerror or exc}") from None


def format_summary(summary: ExportSummary) -> str:
    """The summary as lines of text for a terminal."""
    rate = summary.rows / summary.seconds if summary.seconds > 0 else 0.0
    head = (f"wrote {summary.rows:,} {summary.format} rows to {summary.path} "
            f"in {summary.seconds:.1f}s ({rate:,.0f} rows/s)")
    lines = [head]
    for name, ds in summary.datasets.items():
        dropped = ", ".join(f"{reason} {count:,}" for reason, count in
                            sorted(ds.dropped.items(), key=lambda item: _reason_order(item[0])))
        trimmed = f"; {ds.trimmed:,} outputs lost prepended prompt ids" if ds.trimmed else ""
        exact = ("" if ds.exact is None else
                 f"; {ds.exact:,} of {ds.written:,} re-render to the generated ids")
        lines.append(f"  {name}: {ds.written:,} written; dropped: {dropped or 'none'}"
                     f"{trimmed}{exact}")
    if summary.trainer is not None:
        lines += _trainer_lines(summary.trainer)
    elif Path(summary.path).suffix.lower() in PARQUET_SUFFIXES:
        lines.append("note: SpecForge and speculators read JSON/JSONL only, not Parquet; "
                     "for them export with --for specforge|speculators")
    return "\n".join(lines)


def _trainer_lines(report: TrainerReport) -> list[str]:
    """Length figures, what max_length costs, the manifest and the trainer's command."""
    lines = [(f"token lengths (rows; p50/p90/p99/max) and {report.trainer} max_length "
              f"{report.max_length:,}:")]
    for name, figures in report.lengths.items():
        cost = (f"{figures.cut:,} rows cut, {figures.dropped:,} of them left with no "
                f"supervised token (the trainer drops them)" if figures.cut else "none cut")
        lines.append(f"  {name}: {figures.rows:,} rows; {figures.p50:,}/{figures.p90:,}/"
                     f"{figures.p99:,}/{figures.max:,}; {cost}")
    default = report.at_default
    if default.cut and report.max_length != report.default_max_length:
        lines.append(f"{report.trainer}'s default {report.length_key} "
                     f"{report.default_max_length:,} would cut {default.cut:,} rows and drop "
                     f"{default.dropped:,} of them without a word: pass the one below")
    lines.append(f"manifest: {report.manifest}")
    lines.append(f"train with: {report.command}")
    return lines


def _reason_order(reason: str) -> int:
    return DROP_REASONS.index(reason) if reason in DROP_REASONS else len(DROP_REASONS)
