"""Token id arrays read straight from a block's bytes into one int64 array, never Python lists.

    IdArrays      the ids of a block's rows back to back: row i holds ids[starts[i]:ends[i]]
    of_lists      the same built from lists (a block read line by line)
    parse_spans   the integers of a block's ``[...]`` array spans, in one call
    span_lines    the line of each span, found in the block with the spans emptied
    prepare       the compiled parser made ready before worker processes fork

The readers (:mod:`workbench.rundir.reader` for the output ids of records,
:mod:`workbench.rundir.prompt_reader` for the input ids of prompts) find every id array of a
block by a byte search, decode the rest of each line in one call and hand the arrays' digits
here, parsed in one call: a loop compiled by numba when it is installed (the ``fast`` extra,
:mod:`workbench.rundir._parse_loop`: about 6 ns an id with its checks), else one
``numpy.fromstring`` over them all (about 21 ns an id); either is several times faster than
decoding each id into a Python int and turning the lists into an array, and both give the
same answers. The parse is as strict as JSON, so a block it
takes gives exactly what decoding each line would; a block it does not take (a fraction, an
exponent, ``true`` or a sign inside an array, a leading zero, a tab, an id of 19 digits or
more) is read line by line by the caller, where JSON decides.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from workbench import loops

__all__ = ["IdArrays", "of_lists", "one_per_line", "parse_spans", "prepare", "span_lines"]

_NEWLINE, _COMMA, _SPACE, _ZERO = ord("\n"), ord(","), ord(" "), ord("0")
_MAX_DIGITS = 18  # an id of more digits may not fit int64: such a block is read line by line
_BLANK = frozenset(b" \t\r")


class IdArrays(NamedTuple):
    """The token ids of a block's rows in one int64 array: row i holds ``ids[starts[i]:ends[i]]``
    (none when it has no id array)."""

    ids: Any  # numpy int64 array
    starts: Any
    ends: Any

    def row(self, index: int) -> Any:
        """Row index's ids (a view)."""
        return self.ids[self.starts[index]:self.ends[index]]


def of_lists(id_lists: Sequence[Sequence[int] | None]) -> IdArrays:
    """The rows' id lists (None: no ids) as one array; an id past 64 bits is clipped to 2**62
    (out of any vocabulary)."""
    import numpy as np

    lengths = np.fromiter((0 if ids is None else len(ids) for ids in id_lists), dtype=np.int64,
                          count=len(id_lists))
    ends = np.cumsum(lengths)
    flat: list[int] = []
    for ids in id_lists:
        if ids is not None:
            flat.extend(ids)
    try:
        array = np.fromiter(flat, dtype=np.int64, count=len(flat))
    except OverflowError:
        array = np.array([min(max(i, -1), 1 << 62) for i in flat], dtype=np.int64)
    return IdArrays(array, ends - lengths, ends)


def parse_spans(data: bytes, spans: Sequence[tuple[int, int]]) -> tuple[Any, list[int]] | None:
    """(ids, items per span) of the arrays whose items are ``data[start:end]`` for each span, or
    None unless every one is a JSON array of non-negative integers of at most 18 digits with
    spaces around its commas at most (what the caller then reads line by line): with the
    compiled loop when numba is installed (the ``fast`` extra), else with numpy. Both give
    the same answer for every input."""
    kernel = _kernel()
    if kernel is None:
        return _parse_numpy(data, spans)
    return _parse_compiled(kernel, data, spans)


