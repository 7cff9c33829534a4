"""The data contract: record types, safe JSONL appends, and fast normalising reads.

A run writes, per dataset, one flat :class:`Record` a line to ``raw_responses.jsonl``, the
prompts as sent to ``prompts.jsonl`` and one :class:`ErrorRecord` per failed attempt to
``errors.jsonl``. :class:`JsonlAppender` writes whole lines only; :func:`repair_torn_tail`
puts aside the partial line a killed writer may leave.

Readers (:func:`iter_blocks`, :func:`read_rows`, :func:`parse_lines`) turn each line into a
:class:`Row` and say which layout it had (prompts.jsonl has its own reader,
:func:`iter_prompt_blocks`, which reads the sample id the same way):

    flat        the Record keys at top level (what the workbench writes)
    legacy      OpenAI chat-completions: counts under ``usage``, ``response.usage`` or
                ``response.body.usage`` (OpenAI batch output), ``cached_tokens`` under
                ``usage.prompt_tokens_details``; ``finish_reason`` and ``matched_stop`` under
                ``choices[0]`` (or ``response.choices[0]``, ``response.body.choices[0]``)
    meta_info   raw SGLang ``/generate`` replies: counts, ``finish_reason.type`` /
                ``.matched`` and ``e2e_latency`` under ``meta_info``

The layout is the first container a line holds: ``meta_info``; else ``usage``, ``response``
or ``choices``; else flat (so ``{"sample_id": 3}`` is flat with no counts). In every layout
the sample id is top-level ``sample_id``, else ``custom_id``, else ``id``; ``output_ids``,
``ts`` (and ``e2e_latency`` when the layout has none) are read at top level. A flat
``finish_reason`` may also be a ``{"type", "matched"}`` object, a meta_info one a string.

A count that cannot be read is None, never 0. The one exception: ``cached_tokens`` absent
next to other counts is 0 (servers omit it when nothing was cached); null or mistyped, None.
Counts and output ids are non-negative ints: a negative one is of the wrong type.

Every reader sees the same lines as records, whether it reads the output ids or not: a line
whose ``output_ids`` array would not decode as non-negative ints (a NUL byte, a minus sign, a
fraction or an exponent in it) is decoded line by line on every path, ids included, and is a
problem on each. What one finished record is (the line clean, the contract fields present) is
:func:`is_finished`, shared by resume, stats, validate and export; :func:`missing_fields` names
what a record lacks.

Lines that are not clean rows are reported as :class:`LineProblem`, by kind:

    malformed   not JSON (or nested too deeply); no Row
    not_object  a JSON value other than an object; no Row
    bad_type    known fields hold the wrong type: the Row has None for them, and one
                problem per line names them all
    torn        the file's last line has no newline: a writer died mid-line or is still
                writing; no Row, and the block's ``end_offset`` stays before it

Blank lines are skipped silently. Line numbers are 1-based.

Writing: :class:`JsonlAppender` puts whole lines on disk or none. A write that fails (a full
disk, an I/O error, a read-only file system) is cut back to where it started before the
error is raised as :class:`~workbench.errors.StorageError`, so a file never holds part of a
line of this writer's, and the caller may write the same lines again.
"""

from __future__ import annotations

import contextlib
import gc
import os
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import (
    Annotated,
    Any,
    BinaryIO,
    Literal,
    NamedTuple,
    Self,
    TypeAlias,
    get_args,
    get_origin,
)

import msgspec
from msgspec import UNSET, UnsetType

from workbench.errors import StorageError
from workbench.rundir.files import temp_path
from workbench.rundir.layout import TORN_SUFFIX
from workbench.rundir.storage import storage_error

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "PROMPT_BLOCK_BYTES",
    "SCHEMA_VERSION",
    "Block",
    "ErrorRecord",
    "JsonlAppender",
    "Layout",
    "LineProblem",
    "LineSpan",
    "ProblemKind",
    "PromptBlock",
    "PromptContents",
    "PromptRecord",
    "PromptRow",
    "Record",
    "Row",
    "SampleId",
    "encode_line",
    "index_lines",
    "is_finished",
    "iter_blocks",
    "iter_prompt_blocks",
    "iter_prompt_contents",
    "missing_fields",
    "move_lines_aside",
    "parse_lines",
    "paused_gc",
    "read_rows",
    "read_sample_ids",
    "repair_torn_tail",
    "span_reader",
]

SCHEMA_VERSION = 1

DEFAULT_BLOCK_BYTES = 8 << 20
PROMPT_BLOCK_BYTES = 1 << 20  # smaller: the id arrays are searched and counted while cached

StrPath: TypeAlias = str | os.PathLike[str]
SampleId: TypeAlias = int | str
Layout: TypeAlias = Literal["flat", "legacy", "meta_info"]
ProblemKind: TypeAlias = Literal["malformed", "not_object", "bad_type", "torn"]
Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]  # a token count, as readers take it
TokenId: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]  # an output id, as readers take it
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


class ErrorRecord(msgspec.Struct):
    """One failed attempt, one line of errors.jsonl."""

    sample_id: SampleId
    attempt: int
    error_type: str
    http_status: int | None
    message: str
    ts: float


