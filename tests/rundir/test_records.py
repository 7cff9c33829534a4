from __future__ import annotations

import itertools
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import StorageError
from workbench.rundir.appender import JsonlAppender, repair_torn_tail
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import iter_blocks, parse_lines, read_rows
from workbench.rundir.records import (
    SCHEMA_VERSION,
    ErrorRecord,
    LineProblem,
    PromptRecord,
    Record,
    Row,
    encode_line,
    is_finished,
)

DESIGN_KEYS = [
    "sample_id",
    "output_ids",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "matched_stop",
    "e2e_latency",
    "ts",
    "schema",
]


def record(sample_id: int | str = 1, *, ids: int = 3, **changes: Any) -> Record:
    fields: dict[str, Any] = dict(
        sample_id=sample_id,
        output_ids=list(range(100, 100 + ids)),
        prompt_tokens=10,
        completion_tokens=ids,
        cached_tokens=4,
        finish_reason="stop",
        matched_stop=163586,
        e2e_latency=1.5,
        ts=1750000000.0,
    )
    fields.update(changes)
    return Record(**fields)


def as_line(value: Any) -> bytes:
    return value if isinstance(value, bytes) else encode_line(value)


def write(path: Path, *values: Any) -> Path:
    path.write_bytes(b"".join(as_line(v) for v in values))
    return path


def one(value: Any, **kwargs: Any) -> tuple[Row | None, list[LineProblem]]:
    rows, problems = parse_lines(as_line(value), **kwargs)
    assert len(rows) <= 1
    return (rows[0] if rows else None), problems


META_REPLY = {
    "text": "hi",
    "output_ids": [5, 6, 163586],
    "meta_info": {
        "id": "f00",
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "cached_tokens": 8,
        "finish_reason": {"type": "stop", "matched": 163586},
        "e2e_latency": 0.25,
        "reasoning_tokens": 2,
    },
}

CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}],
    "usage": {
        "prompt_tokens": 7,
        "completion_tokens": 9,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 5},
    },
}


# --- written records -----------------------------------------------------------------------------


def test_record_line_has_the_design_keys_in_order() -> None:
    line = encode_line(record())
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded = json.loads(line)
    assert list(decoded) == DESIGN_KEYS
    assert decoded["schema"] == SCHEMA_VERSION


def test_prompt_record_omits_what_it_lacks_and_error_record_keeps_nulls() -> None:
    assert json.loads(encode_line(PromptRecord(sample_id="a", input_ids=[1, 2]))) == {
        "sample_id": "a",
        "input_ids": [1, 2],
    }
    error = ErrorRecord(
        sample_id=3, attempt=1, error_type="timeout", http_status=None, message="no reply", ts=1.0
    )
    assert json.loads(encode_line(error))["http_status"] is None


# --- layouts -------------------------------------------------------------------------------------


def test_flat_record_reads_back_whole() -> None:
    row, problems = one(record(7), with_output_ids=True)
    assert problems == []
    assert row == Row(
        line=1,
        layout="flat",
        sample_id=7,
        prompt_tokens=10,
        completion_tokens=3,
        cached_tokens=4,
        finish_reason="stop",
        matched_stop=163586,
        e2e_latency=1.5,
        ts=1750000000.0,
        output_ids=[100, 101, 102],
        has_output_ids=True,
    )


def test_output_ids_only_when_asked() -> None:
    row, _ = one(record())
    assert row is not None and row.output_ids is None


def test_meta_info_layout() -> None:
    row, problems = one({"sample_id": "s1", **META_REPLY}, with_output_ids=True)
    assert problems == []
    assert row is not None
    assert (row.layout, row.sample_id, row.prompt_tokens, row.completion_tokens) == (
        "meta_info",
        "s1",
        12,
        3,
    )
    assert (row.cached_tokens, row.finish_reason, row.matched_stop) == (8, "stop", 163586)
    assert (row.e2e_latency, row.output_ids) == (0.25, [5, 6, 163586])


@pytest.mark.parametrize(
    ("finish_reason", "expected"),
    [
        ({"type": "length", "length": 64}, ("length", None)),
        ({"type": "abort", "message": "x", "status_code": 503}, ("abort", None)),
        ("stop", ("stop", None)),
        (None, (None, None)),
    ],
)
def test_meta_info_finish_reasons(finish_reason: Any, expected: tuple[Any, Any]) -> None:
    reply = {"meta_info": {"completion_tokens": 1, "finish_reason": finish_reason}}
    row, _ = one(reply)
    assert row is not None and (row.finish_reason, row.matched_stop) == expected