def _parse_compiled(kernel: Any, data: bytes, spans: Sequence[tuple[int, int]],
                    ) -> tuple[Any, list[int]] | None:
    import numpy as np

    bounds = np.array(spans, dtype=np.int64).reshape(-1, 2)
    most = int(((bounds[:, 1] - bounds[:, 0] + 1) // 2).sum())  # an id and a comma: 2 bytes
    ids = np.empty(most, dtype=np.int64)
    counts = np.zeros(len(spans), dtype=np.int64)
    found = kernel(np.frombuffer(data, dtype=np.uint8), bounds, ids, counts)
    return None if found < 0 else (ids[:found], counts.tolist())


def _parse_numpy(data: bytes, spans: Sequence[tuple[int, int]]) -> tuple[Any, list[int]] | None:
    """:func:`parse_spans` without numba.

    The non-blank spans are joined by commas and parsed in one ``numpy.fromstring`` call. It
    reads ``ws? int (ws? , ws? int)* ws?`` and warns when it stops early (two commas, a
    missing comma, a letter); what it would take but JSON does not is refused by counting:
    every byte is a digit, a comma or a space, no comma next to another or at an end (spaces
    aside), one comma fewer than ids, and as many digits as the ids have (a leading zero has
    one more).
    """
    import numpy as np

    blank = [_blank(data, start, end) for start, end in spans]
    if all(blank):
        return np.zeros(0, dtype=np.int64), [0] * len(spans)
    text = b",".join([data[start:end] for (start, end), empty in zip(spans, blank, strict=True)
                     if not empty])
    chars = np.frombuffer(text, dtype=np.uint8)
    commas = chars == _COMMA
    digits = int(np.count_nonzero((chars - np.uint8(_ZERO)) < 10))
    comma_count = int(np.count_nonzero(commas))
    if digits + comma_count + int(np.count_nonzero(chars == _SPACE)) != len(text):
        return None
    solid = commas[chars != _SPACE]  # an empty item (", ,", a comma at an end) reads as a 0
    if solid[0] or solid[-1] or bool((solid[1:] & solid[:-1]).any()):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns when it stops before the end of the text
        try:
            ids = np.fromstring(text, dtype=np.int64, sep=",")
        except (DeprecationWarning, ValueError):
            return None
    if comma_count != len(ids) - 1 or not _digits_match(ids, digits):
        return None
    return ids, _span_counts(spans, blank, commas)


def _blank(data: bytes, start: int, end: int) -> bool:
    while start < end and data[start] in _BLANK:
        start += 1
    return start == end


def _digits_match(ids: Any, digits: int) -> bool:
    """Whether the ids, written without leading zeros, take `digits` digits (and each fewer
    than 19)."""
    import numpy as np

    if not len(ids):
        return digits == 0
    largest = int(ids.max())
    if int(ids.min()) < 0 or len(str(largest)) > _MAX_DIGITS:
        return False
    written = len(ids) + sum(int(np.count_nonzero(ids >= 10 ** k))
                             for k in range(1, len(str(largest))))
    return written == digits


def _span_counts(spans: Sequence[tuple[int, int]], blank: list[bool], commas: Any) -> list[int]:
    """Items of each span: its commas plus one (0 for a blank one), summed per joined piece
    with the comma that joins it to the next (so each piece but the last counts exactly)."""
    import numpy as np

    lengths = np.array([end - start for (start, end), empty in zip(spans, blank, strict=True)
                        if not empty], dtype=np.int64)
    at = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=at[1:])
    pieces = np.add.reduceat(commas.view(np.uint8), at, dtype=np.uint32)  # < 2**32 per piece
    pieces[-1] += 1
    counts = iter(pieces.tolist())
    return [0 if empty else next(counts) for empty in blank]


def one_per_line(owners: Any) -> bool:
    """Whether no two of the spans whose lines are `owners` (:func:`span_lines`) share one."""
    import numpy as np

    return len(owners) < 2 or bool((np.diff(owners) > 0).all())


def span_lines(whole: bytes, spans: Sequence[tuple[int, int]]) -> Any:
    """The line (0-based) of `whole` that held each span, `whole` being the lines with every
    span emptied (:func:`workbench.rundir.reader.emptied`): int64 array, one entry per span."""
    import numpy as np

    if not spans:
        return np.zeros(0, dtype=np.int64)
    bounds = np.array(spans, dtype=np.int64)
    lengths = bounds[:, 1] - bounds[:, 0]
    emptied_at = bounds[:, 0] - (np.cumsum(lengths) - lengths)  # where each span was in whole
    line_ends = np.flatnonzero(np.frombuffer(whole, dtype=np.uint8) == _NEWLINE)
    owners: Any = np.searchsorted(line_ends, emptied_at)  # the newlines before: the line
    return owners


# --- the compiled loop (numba, when installed) ------------------------------------------------

@loops.compiled("workbench.rundir._parse_loop")
def _kernel() -> Any:
    """The compiled span parser (:mod:`workbench.rundir._parse_loop`), or None."""
    from workbench.rundir._parse_loop import parse_loop

    return parse_loop


def prepare() -> None:
    """Compile (or load from numba's cache) the span parser now: worker processes forked
    after it inherit it instead of each paying for numba's import and the load."""
    if _kernel() is not None:
        parse_spans(b"[1]", [(1, 2)])