class PromptRecord(msgspec.Struct, omit_defaults=True):
    """One prompt as sent, one line of prompts.jsonl: token ids or text."""

    sample_id: SampleId
    input_ids: list[int] | None = None
    text: str | None = None


_encoder = msgspec.json.Encoder()


def encode_line(obj: Any) -> bytes:
    """Encode obj as one JSON line, newline included (JSON strings never hold a raw newline)."""
    return _encoder.encode(obj) + b"\n"


Writer: TypeAlias = "Callable[[int, memoryview], int]"


class JsonlAppender:
    """Appends whole JSON lines to a file; the one writer of it (the run's lock says so).

    Each ``append``/``append_many`` is one ``os.write`` of complete lines on an ``O_APPEND``
    descriptor (finished by further writes when the system writes less), so a reader never
    sees part of a line once the call returned. A write that fails raises StorageError
    after the bytes it put down are cut off again; when even that fails, the next append
    cuts them first (and raises again if it cannot). ``fsync=True`` also makes each append
    durable before returning; ``flush()`` does so on demand. ``write`` is the system call
    (``os.write``; tests pass one that fails at the Nth call).
    """

    def __init__(self, path: StrPath, *, fsync: bool = False, write: Writer = os.write) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._write_call = write
        self._cut_at: int | None = None  # where a failed write began, while not yet cut back
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise storage_error(self.path, exc) from None

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, obj: Any) -> None:
        """Append obj as one line."""
        self._write(encode_line(obj))

    def append_many(self, objs: Iterable[Any]) -> None:
        """Append every obj, one line each, in one write."""
        data = b"".join(encode_line(obj) for obj in objs)
        if data:
            self._write(data)

    def flush(self) -> None:
        """Make the appended lines durable (lines reach the OS on every append already)."""
        os.fsync(self._open_fd())

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: appender is closed")
        return self._fd

    def _write(self, data: bytes) -> None:
        """One write of whole lines; a short write (disk full, file size limit) is finished,
        or cut back and raised as StorageError."""
        fd = self._open_fd()
        if self._cut_at is not None:
            self._cut_back(fd, self._cut_at)
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += self._write_call(fd, view[written:])
            if self._fsync:
                os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError, StorageError):  # else cut by the next append
                self._cut_back(fd, os.fstat(fd).st_size - written)
            raise storage_error(self.path, exc) from None

    def _cut_back(self, fd: int, size: int) -> None:
        """Truncate the file to `size` (where a failed write began); StorageError if it cannot."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            self._cut_at = size
            raise storage_error(self.path, exc) from None
        self._cut_at = None


def repair_torn_tail(path: StrPath) -> int:
    """Move a last line without newline to ``<path>.torn``; return how many bytes moved.

    The fragment is appended to the .torn file, followed by a newline, and made durable before
    it is cut from path, so no byte is lost. Returns 0 when path is missing, empty or already
    ends with a newline. Run it before any writer opens path.
    """
    if not os.path.exists(path):
        return 0
    with open(path, "r+b") as file:
        size = file.seek(0, os.SEEK_END)
        start = _tail_start(file, size)
        if start == size:
            return 0
        file.seek(start)
        fragment = file.read()
        with open(f"{os.fspath(path)}{TORN_SUFFIX}", "ab") as torn:
            torn.write(fragment + b"\n")
            torn.flush()
            os.fsync(torn.fileno())
        file.truncate(start)
        file.flush()
        os.fsync(file.fileno())
    return len(fragment)


def _tail_start(file: BinaryIO, size: int, step: int = 1 << 16) -> int:
    """Offset just after the last newline of a file of the given size (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - step)
        file.seek(start)
        found = file.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


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


# --- decoding structs: only the fields readers need; the rest is skipped, never built ------------


class _FinishReason(msgspec.Struct, gc=False):
    type: str | None = None
    matched: int | str | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: Count | UnsetType | None = UNSET


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Choice(msgspec.Struct, gc=False):
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class _Completion(msgspec.Struct, gc=False):
    usage: _Usage | None = None
    choices: list[_Choice] | None = None


class _Response(_Completion, gc=False):
    body: _Completion | None = None


class _MetaInfo(msgspec.Struct, gc=False):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    cached_tokens: Count | UnsetType | None = UNSET
    finish_reason: str | _FinishReason | None = None
    e2e_latency: float | None = None


class _Line(_Completion, gc=False):
    sample_id: SampleId | None = None
    custom_id: SampleId | None = None
    id: SampleId | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    cached_tokens: Count | UnsetType | None = UNSET
    finish_reason: str | _FinishReason | None = None
    matched_stop: int | str | None = None
    e2e_latency: float | None = None
    ts: float | None = None
    max_new_tokens_reduced: Count | None = None
    response: _Response | None = None
    meta_info: _MetaInfo | None = None
    # Decoded in full on the line-by-line path; on the block path an emptied array ([]),
    # unless the reader asked for the ids (_Schema.keeps_output_ids).
    output_ids: list[TokenId] | None = None


class _IdLine(msgspec.Struct, gc=False):
    sample_id: SampleId | None = None


class _PromptLine(_Line, gc=False):
    """A line of prompts.jsonl on the block path: a Row's fields, the input ids unparsed."""

    input_ids: msgspec.Raw = msgspec.Raw(b"null")
    text: str | None = None


