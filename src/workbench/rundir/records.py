"""The data contract: what a record is, as the workbench writes it and as readers give it back.

A run writes, per dataset, one flat :class:`Record` a line to ``raw_responses.jsonl``, the
prompts as sent (:class:`PromptRecord`) to ``prompts.jsonl`` and one :class:`ErrorRecord` per
failed attempt to ``errors.jsonl``, each line made by :func:`encode_line`. Readers turn each
line into a :class:`Row` (prompts.jsonl into a :class:`PromptRow`), block by block
(:class:`Block`, :class:`PromptBlock`). The modules beside this one do the work:

    appender        the write path: whole lines appended or none, a torn tail put aside
    normalise       one line decoded into a Row, whatever its layout
    reader          the fast path: a file read in blocks of whole lines, each a Block
    prompt_reader   prompts.jsonl: sample ids, sizes and contents in one read
    line_index      where each sample id's line is; the sample ids a file holds

What one finished record is (the line clean, the contract fields present) is
:func:`is_finished`, shared by resume, stats, validate and export; :func:`missing_fields`
names what a record lacks.

Lines that are not clean rows are reported as :class:`LineProblem`, by kind:

    malformed   not JSON (or nested too deeply); no Row
    not_object  a JSON value other than an object; no Row
    bad_type    known fields hold the wrong type: the Row has None for them, and one
                problem per line names them all
    torn        the file's last line has no newline: a writer died mid-line or is still
                writing; no Row, and the block's ``end_offset`` stays before it

Blank lines are skipped silently. Line numbers are 1-based.
"""

from __future__ import annotations

import os
from typing import Any, Literal, NamedTuple, TypeAlias

import msgspec

__all__ = [
    "FINISH_REASONS",
    "SCHEMA_VERSION",
    "Block",
    "ErrorRecord",
    "Layout",
    "LineProblem",
    "ProblemKind",
    "PromptBlock",
    "PromptRecord",
    "PromptRow",
    "Record",
    "Row",
    "SampleId",
    "StrPath",
    "encode_line",
    "is_finished",
    "missing_fields",
]

SCHEMA_VERSION = 1

StrPath: TypeAlias = str | os.PathLike[str]  # a path, as readers and the appender take it
SampleId: TypeAlias = int | str
Layout: TypeAlias = Literal["flat", "legacy", "meta_info"]
ProblemKind: TypeAlias = Literal["malformed", "not_object", "bad_type", "torn"]
FINISH_REASONS = ("stop", "length")  # how a finished record ended


# --- what the workbench writes -------------------------------------------------------------------


class Record(msgspec.Struct):
    """One response, one line of raw_responses.jsonl (keys and order are the contract)."""

    sample_id: SampleId
    output_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    matched_stop: int | str | None
    e2e_latency: float
    ts: float
    schema: int = SCHEMA_VERSION
    # Requests retracted and recomputed under KV pressure (meta_info.num_retractions), kept
    # only when the server sends it.
    num_retractions: int | msgspec.UnsetType = msgspec.UNSET
    # The max_new_tokens the reply was generated with, kept only when it was cut below the
    # sampling's for the prompt to fit the model's context (a dataset's context_fit).
    max_new_tokens_reduced: int | msgspec.UnsetType = msgspec.UNSET
    # A dataset regenerated turn by turn (`turns: each`): the generated assistant turn of the
    # conversation `sample_id` (0-based; `(sample_id, turn)` unique), and on the turn after
    # which the conversation could not go on, why (an END_REASONS name).
    turn: int | msgspec.UnsetType = msgspec.UNSET
    ended: str | msgspec.UnsetType = msgspec.UNSET
    # A dataset that mixes modes (`modes`): the name of the mode its conversation drew.
    mode: str | msgspec.UnsetType = msgspec.UNSET


class ErrorRecord(msgspec.Struct):
    """One failed attempt, one line of errors.jsonl."""

    sample_id: SampleId
    attempt: int
    error_type: str
    http_status: int | None
    message: str
    ts: float
    turn: int | msgspec.UnsetType = msgspec.UNSET  # the turn of a conversation (turns: each)


