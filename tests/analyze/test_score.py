"""`workbench score`: a generated run scored on the simulator, one line per finished record,
incremental and resume-safe; servers that fail or cannot be reached; the scores' reader."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, generate_run, jsonl, workbench

import workbench.analyze.score as score_module
from workbench.analyze.score import (
    SCORES_FILE,
    load_scores,
    nll_and_entropy,
    score_run,
)
from workbench.errors import DataError
from workbench.rundir.lock import hold_run_lock, hold_score_lock
from workbench.rundir.records import encode_line
from workbench.server.launch import ServerProcess, find_free_port
from workbench.sim import SimConfig, create_app

pytestmark = pytest.mark.integration

CONTENT_IDS = (0, 1294)  # the simulator's vocabulary (kimi-k2.5's sim_content_ids)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, shared_sim: ServerProcess) -> Path:
    """A small run of two datasets (ids and text prompts) generated on the simulator."""
    return generate_run(tmp_path_factory.mktemp("score-run"), [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 10},
        {"name": "txt", "path": str(EXAMPLES / "data/texts.jsonl"), "input": "text",
         "max_samples": 4},
    ], shared_sim)


@pytest.fixture
def sim(shared_sim: ServerProcess) -> ServerProcess:
    """The worker's simulator: scoring asks for the HTTP contract only."""
    return shared_sim


@pytest.fixture
def out(generated: Path, tmp_path: Path) -> Path:
    """A fresh copy of the generated run (tests change it)."""
    return Path(shutil.copytree(generated, tmp_path / "out"))


def in_process(**config: Any) -> httpx.ASGITransport:
    return httpx.ASGITransport(app=create_app(SimConfig(**config)))


def score(out: Path, server: ServerProcess, *args: str) -> Any:
    return workbench("score", str(out), "--server", server.url, *args)


def records(folder: Path) -> list[dict[str, Any]]:
    return jsonl(folder / "raw_responses.jsonl")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(encode_line(row) for row in rows))


# --- the CLI on a simulator -----------------------------------------------------------------


def test_every_finished_record_gets_one_score_line(out: Path, sim: ServerProcess) -> None:
    raw_before = (out / "ids" / "raw_responses.jsonl").read_bytes()
    done = score(out, sim)
    assert done.returncode == 0, done.stderr
    total = 0
    for name in ("ids", "txt"):
        finished = {r["sample_id"]: r for r in records(out / name)
                    if r["finish_reason"] in ("stop", "length") and r["output_ids"]}
        lines = jsonl(out / name / SCORES_FILE)
        assert sorted(line["sample_id"] for line in lines) == sorted(finished)
        for line in lines:
            assert set(line) == {"sample_id", "nll", "entropy", "tokens", "top_k"}
            assert math.isfinite(line["nll"]) and line["nll"] > 0
            assert math.isfinite(line["entropy"]) and line["entropy"] >= 0
            assert line["tokens"] == len(finished[line["sample_id"]]["output_ids"])
            assert line["top_k"] == 20
        total += len(finished)
    assert done.stdout.startswith(f"scored {total} (0 already), failed 0; mean nll: ids ")
    assert (out / "ids" / "raw_responses.jsonl").read_bytes() == raw_before


def test_a_second_run_scores_nothing_new(out: Path, sim: ServerProcess) -> None:
    assert score(out, sim).returncode == 0
    before = (out / "ids" / SCORES_FILE).read_bytes()
    again = score(out, sim)
    assert again.returncode == 0, again.stderr
    total = len(jsonl(out / "ids" / SCORES_FILE)) + len(jsonl(out / "txt" / SCORES_FILE))
    assert again.stdout.startswith(f"scored 0 ({total} already), failed 0")
    assert (out / "ids" / SCORES_FILE).read_bytes() == before


def test_a_second_score_of_the_same_run_is_refused_while_one_runs(out: Path, sim: ServerProcess) -> None:
    """Two scorers would append the same scores twice: the second one is one line, exit 2,
    and nothing is written; a generate's lock does not stop a score (it reads finished
    records only)."""
    with hold_score_lock(out):
        refused = score(out, sim)
    assert refused.returncode == 2 and not (out / "ids" / SCORES_FILE).exists()
    assert "another workbench score (pid " in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    with hold_run_lock(out):
        assert score(out, sim).returncode == 0
    assert len(jsonl(out / "ids" / SCORES_FILE)) == len(records(out / "ids"))