class _PromptParts(msgspec.Struct, gc=False):
    """A line of prompts.jsonl read alone: its input ids and text, whatever their types."""

    input_ids: msgspec.Raw = msgspec.Raw(b"null")
    text: msgspec.Raw = msgspec.Raw(b"null")


class _Schema(NamedTuple):
    line_type: type[_Line]
    decoder: msgspec.json.Decoder[Any]
    keeps_output_ids: bool


_LINES = msgspec.json.Decoder(_Line)
_ROWS = _Schema(_Line, _LINES, False)
_ROWS_WITH_IDS = _Schema(_Line, _LINES, True)
_IDS = msgspec.json.Decoder(_IdLine)
_PROMPT_LINES = msgspec.json.Decoder(_PromptLine)
_PROMPT_PARTS = msgspec.json.Decoder(_PromptParts)


# --- normalising one decoded line ----------------------------------------------------------------


def _to_row(rec: _Line, line: int, keep_ids: bool) -> Row:
    if rec.meta_info is not None:
        row = _meta_info_row(rec, rec.meta_info, line)
    elif rec.usage is not None or rec.choices is not None or rec.response is not None:
        row = _legacy_row(rec, line)
    else:
        row = _flat_row(rec, line)
    if rec.output_ids is not None:
        row.has_output_ids = True
        if keep_ids:
            row.output_ids = rec.output_ids
    return row


def _flat_row(rec: _Line, line: int) -> Row:
    reason, matched = _finish(rec.finish_reason, rec.matched_stop)
    return Row(
        line=line,
        layout="flat",
        sample_id=_sample_id(rec),
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        cached_tokens=_cached(rec.cached_tokens, rec.prompt_tokens, rec.completion_tokens),
        finish_reason=reason,
        matched_stop=matched,
        e2e_latency=rec.e2e_latency,
        ts=rec.ts,
        max_new_tokens_reduced=rec.max_new_tokens_reduced,
    )


def _meta_info_row(rec: _Line, meta: _MetaInfo, line: int) -> Row:
    reason, matched = _finish(meta.finish_reason, rec.matched_stop)
    return Row(
        line=line,
        layout="meta_info",
        sample_id=_sample_id(rec),
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=meta.completion_tokens,
        cached_tokens=_cached(meta.cached_tokens, meta.prompt_tokens, meta.completion_tokens),
        finish_reason=reason,
        matched_stop=matched,
        e2e_latency=meta.e2e_latency if meta.e2e_latency is not None else rec.e2e_latency,
        ts=rec.ts,
    )


def _legacy_row(rec: _Line, line: int) -> Row:
    usage, choice = _completion_parts(rec)
    prompt = usage.prompt_tokens if usage else None
    completion = usage.completion_tokens if usage else None
    details = usage.prompt_tokens_details if usage else None
    return Row(
        line=line,
        layout="legacy",
        sample_id=_sample_id(rec),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=_cached(details.cached_tokens if details else UNSET, prompt, completion),
        finish_reason=choice.finish_reason if choice else None,
        matched_stop=choice.matched_stop if choice else None,
        e2e_latency=rec.e2e_latency,
        ts=rec.ts,
    )


def _completion_parts(rec: _Line) -> tuple[_Usage | None, _Choice | None]:
    """The first usage and first choice found in the line, its response, the response body."""
    parts: list[_Completion] = [rec]
    if rec.response is not None:
        parts.append(rec.response)
        if rec.response.body is not None:
            parts.append(rec.response.body)
    usage = next((part.usage for part in parts if part.usage is not None), None)
    choice = next((part.choices[0] for part in parts if part.choices), None)
    return usage, choice


def _sample_id(rec: _Line) -> SampleId | None:
    if rec.sample_id is not None:
        return rec.sample_id
    return rec.custom_id if rec.custom_id is not None else rec.id


def _finish(
    reason: str | _FinishReason | None, matched: int | str | None
) -> tuple[str | None, int | str | None]:
    """(finish reason, matched stop) from a plain reason or a {"type", "matched"} object."""
    if isinstance(reason, _FinishReason):
        return reason.type, reason.matched if reason.matched is not None else matched
    return reason, matched


def _cached(
    cached: int | UnsetType | None, prompt: int | None, completion: int | None
) -> int | None:
    """cached_tokens: absent next to other counts is 0; null, mistyped or alone, None."""
    if cached is UNSET:
        return 0 if prompt is not None or completion is not None else None
    return cached


# --- decoding lines that do not fit the structs --------------------------------------------------


def _decode_line(text: bytes, line: int, schema: _Schema) -> tuple[Row | None, LineProblem | None]:
    """Decode one non-blank line into a row, a problem, or both (a row with bad types)."""
    try:
        return _to_row(schema.decoder.decode(text), line, schema.keeps_output_ids), None
    except msgspec.ValidationError:
        return _decode_loosely(text, line, schema)
    except (msgspec.DecodeError, RecursionError) as exc:
        return None, LineProblem(line, "malformed", _reason(exc))


