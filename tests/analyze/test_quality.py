"""Data worth training on: degenerate replies, duplicates and contamination on planted runs,
through validate, the CLI and the export's drops."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, workbench
from test_validate import END, TE, findings, plant, record, write_run_json

from workbench.analyze import quality
from workbench.analyze.quality import Decontamination
from workbench.analyze.rules import RecordChecker, Thresholds
from workbench.analyze.scan import scan_run
from workbench.analyze.validate import validate_run
from workbench.profiles import get_profile
from workbench.rundir.records import PromptRecord, encode_line
from workbench.tokenizer import load_tokenizer

KIMI = get_profile("kimi-k2.5")
TOKENIZER = EXAMPLES / "tokenizer"
BENCH_TEXT = ("Some recent order sends a special service after that current city. The company "
              "includes a bad team now.")  # words the example tokenizer knows


def reply(seed: int, length: int = 400) -> list[int]:
    """A reply of random content ids (no loop), its reasoning closed and ended."""
    rng = random.Random(seed)
    body = [rng.randrange(0, 1200) for _ in range(length)]
    return [*body[: length // 2], TE, *body[length // 2:], END]


def near_copy(ids: list[int], changes: int, seed: int = 99) -> list[int]:
    rng = random.Random(seed)
    out = list(ids)
    for _ in range(changes):
        out[rng.randrange(1, len(out) - 2)] = rng.randrange(0, 1200)
    return out


def prompts_file(folder: Path, prompts: list[PromptRecord]) -> None:
    (folder / "prompts.jsonl").write_bytes(b"".join(encode_line(p) for p in prompts))


def two_datasets(out: Path) -> None:
    """a: three clean replies, a loop, a special-heavy one; b: an exact copy of a's first reply,
    a near copy of its second, one of its own; b's first prompt repeats a's first."""
    loop = [*reply(5, 100)[:100], *([11, 12, 13, 14, 15, 16, 17] * 60), TE, 21, END]
    special = [*reply(6, 40)[:40], *([163590, 163591, 163600] * 10), TE, 22, END]
    plant(out, "a", [record(0, reply(0)), record(1, reply(1)), record(2, reply(2)),
                     record(3, loop), record(4, special)])
    prompts_file(out / "a", [PromptRecord(sample_id=i, input_ids=list(range(i * 100, i * 100 + 40)))
                             for i in range(5)])
    plant(out, "b", [record(10, reply(0)), record(11, near_copy(reply(1), 6)),
                     record(12, reply(12))])
    prompts_file(out / "b", [PromptRecord(sample_id=10, input_ids=list(range(40))),
                             PromptRecord(sample_id=11, input_ids=list(range(500, 540))),
                             PromptRecord(sample_id=12, input_ids=list(range(900, 940)))])
    write_run_json(out, model_profile="kimi-k2.5",
                   datasets=[{"name": "a"}, {"name": "b"}])


def test_degenerate_replies_are_told_by_the_record_rules() -> None:
    checker = RecordChecker(KIMI)
    loop = [*reply(5, 100)[:100], *([11, 12, 13, 14, 15, 16, 17] * 60), TE, 21, END]
    from test_validate import row_of
    assert "repetition" in checker.failures(row_of(record(0, loop)))
    assert "repetition" not in checker.failures(row_of(record(0, reply(3))))
    body = reply(4, 120)[:60]
    restated = [*body, TE, *body, END]  # an answer that restates its reasoning is no loop
    assert "repetition" not in checker.failures(row_of(record(0, restated)))
    looped_answer = [*body, TE, *([31, 32, 33] * 40), END]
    assert "repetition" in checker.failures(row_of(record(0, looped_answer)))
    special = [*reply(6, 40)[:40], *([163590, 163591, 163600] * 10), TE, 22, END]
    problems = dict(checker.problems(row_of(record(0, special))))
    assert problems["special_heavy"].startswith("30 special ids of 73")
    # think, end and eos ids are expected special ids, and so are tool-call markers
    assert "special_heavy" not in checker.failures(row_of(record(0, [5, TE, 6, END])))
    tool_call = [5, TE, 163595, 163597, 7, 163598, 8, 163599, 163596, END]
    assert "special_heavy" not in checker.failures(row_of(record(0, tool_call)))
    lenient = RecordChecker(KIMI, thresholds=Thresholds(repetition_share=0.95))
    assert "repetition" not in lenient.failures(row_of(record(0, loop)))


def test_duplicates_across_datasets_are_told_once_the_first_copy_kept(tmp_path: Path) -> None:
    two_datasets(tmp_path)
    report = validate_run(tmp_path, workers=1)
    a, b = findings(report, "a"), findings(report, "b")
    assert a["repetition"].count == 1 and a["special_heavy"].count == 1
    assert "duplicate_reply" not in a and "near_duplicate_reply" not in a
    assert b["duplicate_reply"].count == 1
    assert "same as a sample_id 0" in b["duplicate_reply"].examples[0].detail
    assert b["near_duplicate_reply"].count == 1
    assert "nearly the same as a sample_id 1" in b["near_duplicate_reply"].examples[0].detail
    assert b["duplicate_prompt"].count == 1 and b["duplicate_prompt"].examples[0].file == "prompts.jsonl"
    assert b["duplicate_prompt"].rate == pytest.approx(1 / 3)  # over the prompts
    assert "contaminated_reply" not in b  # no benchmark given


def test_a_grown_run_compares_new_records_with_the_cached_ones(tmp_path: Path) -> None:
    two_datasets(tmp_path)
    first = validate_run(tmp_path, workers=1)
    assert "duplicate_reply" not in findings(first, "a")
    with open(tmp_path / "a" / "raw_responses.jsonl", "ab") as file:
        file.write(encode_line(record(5, reply(2))))  # a copy of a's own third reply
    with open(tmp_path / "a" / "prompts.jsonl", "ab") as file:
        file.write(encode_line(PromptRecord(sample_id=5, input_ids=list(range(200, 240)))))
        file.write(b'{"sample_id": 6, "input_')  # torn: read once it is whole
    grown = validate_run(tmp_path, workers=1)
    found = findings(grown, "a")["duplicate_reply"]
    assert found.count == 1 and found.examples[0].line == 6
    assert findings(grown, "b")["duplicate_reply"].count == 1  # the old finding stays
    prompt = findings(grown, "a")["duplicate_prompt"]  # the appended prompt repeats sample 2's
    assert (prompt.count, prompt.examples[0].line) == (1, 6)
    with open(tmp_path / "a" / "prompts.jsonl", "ab") as file:
        file.write(b'ids": [300, 301]}\n' + encode_line(PromptRecord(sample_id=7, text="x")))
    prompts = findings(validate_run(tmp_path, workers=1), "a")
    assert prompts["duplicate_prompt"].count == 1 and prompts["missing_response"].count == 2


def test_prompt_findings_are_kept_while_the_prompts_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies grow, prompts.jsonl does not (generate writes it before sending): the prompts
    are not compared again; a prompts file rewritten is."""
    two_datasets(tmp_path)
    compared: list[str] = []
    compare = quality._compare

    def counting(rows: Any, what: str, *args: Any) -> None:
        compared.append(what)
        compare(rows, what, *args)

    monkeypatch.setattr(quality, "_compare", counting)
    first = findings(validate_run(tmp_path, workers=1), "b")["duplicate_prompt"]
    with open(tmp_path / "a" / "raw_responses.jsonl", "ab") as file:
        file.write(encode_line(record(5, reply(7))))
    compared.clear()
    grown = findings(validate_run(tmp_path, workers=1), "b")
    assert compared == ["reply"] and grown["duplicate_prompt"] == first
    prompts_file(tmp_path / "b", [PromptRecord(sample_id=10, input_ids=list(range(700, 740))),
                                  PromptRecord(sample_id=11, input_ids=list(range(500, 540))),
                                  PromptRecord(sample_id=12, input_ids=list(range(900, 940)))])
    compared.clear()
    rewritten = findings(validate_run(tmp_path, workers=1), "b")
    assert sorted(compared) == ["prompt", "reply"] and "duplicate_prompt" not in rewritten