def test_only_records_appended_since_are_scored(out: Path, sim: ServerProcess) -> None:
    assert score(out, sim, "--only", "ids").returncode == 0
    folder = out / "ids"
    scored = len(jsonl(folder / SCORES_FILE))
    prompts = {p["sample_id"]: p for p in jsonl(folder / "prompts.jsonl")}
    extra = [dict(r, sample_id=f"extra-{i}") for i, r in enumerate(records(folder)[:3])]
    extra_prompts = [dict(prompts[r["sample_id"]], sample_id=f"extra-{i}")
                     for i, r in enumerate(records(folder)[:3])]
    with open(folder / "raw_responses.jsonl", "ab") as raw:
        raw.write(b"".join(encode_line(r) for r in extra))
    with open(folder / "prompts.jsonl", "ab") as file:
        file.write(b"".join(encode_line(p) for p in extra_prompts))
    again = score(out, sim, "--only", "ids")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"scored 3 ({scored} already), failed 0; mean nll: ids ")
    lines = jsonl(folder / SCORES_FILE)
    assert [line["sample_id"] for line in lines[scored:]] == ["extra-0", "extra-1", "extra-2"]
    assert not (out / "txt" / SCORES_FILE).exists()


def test_a_torn_last_line_is_put_aside_and_its_record_scored_again(
    out: Path, sim: ServerProcess
) -> None:
    assert score(out, sim, "--only", "ids").returncode == 0
    path = out / "ids" / SCORES_FILE
    data = path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    fragment = last[: len(last) // 2]
    path.write_bytes(data[: len(data) - len(last) - 1] + fragment)
    again = score(out, sim, "--only", "ids")
    assert again.returncode == 0, again.stderr
    lines = jsonl(path)
    assert again.stdout.startswith(f"scored 1 ({len(lines) - 1} already)")
    assert lines[-1]["sample_id"] == json.loads(last)["sample_id"]
    assert (out / "ids" / (SCORES_FILE + ".torn")).read_bytes() == fragment + b"\n"


def test_an_unreachable_server_is_one_line_and_exit_2(out: Path) -> None:
    url = f"http://127.0.0.1:{find_free_port()}"
    done = workbench("score", str(out), "--server", url)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: error: cannot reach the server")
    assert url in lines[0]
    assert not (out / "ids" / SCORES_FILE).exists()


# --- in process: what the scores say, what is skipped, what fails ---------------------------


def test_random_ids_score_a_higher_nll_than_the_simulators_own_replies(out: Path) -> None:
    folder = out / "ids"
    rows = records(folder)
    rng = random.Random(7)
    randomised = {r["sample_id"] for r in rows[::2]}
    for row in rows:
        if row["sample_id"] in randomised:
            row["output_ids"] = [rng.randrange(*CONTENT_IDS) for _ in row["output_ids"]]
    write_jsonl(folder / "raw_responses.jsonl", rows)
    summary = score_run(out, "http://sim", only=["ids"], transport=in_process())
    assert (summary.scored, summary.failed) == (len(rows), 0)
    scores = load_scores(folder).set_index("sample_id")["nll"]
    random_nll = scores[scores.index.isin(randomised)]
    own_nll = scores[~scores.index.isin(randomised)]
    assert len(random_nll) and len(own_nll)
    assert random_nll.min() > own_nll.max() + 2


def test_over_long_and_orphan_records_are_skipped_and_counted(out: Path) -> None:
    folder = out / "ids"
    rows = records(folder)
    prompts = jsonl(folder / "prompts.jsonl")
    orphan = rows[0]["sample_id"]
    write_jsonl(folder / "prompts.jsonl", [p for p in prompts if p["sample_id"] != orphan])
    lengths = sorted(r["prompt_tokens"] + len(r["output_ids"]) for r in rows[1:])
    pool = lengths[len(lengths) // 2]  # max_req_input_len = pool - 1: the longer half is refused
    too_long = sum(length >= pool - 1 for length in lengths)
    summary = score_run(out, "http://sim", only=["ids"],
                        transport=in_process(max_total_tokens=pool))
    ds = summary.datasets[0]
    reason = f"prompt + reply too long for the server's context ({pool - 1} tokens)"
    assert ds.skipped == {"prompt not in prompts.jsonl": 1, reason: too_long}
    assert (ds.scored, ds.failed) == (len(rows) - 1 - too_long, 0)
    assert "skipped" in score_module.format_summary(summary)
    assert orphan not in set(load_scores(folder)["sample_id"])


def test_text_prompts_need_the_runs_tokenizer(out: Path) -> None:
    run_json = json.loads((out / "run.json").read_text())
    del run_json["datasets"]["txt"]["tokenizer"]
    (out / "run.json").write_text(json.dumps(run_json))
    summary = score_run(out, "http://sim", only=["txt"], transport=in_process())
    count = len(records(out / "txt"))
    assert summary.skipped == {"text prompt and the run names no tokenizer": count}
    assert summary.scored == 0
    assert "text prompt and the run names no tokenizer: " in score_module.format_summary(summary)


def failing_server(status: int, calls: list[str]) -> httpx.MockTransport:
    info = {"context_length": 32768, "max_req_input_len": 32767}

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/server_info":
            return httpx.Response(200, json=info)
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "m"})
        return httpx.Response(status, json={"error": {"message": f"no ({status})"}})

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(("status", "attempts"), [(503, score_module.ATTEMPTS), (400, 1)])
def test_failed_requests_are_retried_counted_and_never_stop_the_job(
    out: Path, monkeypatch: pytest.MonkeyPatch, status: int, attempts: int
) -> None:
    monkeypatch.setattr(score_module, "RETRY_DELAYS", (0.0,))
    calls: list[str] = []
    summary = score_run(out, "http://sim", only=["ids"], transport=failing_server(status, calls))
    count = len(records(out / "ids"))
    assert (summary.scored, summary.failed) == (0, count)
    assert calls.count("/generate") == count * attempts
    assert summary.datasets[0].first_failure is not None
    assert f"no ({status})" in summary.datasets[0].first_failure
    assert score_module.format_summary(summary).endswith(f"no ({status})")
    assert load_scores(out / "ids").empty


