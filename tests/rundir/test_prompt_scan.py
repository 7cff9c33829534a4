"""The one read of prompts.jsonl: what it finds equals a plain json.loads read of each line, on
the block path and line by line, and validation's prompt findings equal a read of its rows."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from workbench.analyze.quality import DATA_RULES
from workbench.analyze.rules import Thresholds
from workbench.analyze.validate import validate_run
from workbench.rundir import prompt_reader, prompt_scan
from workbench.rundir.columns import Tally
from workbench.rundir.layout import CACHE_DIR
from workbench.rundir.prompt_reader import iter_prompt_blocks
from workbench.rundir.reader import iter_blocks

LINES = [
    b'{"sample_id":0,"input_ids":[1,2,3]}\n',  # compact, as the workbench writes
    b'{"sample_id": 1, "input_ids": [4, 5]}\n',  # json.dumps' default separators
    b'{"input_ids": [6, 7, 8, 9], "sample_id": 2}\n',  # another key order
    b'{"sample_id": 3, "text": "Hello there, how are you?"}\n',  # a text prompt
    b'{"text": "\\u00e9t\\u00e9", "sample_id": "s-4", "input_ids": null}\n',  # escapes, str id
    b'{"sample_id": 5, "input_ids": []}\n',
    b"{not json\n",  # a bad line
    b"\n",  # a blank line
    b'[1, 2]\n',  # not an object
    b'{"sample_id": 1, "input_ids": [9]}\n',  # a duplicate id
    b'{"input_ids": [1, 2]}\n',  # a missing id
    b'{"sample_id": 7, "ts": "late", "input_ids": [1]}\n',  # a known field of the wrong type
    b'{"custom_id": "c-8", "text": "x"}\n',  # the id read as a record's
    b'{"sample_id": 9, "input_ids": [5, 6], "meta": {"input_ids": [1]}}\n',  # nested input_ids
    b'{"sample_id": 10, "input\\u005fids": [5, 6]}\n',  # a key written with escapes
    b'{"sample_id": 11, "text": 12}\n',  # a text that is not a string
    b'{"sample_id": 12, "input_ids": [1, 2, 3, 4, 5]}\r\n',
    b'{"sample_id": 13, "input_ids": [3',  # a torn last line
]
DATA = b"".join(LINES)


def by_json(data: bytes) -> dict[str, Any]:
    """What one read should find, each line read alone with json.loads."""
    *whole, torn = data.split(b"\n")
    found: dict[str, Any] = {"ids": [], "first_lines": [], "lengths": [], "problems": [],
                             "lines": 0, "tokenized": 0, "tokens": 0}
    first: dict[Any, int] = {}
    for line, text in enumerate(whole, start=1):
        if not text.strip():
            continue
        found["lines"] += 1
        try:
            value = json.loads(text)
        except ValueError:
            found["problems"].append((line, "malformed"))
            continue
        if not isinstance(value, dict):
            found["problems"].append((line, "not_object"))
            continue
        if isinstance(value.get("ts", 0.0), str):
            found["problems"].append((line, "bad_type"))
        ids = value.get("input_ids")
        if isinstance(ids, list):
            found["tokenized"] += 1
            found["tokens"] += len(ids)
        sample_id = next((value[k] for k in ("sample_id", "custom_id", "id")
                          if value.get(k) is not None), None)
        if sample_id is None:
            found["problems"].append((line, "no_id"))
        elif sample_id in first:
            found["problems"].append((line, "duplicate_id"))
        else:
            first[sample_id] = line
            found["ids"].append(sample_id)
            found["first_lines"].append(line)
            found["lengths"].append(length_by_json(value))
    if torn.strip():
        found["problems"].append((len(whole) + 1, "torn"))
    return found


def length_by_json(value: dict[str, Any]) -> int | None:
    if isinstance(value.get("input_ids"), list):
        return len(value["input_ids"])
    if isinstance(value.get("text"), str):
        return max(1, round(len(value["text"]) / prompt_scan.TEXT_CHARS_PER_TOKEN))
    return None


def as_found(scan: prompt_scan.PromptScan) -> dict[str, Any]:
    return {"ids": scan.ids, "first_lines": scan.first_lines, "lengths": scan.lengths,
            "problems": sorted((line, kind) for line, kind, _ in scan.problems),
            "lines": scan.lines, "tokenized": scan.tokenized, "tokens": scan.tokens}


@pytest.mark.parametrize("block_bytes", [1, 100, 700, 8 << 20])
def test_one_read_finds_what_json_finds_line_by_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(DATA)
    monkeypatch.setattr(prompt_scan, "iter_prompt_blocks",
                        functools.partial(iter_prompt_blocks, block_bytes=block_bytes))
    expected = by_json(DATA)
    expected["problems"].sort()
    found = prompt_scan.scan(path)
    assert as_found(found) == expected
    assert found.end_offset == len(DATA) - len(LINES[-1])
    lengths = {0: 3, 1: 2, 2: 4, 3: 6, "s-4": 1, 5: 0, 7: 1, "c-8": 1, 9: 2, 10: 2, 12: 5}
    assert found.length_of() == {(sid, None): n for sid, n in lengths.items()}
    details = {kind: detail for _, kind, detail in found.problems}
    assert details["duplicate_id"] == "sample_id 1 also at line 2"
    assert details["no_id"] == "cannot read sample_id"


@pytest.mark.parametrize("block_bytes", [1, 100, 700, 8 << 20])
def test_problems_are_those_of_a_read_of_rows(tmp_path: Path, block_bytes: int) -> None:
    """Line problems, sample ids and their order as :func:`iter_blocks` gives them."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(DATA)
    blocks = list(iter_prompt_blocks(path, block_bytes=block_bytes))
    rows = list(iter_blocks(path, block_bytes=block_bytes))
    assert [b.problems for b in blocks] == [b.problems for b in rows]
    assert [[(r.line, r.sample_id) for r in b.rows] for b in blocks] == [
        [(r.line, r.sample_id) for r in b.rows] for b in rows]
    assert [(b.start_offset, b.end_offset, b.first_line, b.lines) for b in blocks] == [
        (b.start_offset, b.end_offset, b.first_line, b.lines) for b in rows]


