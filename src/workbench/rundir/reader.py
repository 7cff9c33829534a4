"""The fast path: a records file read in blocks of whole lines, each line a normalised row.

:func:`iter_blocks` reads a file from a byte offset to its end, one
:class:`~workbench.rundir.records.Block` per chunk of about ``block_bytes``;
:func:`read_rows` gives every row and problem of a file, :func:`parse_lines` those of lines in
memory. Each line becomes a Row as :mod:`workbench.rundir.normalise` says. A chunk of clean
lines is decoded in one call, its token id arrays emptied first by a byte search (parsing
their digits is most of a scan's cost); a chunk holding a bad line is decoded line by line.
A reader that wants the output ids as numbers (validation: ``id_arrays``) gets them in one
int64 array per chunk, their digits parsed in one call (:mod:`workbench.rundir.id_arrays`:
compiled with numba, else numpy), never as Python lists.

Every reader sees the same lines as records, whether it reads the output ids or not: a line
whose ``output_ids`` array would not decode as non-negative ints (a NUL byte, a minus sign, a
fraction or an exponent in it) is decoded line by line on every path, ids included, and is a
problem on each.

The byte-level helpers (chunks of whole lines, the spans of id arrays, the NUL check) are
shared with :mod:`workbench.rundir.prompt_reader` and :mod:`workbench.rundir.line_index`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from workbench.rundir.columns import FileScan
from workbench.rundir.id_arrays import IdArrays, of_lists, one_per_line, parse_spans, span_lines
from workbench.rundir.normalise import ROWS, ROWS_WITH_IDS, Schema, decode_line, to_row
from workbench.rundir.records import Block, LineProblem, Row, StrPath

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "ID_KEYS",
    "ROWS_AT_BLOCK_BYTES",
    "Chunk",
    "array_spans",
    "decode_aligned",
    "decode_arrays",
    "decode_chunk",
    "decode_whole",
    "emptied",
    "has_nul",
    "iter_blocks",
    "iter_chunks",
    "numbered",
    "parse_lines",
    "paused_gc",
    "read_rows",
    "rows_at",
    "split_lines",
    "torn_block",
]

DEFAULT_BLOCK_BYTES = 8 << 20


# --- reading files in blocks of whole lines ------------------------------------------------------


class Chunk(NamedTuple):
    """Bytes read at file ``offset``: whole lines ``data[:size]``, or (torn) a last partial line."""

    data: bytes
    size: int
    offset: int
    torn: bool = False

    def whole(self) -> bytes:
        return self.data if self.size == len(self.data) else self.data[: self.size]


def iter_chunks(path: StrPath, offset: int, block_bytes: int) -> Iterator[Chunk]:
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
                yield Chunk(data, cut, offset)
                offset, size = offset + cut, block_bytes
            elif len(data) == size:
                size *= 2
            else:
                if data.strip():
                    yield Chunk(data, len(data), offset, torn=True)
                return


def decode_whole(
    decoder: msgspec.json.Decoder[Any], chunk: Chunk, *, keep_output_ids: bool = False
) -> list[Any] | None:
    """Every line of the chunk decoded in one call, or None unless each is one clean object
    (and its id arrays what :func:`_without_arrays` takes)."""
    data, size = chunk.data, chunk.size
    if has_nul(data, size):
        return None
    minus = data.find(b"-", 0, size) >= 0
    for key in ID_KEYS[keep_output_ids:]:
        emptied = _without_arrays(data, size, key, minus)
        if emptied is None:
            return None
        if emptied is not data:
            data, size = emptied, len(emptied)
    return decode_aligned(decoder, data if size == len(data) else data[:size])


def decode_aligned(decoder: msgspec.json.Decoder[Any], data: bytes) -> list[Any] | None:
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


ID_KEYS = (b'"output_ids"', b'"input_ids"')  # token id arrays no reader decodes (but output_ids)
_INLINE_SPACE = frozenset(b" \t")
_COLON, _BRACKET = ord(":"), ord("[")


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
    gives None (and so does a NUL byte anywhere in the chunk, :func:`has_nul`); a nested
    array leaves bytes that fail to decode. Either way the chunk is then decoded line by
    line from its original bytes, where every reader decodes the ids. What else an emptied
    array holds is not checked (a search of every array's bytes for each is what it would
    cost): a line with ``"output_ids":[1,,2]``, ``[1.5]`` or ``[1,true]`` reads as a row
    here, malformed or of the wrong type line by line.
    """
    spans = array_spans(data, size, key, minus)
    if spans is None:
        return None
    return data if not spans else emptied(data, size, spans)