@pytest.mark.parametrize(
    ("line", "cached"),
    [
        ({"meta_info": {"prompt_tokens": 3, "completion_tokens": 2}}, 0),
        ({"meta_info": {"completion_tokens": 2, "cached_tokens": None}}, None),
        ({"meta_info": {"finish_reason": "stop"}}, None),
        ({"sample_id": 1, "completion_tokens": 2}, 0),
        ({"sample_id": 1, "completion_tokens": 2, "cached_tokens": None}, None),
    ],
    ids=["absent next to counts", "null", "absent alone", "flat absent", "flat null"],
)
def test_cached_tokens_is_zero_only_when_omitted_next_to_counts(
    line: dict[str, Any], cached: int | None
) -> None:
    row, _ = one(line)
    assert row is not None and row.cached_tokens == cached


@pytest.mark.parametrize(
    "line",
    [
        {"sample_id": 4, **CHAT_COMPLETION},
        {"sample_id": 4, "response": CHAT_COMPLETION},
        {"custom_id": 4, "response": {"status_code": 200, "body": CHAT_COMPLETION}},
    ],
    ids=["usage", "response.usage", "batch response.body"],
)
def test_legacy_layouts(line: dict[str, Any]) -> None:
    row, problems = one(line)
    assert problems == []
    assert row == Row(
        line=1,
        layout="legacy",
        sample_id=4,
        prompt_tokens=7,
        completion_tokens=9,
        cached_tokens=5,
        finish_reason="length",
        matched_stop=None,
        e2e_latency=None,
        ts=None,
    )


def test_legacy_sample_id_falls_back_to_id_and_matched_stop_comes_from_the_choice() -> None:
    line = {**CHAT_COMPLETION, "choices": [{"finish_reason": "stop", "matched_stop": 2}]}
    row, _ = one(line)
    assert row is not None
    assert (row.sample_id, row.finish_reason, row.matched_stop) == ("chatcmpl-1", "stop", 2)