def bench_file(folder: Path, lines: list[Any]) -> Path:
    path = folder / "bench.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_benchmark_ngrams_are_found_in_text_prompts_and_in_replies(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(TOKENIZER)
    quoted = list(tokenizer.encode("so: " + BENCH_TEXT.upper().replace(".", ",")))
    plant(tmp_path, "t", [record("x", reply(1)), record("y", [*quoted, TE, 5, END])])
    (tmp_path / "t" / "prompts.jsonl").write_bytes(
        encode_line(PromptRecord(sample_id="x", text="Please answer: " + BENCH_TEXT))
        + encode_line(PromptRecord(sample_id="y", text="twelve words only: some recent order "
                                                       "sends a special service after that "
                                                       "current city; the")))
    write_run_json(tmp_path, model_profile="kimi-k2.5", datasets=[{"name": "t"}])
    bench = bench_file(tmp_path, [{"question": BENCH_TEXT}, {"question": "too short"}])
    no_ids = scan_run(tmp_path, workers=1, decontaminate=Decontamination.load([bench])).report
    assert "contaminated_reply" not in findings(no_ids, "t")  # ids not read without a tokenizer
    benchmarks = Decontamination.load([bench], tokenizer=tokenizer)
    report = scan_run(tmp_path, workers=1, decontaminate=benchmarks).report  # not the cached scan
    found = findings(report, "t")
    assert found["contaminated_prompt"].count == 1  # the 12-word quote is not a 13-gram
    assert "sample_id 'x' holds a 13-gram of bench" in found["contaminated_prompt"].examples[0].detail
    assert found["contaminated_reply"].count == 1
    assert "sample_id 'y'" in found["contaminated_reply"].examples[0].detail


