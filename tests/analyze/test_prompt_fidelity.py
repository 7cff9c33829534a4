"""Prompt fidelity (`prompt_tokens_mismatch`: a prompt the server cut or changed) and context
fit (`context_reduced`) in `workbench validate`, and the runner's count of mismatches as
replies arrive."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import msgspec

from workbench.analyze.validate import exit_code, format_report, validate_run
from workbench.config import load_manifest
from workbench.generate.plan import GenerateOptions
from workbench.generate.session import run_generation
from workbench.rundir.records import PromptRecord, Record, encode_line
from workbench.server.client import SGLangClient

TE, END = 163607, 163586
GOOD = [101, TE, 201, END]


def record(sid: int, prompt_tokens: int, *, reduced: int | None = None,
           finish: str = "stop") -> Record:
    return Record(sample_id=sid, output_ids=GOOD, prompt_tokens=prompt_tokens,
                  completion_tokens=len(GOOD), cached_tokens=0, finish_reason=finish,
                  matched_stop=END if finish == "stop" else None, e2e_latency=1.0, ts=1.75e9,
                  max_new_tokens_reduced=msgspec.UNSET if reduced is None else reduced)


def plant(out: Path, records: list[Any], prompts: list[Any], name: str = "ds") -> None:
    """A dataset folder: records and prompts.jsonl (PromptRecord, or raw bytes lines)."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(encode_line(r) for r in records))
    (folder / "prompts.jsonl").write_bytes(
        b"".join(p if isinstance(p, bytes) else encode_line(p) for p in prompts))


def ids(sid: int, length: int) -> PromptRecord:
    """A prompt of `length` ids, unlike the other samples' (no duplicate findings)."""
    return PromptRecord(sample_id=sid, input_ids=[sid * 10_000 + i for i in range(length)])


def findings(out: Path, name: str = "ds", **options: Any) -> dict[str, Any]:
    return {f.rule: f for f in validate_run(out, workers=1, **options).datasets[name].findings}


# --- prompt_tokens_mismatch --------------------------------------------------------------------


def test_records_whose_prompt_tokens_differ_from_the_ids_sent(tmp_path: Path) -> None:
    plant(tmp_path, [record(0, 10), record(1, 7), record(2, 30), record(3, 4096)],
          [ids(0, 10), ids(1, 12), ids(2, 30), ids(3, 5000)])
    report = validate_run(tmp_path, workers=1)
    found = {f.rule: f for f in report.datasets["ds"].findings}
    mismatch = found["prompt_tokens_mismatch"]
    assert (mismatch.severity, mismatch.count, mismatch.rate) == ("error", 2, 0.5)
    assert [(e.file, e.line, e.detail) for e in mismatch.examples] == [
        ("raw_responses.jsonl", 2, "sample_id 1: prompt_tokens 7, sent 12 ids (-5)"),
        ("raw_responses.jsonl", 4, "sample_id 3: prompt_tokens 4096, sent 5000 ids (-904)")]
    assert set(found) == {"prompt_tokens_mismatch"}
    assert not report.ok and exit_code(report, strict=True) == 1
    assert "prompt_tokens_mismatch" in format_report(report)


def test_equal_lengths_give_no_finding(tmp_path: Path) -> None:
    plant(tmp_path, [record(i, 5 + i) for i in range(4)], [ids(i, 5 + i) for i in range(4)])
    report = validate_run(tmp_path, workers=1)
    assert report.ok and report.datasets["ds"].findings == []


def test_examples_are_capped_and_counted_whole(tmp_path: Path) -> None:
    plant(tmp_path, [record(i, 3) for i in range(9)], [ids(i, 4) for i in range(9)])
    mismatch = findings(tmp_path)["prompt_tokens_mismatch"]
    assert mismatch.count == 9 and [e.line for e in mismatch.examples] == [1, 2, 3, 4, 5]


def test_text_prompts_are_not_compared(tmp_path: Path) -> None:
    """The server tokenizes a text prompt: its length is not known, whatever prompt_tokens say."""
    plant(tmp_path, [record(0, 99), record(1, 3)],
          [PromptRecord(sample_id=0, text="a" * 40), PromptRecord(sample_id=1, text="b")])
    assert "prompt_tokens_mismatch" not in findings(tmp_path)


def test_a_file_mixing_text_and_ids_is_not_compared(tmp_path: Path) -> None:
    plant(tmp_path, [record(0, 99), record(1, 99)],
          [ids(0, 10), PromptRecord(sample_id=1, text="hello")])
    assert "prompt_tokens_mismatch" not in findings(tmp_path)


def test_bad_prompt_lines_leave_the_others_compared(tmp_path: Path) -> None:
    plant(tmp_path, [record(0, 10), record(1, 8), record(2, 3)],
          [ids(0, 10), b"{not json\n", ids(1, 9), ids(1, 8), ids(2, 3)])
    found = findings(tmp_path)
    assert found["prompt_tokens_mismatch"].count == 1  # sample 1: its first line, 9 ids
    assert found["prompt_tokens_mismatch"].examples[0].detail == (
        "sample_id 1: prompt_tokens 8, sent 9 ids (-1)")
    assert {"parse_error", "duplicate_sample_id"} <= set(found)


