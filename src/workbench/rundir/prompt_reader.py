"""prompts.jsonl read fast: per line its sample id (and turn) and the size of its prompt, or
what the prompt says.

    iter_prompt_blocks    sample ids, problems and sizes, one PromptBlock per block: the one
                          read of prompts.jsonl (:mod:`workbench.rundir.prompt_scan`)
    iter_prompt_contents  sample ids, texts and input ids as numpy arrays, one
                          :class:`PromptContents` per block: the prompts' figures
                          (:mod:`workbench.rundir.figures`)

Both read blocks as :mod:`workbench.rundir.reader` does, with its chunks and array spans:
the ``input_ids`` arrays are cut out of a block's lines and the rest decoded in one call; a
block holding a bad or unusual line is read line by line. The sample id is read as a Row's
(:mod:`workbench.rundir.normalise`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, TypeAlias

import msgspec

from workbench.rundir.id_arrays import one_per_line, parse_spans, span_lines
from workbench.rundir.normalise import ROWS, Line, line_sample_id
from workbench.rundir.reader import (
    ID_KEYS,
    Chunk,
    array_spans,
    decode_aligned,
    decode_chunk,
    emptied,
    has_nul,
    iter_chunks,
    numbered,
    split_lines,
    torn_block,
)
from workbench.rundir.records import LineProblem, PromptBlock, PromptRow, SampleId, StrPath

__all__ = ["PROMPT_BLOCK_BYTES", "PromptContents", "iter_prompt_blocks", "iter_prompt_contents"]

PROMPT_BLOCK_BYTES = 1 << 20  # smaller: the id arrays are searched and counted while cached


class _PromptLine(Line, gc=False):
    """A line of prompts.jsonl on the block path: a Row's fields, the input ids unparsed."""

    input_ids: msgspec.Raw = msgspec.Raw(b"null")
    text: str | None = None


class _PromptParts(msgspec.Struct, gc=False):
    """A line of prompts.jsonl read alone: its input ids and text, whatever their types."""

    input_ids: msgspec.Raw = msgspec.Raw(b"null")
    text: msgspec.Raw = msgspec.Raw(b"null")


_PROMPT_LINES = msgspec.json.Decoder(_PromptLine)
_PROMPT_PARTS = msgspec.json.Decoder(_PromptParts)


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
    for chunk in iter_chunks(path, offset, block_bytes):
        if chunk.torn:
            torn = torn_block(chunk, line)
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


def _prompt_rows(chunk: Chunk, first_line: int) -> list[PromptRow] | None:
    """Every line of the chunk as a prompt row, in one decode call; None unless each line is
    one clean object with at most one ``input_ids`` array, its own (:func:`_prompt_items`)."""
    found = _prompt_items(chunk)
    if found is None:
        return None
    items, arrays, spans = found
    counts = _span_items(chunk.data, spans)
    return [PromptRow(first_line + index, line_sample_id(item),
                      counts[array] if array >= 0 else None,
                      None if item.text is None else len(item.text), item.turn)
            for index, (item, array) in enumerate(zip(items, arrays, strict=True))]


