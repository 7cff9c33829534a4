"""`dedup: exact | near` in the manifest: duplicate prompts skipped before sending, listed in
skipped.jsonl, across datasets and sessions (httpx.MockTransport servers)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import jsonl, workbench

from workbench.analyze.validate import validate_run
from workbench.config import Manifest, load_manifest
from workbench.errors import ConfigError
from workbench.generate.plan import GenerateOptions
from workbench.generate.progress import RunSummary
from workbench.generate.session import run_generation
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess

pytestmark = pytest.mark.anyio

LENGTH = 300  # ids per prompt: long enough that a few changed ids leave a near copy


def _prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 150_000) for _ in range(LENGTH)] for _ in range(count)]


def _near(ids: list[int], changes: int = 1) -> list[int]:
    """ids with `changes` ids replaced, spread out (one change in 300 ids: a shingle Jaccard
    of about 0.98, above the default threshold of 0.9 by far more than the estimate's spread)."""
    copy = list(ids)
    for k in range(changes):
        copy[(k + 1) * len(copy) // (changes + 1)] = 151_000 + k
    return copy


A = _prompts(1, 8)
B = _prompts(2, 4)
# a: rows 0-7 distinct, 10 an exact copy of a/2, 11 a near copy of a/3.
ROWS_A = [*enumerate(A), (10, list(A[2])), (11, _near(A[3]))]
# b: 0 an exact copy of a/5, 1 a near copy of a/6, 2-5 new, 6 an exact copy of b/2.
ROWS_B = [(0, list(A[5])), (1, _near(A[6])), *((i + 2, ids) for i, ids in enumerate(B)),
          (6, list(B[0]))]

EXPECTED_NEAR = {
    "a": [{"sample_id": 10, "rule": "exact_duplicate", "of": {"dataset": "a", "sample_id": 2}},
          {"sample_id": 11, "rule": "near_duplicate", "of": {"dataset": "a", "sample_id": 3}}],
    "b": [{"sample_id": 0, "rule": "exact_duplicate", "of": {"dataset": "a", "sample_id": 5}},
          {"sample_id": 1, "rule": "near_duplicate", "of": {"dataset": "a", "sample_id": 6}},
          {"sample_id": 6, "rule": "exact_duplicate", "of": {"dataset": "b", "sample_id": 2}}],
}


def write_data(tmp: Path) -> None:
    for name, rows in (("a", ROWS_A), ("b", ROWS_B)):
        (tmp / f"{name}.jsonl").write_text(
            "".join(json.dumps({"sample_id": i, "input_ids": ids}) + "\n" for i, ids in rows))


def manifest_text(top: str = "", a: str = "", b: str = "") -> str:
    """A manifest of datasets a and b; `top`, `a`, `b`: extra YAML lines (e.g. dedup keys)."""
    lines = ["model_profile: kimi-k2.5", "sampling:", "  temperature: 0.0",
             "  max_new_tokens: 16", *([top] if top else []), "datasets:",
             "  - name: a", "    path: a.jsonl", "    input: input_ids", *([f"    {a}"] if a else []),
             "  - name: b", "    path: b.jsonl", "    input: input_ids", *([f"    {b}"] if b else [])]
    return "\n".join(lines) + "\n"


def write_manifest(tmp: Path, top: str = "", a: str = "", b: str = "") -> Manifest:
    write_data(tmp)
    path = tmp / "datasets.yaml"
    path.write_text(manifest_text(top, a, b))
    return load_manifest(path)


class Server:
    """Answers /generate like SGLang and keeps every prompt it was sent (a tuple of ids, or
    the text); `refuse` names samples (``dataset-sample_id``, as the request's rid starts) it
    answers with a 400, so they stay unfinished."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[int, ...] | str] = []
        self.refuse = refuse

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "sim/kimi", "version": "test"})
        body = json.loads(request.content)
        prompt = tuple(body["input_ids"]) if "input_ids" in body else body["text"]
        self.sent.append(prompt)
        if any(body["rid"].startswith(f"{sample}-") for sample in self.refuse):
            return httpx.Response(400, json={"error": {"message": "refused"}})
        return httpx.Response(200, json={
            "text": "x", "output_ids": [1, 2, 3],
            "meta_info": {"id": body["rid"], "prompt_tokens": len(prompt),
                          "completion_tokens": 3, "cached_tokens": 0,
                          "finish_reason": {"type": "stop", "matched": 163586},
                          "e2e_latency": 0.01}})


async def run(manifest: Manifest, server: Server, out: Path, events: list[str] | None = None,
              **options: Any) -> RunSummary:
    opts = GenerateOptions(seed=1, backoff_base=0.001, progress_interval=60, max_attempts=1,
                           **options)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(server)) as client:
        return await run_generation(manifest, client, out, opts,
                                    on_event=(events.append if events is not None else None))


def ids_of(path: Path) -> list[Any]:
    return sorted(row["sample_id"] for row in jsonl(path)) if path.exists() else []


def prompt_of(rows: list[tuple[int, list[int]]], sample_id: int) -> tuple[int, ...]:
    return tuple(dict(rows)[sample_id])


async def test_duplicates_across_and_within_datasets_are_never_sent(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: near")
    server, out, events = Server(), tmp_path / "out", list[str]()
    summary = await run(manifest, server, out, events)
    assert len(server.sent) == 12 and len(set(server.sent)) == 12  # 17 rows, 5 copies
    assert prompt_of(ROWS_A, 2) in server.sent and prompt_of(ROWS_A, 5) in server.sent
    assert {n: (p.done, p.target) for n, p in summary.datasets.items()} == {"a": (8, 8),
                                                                           "b": (4, 4)}
    assert ids_of(out / "a/raw_responses.jsonl") == list(range(8))
    assert ids_of(out / "b/raw_responses.jsonl") == [2, 3, 4, 5]
    assert ids_of(out / "b/prompts.jsonl") == [2, 3, 4, 5]  # skipped ones are no prompt of the run
    for name, expected in EXPECTED_NEAR.items():
        assert jsonl(out / name / "skipped.jsonl") == expected
    record = json.loads((out / "run.json").read_text())["datasets"]
    assert record["b"]["dedup"] == {"mode": "near", "threshold": 0.55, "skipped": 3, "exact": 2,
                                    "near": 1}
    assert record["b"]["prompts"] == 4
    assert "[a] dedup: 1 exact, 1 near duplicates skipped (compared: whole prompts) (listed in " \
           f"{out / 'a' / 'skipped.jsonl'})" in events
    assert "[b] dedup: 2 exact, 1 near duplicates skipped" in " ".join(events)
    findings = validate_run(out, workers=1)
    assert all(f.rule != "missing_response" for ds in findings.datasets.values()
               for f in ds.findings)


async def test_exact_mode_sends_near_copies(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: exact")
    server, out = Server(), tmp_path / "out"
    await run(manifest, server, out)
    assert len(server.sent) == 14
    assert prompt_of(ROWS_A, 11) in server.sent and prompt_of(ROWS_B, 1) in server.sent
    assert [s["sample_id"] for s in jsonl(out / "a/skipped.jsonl")] == [10]
    assert [s["sample_id"] for s in jsonl(out / "b/skipped.jsonl")] == [0, 6]
    assert {s["rule"] for s in jsonl(out / "b/skipped.jsonl")} == {"exact_duplicate"}


@pytest.mark.parametrize("top, b, sent_a", [
    ("", "", 10),  # no key: off
    ("dedup: off", "", 10),  # YAML reads a bare off as false: off too
    ("dedup: near", "dedup: off", 8),  # a dataset's own setting wins
])
async def test_dedup_off_sends_every_prompt(tmp_path: Path, top: str, b: str, sent_a: int) -> None:
    manifest = write_manifest(tmp_path, top=top, b=b)
    server, out = Server(), tmp_path / "out"
    await run(manifest, server, out)
    assert len(server.sent) == sent_a + len(ROWS_B)
    assert prompt_of(ROWS_B, 0) in server.sent and prompt_of(ROWS_B, 6) in server.sent
    assert not (out / "b/skipped.jsonl").exists()
    assert json.loads((out / "run.json").read_text())["datasets"]["b"]["dedup"]["mode"] == "off"


async def test_a_second_run_sends_nothing_and_rewrites_the_list(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: near")
    out = tmp_path / "out"
    await run(manifest, Server(), out)
    before = {name: (out / name / "skipped.jsonl").read_bytes() for name in ("a", "b")}
    server = Server()
    summary = await run(manifest, server, out)
    assert server.sent == [] and summary.datasets["b"].done == 4
    assert {name: (out / name / "skipped.jsonl").read_bytes() for name in ("a", "b")} == before
    assert len(jsonl(out / "a/raw_responses.jsonl")) == 8


async def test_an_interrupted_run_resumes_without_sending_a_duplicate(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: near")
    out = tmp_path / "out"
    await run(manifest, Server(), out)
    raw = out / "a/raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    raw.write_bytes(b"".join(lines[:5]) + lines[5][:20])  # killed while writing the 6th record
    lost = {json.loads(line)["sample_id"] for line in lines[5:]}
    server = Server()
    await run(manifest, server, out)
    assert sorted(server.sent) == sorted(prompt_of(ROWS_A, i) for i in lost)
    assert ids_of(raw) == list(range(8))
    assert jsonl(out / "a/skipped.jsonl") == EXPECTED_NEAR["a"]


async def test_a_finished_copy_is_kept_and_its_unfinished_original_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Dedup off at first, and a/2 refused: its exact copy a/10 finishes, a/2 does not.
    refused = Server(refuse=frozenset({"a-2"}))
    await run(write_manifest(tmp_path), refused, out)
    assert 10 in ids_of(out / "a/raw_responses.jsonl")
    assert 2 not in ids_of(out / "a/raw_responses.jsonl")
    server, events = Server(), list[str]()
    summary = await run(write_manifest(tmp_path, top="dedup: near"), server, out, events)
    assert server.sent == []  # a/2 is not sent again: its copy a/10 finished
    skipped_a = {s["sample_id"]: s for s in jsonl(out / "a/skipped.jsonl")}
    assert skipped_a == {2: {"sample_id": 2, "rule": "exact_duplicate",
                             "of": {"dataset": "a", "sample_id": 10}}}  # not a/10, finished
    assert not (out / "b/skipped.jsonl").exists()  # every copy in b finished: all kept
    assert summary.datasets["a"].target == summary.datasets["a"].done == 9
    assert "[a] dedup changed from off to near (0.55) since the earlier session: duplicates " \
           "found anew, finished samples kept" in events


async def test_only_compares_with_the_earlier_datasets_of_the_manifest(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: near")
    server, out = Server(), tmp_path / "out"
    await run(manifest, server, out, only=("b",))
    assert len(server.sent) == 4 and not (out / "a").exists()  # a read, not sent
    assert jsonl(out / "b/skipped.jsonl") == EXPECTED_NEAR["b"]


async def test_skipped_prompts_do_not_count_in_max_samples(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: exact\norder: file", b="max_samples: 3")
    server, out = Server(), tmp_path / "out"
    summary = await run(manifest, server, out)
    # b in file order, its copy 0 (of a/5) dropped first: the head is 1, 2, 3.
    assert ids_of(out / "b/raw_responses.jsonl") == [1, 2, 3]
    assert summary.datasets["b"].target == 3 and len(server.sent) == 9 + 3
    assert [s["sample_id"] for s in jsonl(out / "b/skipped.jsonl")] == [0, 6]


async def test_a_copy_of_what_an_earlier_dataset_leaves_out_is_sent(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, top="dedup: exact\norder: file", a="max_samples: 2")
    server, out = Server(), tmp_path / "out"
    await run(manifest, server, out)
    assert ids_of(out / "a/raw_responses.jsonl") == [0, 1]
    assert ids_of(out / "b/raw_responses.jsonl") == [0, 1, 2, 3, 4, 5]  # a/5 was never sent
    assert jsonl(out / "b/skipped.jsonl") == [EXPECTED_NEAR["b"][2]]


async def test_text_prompts_compare_their_normalised_words(tmp_path: Path) -> None:
    rows = [{"sample_id": "x", "text": "What is the capital of France?"},
            {"sample_id": "y", "text": "what is  the CAPITAL of france"},
            {"sample_id": "z", "text": "What is the capital of Spain?"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "m.yaml").write_text("model_profile: kimi-k2.5\ndedup: exact\ndatasets:\n"
                                     "  - {name: t, path: t.jsonl, input: text}\n")
    server, out = Server(), tmp_path / "out"
    await run(load_manifest(tmp_path / "m.yaml"), server, out)
    assert sorted(server.sent) == [rows[0]["text"], rows[2]["text"]]  # type: ignore[type-var]
    assert jsonl(out / "t/skipped.jsonl") == [
        {"sample_id": "y", "rule": "exact_duplicate", "of": {"dataset": "t", "sample_id": "x"}}]


@pytest.mark.parametrize("top, a, message", [
    ("dedup: fuzzy", "", (r"datasets\.yaml:5: dedup: invalid value 'fuzzy' "
                          r"\(expected one of: exact, near, off\)$")),
    ("", "dedup: on", r"datasets\.yaml:9: datasets\[0\]\.dedup: invalid value true"),
    ("dedup_threshold: 1.5", "dedup: near",
     r"datasets\.yaml:5: dedup_threshold: expected float <= 1\.0, got 1\.5$"),
    ("dedup_threshold: 0.9", "dedup: exact",
     r"datasets\.yaml:5: dedup_threshold: only applies with dedup: near"),
])
def test_a_bad_setting_names_the_file_line_and_key(tmp_path: Path, top: str, a: str,
                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        write_manifest(tmp_path, top=top, a=a)


def test_the_cli_says_a_bad_value_in_one_line(tmp_path: Path) -> None:
    write_data(tmp_path)
    path = tmp_path / "datasets.yaml"
    path.write_text(manifest_text(b="dedup: exakt"))
    done = workbench("generate", "--datasets", str(path), "--server", "http://127.0.0.1:9",
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:12: datasets[1].dedup: invalid value 'exakt'" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_generate_on_the_simulator_skips_and_says_so(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    write_manifest(tmp_path, top="dedup: near")
    server, out = shared_sim, tmp_path / "out"
    args = ("generate", "--datasets", str(tmp_path / "datasets.yaml"), "--server", server.url,
            "--out", str(out), "--progress-interval", "30")
    first = workbench(*args)
    assert first.returncode == 0, first.stderr
    assert "[a] dedup: 1 exact, 1 near duplicates skipped" in first.stdout
    assert "[b] dedup: 2 exact, 1 near duplicates skipped" in first.stdout
    assert ids_of(out / "a/raw_responses.jsonl") == list(range(8))
    assert ids_of(out / "b/raw_responses.jsonl") == [2, 3, 4, 5]
    second = workbench(*args)
    assert second.returncode == 0, second.stderr
    assert "resuming" in second.stdout and "12/12 done, 0 to send" in second.stdout
    assert len(jsonl(out / "a/raw_responses.jsonl")) == 8
    assert jsonl(out / "b/skipped.jsonl") == EXPECTED_NEAR["b"]