class PromptRecord(msgspec.Struct, omit_defaults=True):
    """One prompt as sent, one line of prompts.jsonl: token ids or text (and the turn of a
    conversation regenerated turn by turn)."""

    sample_id: SampleId
    input_ids: list[int] | None = None
    text: str | None = None
    turn: int | None = None
    # A prompt the server rendered (a dataset's `render: server`): a digest of the history it
    # rendered it from (workbench.chat.history_digest), what a resume compares.
    history: str | None = None
    mode: str | None = None  # a dataset that mixes modes: the mode the prompt was drawn


_encoder = msgspec.json.Encoder()


def encode_line(obj: Any) -> bytes:
    """Encode obj as one JSON line, newline included (JSON strings never hold a raw newline)."""
    return _encoder.encode(obj) + b"\n"


# --- what readers return -------------------------------------------------------------------------


class Row(msgspec.Struct):
    """One readable line, normalised; None where a value cannot be read."""

    line: int
    layout: Layout
    sample_id: SampleId | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    matched_stop: int | str | None
    e2e_latency: float | None
    ts: float | None
    output_ids: list[int] | None = None  # read only when the reader asked for them
    has_output_ids: bool = False  # the line holds an output_ids array (read or not)
    max_new_tokens_reduced: int | None = None  # a flat record's, when its line has one
    turn: int | None = None  # a flat record's turn of its conversation (turns: each)
    ended: str | None = None  # why its conversation ended after this turn (turns: each)
    mode: str | None = None  # a flat record's mode (a dataset that mixes modes)

    @property
    def key(self) -> tuple[SampleId | None, int | None]:
        """What is unique in a dataset: (sample_id, turn), turn None outside conversations."""
        return self.sample_id, self.turn


_REQUIRED = ("sample_id", "output_ids", "prompt_tokens", "completion_tokens", "finish_reason")
_REQUIRED_FLAT = (*_REQUIRED, "cached_tokens", "e2e_latency", "ts")


def missing_fields(row: Row) -> list[str]:
    """The contract fields of row that could not be read: the sample id, the output ids, the
    counts and the finish reason; for a flat record (what the workbench writes) also
    ``cached_tokens``, ``e2e_latency`` and ``ts``."""
    if (
        row.sample_id is not None and row.has_output_ids and row.prompt_tokens is not None
        and row.completion_tokens is not None and row.finish_reason is not None
        and (row.layout != "flat" or (row.cached_tokens is not None
                                      and row.e2e_latency is not None and row.ts is not None))
    ):
        return []
    names = _REQUIRED_FLAT if row.layout == "flat" else _REQUIRED
    return [name for name in names
            if (not row.has_output_ids if name == "output_ids" else getattr(row, name) is None)]


def is_finished(row: Row, clean: bool = True) -> bool:
    """Whether row is a finished record, the one definition resume, stats and export share:
    its line read without a problem (`clean`: no bad_type problem names its line), every
    contract field present, and it ended with ``stop`` or ``length`` (an ``abort`` is sent
    again)."""
    return clean and row.finish_reason in FINISH_REASONS and not missing_fields(row)


class LineProblem(msgspec.Struct):
    """A line that is not a clean row (kinds in the module docstring)."""

    line: int
    kind: ProblemKind
    detail: str


class Block(msgspec.Struct):
    """The rows and problems of the whole lines in file bytes [start_offset, end_offset).

    ``lines`` counts every line of the block, blank and bad ones included, so the next block
    starts at ``first_line + lines``; resume a read at ``end_offset`` with that first line.
    """

    rows: list[Row]
    problems: list[LineProblem]
    start_offset: int
    end_offset: int
    first_line: int
    lines: int
    ids: Any = None  # the rows' output ids in one array (IdArrays) when the reader was asked


class PromptRow(NamedTuple):
    """One readable line of prompts.jsonl.

    ``sample_id`` is read as a :class:`Row`'s (None when none can be read); ``input_ids`` is
    how many items its top-level ``input_ids`` array holds (None without such an array);
    ``text_chars`` the characters of its top-level ``text`` (None unless a string).
    """

    line: int
    sample_id: SampleId | None
    input_ids: int | None
    text_chars: int | None
    turn: int | None = None  # the turn of its conversation (turns: each), as a Row's


class PromptBlock(NamedTuple):
    """The prompt rows and problems of the whole lines in file bytes [start_offset, end_offset),
    counted as a :class:`Block`'s (every line of prompts.jsonl that gives a Row gives a
    PromptRow, with the same problems)."""

    rows: list[PromptRow]
    problems: list[LineProblem]
    start_offset: int
    end_offset: int
    first_line: int
    lines: int
