"""One line of a records file decoded into a :class:`~workbench.rundir.records.Row`, whatever
its layout, or into a line problem.

The readers (:mod:`workbench.rundir.reader`; :mod:`workbench.rundir.prompt_reader` reads the
sample id the same way) turn each line into a Row and say which layout it had:

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

A line that does not fit the decoding structs is decoded loosely: what fits is kept, the rest
is None and named in one ``bad_type`` problem (the kinds of
:class:`~workbench.rundir.records.LineProblem` are in :mod:`workbench.rundir.records`).
"""

from __future__ import annotations

import types
from typing import Annotated, Any, NamedTuple, TypeAlias, get_args, get_origin

import msgspec
from msgspec import UNSET, UnsetType

from workbench.rundir.records import LineProblem, Row, SampleId

__all__ = [
    "ROWS",
    "ROWS_WITH_IDS",
    "Line",
    "Schema",
    "decode_line",
    "line_sample_id",
    "to_row",
]

Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]  # a token count, as readers take it
TokenId: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]  # an output id, as readers take it


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


class Line(_Completion, gc=False):
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
    turn: Count | None = None
    ended: str | None = None
    mode: str | None = None
    response: _Response | None = None
    meta_info: _MetaInfo | None = None
    # Decoded in full on the line-by-line path; on the block path an emptied array ([]),
    # unless the reader asked for the ids (Schema.keeps_output_ids).
    output_ids: list[TokenId] | None = None


class Schema(NamedTuple):
    line_type: type[Line]
    decoder: msgspec.json.Decoder[Any]
    keeps_output_ids: bool


_LINES = msgspec.json.Decoder(Line)
ROWS = Schema(Line, _LINES, False)
ROWS_WITH_IDS = Schema(Line, _LINES, True)


# --- normalising one decoded line ----------------------------------------------------------------


def to_row(rec: Line, line: int, keep_ids: bool) -> Row:
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


def _flat_row(rec: Line, line: int) -> Row:
    reason, matched = _finish(rec.finish_reason, rec.matched_stop)
    return Row(
        line=line,
        layout="flat",
        sample_id=line_sample_id(rec),
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        cached_tokens=_cached(rec.cached_tokens, rec.prompt_tokens, rec.completion_tokens),
        finish_reason=reason,
        matched_stop=matched,
        e2e_latency=rec.e2e_latency,
        ts=rec.ts,
        max_new_tokens_reduced=rec.max_new_tokens_reduced,
        turn=rec.turn,
        ended=rec.ended,
        mode=rec.mode,
    )


def _meta_info_row(rec: Line, meta: _MetaInfo, line: int) -> Row:
    reason, matched = _finish(meta.finish_reason, rec.matched_stop)
    return Row(
        line=line,
        layout="meta_info",
        sample_id=line_sample_id(rec),
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=meta.completion_tokens,
        cached_tokens=_cached(meta.cached_tokens, meta.prompt_tokens, meta.completion_tokens),
        finish_reason=reason,
        matched_stop=matched,
        e2e_latency=meta.e2e_latency if meta.e2e_latency is not None else rec.e2e_latency,
        ts=rec.ts,
    )


def _legacy_row(rec: Line, line: int) -> Row:
    usage, choice = _completion_parts(rec)
    prompt = usage.prompt_tokens if usage else None
    completion = usage.completion_tokens if usage else None
    details = usage.prompt_tokens_details if usage else None
    return Row(
        line=line,
        layout="legacy",
        sample_id=line_sample_id(rec),
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=_cached(details.cached_tokens if details else UNSET, prompt, completion),
        finish_reason=choice.finish_reason if choice else None,
        matched_stop=choice.matched_stop if choice else None,
        e2e_latency=rec.e2e_latency,
        ts=rec.ts,
    )


def _completion_parts(rec: Line) -> tuple[_Usage | None, _Choice | None]:
    """The first usage and first choice found in the line, its response, the response body."""
    parts: list[_Completion] = [rec]
    if rec.response is not None:
        parts.append(rec.response)
        if rec.response.body is not None:
            parts.append(rec.response.body)
    usage = next((part.usage for part in parts if part.usage is not None), None)
    choice = next((part.choices[0] for part in parts if part.choices), None)
    return usage, choice


def line_sample_id(rec: Line) -> SampleId | None:
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


def decode_line(text: bytes, line: int, schema: Schema) -> tuple[Row | None, LineProblem | None]:
    """Decode one non-blank line into a row, a problem, or both (a row with bad types)."""
    try:
        return to_row(schema.decoder.decode(text), line, schema.keeps_output_ids), None
    except msgspec.ValidationError:
        return _decode_loosely(text, line, schema)
    except (msgspec.DecodeError, RecursionError) as exc:
        return None, LineProblem(line, "malformed", _reason(exc))


def _decode_loosely(
    text: bytes, line: int, schema: Schema
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
    return to_row(rec, line, schema.keeps_output_ids), problem


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