def has_nul(data: bytes, size: int) -> bool:
    """Whether data[:size] holds a NUL byte, which no JSON text holds (a crash leaves
    zero-filled pages): such a chunk is read line by line, where the line is named."""
    return data.find(b"\x00", 0, size) >= 0


def array_spans(
    data: bytes, size: int, key: bytes, minus: bool = True, checked: bool = True,
) -> list[tuple[int, int]] | None:
    """[start, end) of the items of every ``"key": [...]`` array in data[:size], or None
    when one is not closed, or (when `checked`) holds a newline or a quote (a torn line with
    another appended) or a minus sign (searched for only when `minus`: the caller found one
    in the chunk; see :func:`_without_arrays`). A caller that parses the items itself, and
    refuses all three, passes `checked` False."""
    spans: list[tuple[int, int]] = []
    search = 0
    find = data.find
    while (found := find(key, search, size)) >= 0:
        search = found + len(key)
        start = _array_after_key(data, search, size)
        if start < 0:
            continue
        end = find(b"]", start, size)
        if end < 0 or checked and (find(b"\n", start, end) >= 0 or find(b'"', start, end) >= 0
                                   or (minus and find(b"-", start, end) >= 0)):
            return None
        spans.append((start, end))
        search = end
    return spans


def emptied(data: bytes, size: int, spans: list[tuple[int, int]]) -> bytes:
    view = memoryview(data)
    pieces: list[memoryview] = []
    position = 0
    for start, end in spans:
        pieces.append(view[position:start])
        position = end
    pieces.append(view[position:size])
    return b"".join(pieces)


def split_lines(chunk: Chunk) -> list[bytes]:
    return chunk.whole().split(b"\n")[:-1]