def test_legacy_without_prompt_details_counts_zero_cached() -> None:
    row, _ = one({"usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    assert row is not None and row.cached_tokens == 0


def test_flat_finish_reason_may_be_an_object() -> None:
    line = {"sample_id": 1, "completion_tokens": 2, "finish_reason": {"type": "stop", "matched": 9}}
    row, _ = one(line)
    assert row is not None and (row.finish_reason, row.matched_stop) == ("stop", 9)


def test_a_line_whose_layout_cannot_be_told_is_flat_with_no_counts() -> None:
    row, problems = one({"sample_id": 3})
    assert problems == []
    assert row == Row(
        line=1,
        layout="flat",
        sample_id=3,
        prompt_tokens=None,
        completion_tokens=None,
        cached_tokens=None,
        finish_reason=None,
        matched_stop=None,
        e2e_latency=None,
        ts=None,
    )


@pytest.mark.parametrize(
    "line",
    [
        {"sample_id": 1, "prompt_tokens": 5, "finish_reason": "stop"},
        {"sample_id": 1, "meta_info": {"prompt_tokens": 5}},
        {"sample_id": 1, "usage": {"prompt_tokens": 5}},
    ],
    ids=["flat", "meta_info", "legacy"],
)
def test_missing_completion_tokens_is_none_never_zero(line: dict[str, Any]) -> None:
    row, problems = one(line)
    assert problems == []
    assert row is not None and row.completion_tokens is None and row.prompt_tokens == 5


def test_mixed_layouts_in_one_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "mixed.jsonl",
        record(1),
        {"sample_id": 2, **META_REPLY},
        {"sample_id": 3, **CHAT_COMPLETION},
        {"sample_id": 4},
    )
    rows, problems = read_rows(path)
    assert problems == []
    assert [(r.line, r.sample_id, r.layout) for r in rows] == [
        (1, 1, "flat"),
        (2, 2, "meta_info"),
        (3, 3, "legacy"),
        (4, 4, "flat"),
    ]
    assert [r.completion_tokens for r in rows] == [3, 3, 9, None]


# --- bad lines -----------------------------------------------------------------------------------


def test_wrong_types_keep_the_row_with_none_and_name_the_fields() -> None:
    row, problems = one(
        {
            "sample_id": 5,
            "prompt_tokens": 3,
            "completion_tokens": "12",
            "cached_tokens": "x",
            "finish_reason": "stop",
        }
    )
    assert row is not None
    assert (row.sample_id, row.prompt_tokens, row.finish_reason) == (5, 3, "stop")
    assert row.completion_tokens is None and row.cached_tokens is None
    [problem] = problems
    assert (problem.line, problem.kind) == (1, "bad_type")
    assert "completion_tokens" in problem.detail and "cached_tokens" in problem.detail


def test_wrong_nested_types_spare_their_neighbours() -> None:
    line = {
        "custom_id": 2,
        "usage": {"prompt_tokens": True, "completion_tokens": 4},
        "choices": [{"finish_reason": 1}],
    }
    row, problems = one(line)
    assert row is not None
    assert (row.layout, row.prompt_tokens, row.completion_tokens, row.finish_reason) == (
        "legacy",
        None,
        4,
        None,
    )
    assert [p.kind for p in problems] == ["bad_type"]
    assert "usage.prompt_tokens" in problems[0].detail
    assert "choices[0].finish_reason" in problems[0].detail


@pytest.mark.parametrize("ids", [[1, "two"], [1, -2]])
def test_wrong_output_ids_are_a_problem_whether_the_ids_are_read_or_not(
    tmp_path: Path, ids: list[Any]
) -> None:
    path = write(tmp_path / "raw.jsonl", record(1),
                 {"sample_id": 2, "completion_tokens": 2, "output_ids": ids}, record(3))
    for with_ids in (False, True):
        rows, problems = read_rows(path, with_output_ids=with_ids)
        bad = rows[1]
        assert bad.output_ids is None and not bad.has_output_ids and bad.completion_tokens == 2
        assert [(p.line, p.kind) for p in problems] == [(2, "bad_type")]
        assert "output_ids" in problems[0].detail
        assert [is_finished(r) for r in rows] == [True, False, True]


def test_a_nul_byte_in_an_id_array_makes_the_line_malformed_for_every_reader(
    tmp_path: Path,
) -> None:
    """A crash can leave zero-filled pages inside a line: the fast readers (stats, resume)
    and the id readers (validate, export) all call that line malformed."""
    path = tmp_path / "raw.jsonl"
    bad = encode_line(record(2)).replace(b"[100,101", b"[100,\x00\x00101")
    assert b"\x00" in bad
    path.write_bytes(encode_line(record(1)) + bad + encode_line(record(3)))
    for with_ids in (False, True):
        rows, problems = read_rows(path, with_output_ids=with_ids)
        assert [r.sample_id for r in rows] == [1, 3]
        assert [(p.line, p.kind) for p in problems] == [(2, "malformed")]
    assert read_sample_ids(path) == ({1, 3}, [])


def test_malformed_not_object_and_blank_lines_are_numbered_exactly(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.jsonl",
        record(1),
        b"{not json\n",
        b"\n",
        b"[1, 2]\n",
        b"   \n",
        b'"text"\n',
        record(2),
        b'{"sample_id": 3,}\n',
        record(3),
    )
    rows, problems = read_rows(path)
    assert [(r.line, r.sample_id) for r in rows] == [(1, 1), (7, 2), (9, 3)]
    assert [(p.line, p.kind) for p in problems] == [
        (2, "malformed"),
        (4, "not_object"),
        (6, "not_object"),
        (8, "malformed"),
    ]


TORN_THEN_APPENDED = encode_line(record(1, ids=50))[:60] + encode_line(record(2))


@pytest.mark.parametrize(
    ("data", "rows", "problems"),
    [
        (b'{"sample_id": 1}\r\n{"sample_id": 2}\r\n', [(1, 1), (2, 2)], []),
        (b'{"sample_id":1} {"sample_id":2}\n', [], [(1, "malformed")]),
        (b'{"sample_id":1}{"sample_id":2}\n\n{"sample_id":3}\n', [(3, 3)], [(1, "malformed")]),
        (b'{"sample_id":\n1}\n{"sample_id":3}\n', [(3, 3)], [(1, "malformed"), (2, "malformed")]),
        (
            b'{"sample_id":1,"output_ids":[1,\n2],"completion_tokens":2}\n',
            [],
            [(1, "malformed"), (2, "malformed")],
        ),
        (
            b'{"sample_id":1,"output_ids":[1,2\n{"sample_id":2,"output_ids":[3]}\n',
            [(2, 2)],
            [(1, "malformed")],
        ),
        (b'{"sample_id":1,"output_ids":[1,2\n', [], [(1, "malformed")]),
        (TORN_THEN_APPENDED + encode_line(record(3)), [(2, 3)], [(1, "malformed")]),
        (b'{"sample_id":1,"output_ids":[[1],[2]],"ts":2.0}\n', [(1, 1)], []),
        (b'{"sample_id":1,"output_ids":["]"],"ts":2.0}\n', [(1, 1)], []),
        (b'{"sample_id":1,"output_ids":["],","k"],"ts":2.0}\n', [(1, 1)], []),
        (b'{"sample_id":1,"output_ids":[{"a":[1]}],"ts":2.0}\n', [(1, 1)], []),
    ],
    ids=[
        "crlf and spaces",
        "two values on a line",
        "two values and a blank line",
        "object across lines",
        "id array across lines",
        "torn id array then a line",
        "unclosed id array",
        "torn line with the next appended",
        "nested id arrays",
        "string holding ]",
        "strings holding ], and commas",
        "objects in the id array",
    ],
)
def test_lines_that_defeat_the_fast_path_still_read_right(
    data: bytes, rows: list[tuple[int, int]], problems: list[tuple[int, str]]
) -> None:
    for with_ids in (False, True):
        got_rows, got_problems = parse_lines(data, with_output_ids=with_ids)
        assert [(r.line, r.sample_id) for r in got_rows] == rows
        kinds = [(p.line, p.kind) for p in got_problems if p.kind != "bad_type"]
        assert kinds == problems


def test_nesting_too_deep_is_malformed() -> None:
    row, problems = one(b'{"sample_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    assert row is None and [p.kind for p in problems] == ["malformed"]


# --- torn tails, blocks and offsets --------------------------------------------------------------


def test_a_torn_last_line_is_tolerated_and_re_read_once_complete(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.jsonl", record(1), record(2))
    whole = encode_line(record(3))
    with open(path, "ab") as file:
        file.write(whole[:25])
    blocks = list(iter_blocks(path))
    rows = [r for b in blocks for r in b.rows]
    assert [r.sample_id for r in rows] == [1, 2]
    assert [(p.line, p.kind) for p in blocks[-1].problems] == [(3, "torn")]
    end, next_line = blocks[-1].end_offset, blocks[-1].first_line
    assert end == path.stat().st_size - 25

    with open(path, "ab") as file:
        file.write(whole[25:])
    [block] = iter_blocks(path, offset=end, first_line=next_line)
    assert [(r.line, r.sample_id) for r in block.rows] == [(3, 3)]
    assert (block.problems, block.end_offset) == ([], path.stat().st_size)


def test_repair_torn_tail_moves_the_fragment_aside(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.jsonl", record(1), b'{"sample_id":2,"outp')
    assert repair_torn_tail(path) == len(b'{"sample_id":2,"outp')
    assert path.read_bytes() == encode_line(record(1))
    assert repair_torn_tail(path) == 0

    with open(path, "ab") as file:
        file.write(b"xyz")
    assert repair_torn_tail(path) == 3
    torn = Path(f"{path}.torn")
    assert torn.read_bytes() == b'{"sample_id":2,"outp\nxyz\n'
    assert read_rows(path) == ([one(record(1))[0]], [])


def test_repair_torn_tail_of_a_file_without_any_newline(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.jsonl", b"x" * 100_000)
    assert repair_torn_tail(path) == 100_000
    assert path.read_bytes() == b""


def test_repair_torn_tail_of_missing_or_clean_files(tmp_path: Path) -> None:
    assert repair_torn_tail(tmp_path / "missing.jsonl") == 0
    assert repair_torn_tail(write(tmp_path / "empty.jsonl")) == 0
    assert repair_torn_tail(write(tmp_path / "clean.jsonl", record())) == 0
    assert not list(tmp_path.glob("*.torn"))


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 300, 1 << 20])
def test_block_boundaries_keep_line_numbers_exact(tmp_path: Path, block_bytes: int) -> None:
    values = [record(i, ids=i * 7) if i % 4 else b"{bad\n" for i in range(1, 41)]
    values[9] = b"\n"
    values.append(b'{"sample_id": 99')  # torn tail
    path = write(tmp_path / "raw.jsonl", *values)
    blocks = list(iter_blocks(path, block_bytes=block_bytes))
    rows = [(r.line, r.sample_id) for b in blocks for r in b.rows]
    problems = [(p.line, p.kind) for b in blocks for p in b.problems]
    assert rows == [(i, i) for i in range(1, 41) if i % 4 and i != 10]
    assert problems == [(i, "malformed") for i in range(4, 41, 4)] + [(41, "torn")]
    for before, after in itertools.pairwise(blocks):
        assert after.start_offset == before.end_offset
        assert after.first_line == before.first_line + before.lines


def test_iter_blocks_from_an_end_offset_returns_only_new_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.jsonl", record(1), record(2))
    [block] = iter_blocks(path)
    assert list(iter_blocks(path, offset=block.end_offset, first_line=3)) == []
    with open(path, "ab") as file:
        file.write(encode_line(record(3)) + encode_line(record(4)))
    [new] = iter_blocks(path, offset=block.end_offset, first_line=block.first_line + block.lines)
    assert [(r.line, r.sample_id) for r in new.rows] == [(3, 3), (4, 4)]
    assert new.start_offset == block.end_offset and new.end_offset == path.stat().st_size


def test_iter_blocks_rejects_a_zero_block_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block_bytes"):
        list(iter_blocks(write(tmp_path / "raw.jsonl", record()), block_bytes=0))


# --- appending -----------------------------------------------------------------------------------


def test_appender_writes_lines_and_closes(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    with JsonlAppender(path, fsync=True) as appender:
        appender.append(record(1))
        appender.append_many([record(2), record(3)])
        appender.append_many([])
        appender.flush()
    assert appender.closed
    appender.close()
    with pytest.raises(ValueError, match="closed"):
        appender.append(record(4))
    assert [r.sample_id for r in read_rows(path)[0]] == [1, 2, 3]


def test_concurrent_appends_never_tear_a_line(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    path.touch()
    appenders = [JsonlAppender(path), JsonlAppender(path)]  # two descriptors on one file
    followed: list[Row] = []
    follow_problems: list[LineProblem] = []
    done = threading.Event()

    def write_some(worker: int) -> None:
        appender = appenders[worker % 2]
        for n in range(150):
            sample_id = worker * 1000 + n
            if n % 3:
                appender.append(record(sample_id, ids=3000))
            else:
                appender.append_many(
                    [record(f"{sample_id}a", ids=1500), record(f"{sample_id}b", ids=10)]
                )

    def follow() -> None:
        """Read new lines as they come, as a monitor does, with one last pass at the end."""
        offset, line, last_pass = 0, 1, False
        while not last_pass:
            last_pass = done.is_set()
            for block in iter_blocks(path, offset=offset, first_line=line, block_bytes=1 << 16):
                followed.extend(block.rows)
                follow_problems.extend(p for p in block.problems if p.kind != "torn")
                offset, line = block.end_offset, block.first_line + block.lines

    writers = [threading.Thread(target=write_some, args=(w,)) for w in range(8)]
    reader = threading.Thread(target=follow)
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join()
    for appender in appenders:
        appender.close()

    rows, problems = read_rows(path)
    assert problems == [] and follow_problems == []
    assert len(rows) == 8 * (100 + 2 * 50) == len({r.sample_id for r in rows})
    assert followed == rows


def test_appender_is_shared_by_asyncio_tasks(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "raw.jsonl"

    async def main() -> None:
        with JsonlAppender(path) as appender:

            async def task(k: int) -> None:
                for n in range(20):
                    await asyncio.sleep(0)
                    appender.append(record(k * 100 + n, ids=200))

            await asyncio.gather(*(task(k) for k in range(10)))

    asyncio.run(main())
    rows, problems = read_rows(path)
    assert problems == [] and len({r.sample_id for r in rows}) == 200


class ShortThenFail:
    """os.write that, from the `at`-th call, writes part of what it is given, then fails."""

    def __init__(self, at: int, error: int = 28) -> None:
        self.at, self.error, self.calls = at, error, 0

    def __call__(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        if self.calls < self.at:
            return os.write(fd, data)
        if self.calls == self.at:
            return os.write(fd, data[: len(data) // 3])
        raise OSError(self.error, os.strerror(self.error))


@pytest.mark.parametrize("error", [28, 5, 30])  # ENOSPC, EIO, EROFS
def test_a_failed_append_is_cut_back_to_the_last_whole_line(tmp_path: Path, error: int) -> None:
    path = tmp_path / "raw.jsonl"
    fail = ShortThenFail(at=3, error=error)
    with JsonlAppender(path, write=fail) as appender:
        appender.append(record(1))
        appender.append(record(2))
        before = path.read_bytes()
        with pytest.raises(StorageError, match=rf"raw.jsonl: cannot write: {os.strerror(error)} \("):
            appender.append_many([record(3), record(4)])
        assert path.read_bytes() == before  # no part of the failed lines is left
        fail.at = 10**9  # the space is back: the same lines go again, whole
        appender.append_many([record(3), record(4)])
    rows, problems = read_rows(path)
    assert problems == [] and [r.sample_id for r in rows] == [1, 2, 3, 4]


def test_a_cut_that_fails_is_done_before_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "raw.jsonl"
    with JsonlAppender(path, write=ShortThenFail(at=2)) as appender:
        appender.append(record(1))
        real_truncate = os.ftruncate

        def broken(fd: int, size: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "ftruncate", broken)
        with pytest.raises(StorageError):
            appender.append(record(2))
        assert not path.read_bytes().endswith(b"\n")  # the partial line is still there
        with pytest.raises(StorageError, match="Input/output error"):
            appender.append(record(2))  # nothing is appended after a partial line
        monkeypatch.setattr(os, "ftruncate", real_truncate)
        appender._write_call = os.write  # the disk works again
        appender.append(record(2))
    rows, problems = read_rows(path)
    assert problems == [] and [r.sample_id for r in rows] == [1, 2]


def test_an_appender_that_cannot_open_its_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"nope/raw.jsonl: cannot write: No such file"):
        JsonlAppender(tmp_path / "nope" / "raw.jsonl")


# --- sample ids ----------------------------------------------------------------------------------


def test_read_sample_ids_reports_repeats_and_skips_bad_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path / "raw.jsonl",
        record(1),
        record("1"),
        b"{bad\n",
        record(2),
        {"no_id": True},
        {"sample_id": 2.5},
        record(1),
        b"\n",
        record(2),
        b'{"sample_id": 7',
    )
    ids, repeats = read_sample_ids(path)
    assert ids == {1, "1", 2}
    assert repeats == [(7, 1), (9, 2)]


def test_read_sample_ids_fast_path_numbers_repeats(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.jsonl", *(record(i % 50, ids=20) for i in range(120)))
    ids, repeats = read_sample_ids(path)
    assert ids == set(range(50))
    assert repeats == [(i + 1, i % 50) for i in range(50, 120)]


# --- properties ----------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "sample_id",
        "id",
        "custom_id",
        "output_ids",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "matched_stop",
        "e2e_latency",
        "ts",
        "usage",
        "prompt_tokens_details",
        "choices",
        "response",
        "body",
        "meta_info",
        "type",
        "matched",
    ]
) | st.text(max_size=4)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=25,
)


def dump(value: Any, compact: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(value, separators=separators).encode() + b"\n"


@settings(max_examples=300, deadline=None)
@given(value=JSON, compact=st.booleans(), with_ids=st.booleans())
def test_any_json_value_gives_a_row_or_a_problem(value: Any, compact: bool, with_ids: bool) -> None:
    rows, problems = parse_lines(dump(value, compact), with_output_ids=with_ids)
    assert all(isinstance(r, Row) for r in rows)
    assert all(isinstance(p, LineProblem) and p.line == 1 for p in problems)
    if isinstance(value, dict):
        assert len(rows) == 1 and [p.kind for p in problems] in ([], ["bad_type"])
    else:
        assert rows == [] and [p.kind for p in problems] == ["not_object"]


@settings(max_examples=200, deadline=None)
@given(text=st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")))
def test_any_bytes_give_rows_or_problems(text: bytes) -> None:
    rows, problems = parse_lines(text + b"\n")
    assert len(rows) + len([p for p in problems if p.kind != "bad_type"]) <= 1


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(JSON | st.builds(dict, sample_id=st.integers(0, 9)), max_size=8),
    compact=st.booleans(),
    with_ids=st.booleans(),
)
def test_a_block_reads_like_its_lines_one_by_one(
    values: list[Any], compact: bool, with_ids: bool
) -> None:
    lines = [dump(v, compact) for v in values]
    expected_rows: list[Row] = []
    expected_problems: list[LineProblem] = []
    for number, line in enumerate(lines, start=1):
        rows, problems = parse_lines(line, first_line=number, with_output_ids=with_ids)
        expected_rows += rows
        expected_problems += problems
    block = parse_lines(b"".join(lines), with_output_ids=with_ids)
    assert block == (expected_rows, expected_problems)


# --- the fast path on every formatting -----------------------------------------------------------


def _formatted(value: dict[str, Any], style: str) -> bytes:
    if style == "compact":
        return json.dumps(value, separators=(",", ":")).encode() + b"\n"
    if style == "dumps":
        return json.dumps(value).encode() + b"\n"
    if style == "reversed keys":
        return json.dumps(dict(reversed(list(value.items())))).encode() + b"\n"
    if style == "spaced colon":
        return json.dumps(value, separators=(" , ", " : ")).encode() + b"\n"
    assert style == "crlf"
    return json.dumps(value).encode() + b"\r\n"


FLAT_VALUE = json.loads(encode_line(record(7, ids=40)))
STYLES = ["compact", "dumps", "reversed keys", "spaced colon", "crlf"]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(
    "value",
    [FLAT_VALUE, {"sample_id": "s1", **META_REPLY}, {"output_ids": [1, 2], **CHAT_COMPLETION}],
    ids=["flat", "meta_info", "legacy"],
)
def test_every_formatting_takes_the_block_path_and_reads_the_same(
    value: dict[str, Any], style: str
) -> None:
    from workbench.rundir import normalise, reader

    data = b"".join(_formatted({**value, "ts": 1.0 + n}, style) for n in range(3))
    chunk = reader.Chunk(data, len(data), 0)
    emptied = reader._without_arrays(data, len(data), b'"output_ids"')
    assert emptied is not None
    assert len(re.findall(rb'"output_ids" ?: ?\[\]', emptied)) == ("output_ids" in value) * 3
    assert reader.decode_whole(normalise.ROWS.decoder, chunk) is not None  # no line-by-line
    expected = parse_lines(b"".join(_formatted({**value, "ts": 1.0 + n}, "compact")
                                    for n in range(3)))
    assert parse_lines(data) == expected
    with_ids = parse_lines(data, with_output_ids=True)[0]
    assert [row.output_ids for row in with_ids] == [value.get("output_ids")] * 3


@pytest.mark.parametrize(
    "text",
    [
        b'{"output_ids" : null, "sample_id": 1, "ts": 2.0}\n',
        b'{"note": "output_ids", "sample_id": 1, "output_ids": [5, 6], "ts": 2.0}\n',
        b'{"a \\"output_ids": [9], "sample_id": 1, "output_ids": [5, 6], "ts": 2.0}\n',
        b'{"meta": {"output_ids": [9, 9]}, "sample_id": 1, "output_ids": [5], "ts": 2.0}\n',
    ],
    ids=["null ids", "key text as a value", "escaped quote before the key", "nested key"],
)
def test_look_alike_keys_change_no_value(text: bytes) -> None:
    rows, problems = parse_lines(text)
    assert problems == [] and [(r.sample_id, r.ts) for r in rows] == [(1, 2.0)]
    rows, _ = parse_lines(text, with_output_ids=True)
    assert rows[0].output_ids == json.loads(text).get("output_ids")


def test_prompt_lines_skip_their_input_ids_on_the_block_path() -> None:
    from workbench.rundir import normalise, reader

    data = b"".join(_formatted({"sample_id": n, "input_ids": [5] * n}, "dumps") for n in range(4))
    chunk = reader.Chunk(data, len(data), 0)
    assert reader._without_arrays(data, len(data), b'"input_ids"').count(b"[]") == 4
    assert reader.decode_whole(normalise.ROWS.decoder, chunk) is not None
    assert [r.sample_id for r in parse_lines(data)[0]] == [0, 1, 2, 3]


def test_retraction_count_is_written_only_when_the_server_sent_it() -> None:
    from workbench.rundir.records import Record

    base: dict[str, Any] = {
        "sample_id": 1, "output_ids": [5], "prompt_tokens": 2, "completion_tokens": 1,
        "cached_tokens": 0, "finish_reason": "stop", "matched_stop": 5, "e2e_latency": 0.1,
        "ts": 1.0,
    }
    assert b"num_retractions" not in msgspec.json.encode(Record(**base))
    line = msgspec.json.encode(Record(**base, num_retractions=3))
    assert msgspec.json.decode(line)["num_retractions"] == 3
    assert msgspec.json.decode(line, type=Record).num_retractions == 3