def _prompt_items(chunk: Chunk) -> tuple[list[_PromptLine], list[int], list[tuple[int, int]]] | None:
    """The chunk's lines decoded in one call with their ``input_ids`` arrays emptied, the
    index of the array span each line held (-1: none) and the spans; None unless each line
    is one clean object with at most one such array, its own.

    The lines are those :func:`iter_blocks` reads: it empties the same ``input_ids`` arrays
    (and ``output_ids`` ones: a chunk with arrays emptied and an ``output_ids`` key left is
    not taken here; no emptied array held a quote, so none held that key); with nothing
    emptied, every line decoded is valid JSON, which both of its paths read alike.
    """
    data, size = chunk.data, chunk.size
    spans = None if has_nul(data, size) else array_spans(data, size, ID_KEYS[1])
    if spans is None:
        return None
    whole = emptied(data, size, spans) if spans else (data if size == len(data) else data[:size])
    if spans and ID_KEYS[0] in whole:
        return None
    items = decode_aligned(_PROMPT_LINES, whole)
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
    (``ids[starts[i]:ends[i]]``; ``has_ids[i]`` False without an ``input_ids`` array), and
    its turn (None outside a conversation regenerated turn by turn). ``next_line`` is the
    number of the line at end_offset."""

    lines: list[int]
    sample_ids: list[SampleId]
    texts: list[str | None]
    has_ids: list[bool]
    ids: Any  # numpy int64 array
    starts: Any
    ends: Any
    end_offset: int
    next_line: int
    turns: list[int | None]


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
    for chunk in iter_chunks(path, offset, block_bytes):
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
                             chunk.offset + chunk.size, line, [r[4] for r in rows])


_ContentRows: TypeAlias = "list[tuple[int, SampleId, str | None, bool, int | None]]"


def _contents_at_once(chunk: Chunk, first_line: int) -> tuple[_ContentRows, Any, list[int]] | None:
    """(line, sample id, text, has ids, turn) per line, their ids and the count of each, from one
    decode call and one parse of the arrays' digits; None unless every line is clean."""
    found = _prompt_items(chunk)
    if found is None:
        return None
    items, arrays, spans = found
    parsed = parse_spans(chunk.data, spans)
    if parsed is None:
        return None
    ids, counts = parsed
    rows: _ContentRows = []
    per_row: list[int] = []
    for index, (item, array) in enumerate(zip(items, arrays, strict=True)):
        sample_id = line_sample_id(item)
        count = counts[array] if array >= 0 else 0
        if sample_id is None:
            if count:
                return None  # rare: its ids would have to be cut out of the parsed ones
            continue
        rows.append((first_line + index, sample_id, item.text, array >= 0, item.turn))
        per_row.append(count)
    return rows, ids, per_row


def _contents_by_line(chunk: Chunk, first_line: int) -> tuple[_ContentRows, Any, list[int]]:
    """What :func:`_contents_at_once` gives, each line decoded alone (bad ones left out)."""
    import numpy as np

    rows: _ContentRows = []
    lists: list[list[int]] = []
    for line, text in numbered(split_lines(chunk), first_line):
        found = _prompt_content(text)
        if found is not None:
            sample_id, prompt, ids, turn = found
            rows.append((line, sample_id, prompt, ids is not None, turn))
            lists.append(ids or [])
    counts = [len(ids) for ids in lists]
    flat = [min(max(i, -(1 << 63)), (1 << 63) - 1) for ids in lists for i in ids]
    return rows, np.asarray(flat, dtype=np.int64), counts


def _prompt_content(
    text: bytes,
) -> tuple[SampleId, str | None, list[int] | None, int | None] | None:
    """(sample id, text, input ids, turn) of one line, or None: not a JSON object, no sample
    id, a text that is not a string or input ids that are not a list of integers (a turn
    that is not a non-negative integer reads as None)."""
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
    turn = value.get("turn")
    good_turn = isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0
    return sample_id, prompt, ids, turn if good_turn else None


def _line_arrays(whole: bytes, spans: list[tuple[int, int]], lines: int) -> list[int] | None:
    """Per line of `whole` (the lines with the array spans emptied), the index of the span it
    held (-1 for none); None when a line held more than one."""
    if not spans:
        return [-1] * lines
    import numpy as np  # here: most readers of records never count

    owner = span_lines(whole, spans)
    if not one_per_line(owner):
        return None
    arrays = np.full(lines, -1, dtype=np.int64)
    arrays[owner] = np.arange(len(spans))
    found: list[int] = arrays.tolist()
    return found


def _prompt_lines(chunk: Chunk, first_line: int) -> tuple[list[PromptRow], list[LineProblem], int]:
    """The prompt rows, problems and line count of a chunk whose lines are read one by one:
    rows and problems exactly as :func:`iter_blocks` reads them, sizes from each row's line."""
    rows, problems, lines = decode_chunk(chunk, first_line, ROWS)
    texts = split_lines(chunk)
    prompts = [PromptRow(row.line, row.sample_id, *_prompt_parts(texts[row.line - first_line]),
                         row.turn) for row in rows]
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