def numbered(texts: list[bytes], first_line: int) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines with their line numbers."""
    for index, text in enumerate(texts):
        if text.strip():
            yield first_line + index, text


def decode_chunk(
    chunk: Chunk, first_line: int, schema: Schema
) -> tuple[list[Row], list[LineProblem], int]:
    """Rows, problems and line count of a chunk: in one call, or line by line if one is bad."""
    records = decode_whole(schema.decoder, chunk, keep_output_ids=schema.keeps_output_ids)
    if records is not None:
        keep = schema.keeps_output_ids
        rows = [to_row(rec, first_line + index, keep) for index, rec in enumerate(records)]
        return rows, [], len(records)
    rows = []
    problems: list[LineProblem] = []
    texts = split_lines(chunk)
    for line, text in numbered(texts, first_line):
        row, problem = decode_line(text, line, schema)
        if row is not None:
            rows.append(row)
        if problem is not None:
            problems.append(problem)
    return rows, problems, len(texts)


def decode_arrays(
    chunk: Chunk, first_line: int
) -> tuple[list[Row], list[LineProblem], int, IdArrays]:
    """What :func:`decode_chunk` gives with the output ids, those ids as one array: parsed
    from the chunk's bytes with the rest of each line decoded in one call (the rows' own
    ``output_ids`` left None), else the chunk decoded as :func:`decode_chunk` decodes it
    (the rows keep their lists, the array is built from them)."""
    found = _arrays_at_once(chunk, first_line)
    if found is not None:
        rows, arrays = found
        return rows, [], len(rows), arrays
    rows, problems, lines = decode_chunk(chunk, first_line, ROWS_WITH_IDS)
    return rows, problems, lines, of_lists([row.output_ids for row in rows])


def _arrays_at_once(chunk: Chunk, first_line: int) -> tuple[list[Row], IdArrays] | None:
    """The chunk's rows and their output ids, or None unless every line is one clean object
    whose top-level ``output_ids`` (if any) is the one array of that key the byte search
    found in it, and every such array plain non-negative integers
    (:func:`workbench.rundir.id_arrays.parse_spans`)."""
    import numpy as np

    data, size = chunk.data, chunk.size
    if has_nul(data, size):
        return None
    outputs = array_spans(data, size, ID_KEYS[0], checked=False)  # parse_spans checks them
    parsed = None if outputs is None else parse_spans(data, outputs)
    if outputs is None or parsed is None:
        return None
    spans = outputs
    whole = emptied(data, size, spans) if spans else chunk.whole()
    if whole.find(ID_KEYS[1]) >= 0:  # prompt ids too (searched for without the reply ids)
        inputs = array_spans(data, size, ID_KEYS[1])
        if inputs is None:
            return None
        spans = sorted(outputs + inputs)
        whole = emptied(data, size, spans)
    items = decode_aligned(ROWS.decoder, whole)
    if items is None:
        return None
    owners = span_lines(whole, spans)
    if len(spans) > len(outputs):
        owned_by = set(outputs)
        owners = owners[[index for index, span in enumerate(spans) if span in owned_by]]
    if not one_per_line(owners):
        return None  # a line with two output_ids arrays (one nested)
    owned = np.zeros(len(items), dtype=bool)
    owned[owners] = True
    for item, own in zip(items, owned.tolist(), strict=True):
        if (item.output_ids is not None) != own or (own and item.output_ids):
            return None  # a nested array only, or a key written with escapes
    ids, counts = parsed
    lengths = np.zeros(len(items), dtype=np.int64)
    lengths[owners] = counts
    ends = np.cumsum(lengths)
    rows = [to_row(item, first_line + index, False) for index, item in enumerate(items)]
    return rows, IdArrays(ids, ends - lengths, ends)


def torn_block(chunk: Chunk, line: int) -> Block:
    detail = f"last line has no newline ({chunk.size} bytes): cut short or still being written"
    problem = LineProblem(line, "torn", detail)
    return Block([], [problem], chunk.offset, chunk.offset, line, 0)


def iter_blocks(
    path: StrPath,
    *,
    offset: int = 0,
    first_line: int = 1,
    with_output_ids: bool = False,
    id_arrays: bool = False,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Iterator[Block]:
    """Normalised blocks of path from byte offset (a line start) to the end of the file.

    ``first_line`` is the number of the line at offset. With `id_arrays`, each block's
    output ids come as one array (``Block.ids``, :func:`decode_arrays`), not as lists. A torn last line comes as a final
    block with no rows and a "torn" problem, its offsets both before the line, so a reader
    resuming at the last ``end_offset`` reads it again once it is complete. Raises OSError
    when path cannot be read.
    """
    schema = ROWS_WITH_IDS if with_output_ids else ROWS
    line = first_line
    for chunk in iter_chunks(path, offset, block_bytes):
        if chunk.torn:
            yield torn_block(chunk, line)
            return
        if id_arrays:
            rows, problems, lines, arrays = decode_arrays(chunk, line)
        else:
            (rows, problems, lines), arrays = decode_chunk(chunk, line, schema), None
        yield Block(rows, problems, chunk.offset, chunk.offset + chunk.size, line, lines, arrays)
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
    schema = ROWS_WITH_IDS if with_output_ids else ROWS
    rows, problems, _ = decode_chunk(Chunk(data, len(data), 0), first_line, schema)
    return rows, problems


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


ROWS_AT_BLOCK_BYTES = 256 << 10  # the scan's blocks (an index's) are this long: read no more


def rows_at(path: Path, lines: set[int], index: FileScan | None = None,
            block_bytes: int = ROWS_AT_BLOCK_BYTES) -> dict[int, Row]:
    """The rows (with output ids) at the given line numbers of a raw file: read from the
    block holding each (in the scan's block index), else from the file's start, in reads of
    `block_bytes` up to the last line wanted."""
    found: dict[int, Row] = {}
    if not lines or not path.is_file():
        return found
    starts = {index.block_at(line) if index else (0, 1) for line in lines}
    for offset, first in sorted(starts, reverse=True):  # each block reads only its own lines
        wanted = {line for line in lines if line >= first and line not in found}
        if wanted:
            found.update(_rows_from(path, offset, first, wanted, block_bytes))
    return found


def _rows_from(path: Path, offset: int, first: int, lines: set[int],
               block_bytes: int) -> dict[int, Row]:
    found: dict[int, Row] = {}
    last = max(lines)
    for block in iter_blocks(path, offset=offset, first_line=first, with_output_ids=True,
                             block_bytes=block_bytes):
        found.update((row.line, row) for row in block.rows if row.line in lines)
        if block.first_line + block.lines > last:
            break
    return found