def test_validate_cli_decontaminates_and_names_a_bad_benchmark_line(tmp_path: Path) -> None:
    two_datasets(tmp_path)
    bench = bench_file(tmp_path, [{"prompt": BENCH_TEXT}])
    done = workbench("validate", str(tmp_path), "--decontaminate", str(bench),
                     "--tokenizer", str(TOKENIZER))
    assert done.returncode == 0, done.stderr
    assert "duplicate_reply" in done.stdout and "repetition" in done.stdout
    bench.write_text(json.dumps({"prompt": BENCH_TEXT}) + "\n{not json\n")
    bad = workbench("validate", str(tmp_path), "--decontaminate", str(bench),
                    "--tokenizer", str(TOKENIZER))
    assert bad.returncode == 2
    last = bad.stderr.strip().splitlines()
    assert len(last) == 1 and f"{bench}:2" in last[0]


def test_export_drops_duplicates_and_near_duplicates_keeping_the_first(tmp_path: Path) -> None:
    run = tmp_path / "run"
    two_datasets(run)
    exact = tmp_path / "exact.jsonl"
    done = workbench("export", str(run), "--to", str(exact), "--drop", "duplicate")
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["id"] for line in exact.read_text().splitlines()]
    assert "b/10" not in ids and "a/0" in ids and "b/11" in ids
    near = tmp_path / "near.jsonl"
    done = workbench("export", str(run), "--to", str(near), "--drop", "near_duplicate,repetition")
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["id"] for line in near.read_text().splitlines()]
    assert sorted(ids) == ["a/0", "a/1", "a/2", "a/4", "b/12"]
    assert "near_duplicate 2" in done.stdout and "repetition 1" in done.stdout
    refused = workbench("export", str(run), "--to", str(tmp_path / "c.jsonl"), "--drop", "contaminated")
    assert refused.returncode == 2 and "--decontaminate" in refused.stderr
    bench = bench_file(tmp_path, [{"prompt": BENCH_TEXT}])
    unused = workbench("export", str(run), "--to", str(tmp_path / "c.jsonl"), "--decontaminate", str(bench))
    assert unused.returncode == 2 and "goes with --drop contaminated" in unused.stderr
    assert not (tmp_path / "c.jsonl").exists()
    only = workbench("export", str(run), "--to", str(tmp_path / "b.jsonl"), "--only", "b",
                     "--drop", "duplicate")  # a's copy still makes b/10 a duplicate
    assert only.returncode == 0, only.stderr
    assert "duplicate 1" in only.stdout