def _decode_loosely(
    text: bytes, line: int, schema: _Schema
) -> tuple[Row | None, LineProblem | None]:
    """Decode a line that failed validation: keep what fits, None for what does not."""
    try:
        value = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        return None, LineProblem(line, "malformed", _reason(exc))
    if not isinstance(value, dict):
        return None, LineProblem(line, "not_object", f"expected an object, got {_json_type(value)}")
    misfits: list[str] = []
    line_type = schema.line_type
    rec = msgspec.convert(_fitting(value, line_type, "", misfits), line_type)
    problem = LineProblem(line, "bad_type", "; ".join(misfits)) if misfits else None
    return _to_row(rec, line, schema.keeps_output_ids), problem


def _fitting(value: Any, tp: Any, where: str, misfits: list[str]) -> Any:
    """value with every part that does not fit type tp replaced by None (each noted in misfits).

    Objects are checked field by field against a struct in tp, and lists of objects item by
    item against a ``list[struct]`` in tp, so one bad count does not hide its neighbours.
    """
    options = get_args(tp) if isinstance(tp, types.UnionType) else (tp,)
    struct = next((o for o in options if _is_struct(o)), None)
    if struct is not None and isinstance(value, dict):
        return {
            field.encode_name: _fitting(
                value[field.encode_name], field.type, _join(where, field.encode_name), misfits
            )
            for field in msgspec.structs.fields(struct)
            if field.encode_name in value
        }
    item = next((get_args(o)[0] for o in options if get_origin(o) is list), None)
    if _is_struct(item) and isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return [_fitting(v, item, f"{where}[{i}]", misfits) for i, v in enumerate(value)]
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        misfits.append(f"{where}: {exc}")
        return None
    return value


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


# --- reading files in blocks of whole lines ------------------------------------------------------


class _Chunk(NamedTuple):
    """Bytes read at file ``offset``: whole lines ``data[:size]``, or (torn) a last partial line."""

    data: bytes
    size: int
    offset: int
    torn: bool = False

    def whole(self) -> bytes:
        return self.data if self.size == len(self.data) else self.data[: self.size]