def test_findings_on_prompts_keep_any_number_of_examples(tmp_path: Path) -> None:
    folder = tmp_path / "out" / "d"
    folder.mkdir(parents=True)
    (folder / "raw_responses.jsonl").write_bytes(b"")
    (folder / "prompts.jsonl").write_bytes(
        b"".join(b'{"sample_id": %d, "input_ids": [1]}\n' % (i % 3) for i in range(12)) + DATA)

    def duplicates(max_examples: int, cache: bool = True) -> list[Any]:
        report = validate_run(tmp_path / "out", thresholds=Thresholds(max_examples=max_examples),
                              cache=cache)
        return [f for f in report.datasets["d"].findings if f.rule == "duplicate_sample_id"]

    few, many = duplicates(2), duplicates(50)  # the second from the kept read
    assert list((folder / CACHE_DIR).glob("prompts-*"))
    assert few[0].count == many[0].count == 13 and len(few[0].examples) == 2
    assert many == duplicates(50, cache=False) and len(many[0].examples) == 13
    assert many[0].examples[:2] == few[0].examples


def test_prompt_findings_equal_those_of_a_read_of_rows(tmp_path: Path) -> None:
    """Rules, counts, lines, details and the order of the examples, as validation found them
    when it read prompts.jsonl's rows itself."""
    folder = tmp_path / "out" / "d"
    folder.mkdir(parents=True)
    (folder / "raw_responses.jsonl").write_bytes(b"")
    (folder / "prompts.jsonl").write_bytes(DATA[: -len(LINES[-1])] * 3 + LINES[-1])
    rules = {"malformed": "parse_error", "not_object": "parse_error", "bad_type": "bad_type",
             "torn": "torn_line"}
    tally = Tally(4)
    first: dict[Any, int] = {}
    for block in iter_blocks(folder / "prompts.jsonl"):
        for problem in block.problems:
            tally.add(rules[problem.kind], problem.line, problem.detail)
        for row in block.rows:
            if row.sample_id is None:
                tally.add("missing_field", row.line, "cannot read sample_id")
            elif row.sample_id in first:
                tally.add("duplicate_sample_id", row.line,
                          f"sample_id {row.sample_id!r} also at line {first[row.sample_id]}")
            else:
                first[row.sample_id] = row.line
    report = validate_run(tmp_path / "out", thresholds=Thresholds(max_examples=4))
    found = {f.rule: (f.count, [(e.line, e.detail) for e in f.examples])
             for f in report.datasets["d"].findings
             if f.examples and f.examples[0].file == "prompts.jsonl"
             and f.rule not in ("missing_response", "unsent_budget", *DATA_RULES)}
    assert found == {rule: (count, tally.examples[rule]) for rule, count in tally.counts.items()}
    assert report.datasets["d"].prompts == len(first)


