"""prompts.jsonl and records files of conversations regenerated turn by turn: every reader keys
on (sample_id, turn), on the block path and line by line, and caches of the older meaning are
not read."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.rundir import prompt_scan
from workbench.rundir.columns import SCAN_CACHE
from workbench.rundir.line_index import (
    index_keys,
    index_lines,
    key_text,
    read_keys,
    read_sample_ids,
    span_reader,
)
from workbench.rundir.prompt_reader import iter_prompt_blocks, iter_prompt_contents
from workbench.rundir.records import PromptRecord, encode_line

PROMPTS = [PromptRecord(0, [1, 2], turn=0), PromptRecord(1, [3], turn=0),
           PromptRecord(0, [1, 2, 9, 4], turn=1), PromptRecord(1, [3, 8, 5], turn=1),
           PromptRecord(1, [3, 8, 5, 7, 6], turn=2), PromptRecord(2, [4, 4, 4], turn=0)]
BAD = b'{"sample_id": 9, "input_ids": [1, -2], "turn": 0}\n'  # read line by line


def planted(tmp_path: Path, *extra: bytes) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"".join(map(encode_line, PROMPTS)) + b"".join(extra))
    return path


@pytest.mark.parametrize("block_bytes", [1, 60, 1 << 20])
@pytest.mark.parametrize("extra", [(), (BAD,)])
def test_prompt_rows_carry_their_turn(tmp_path: Path, block_bytes: int,
                                      extra: tuple[bytes, ...]) -> None:
    path = planted(tmp_path, *extra)
    rows = [row for block in iter_prompt_blocks(path, block_bytes=block_bytes)
            for row in block.rows]
    assert [(row.sample_id, row.turn, row.input_ids) for row in rows][:6] == [
        (p.sample_id, p.turn, len(p.input_ids or [])) for p in PROMPTS]
    contents = list(iter_prompt_contents(path, block_bytes=block_bytes))
    assert [t for block in contents for t in block.turns][:6] == [p.turn for p in PROMPTS]


def test_the_scan_keys_on_sample_id_and_turn(tmp_path: Path) -> None:
    path = planted(tmp_path, encode_line(PromptRecord(1, [3, 8], turn=1)))
    found = prompt_scan.scan(path)
    assert found.keys() == [(p.sample_id, p.turn) for p in PROMPTS]
    assert found.length_of()[(1, 2)] == 5
    assert found.first_line_of()[(0, 1)] == 3
    assert found.problems == [(7, "duplicate_id", "sample_id 1 turn 1 also at line 4")]


def test_a_kept_scan_of_the_older_meaning_is_not_read(tmp_path: Path) -> None:
    path = planted(tmp_path)
    first = prompt_scan.summary(path)
    assert prompt_scan.summary(path) == first  # kept, and read back
    old = prompt_scan._CACHE  # a kept value under an older key: another cache file
    assert old.load(path, prompt_scan.cache_key("prompts", 4.0, "appended")) is None


def test_the_scan_cache_of_records_has_a_new_name() -> None:
    assert SCAN_CACHE.kind.startswith("scan-v")


def test_line_index_by_key(tmp_path: Path) -> None:
    path = planted(tmp_path, encode_line(PromptRecord(1, [0], turn=1)))
    spans = index_keys(path)
    assert list(spans) == [(p.sample_id, p.turn) for p in PROMPTS]
    with span_reader(path) as read:
        assert read(spans[(1, 2)]) == encode_line(PROMPTS[4])
    assert list(index_lines(path)) == [0, 1, 2]  # by sample id, as before: each first line
    keys, repeats = read_keys(path)
    assert keys == {(p.sample_id, p.turn) for p in PROMPTS}
    assert repeats == [(7, (1, 1))]
    ids, id_repeats = read_sample_ids(path)
    assert ids == {0, 1, 2} and [line for line, _ in id_repeats] == [3, 4, 5, 7]


def test_key_text_names_the_turn_only_when_there_is_one() -> None:
    assert key_text(7) == "sample_id 7"
    assert key_text("a", None) == "sample_id 'a'"
    assert key_text(7, 2) == "sample_id 7 turn 2"