def test_records_without_prompt_tokens_or_prompt_are_not_compared(tmp_path: Path) -> None:
    no_count = msgspec.to_builtins(record(0, 0))
    del no_count["prompt_tokens"]
    plant(tmp_path, [no_count, record(5, 1)], [ids(0, 10)])
    found = findings(tmp_path)
    assert "prompt_tokens_mismatch" not in found
    assert {"missing_field", "orphan_response"} <= set(found)


def test_same_findings_from_the_cached_scan(tmp_path: Path) -> None:
    plant(tmp_path, [record(0, 10), record(1, 7)], [ids(0, 10), ids(1, 12)])
    first = validate_run(tmp_path, workers=1)
    assert list(tmp_path.glob("ds/.workbench-cache/*"))  # the scans were kept
    assert validate_run(tmp_path, workers=1) == first


# --- context_reduced ---------------------------------------------------------------------------


def test_records_cut_to_fit_the_context_are_counted(tmp_path: Path) -> None:
    plant(tmp_path, [record(0, 10), record(1, 10, reduced=3000),
                     record(2, 10, reduced=2048, finish="length"), record(3, 10)],
          [ids(i, 10) for i in range(4)])
    report = validate_run(tmp_path, workers=1)
    found = {f.rule: f for f in report.datasets["ds"].findings}
    reduced = found["context_reduced"]
    assert (reduced.severity, reduced.count) == ("info", 2)
    assert [e.detail for e in reduced.examples] == [
        "sample_id 1: max_new_tokens cut to 3000 to fit the context",
        "sample_id 2: max_new_tokens cut to 2048 to fit the context"]
    assert found["truncated"].count == 1  # the cut one that ran to its end: a truncated record
    assert set(found) == {"context_reduced", "truncated"}


def test_reduced_field_written_only_when_set() -> None:
    assert b"max_new_tokens_reduced" not in encode_line(record(0, 1))
    line = json.loads(encode_line(record(0, 1, reduced=77)))
    assert list(line)[-2:] == ["schema", "max_new_tokens_reduced"] and line["max_new_tokens_reduced"] == 77


# --- as replies arrive -------------------------------------------------------------------------


def test_runner_counts_replies_whose_prompt_was_cut(tmp_path: Path) -> None:
    """A server that truncates prompts (SGLang --allow-auto-truncate at 8 tokens) says so only
    in prompt_tokens: the runner counts it and validate reports it."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "m"})
        body = json.loads(request.content)
        return httpx.Response(200, json={
            "text": "x", "output_ids": GOOD,
            "meta_info": {"id": body["rid"], "prompt_tokens": min(len(body["input_ids"]), 8),
                          "completion_tokens": len(GOOD), "cached_tokens": 0,
                          "finish_reason": {"type": "stop", "matched": END}, "e2e_latency": 0.01}})

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"sample_id": i, "input_ids": [7] * n}) + "\n"
                            for i, n in enumerate([5, 8, 9, 20, 3, 30])))
    manifest = tmp_path / "datasets.yaml"
    manifest.write_text(f"model_profile: kimi-k2.5\ndatasets:\n  - name: ds\n    path: {data}\n"
                        "    input: input_ids\n")

    said: list[str] = []

    async def go() -> Any:
        options = GenerateOptions(seed=1, progress_interval=60, concurrency=1)
        async with SGLangClient("http://mock", transport=httpx.MockTransport(handler)) as client:
            return await run_generation(load_manifest(manifest), client, tmp_path / "out", options,
                                        on_event=said.append)

    summary = asyncio.run(go())
    assert summary.datasets["ds"].done == 6 and summary.datasets["ds"].prompt_mismatches == 3
    mismatch = findings(tmp_path / "out")["prompt_tokens_mismatch"]
    assert mismatch.count == 3
    assert sorted(e.detail for e in mismatch.examples) == [
        "sample_id 2: prompt_tokens 8, sent 9 ids (-1)", "sample_id 3: prompt_tokens 8, sent 20 ids (-12)",
        "sample_id 5: prompt_tokens 8, sent 30 ids (-22)"]
    # told as events at the 1st and 2nd (then 4th, 8th, ...): said, and kept in run.json
    events = json.loads((tmp_path / "out/run.json").read_text())["events"]
    assert [(e["kind"], e["dataset"], e["count"]) for e in events] == [
        ("prompt_mismatch", "ds", 1), ("prompt_mismatch", "ds", 2)]
    first = events[0]["sample_id"]
    sent = {2: 9, 3: 20, 5: 30}[first]
    assert events[0]["message"] == (
        f"ds: prompt_tokens differ from the ids sent in 1 of this run's replies (sample_id "
        f"{first}: {sent} sent, 8 counted): the server cut or changed the prompts (started with "
        "--allow-auto-truncate?); validate lists them (prompt_tokens_mismatch)")
    assert [e["message"] for e in events] == [m for m in said if m.startswith("ds: ")]