def test_a_file_that_grows_is_read_after_what_was_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept summary plus the lines appended since equal one read of the whole file, torn
    line and all; only the appended bytes are read; a rewrite is read again whole."""
    path = tmp_path / "prompts.jsonl"
    reads: list[int] = []

    def counting(path: Path, *, offset: int = 0, first_line: int = 1) -> Any:
        reads.append(offset)
        return iter_prompt_blocks(path, offset=offset, first_line=first_line)

    monkeypatch.setattr(prompt_scan, "iter_prompt_blocks", counting)
    written = b""
    for cut in (5, 9, 12, len(LINES) - 1):
        written = b"".join(LINES[:cut])
        path.write_bytes(written)  # the same inode, longer
        found = prompt_scan.summary(path)
        assert as_found(found) == as_found(prompt_scan.scan(path))  # (a read from 0)
        assert found.next_line == written.count(b"\n") + 1
    whole = prompt_scan.summary(path)
    grown_at = [len(b"".join(LINES[:cut])) for cut in (5, 9, 12)]
    assert reads[::2] == [0, *grown_at] and len(reads) == 8  # nothing read when unchanged
    path.write_bytes(DATA)  # the torn last line comes
    assert as_found(prompt_scan.summary(path)) == by_json(DATA) | {
        "problems": sorted(by_json(DATA)["problems"])}
    path.write_bytes(DATA + b"]}\n")  # the torn line ended
    grown = prompt_scan.summary(path)
    assert [kind for _, kind, _ in grown.problems].count("torn") == 0
    assert grown.ids[-1] == 13 and grown.lines == whole.lines + 1
    reads.clear()
    path.unlink()
    path.write_bytes(b'{"sample_id": 0, "input_ids": [1]}\n')  # another file
    assert prompt_scan.summary(path).ids == [0] and reads[0] == 0


def contents_by_json(data: bytes) -> list[tuple[int, Any, Any, Any]]:
    """(line, sample id, text, input ids) of each whole line json.loads reads as a prompt."""
    found = []
    for line, text in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        sample_id = next((value[k] for k in ("sample_id", "custom_id", "id")
                          if value.get(k) is not None), None)
        ids, prompt = value.get("input_ids"), value.get("text")
        if sample_id is None or not isinstance(prompt, str | None):
            continue
        found.append((line, sample_id, prompt, ids))
    return found


@pytest.mark.parametrize("block_bytes", [1, 100, 700, 8 << 20])
def test_prompt_contents_are_what_json_reads(tmp_path: Path, block_bytes: int) -> None:
    """Ids parsed in one numpy call per block (or line by line around a bad line) equal
    json.loads' lists, text prompts and other id keys included; a torn line waits."""
    path = tmp_path / "prompts.jsonl"
    many = b"".join(b'{"sample_id": %d, "input_ids": [%s]}\n' % (
        100 + i, b",".join(b"%d" % (i * 7919 + j) for j in range(i % 40))) for i in range(300))
    data = DATA.replace(LINES[-1], many + LINES[-1])
    path.write_bytes(data)
    found = []
    blocks = list(prompt_reader.iter_prompt_contents(path, block_bytes=block_bytes))
    for block in blocks:
        for i, line in enumerate(block.lines):
            ids = block.ids[block.starts[i]:block.ends[i]].tolist() if block.has_ids[i] else None
            found.append((line, block.sample_ids[i], block.texts[i], ids))
    assert found == contents_by_json(data)
    assert blocks[-1].end_offset == len(data) - len(LINES[-1])
    assert blocks[-1].next_line == data.count(b"\n") + 1
