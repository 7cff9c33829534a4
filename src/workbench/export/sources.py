"""One dataset being exported: its records checked and turned into rows.

A :class:`Source` holds a dataset's prompts (prompts.jsonl indexed by (sample_id, turn),
each prompt read back by byte offset when its record is: a conversation regenerated turn by
turn, ``turns: each``, has one prompt per turn, and each record of a turn is joined to its
own), its filters (``ExportOptions.only_mode`` and the per-record rules of
``ExportOptions.drop``, whose reasoning rules follow each record's mode in a dataset that
mixes modes), its tokenizer (for text prompts and conversations: the option's,
else the one the run's manifest names) and its source messages (conversations), and counts
what it writes and drops. Everything a format needs is loaded before any row is written
(:func:`open_source`). A record's mode rides on its row, and its conversation is split and
rendered with its mode's chat-template arguments (:meth:`DatasetDir.template_kwargs`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from workbench.analyze.chat_data import data_path
from workbench.analyze.rules import dataset_checker
from workbench.config import DatasetSpec, load_manifest
from workbench.errors import ConfigError, DataError
from workbench.export.conversations import (
    assistant_turn,
    default_system,
    inline_reasoning,
    render_ids,
    renders_exactly,
)
from workbench.export.options import DatasetExport, ExportOptions, SampleId
from workbench.export.sinks import ConversationLine, OutRow, Tokens
from workbench.profiles import ModelProfile
from workbench.rundir.layout import DatasetDir
from workbench.rundir.line_index import Key, key_text
from workbench.rundir.reader import iter_blocks
from workbench.rundir.records import LineProblem, PromptRecord, Row
from workbench.rundir.run import RunInfo
from workbench.tokenizer import load_tokenizer

__all__ = ["READ_BLOCK_BYTES", "Lines", "Source", "manifest_spec", "open_source",
           "trim_prompt_suffix"]

READ_BLOCK_BYTES = 1 << 20

_PROBLEM_REASONS = {"malformed": "parse_error", "not_object": "parse_error", "torn": "torn_line"}


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


class Lines:
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
    """prompts.jsonl indexed by (sample_id, turn); each prompt is read back when its record
    is."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise DataError(path, "not found: the export needs the prepared prompts "
                                  "that `workbench generate` writes next to the records")
        self.path = path
        self.line_of = _index_prompts(path)
        self._lines = Lines(path)

    def __contains__(self, key: object) -> bool:
        return key in self.line_of

    def get(self, key: Key) -> PromptRecord:
        line = self.line_of[key]
        try:
            prompt = _PROMPT_DECODER.decode(self._lines.read(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DataError(self.path, f"bad prompt: {exc}", line) from None
        if not prompt.input_ids and not prompt.text:
            raise DataError(self.path, "prompt has neither input_ids nor text", line)
        return prompt

    def close(self) -> None:
        self._lines.close()


def _index_prompts(path: Path) -> dict[Key, int]:
    """(sample_id, turn) -> line of prompts.jsonl; DataError for a bad line or a repeated
    key."""
    line_of: dict[Key, int] = {}
    for block in iter_blocks(path):
        problem = min(block.problems, key=lambda p: p.line, default=None)
        for row in block.rows:
            if problem is not None and problem.line <= row.line:
                break
            if row.sample_id is None:
                raise DataError(path, "missing sample_id", row.line)
            key = (row.sample_id, row.turn)
            first = line_of.setdefault(key, row.line)
            if first != row.line:
                raise DataError(path, f"duplicate {key_text(*key)} "
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
        self._lines = Lines(path)

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


class Source:
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
        self.checker = dataset_checker(ds, profile)
        self.drop = options.drop_rules()
        # a RUN_DROPS name -> the sample ids (every turn) and (sample id, turn) keys it drops
        self.flagged: dict[str, set[SampleId | Key]] = {}
        self.stats = DatasetExport()
        self.seen: set[Key] = set()
        first = _first_row(ds.raw_path)
        self.turns = ds.settings.get("turns") == "each" or (first is not None
                                                            and first.turn is not None)
        self.modes = bool(ds.modes) or (first is not None and first.mode is not None)
        self.tokenizer: Any = None
        self.messages: _Messages | None = None
        self.default_systems: dict[str | None, str | None] = {}  # by mode
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
        if self.options.only_mode and row.mode not in self.options.only_mode:
            return "other_mode"
        if row.sample_id is None or row.output_ids is None:
            return "missing_field"
        key = (row.sample_id, row.turn)
        if key in self.seen:
            return "duplicate_sample_id"
        self.seen.add(key)
        if key not in self.prompts:
            return "orphan_response"
        failed = {rule for rule, _ in problems}
        return next((rule for rule in self.drop if rule in failed
                     or self._flagged(rule, key)), None)

    def _flagged(self, rule: str, key: Key) -> bool:
        """Whether a run-level drop flags the record of key: its sample id, or its turn."""
        flagged = self.flagged.get(rule, ())
        return key[0] in flagged or (key[1] is not None and key in flagged)

    def render(self, row: Row) -> OutRow | str:
        """The output row of a kept record, or the reason it is dropped after all."""
        assert row.sample_id is not None and row.output_ids is not None
        row_id = f"{self.name}/{row.sample_id}"
        prompt = self.prompts.get((row.sample_id, row.turn))
        if self.options.format == "conversations":
            output = self._output(prompt.input_ids or [], row)
            return self._conversation(row_id, row, prompt.input_ids or [], output)
        prompt_ids = self._prompt_ids(prompt, row)
        if prompt_ids is None:
            return "prompt_tokens_mismatch"
        return Tokens(row_id, self.name, prompt_ids, self._output(prompt_ids, row), row.turn,
                      row.mode)

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
        output = trim_prompt_suffix(prompt_ids, row.output_ids, row.completion_tokens)
        if len(output) != len(row.output_ids):
            self.stats.trimmed += 1
        return output

    def _conversation(self, row_id: str, row: Row, prompt_ids: list[int],
                      output: list[int]) -> OutRow:
        """The record's conversation, rendered with its mode's chat-template arguments."""
        assert self.messages is not None and row.sample_id is not None
        source = self.messages.get(row.sample_id)
        if source is None:
            raise DataError(self.messages.path, f"no row with sample id {row.sample_id!r} "
                                                f"(prompt of {row_id})")
        messages, tools = source
        tokenizer, kwargs = self._tokenizer(), self.ds.template_kwargs(row.mode)
        if tools and render_ids(tokenizer, messages, tools, kwargs,
                                generation_prompt=True) != prompt_ids:
            tools = None  # the prompt was rendered without them: the model never saw them
        messages = self.with_seen_system(messages, tools, prompt_ids, row.mode)
        field = assistant_turn(output, self.profile, self.checker.reasoning_of(row.mode),
                               tokenizer)
        carries = {"field": [field], "inline": [inline_reasoning(field, self.profile, tokenizer)]}
        turns = carries.get(self.options.reasoning) or carries["field"] + carries["inline"]
        for turn in turns:
            conversation = [*messages, turn]
            if renders_exactly(tokenizer, conversation, tools, kwargs, prompt_ids + output):
                self.stats.exact = (self.stats.exact or 0) + 1
                return ConversationLine(id=row_id, dataset=self.name, mode=row.mode,
                                        conversations=conversation, tools=tools)
        return ConversationLine(id=row_id, dataset=self.name, mode=row.mode,
                                conversations=[*messages, turns[0]], tools=tools)

    def with_seen_system(self, messages: list[Any], tools: list[Any] | None,
                          prompt_ids: list[int], mode: str | None = None) -> list[Any]:
        """The messages with the system prompt the template put in when they had none, when
        that gives back the prompt's ids (rendered with `mode`'s chat-template arguments):
        the model saw it, and a trainer would otherwise put in its own."""
        if messages and messages[0].get("role") == "system":
            return messages
        kwargs = self.ds.template_kwargs(mode)
        if mode not in self.default_systems:
            self.default_systems[mode] = default_system(self._tokenizer(), messages, tools,
                                                        kwargs)
        system = self.default_systems[mode]
        if system is None:
            return messages
        explicit = [{"role": "system", "content": system}, *messages]
        rendered = render_ids(self._tokenizer(), explicit, tools, kwargs, generation_prompt=True)
        return explicit if rendered == prompt_ids else messages

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            self.tokenizer = load_dataset_tokenizer(self.ds, self.run, self.options, self.turns)
        return self.tokenizer

    def prepare(self) -> None:
        """Load what the format needs (messages, tokenizer) before any row is written; a
        turns dataset's conversations are read from its data file later
        (:mod:`workbench.export.threads`), which must be there."""
        if self.options.format == "conversations" and self.turns:
            _check_chat_input(self.ds)
            data_path(self.ds)
            self._tokenizer()
            self.stats.exact = 0
        elif self.options.format == "conversations":
            self.messages = open_messages(self.ds, self.run)
            self._tokenizer()
            self.stats.exact = 0
        elif self.ds.settings.get("input") == "text":
            self._tokenizer()


def _first_row(path: Path) -> Row | None:
    """The first record of raw file path (None without one): whether it has a turn (a
    conversation regenerated turn by turn) or a mode tells what the rows carry."""
    if not path.is_file():
        return None
    for block in iter_blocks(path, block_bytes=READ_BLOCK_BYTES):
        if block.rows:
            return block.rows[0]
    return None


def trim_prompt_suffix(prompt: list[int], output: list[int], completion: int | None) -> list[int]:
    """output without the k leading ids that repeat the prompt's last k ids, when
    len(output) exceeds completion by exactly such a k; else output unchanged."""
    if completion is None:
        return output
    extra = len(output) - completion
    if 0 < extra <= len(prompt) and output[:extra] == prompt[-extra:]:
        return output[extra:]
    return output


def manifest_spec(run: RunInfo, name: str) -> DatasetSpec:
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


def load_dataset_tokenizer(ds: DatasetDir, run: RunInfo, options: ExportOptions,
                           recorded: bool = False) -> Any:
    """The option's tokenizer, else (`recorded`) the one run.json records for the dataset,
    else the one the run's manifest names."""
    if options.tokenizer is not None:
        return load_tokenizer(options.tokenizer, trust_remote_code=options.trust_remote_code)
    path = ds.settings.get("tokenizer")
    if recorded and isinstance(path, str) and path:
        trust = ds.settings.get("trust_remote_code") is True or options.trust_remote_code
        return load_tokenizer(path, trust_remote_code=trust)
    spec = manifest_spec(run, ds.name)
    if spec.tokenizer is None:
        raise ConfigError("tokenizer", f"dataset {ds.name}: its manifest names no tokenizer; "
                                       "pass a tokenizer directory (--tokenizer)")
    trust = spec.trust_remote_code or options.trust_remote_code
    return load_tokenizer(spec.tokenizer, trust_remote_code=trust)


def _check_chat_input(ds: DatasetDir) -> None:
    """ConfigError unless the dataset's input is a conversation (messages, conversations)."""
    mode = ds.settings.get("input")
    if mode not in ("messages", "conversations"):
        raise ConfigError("--format", f"dataset {ds.name} has input {mode!r}: the "
                                      "conversations format needs input 'messages' or "
                                      "'conversations' (leave it out with --only, or export "
                                      "tokens)")


def open_messages(ds: DatasetDir, run: RunInfo) -> _Messages:
    """The dataset's source messages (path from run.json, id field from the manifest when it
    loads, else sample_id); ConfigError unless its input mode is messages."""
    mode = ds.settings.get("input")
    if mode != "messages":
        raise ConfigError("--format", f"dataset {ds.name} has input {mode!r}: the "
                                      "conversations format needs input 'messages' "
                                      "(leave it out with --only, or export tokens)")
    path, id_field = ds.settings.get("path"), "sample_id"
    with contextlib.suppress(ConfigError):
        spec = manifest_spec(run, ds.name)
        path, id_field = spec.path, spec.id_field
    if not isinstance(path, str) or not Path(path).is_file():
        raise DataError(path or ds.name, "source file not found: it holds the messages")
    if path.lower().endswith((".parquet", ".pq")):
        raise ConfigError("--format", f"dataset {ds.name}: conversations from a Parquet "
                                      "source are not supported; convert it to JSONL")
    return _Messages(Path(path), id_field)


def open_source(run: RunInfo, ds: DatasetDir, profile: ModelProfile,
                 options: ExportOptions) -> Source:
    """A dataset ready to export: everything it needs is checked before any row is written."""
    source = Source(run, ds, profile, options)
    try:
        source.prepare()
    except BaseException:
        source.close()
        raise
    return source