def test_a_reply_for_other_tokens_is_a_failure(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that scores other ids than the ones sent (a truncating one) is not trusted."""
    monkeypatch.setattr(score_module, "RETRY_DELAYS", (0.0,))
    sim = in_process()

    async def shifted(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.method == "POST" else None
        if body is not None:
            body["input_ids"] = body["input_ids"][:-1]
            request = httpx.Request("POST", request.url, json=body)
        return await sim.handle_async_request(request)

    summary = score_run(out, "http://sim", only=["ids"],
                        transport=httpx.MockTransport(shifted))
    assert summary.scored == 0 and summary.failed == len(records(out / "ids"))
    assert "are not the reply's tokens" in (summary.datasets[0].first_failure or "")


# --- the reader and the math ----------------------------------------------------------------


def test_load_scores_reads_lines_leaves_a_torn_one_and_names_a_bad_one(tmp_path: Path) -> None:
    assert list(load_scores(tmp_path).columns) == ["sample_id", "nll", "entropy", "tokens"]
    assert load_scores(tmp_path).empty
    line = {"sample_id": 1, "nll": 1.5, "entropy": 2.0, "tokens": 3, "top_k": 20}
    path = tmp_path / SCORES_FILE
    path.write_bytes(encode_line(line) + encode_line(dict(line, sample_id="b")) + b'{"samp')
    frame = load_scores(tmp_path)
    assert frame["sample_id"].tolist() == [1, "b"]
    assert frame["nll"].tolist() == [1.5, 1.5]
    path.write_bytes(encode_line(line) + b'{"sample_id": 2}\n')
    with pytest.raises(DataError, match=r"scores.jsonl:2: not a score line"):
        load_scores(tmp_path)


def test_nll_is_minus_the_mean_logprob_and_entropy_a_renormalised_top_k_one() -> None:
    nll, entropy = nll_and_entropy([-1.0, -3.0], [[-2.0] * 4, [0.0]])
    assert nll == pytest.approx(2.0)
    assert entropy == pytest.approx(math.log(4) / 2)
