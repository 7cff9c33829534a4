"""Output ids read straight into arrays give what decoding every id as JSON gives."""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_records import JSON, dump

from workbench.rundir import id_arrays
from workbench.rundir.id_arrays import parse_spans
from workbench.rundir.normalise import ROWS_WITH_IDS
from workbench.rundir.reader import Chunk, _arrays_at_once, decode_arrays, decode_chunk, iter_blocks
from workbench.rundir.records import Row

KERNEL = id_arrays._kernel()  # numba's loop, whatever a test's parser


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with numba's compiled loop and with numpy's parse (no numba)."""
    if request.param == "numpy":
        monkeypatch.setattr(id_arrays, "_kernel", lambda: None)
    else:
        assert id_arrays._kernel() is not None, "the test extra installs numba"
    return str(request.param)


def _spans(*items: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    data, spans = b"", []
    for text in items:
        spans.append((len(data) + 1, len(data) + 1 + len(text)))
        data += b"[" + text + b"]"
    return data, spans


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ((b"1, 2, 3", b"", b"4"), ([1, 2, 3, 4], [3, 0, 1])),
        ((b" ", b" 7 ", b"0"), ([7, 0], [0, 1, 1])),
        ((b"0, 10, 100, 163839",), ([0, 10, 100, 163839], [4])),
        ((b"9" * 18,), ([int("9" * 18)], [1])),
        ((b"1 , 2",), ([1, 2], [2])),
    ],
    ids=["dumps layout and an empty array", "blank arrays", "zeros and powers of ten",
         "18 digits", "spaces before commas"],
)
def test_plain_arrays_parse_in_one_call(items: tuple[bytes, ...],
                                        expected: tuple[list[int], list[int]]) -> None:
    data, spans = _spans(*items)
    found = parse_spans(data, spans)
    assert found is not None
    assert (found[0].dtype, found[0].tolist(), found[1]) == (np.dtype(np.int64), *expected)


@pytest.mark.parametrize(
    "text",
    [b"1,,2", b"1 2", b"01", b"00", b"+1", b"1.5", b"1e5", b"1,true", b"1,2,", b",1", b"-1",
     b"1\t,2", b"9" * 19, b"99999999999999999999", b'1,"2"', b"00, ,0", b"1, , 2"],
)
def test_what_json_or_int64_would_not_take_is_refused(text: bytes) -> None:
    data, spans = _spans(b"5", text)
    assert parse_spans(data, spans) is None


def _read_both(data: bytes) -> tuple[list[Row], Any]:
    """The arrays reader's rows and ids, checked against the lists reader's."""
    chunk = Chunk(data, len(data), 0)
    rows, problems, lines = decode_chunk(chunk, 1, ROWS_WITH_IDS)
    got_rows, got_problems, got_lines, arrays = decode_arrays(chunk, 1)
    assert (got_problems, got_lines) == (problems, lines)
    assert len(got_rows) == len(rows) == len(arrays.starts)
    for index, (got, row) in enumerate(zip(got_rows, rows, strict=True)):
        listed = [min(i, 1 << 62) for i in row.output_ids or []]
        assert arrays.row(index).tolist() == listed
        assert msgspec.structs.replace(got, output_ids=None) == \
            msgspec.structs.replace(row, output_ids=None)
    return got_rows, arrays


def _line(sample_id: int, ids: str, style: str = "dumps") -> bytes:
    value = {"sample_id": sample_id, "prompt_tokens": 3, "completion_tokens": 2,
             "output_ids": "IDS", "finish_reason": "stop", "ts": 1.5}
    separators = {"dumps": (", ", ": "), "compact": (",", ":"), "spaced": (" , ", " : ")}[style]
    return json.dumps(value, separators=separators).replace('"IDS"', ids).encode() + b"\n"


@pytest.mark.parametrize("style", ["dumps", "compact", "spaced"])
def test_every_layout_takes_the_arrays_path(style: str) -> None:
    data = b"".join(_line(n, json.dumps(list(range(n * 3, n * 5)), separators=(
        (",", ":") if style == "compact" else (", ", ": "))), style) for n in range(6))
    data += b'{"sample_id": 9, "input_ids": [1, 2], "ts": 1.0}\n'  # no output ids
    data += b'{"sample_id": 10, "output_ids": [], "ts": 1.0}\r\n'
    data += b'{"sample_id": 11, "input_ids": [7, 8], "output_ids": [3, 4], "ts": 1.0}\n'
    assert _arrays_at_once(Chunk(data, len(data), 0), 1) is not None
    rows, arrays = _read_both(data)
    assert [r.has_output_ids for r in rows] == [True] * 6 + [False, True, True]
    assert arrays.row(8).tolist() == [3, 4]
    assert all(r.output_ids is None for r in rows)  # the ids are in the array only
    assert arrays.row(5).tolist() == list(range(15, 25))


ODD_LINES = {
    "nul byte": b'{"sample_id": 2, "output_ids": [1, \x002], "ts": 1.0}\n',
    "fraction": _line(2, "[1, 2.5]"),
    "exponent": _line(2, "[1, 2e3]"),
    "true": _line(2, "[1, true]"),
    "minus sign": _line(2, "[1, -2]"),
    "leading zero": _line(2, "[1, 02]"),
    "plus sign": _line(2, "[1, +2]"),
    "tab": _line(2, "[1,\t2]"),
    "past int64": _line(2, "[1, 18446744073709551615]"),
    "past uint64": _line(2, "[1, 99999999999999999999999]"),
    "two commas": _line(2, "[1,, 2]"),
    "nested key only": b'{"sample_id": 2, "meta": {"output_ids": [4, 5]}, "ts": 1.0}\n',
    "nested and top keys": b'{"sample_id": 2, "meta": {"output_ids": [4]}, "output_ids": [5]}\n',
    "escaped key": b'{"sample_id": 2, "output\\u005fids": [4, 5], "ts": 1.0}\n',
    "strings in the array": _line(2, '["a", "b"]'),
    "torn line then the next": _line(2, "[1, 2]")[:40] + _line(3, "[3]"),
}


@pytest.mark.parametrize("odd", list(ODD_LINES.values()), ids=list(ODD_LINES))
def test_an_odd_line_reads_as_json_reads_it(odd: bytes) -> None:
    data = _line(1, "[7, 8, 9]") + odd + _line(4, "[10]")
    assert _arrays_at_once(Chunk(data, len(data), 0), 1) is None
    rows, arrays = _read_both(data)
    assert rows[0].sample_id == 1 and arrays.row(0).tolist() == [7, 8, 9]
    assert rows[-1].sample_id == 4 and arrays.row(len(rows) - 1).tolist() == [10]


def test_a_torn_last_line_is_a_block_without_rows(tmp_path: Any) -> None:
    path = tmp_path / "raw.jsonl"
    path.write_bytes(_line(1, "[7, 8]") + _line(2, "[9, 10]")[:30])
    blocks = list(iter_blocks(path, id_arrays=True))
    assert [len(b.rows) for b in blocks] == [1, 0]
    assert blocks[0].ids.row(0).tolist() == [7, 8]
    assert [p.kind for p in blocks[1].problems] == ["torn"]


@settings(max_examples=150, deadline=None)
@given(values=st.lists(JSON | st.builds(dict, sample_id=st.integers(0, 9),
                                        output_ids=st.lists(st.integers(0, 10**6), max_size=6)),
                       max_size=8),
       compact=st.booleans())
def test_any_block_reads_as_the_lists_reader_reads_it(values: list[Any], compact: bool) -> None:
    _read_both(b"".join(dump(v, compact) for v in values))



@settings(max_examples=400, deadline=None)
@given(items=st.lists(st.text(alphabet="0123456789, \t\r-+.e", max_size=12)
                      | st.lists(st.integers(0, 10**19), max_size=4).map(
                          lambda ids: ", ".join(map(str, ids))), max_size=5))
def test_the_compiled_loop_and_numpy_agree_on_any_span(items: list[str]) -> None:
    data, spans = _spans(*(item.encode() for item in items))
    compiled = id_arrays._parse_compiled(KERNEL, data, spans)
    numpy = id_arrays._parse_numpy(data, spans)
    assert (compiled is None) == (numpy is None)
    if compiled is not None and numpy is not None:
        assert compiled[0].tolist() == numpy[0].tolist() and compiled[1] == numpy[1]


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="0123456789, ", max_size=40), cuts=st.lists(st.integers(0, 40)))
def test_a_span_ends_where_it_is_told_even_inside_an_id(text: str, cuts: list[int]) -> None:
    data = text.encode()  # no brackets: a span may end before the digits do
    bounds = sorted({0, len(data), *(min(cut, len(data)) for cut in cuts)})
    spans = list(itertools.pairwise(bounds))
    compiled = id_arrays._parse_compiled(KERNEL, data, spans)
    numpy = id_arrays._parse_numpy(data, spans)
    assert (compiled is None) == (numpy is None)
    if compiled is not None and numpy is not None:
        assert compiled[0].tolist() == numpy[0].tolist() and compiled[1] == numpy[1]