def _iter_chunks(path: StrPath, offset: int, block_bytes: int) -> Iterator[_Chunk]:
    """Read path from offset in chunks of about block_bytes, each cut after its last newline.

    Each read starts at a line start (seeking back over the previous read's partial line), so
    no bytes are copied between chunks; a line longer than a block doubles the read size.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, got {block_bytes}")
    with open(path, "rb") as file:
        size = block_bytes
        while True:
            file.seek(offset)
            data = file.read(size)
            cut = data.rfind(b"\n") + 1
            if cut:
                yield _Chunk(data, cut, offset)
                offset, size = offset + cut, block_bytes
            elif len(data) == size:
                size *= 2
            else:
                if data.strip():
                    yield _Chunk(data, len(data), offset, torn=True)
                return


def _decode_whole(
    decoder: msgspec.json.Decoder[Any], chunk: _Chunk, *, keep_output_ids: bool = False
) -> list[Any] | None:
    """Every line of the chunk decoded in one call, or None unless each is one clean object
    (and its id arrays what :func:`_without_arrays` takes)."""
    data, size = chunk.data, chunk.size
    if _has_nul(data, size):
        return None
    minus = data.find(b"-", 0, size) >= 0
    for key in _ID_KEYS[keep_output_ids:]:
        emptied = _without_arrays(data, size, key, minus)
        if emptied is None:
            return None
        if emptied is not data:
            data, size = emptied, len(emptied)
    return _decode_aligned(decoder, data if size == len(data) else data[:size])


def _decode_aligned(decoder: msgspec.json.Decoder[Any], data: bytes) -> list[Any] | None:
    """Whole lines decoded by ``decode_lines``, or None unless item i is exactly line i.

    ``decode_lines`` reads whitespace-separated values. When every newline but the last sits
    in ``}\n{`` or ``}\r\n{`` (which no valid JSON value holds, and no string holds a raw
    newline), each line holds whole values, at least one; as many items as lines then means
    one each.
    """
    lines = data.count(b"\n")
    joints = data.count(b"}\n{")
    if joints != lines - 1:
        joints += data.count(b"}\r\n{")
    if joints != lines - 1:
        return None
    try:
        items = decoder.decode_lines(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return items if len(items) == lines else None


_ID_KEYS = (b'"output_ids"', b'"input_ids"')  # token id arrays no reader decodes (but output_ids)
_INLINE_SPACE = frozenset(b" \t")
_COLON, _BRACKET, _NEWLINE = ord(":"), ord("["), ord("\n")


def _array_after_key(data: bytes, position: int, size: int) -> int:
    """Where the array opened right after a key ending at position starts its items, or -1.

    Accepts any spacing a writer puts around the colon (``"k":[``, ``"k": [``, ``"k" : [``)
    but no newline; -1 when the key's value is not an array (or the bytes are not a key).
    """
    expect = _COLON
    while position < size:
        byte = data[position]
        position += 1
        if byte in _INLINE_SPACE:
            continue
        if byte != expect:
            return -1
        if expect == _BRACKET:
            return position
        expect = _BRACKET
    return -1


def _without_arrays(data: bytes, size: int, key: bytes, minus: bool = True) -> bytes | None:
    """The lines ``data[:size]`` with every ``"key": [...]`` array emptied (data itself when
    there is none), or None.

    Parsing the digits of token ids (``output_ids`` of records, ``input_ids`` of prompts)
    is most of a scan's cost; finding the closing bracket with a byte search is not. Any
    formatting works (compact, ``json.dumps`` defaults, any key order, every layout). A
    match of the quoted key always ends at a real closing quote (a quote inside a string is
    escaped), so the colon and bracket after it are JSON structure: emptying an array of an
    unread field (a nested ``output_ids``) changes no value read. An array holding a newline
    or a string (as when a torn line has the next record appended to it) or a minus sign
    gives None (and so does a NUL byte anywhere in the chunk, :func:`_has_nul`); a nested
    array leaves bytes that fail to decode. Either way the chunk is then decoded line by
    line from its original bytes, where every reader decodes the ids. What else an emptied
    array holds is not checked (a search of every array's bytes for each is what it would
    cost): a line with ``"output_ids":[1,,2]``, ``[1.5]`` or ``[1,true]`` reads as a row
    here, malformed or of the wrong type line by line.
    """
    spans = _array_spans(data, size, key, minus)
    if spans is None:
        return None
    return data if not spans else _emptied(data, size, spans)


def _has_nul(data: bytes, size: int) -> bool:
    """Whether data[:size] holds a NUL byte, which no JSON text holds (a crash leaves
    zero-filled pages): such a chunk is read line by line, where the line is named."""
    return data.find(b"\x00", 0, size) >= 0


def _array_spans(
    data: bytes, size: int, key: bytes, minus: bool = True
) -> list[tuple[int, int]] | None:
    """[start, end) of the items of every ``"key": [...]`` array in data[:size], or None
    when one holds a newline or a quote (a torn line with another appended), a minus sign
    (searched for only when `minus`: the caller found one in the chunk), or is not closed
    (see :func:`_without_arrays`)."""
    spans: list[tuple[int, int]] = []
    search = 0
    find = data.find
    while (found := find(key, search, size)) >= 0:
        search = found + len(key)
        start = _array_after_key(data, search, size)
        if start < 0:
            continue
        end = find(b"]", start, size)
        if (end < 0 or find(b"\n", start, end) >= 0 or find(b'"', start, end) >= 0
                or (minus and find(b"-", start, end) >= 0)):
            return None
        spans.append((start, end))
        search = end
    return spans


def _emptied(data: bytes, size: int, spans: list[tuple[int, int]]) -> bytes:
    view = memoryview(data)
    pieces: list[memoryview] = []
    position = 0
    for start, end in spans:
        pieces.append(view[position:start])
        position = end
    pieces.append(view[position:size])
    return b"".join(pieces)


_SPACE = frozenset(b" \t\r")
_LONG_ARRAY = 2048  # bytes from which numpy counts an array's commas faster than bytes.count


def _span_items(data: bytes, spans: list[tuple[int, int]]) -> list[int]:
    """Items of each flat array of numbers data[start:end]: its commas plus one, 0 when blank."""
    import numpy as np  # here: most readers of records never count

    commas = None
    counts: list[int] = []
    for start, end in spans:
        while start < end and data[start] in _SPACE:
            start += 1
        if start == end:
            counts.append(0)
        elif end - start < _LONG_ARRAY:
            counts.append(data.count(b",", start, end) + 1)
        else:
            if commas is None:
                commas = np.frombuffer(data, dtype=np.uint8) == ord(",")
            counts.append(int(np.count_nonzero(commas[start:end])) + 1)
    return counts


def _split_lines(chunk: _Chunk) -> list[bytes]:
    return chunk.whole().split(b"\n")[:-1]


def _numbered(texts: list[bytes], first_line: int) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines with their line numbers."""
    for index, text in enumerate(texts):
        if text.strip():
            yield first_line + index, text


def _decode_chunk(
    chunk: _Chunk, first_line: int, schema: _Schema
) -> tuple[list[Row], list[LineProblem], int]:
    """Rows, problems and line count of a chunk: in one call, or line by line if one is bad."""
    records = _decode_whole(schema.decoder, chunk, keep_output_ids=schema.keeps_output_ids)
    if records is not None:
        keep = schema.keeps_output_ids
        rows = [_to_row(rec, first_line + index, keep) for index, rec in enumerate(records)]
        return rows, [], len(records)
    rows = []
    problems: list[LineProblem] = []
    texts = _split_lines(chunk)
    for line, text in _numbered(texts, first_line):
        row, problem = _decode_line(text, line, schema)
        if row is not None:
            rows.append(row)
        if problem is not None:
            problems.append(problem)
    return rows, problems, len(texts)


def _torn_block(chunk: _Chunk, line: int) -> Block:
    detail = f"last line has no newline ({chunk.size} bytes): cut short or still being written"
    problem = LineProblem(line, "torn", detail)
    return Block([], [problem], chunk.offset, chunk.offset, line, 0)


def iter_blocks(
    path: StrPath,
    *,
    offset: int = 0,
    first_line: int = 1,
    with_output_ids: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[Block]:
    """Normalised blocks of path from byte offset (a line start) to the end of the file.

    ``first_line`` is the number of the line at offset. A torn last line comes as a final
    block with no rows and a "torn" problem, its offsets both before the line, so a reader
    resuming at the last ``end_offset`` reads it again once it is complete. Raises OSError
    when path cannot be read.
    """
    schema = _ROWS_WITH_IDS if with_output_ids else _ROWS
    line = first_line
    for chunk in _iter_chunks(path, offset, block_bytes):
        if chunk.torn:
            yield _torn_block(chunk, line)
            return
        rows, problems, lines = _decode_chunk(chunk, line, schema)
        yield Block(rows, problems, chunk.offset, chunk.offset + chunk.size, line, lines)
        line += lines


def read_rows(
    path: StrPath, *, with_output_ids: bool = False
) -> tuple[list[Row], list[LineProblem]]:
    """Every row and every problem of path (see :func:`iter_blocks`)."""
    rows: list[Row] = []
    problems: list[LineProblem] = []
    for block in iter_blocks(path, with_output_ids=with_output_ids):
        rows.extend(block.rows)
        problems.extend(block.problems)
    return rows, problems


def parse_lines(
    data: bytes, *, first_line: int = 1, with_output_ids: bool = False
) -> tuple[list[Row], list[LineProblem]]:
    """Rows and problems of JSON lines held in memory; a last line without newline counts."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    schema = _ROWS_WITH_IDS if with_output_ids else _ROWS
    rows, problems, _ = _decode_chunk(_Chunk(data, len(data), 0), first_line, schema)
    return rows, problems


class LineSpan(NamedTuple):
    """Where one line is in its file: 1-based number, byte offset and length (newline
    included)."""

    line: int
    offset: int
    size: int


def index_lines(path: StrPath) -> dict[SampleId, LineSpan]:
    """Where the first line of each ``sample_id`` of path is (the workbench's own layout:
    top-level ``sample_id``); lines without one, bad lines and a torn last line are left
    out. Raises OSError when path cannot be read."""
    found: dict[SampleId, LineSpan] = {}
    line = 1
    for chunk in _iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        ids, lines = _chunk_ids(chunk, line)
        at = dict(ids)
        offset = chunk.offset
        for number, text in enumerate(_split_lines(chunk), start=line):
            sample_id = at.get(number)
            if sample_id is not None and sample_id not in found:
                found[sample_id] = LineSpan(number, offset, len(text) + 1)
            offset += len(text) + 1
        line += lines
    return found


@contextlib.contextmanager
def span_reader(path: StrPath) -> Iterator[Callable[[LineSpan], bytes]]:
    """A function giving the bytes of a line of path (see :func:`index_lines`), the file
    held open meanwhile."""
    with open(path, "rb") as file:
        fd = file.fileno()
        yield lambda span: os.pread(fd, span.size, span.offset)


def move_lines_aside(path: StrPath, moves: dict[int, Path]) -> int:
    """Take lines out of path (1-based number -> the file it is appended to); return how many
    moved. The files they go to are made durable first, then path is replaced whole (a temp
    file beside it, renamed over it), so every line is in one file whatever happens. Run it
    before any writer opens path."""
    if not moves:
        return 0
    source = Path(path)
    temp = temp_path(source)
    try:
        with contextlib.ExitStack() as stack:
            reader = stack.enter_context(open(source, "rb"))
            kept = stack.enter_context(open(temp, "wb"))
            aside = {to: stack.enter_context(open(to, "ab")) for to in set(moves.values())}
            for number, text in enumerate(reader, start=1):
                to = moves.get(number)
                (kept if to is None else aside[to]).write(text)
            for file in (*aside.values(), kept):
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, source)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return len(moves)


def read_sample_ids(path: StrPath) -> tuple[set[SampleId], list[tuple[int, SampleId]]]:
    """The ``sample_id`` values of path, and each repeat as (line, id).

    Only top-level ``sample_id`` is read (the workbench's own layout); lines without one, bad
    lines and a torn last line are skipped. Raises OSError when path cannot be read.
    """
    seen: set[SampleId] = set()
    repeats: list[tuple[int, SampleId]] = []
    line = 1
    for chunk in _iter_chunks(path, 0, DEFAULT_BLOCK_BYTES):
        if chunk.torn:
            break
        found, lines = _chunk_ids(chunk, line)
        for at, sample_id in found:
            if sample_id is None:
                continue
            if sample_id in seen:
                repeats.append((at, sample_id))
            else:
                seen.add(sample_id)
        line += lines
    return seen, repeats


def _chunk_ids(chunk: _Chunk, first_line: int) -> tuple[list[tuple[int, SampleId | None]], int]:
    """(line, sample_id or None) for each non-blank line, and the chunk's line count."""
    items = _decode_whole(_IDS, chunk)
    if items is not None:
        return [(first_line + i, item.sample_id) for i, item in enumerate(items)], len(items)
    texts = _split_lines(chunk)
    return [(at, _sample_id_of(text)) for at, text in _numbered(texts, first_line)], len(texts)


def _sample_id_of(text: bytes) -> SampleId | None:
    try:
        return _IDS.decode(text).sample_id
    except (msgspec.DecodeError, RecursionError):
        return None


# --- prompts.jsonl: sample ids, problems and sizes in one read -----------------------------------


def iter_prompt_blocks(
    path: StrPath, *, offset: int = 0, first_line: int = 1, block_bytes: int = PROMPT_BLOCK_BYTES
) -> Iterator[PromptBlock]:
    """The prompt blocks of path from byte offset (a line start, numbered `first_line`) to the end.

    Each block is decoded in one call, its ``input_ids`` arrays emptied first and their items
    counted by their commas. A block holding a bad or unusual line (a nested or escaped
    ``input_ids``, a text that is not a string) is read as :func:`iter_blocks` reads it, and
    the sizes of its rows line by line. A torn last line comes as in :func:`iter_blocks`.
    Raises OSError when path cannot be read.
    """
    line = first_line
    for chunk in _iter_chunks(path, offset, block_bytes):
        if chunk.torn:
            torn = _torn_block(chunk, line)
            yield PromptBlock([], torn.problems, chunk.offset, chunk.offset, line, 0)
            return
        rows = _prompt_rows(chunk, line)
        if rows is not None:
            yield PromptBlock(rows, [], chunk.offset, chunk.offset + chunk.size, line, len(rows))
            line += len(rows)
            continue
        rows, problems, lines = _prompt_lines(chunk, line)
        yield PromptBlock(rows, problems, chunk.offset, chunk.offset + chunk.size, line, lines)
        line += lines


def _prompt_rows(chunk: _Chunk, first_line: int) -> list[PromptRow] | None:
    """Every line of the chunk as a prompt row, in one decode call; None unless each line is
    one clean object with at most one ``input_ids`` array, its own (:func:`_prompt_items`)."""
    found = _prompt_items(chunk)
    if found is None:
        return None
    items, arrays, spans = found
    counts = _span_items(chunk.data, spans)
    return [PromptRow(first_line + index, _sample_id(item),
                      counts[array] if array >= 0 else None,
                      None if item.text is None else len(item.text))
            for index, (item, array) in enumerate(zip(items, arrays, strict=True))]


def _prompt_items(chunk: _Chunk) -> tuple[list[_PromptLine], list[int], list[tuple[int, int]]] | None:
    """The chunk's lines decoded in one call with their ``input_ids`` arrays emptied, the
    index of the array span each line held (-1: none) and the spans; None unless each line
    is one clean object with at most one such array, its own.

    The lines are those :func:`iter_blocks` reads: it empties the same ``input_ids`` arrays
    (and ``output_ids`` ones: a chunk with arrays emptied and an ``output_ids`` key left is
    not taken here; no emptied array held a quote, so none held that key); with nothing
    emptied, every line decoded is valid JSON, which both of its paths read alike.
    """
    data, size = chunk.data, chunk.size
    spans = None if _has_nul(data, size) else _array_spans(data, size, _ID_KEYS[1])
    if spans is None:
        return None
    whole = _emptied(data, size, spans) if spans else (data if size == len(data) else data[:size])
    if spans and _ID_KEYS[0] in whole:
        return None
    items = _decode_aligned(_PROMPT_LINES, whole)
    arrays = None if items is None else _line_arrays(whole, spans, len(items))
    if items is None or arrays is None:
        return None
    for item, array in zip(items, arrays, strict=True):
        raw = bytes(item.input_ids)
        if raw != b"[]" if array >= 0 else raw.startswith(b"["):
            return None  # a nested input_ids, or a key written with escapes
    return items, arrays, spans


class PromptContents(NamedTuple):
    """The prompts of the whole lines in file bytes [start_offset, end_offset): per line read
    as an object with a sample id, its line, sample id, text (None when it has none) and ids
    (``ids[starts[i]:ends[i]]``; ``has_ids[i]`` False without an ``input_ids`` array).
    ``next_line`` is the number of the line at end_offset."""

    lines: list[int]
    sample_ids: list[SampleId]
    texts: list[str | None]
    has_ids: list[bool]
    ids: Any  # numpy int64 array
    starts: Any
    ends: Any
    end_offset: int
    next_line: int


def iter_prompt_contents(
    path: StrPath, *, offset: int = 0, first_line: int = 1, block_bytes: int = PROMPT_BLOCK_BYTES
) -> Iterator[PromptContents]:
    """What the prompts of path from byte offset (a line start numbered `first_line`) say.

    A block's ``input_ids`` arrays are cut out of its lines (as :func:`iter_prompt_blocks`
    does), the rest decoded in one call and the arrays' digits parsed in one numpy call; a
    block holding a bad or unusual line is read line by line, where a line that does not
    decode, has no sample id or an ``input_ids`` that is not a list of integers is left out
    (validation names it). A torn last line is not read: ``end_offset`` stays before it.
    Raises OSError when path cannot be read.
    """
    import numpy as np  # here: most readers of records never count

    line = first_line
    for chunk in _iter_chunks(path, offset, block_bytes):
        if chunk.torn:
            return
        found = _contents_at_once(chunk, line) or _contents_by_line(chunk, line)
        rows, ids, counts = found
        lengths = np.asarray(counts, dtype=np.int64)
        ends = np.cumsum(lengths)
        lines = chunk.data.count(b"\n", 0, chunk.size)
        line += lines
        yield PromptContents([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                             [r[3] for r in rows], ids, ends - lengths, ends,
                             chunk.offset + chunk.size, line)


_ContentRows: TypeAlias = "list[tuple[int, SampleId, str | None, bool]]"


def _contents_at_once(chunk: _Chunk, first_line: int) -> tuple[_ContentRows, Any, list[int]] | None:
    """(line, sample id, text, has ids) per line, their ids and the count of each, from one
    decode call and one parse of the arrays' digits; None unless every line is clean."""
    found = _prompt_items(chunk)
    if found is None:
        return None
    items, arrays, spans = found
    counts = _span_items(chunk.data, spans)
    ids = _parsed_ids(chunk.data, spans, counts)
    if ids is None:
        return None
    rows: _ContentRows = []
    per_row: list[int] = []
    for index, (item, array) in enumerate(zip(items, arrays, strict=True)):
        sample_id = _sample_id(item)
        count = counts[array] if array >= 0 else 0
        if sample_id is None:
            if count:
                return None  # rare: its ids would have to be cut out of the parsed ones
            continue
        rows.append((first_line + index, sample_id, item.text, array >= 0))
        per_row.append(count)
    return rows, ids, per_row


def _parsed_ids(data: bytes, spans: list[tuple[int, int]], counts: list[int]) -> Any:
    """The integers of the array spans of data, in order, in one int64 array (an id past 64
    bits saturates: out of any vocabulary); None when one is not a plain list of integers."""
    import numpy as np

    text = b",".join(data[start:end] for (start, end), count in zip(spans, counts, strict=True)
                     if count)
    if not text:
        return np.zeros(0, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns when it stops before the end of the text
        try:
            ids = np.fromstring(text, dtype=np.int64, sep=",")
        except (DeprecationWarning, ValueError):
            return None
    return ids if len(ids) == sum(counts) else None


def _contents_by_line(chunk: _Chunk, first_line: int) -> tuple[_ContentRows, Any, list[int]]:
    """What :func:`_contents_at_once` gives, each line decoded alone (bad ones left out)."""
    import numpy as np

    rows: _ContentRows = []
    lists: list[list[int]] = []
    for line, text in _numbered(_split_lines(chunk), first_line):
        found = _prompt_content(text)
        if found is not None:
            sample_id, prompt, ids = found
            rows.append((line, sample_id, prompt, ids is not None))
            lists.append(ids or [])
    counts = [len(ids) for ids in lists]
    flat = [min(max(i, -(1 << 63)), (1 << 63) - 1) for ids in lists for i in ids]
    return rows, np.asarray(flat, dtype=np.int64), counts


def _prompt_content(text: bytes) -> tuple[SampleId, str | None, list[int] | None] | None:
    """(sample id, text, input ids) of one line, or None: not a JSON object, no sample id, a
    text that is not a string or input ids that are not a list of integers."""
    try:
        value = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    sample_id = next((value[key] for key in ("sample_id", "custom_id", "id")
                      if value.get(key) is not None), None)
    prompt, ids = value.get("text"), value.get("input_ids")
    if (not isinstance(sample_id, int | str) or isinstance(sample_id, bool)
            or not isinstance(prompt, str | None)
            or not (ids is None or isinstance(ids, list) and all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids))):
        return None
    return sample_id, prompt, ids


def _line_arrays(whole: bytes, spans: list[tuple[int, int]], lines: int) -> list[int] | None:
    """Per line of `whole` (the lines with the array spans emptied), the index of the span it
    held (-1 for none), found in the emptied bytes; None when a line held more than one."""
    if not spans:
        return [-1] * lines
    import numpy as np  # here: most readers of records never count

    bounds = np.array(spans, dtype=np.int64)
    lengths = bounds[:, 1] - bounds[:, 0]
    emptied_at = bounds[:, 0] - (np.cumsum(lengths) - lengths)  # where each span was in whole
    line_ends = np.flatnonzero(np.frombuffer(whole, dtype=np.uint8) == _NEWLINE)
    owner = np.searchsorted(line_ends, emptied_at)  # the newlines before: the line's index
    if len(owner) > 1 and not (np.diff(owner) > 0).all():
        return None
    arrays = np.full(lines, -1, dtype=np.int64)
    arrays[owner] = np.arange(len(spans))
    found: list[int] = arrays.tolist()
    return found


def _prompt_lines(chunk: _Chunk, first_line: int) -> tuple[list[PromptRow], list[LineProblem], int]:
    """The prompt rows, problems and line count of a chunk whose lines are read one by one:
    rows and problems exactly as :func:`iter_blocks` reads them, sizes from each row's line."""
    rows, problems, lines = _decode_chunk(chunk, first_line, _ROWS)
    texts = _split_lines(chunk)
    prompts = [PromptRow(row.line, row.sample_id, *_prompt_parts(texts[row.line - first_line]))
               for row in rows]
    return prompts, problems, lines


def _prompt_parts(text: bytes) -> tuple[int | None, int | None]:
    """(items of the input_ids array, characters of the text string) of one line, each None
    when it is not one (the items counted by commas, as on the block path)."""
    try:
        parts = _PROMPT_PARTS.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None, None
    ids = bytes(parts.input_ids).strip()
    count = (ids.count(b",") + 1 if ids[1:-1].strip() else 0) if ids.startswith(b"[") else None
    value = bytes(parts.text)
    chars = len(msgspec.json.decode(value, type=str)) if value.startswith(b'"') else None
    return count, chars


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection while blocks of id lists stream by: they hold no reference
    cycles, and collections would walk every list (validation and export use it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
