"""Modes mixed within a dataset, generated: the draw on the send order (exact within one
sample, under a budget too), each mode's prompt and sampling, the mode on every record and
prompt line, and a resume that keeps what was drawn and refuses a changed `modes`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, jsonl, tool_turn_rows, workbench, write_manifest

from workbench.profiles import get_profile
from workbench.server.launch import ServerProcess

KIMI = get_profile("kimi-k2.5")
THINK_START, THINK_END = KIMI.think_start, KIMI.think_end
MODES = [{"name": "think", "weight": 0.75, "chat_template_kwargs": {"thinking": True}},
         {"name": "direct", "weight": 0.25, "chat_template_kwargs": {"thinking": False},
          "sampling": {"temperature": 0.6}}]
GLAIVE = EXAMPLES / "data" / "glaive_fc.jsonl"  # 300 function-calling chats


def generate(manifest: Path, server: ServerProcess, out: Path, *flags: str) -> Any:
    return workbench("generate", "--datasets", str(manifest), "--server", server.url,
                     "--out", str(out), "--progress-interval", "30", "--seed", "3", *flags)


def mix(path: Path) -> Counter[str | None]:
    return Counter(line.get("mode") for line in jsonl(path))


def glaive(tmp_path: Path, **extra: Any) -> Path:
    return write_manifest(tmp_path, [{"name": "g", "path": str(GLAIVE), "input": "messages",
                                      "modes": MODES, **extra}],
                          sampling={"temperature": 1.0, "max_new_tokens": 96})


def test_the_mix_is_exact_under_a_cap_and_after_the_resume_that_completes_it(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    manifest, out = glaive(tmp_path), tmp_path / "out"
    done = generate(manifest, shared_sim, out, "--max-samples", "40")
    assert done.returncode == 0, done.stderr
    assert mix(out / "g" / "raw_responses.jsonl") == {"think": 30, "direct": 10}
    done = generate(manifest, shared_sim, out)
    assert done.returncode == 0, done.stderr
    records = jsonl(out / "g" / "raw_responses.jsonl")
    assert Counter(r["mode"] for r in records) == {"think": 225, "direct": 75}
    prompts = {p["sample_id"]: p for p in jsonl(out / "g" / "prompts.jsonl")}
    assert all(prompts[r["sample_id"]]["mode"] == r["mode"] for r in records)
    for record in records:  # each mode's template ends its prompt; the simulator follows it
        ids = prompts[record["sample_id"]]["input_ids"]
        if record["mode"] == "direct":
            assert ids[-2:] == [THINK_START, THINK_END]
            assert THINK_END not in record["output_ids"]
        else:
            assert ids[-1] == THINK_START and ids[-2] != THINK_START
    entry = json.loads((out / "run.json").read_text())["datasets"]["g"]
    assert [m["name"] for m in entry["modes"]] == ["think", "direct"]
    assert entry["modes"][1]["sampling"]["temperature"] == 0.6
    again = tmp_path / "again"  # a rerun with the run's seed draws the same
    assert generate(manifest, shared_sim, again).returncode == 0
    drawn = {r["sample_id"]: r["mode"] for r in records}
    assert {r["sample_id"]: r["mode"] for r in jsonl(again / "g" / "raw_responses.jsonl")} == drawn


def test_a_token_budget_keeps_the_weights(tmp_path: Path, shared_sim: ServerProcess) -> None:
    manifest, out = glaive(tmp_path, max_tokens=4000), tmp_path / "out"
    done = generate(manifest, shared_sim, out, "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    counts = mix(out / "g" / "raw_responses.jsonl")
    total = sum(counts.values())
    assert 10 < total < 300
    assert abs(counts["think"] - 0.75 * total) < 1 + 4  # within one of what was sent, and
    assert abs(counts["direct"] - 0.25 * total) < 1 + 4  # the 4 in flight when it stopped


def test_a_changed_mix_is_refused_and_forced_keeps_what_was_sent(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    out = tmp_path / "out"
    assert generate(glaive(tmp_path), shared_sim, out, "--max-samples", "40").returncode == 0
    sent = {r["sample_id"]: r["mode"] for r in jsonl(out / "g" / "raw_responses.jsonl")}
    even = [{**mode, "weight": 1.0} for mode in MODES]
    manifest = write_manifest(tmp_path, [{"name": "g", "path": str(GLAIVE), "input": "messages",
                                          "modes": even}],
                              sampling={"temperature": 1.0, "max_new_tokens": 96})
    refused = generate(manifest, shared_sim, out)
    assert refused.returncode == 2
    assert "datasets.g.modes changed from think 0.75" in refused.stderr
    assert "to think 1.0" in refused.stderr and "--force" in refused.stderr
    forced = generate(manifest, shared_sim, out, "--force")
    assert forced.returncode == 0, forced.stderr
    records = jsonl(out / "g" / "raw_responses.jsonl")
    assert {r["sample_id"]: r["mode"] for r in records if r["sample_id"] in sent} == sent
    assert Counter(r["mode"] for r in records) == {"think": 150, "direct": 150}


def test_each_turn_of_a_conversation_keeps_its_mode(tmp_path: Path,
                                                    shared_sim: ServerProcess) -> None:
    rows = tool_turn_rows(tmp_path, 20)
    modes = [{"name": "on", "chat_template_kwargs": {"thinking": True}},
             {"name": "off", "chat_template_kwargs": {"thinking": False}}]
    manifest = write_manifest(tmp_path, [{"name": "t", "path": str(rows), "input": "messages",
                                          "turns": "each", "modes": modes}])
    out = tmp_path / "out"
    done = generate(manifest, shared_sim, out)
    assert done.returncode == 0, done.stderr
    records = jsonl(out / "t" / "raw_responses.jsonl")
    by_conversation: dict[Any, set[str]] = {}
    for record in records:
        by_conversation.setdefault(record["sample_id"], set()).add(record["mode"])
    assert all(len(modes) == 1 for modes in by_conversation.values())
    assert Counter(m.pop() for m in by_conversation.values()) == {"on": 10, "off": 10}
    assert len(records) > 20  # later turns were generated
    for line in jsonl(out / "t" / "prompts.jsonl"):
        assert line["mode"] in ("on", "off")
        if line["mode"] == "off":
            assert line["input_ids"][-1] == THINK_END


@pytest.mark.anyio
async def test_each_mode_is_sent_with_its_sampling(tmp_path: Path) -> None:
    from workbench.config import load_manifest
    from workbench.generate.plan import GenerateOptions
    from workbench.generate.session import run_generation
    from workbench.server.client import SGLangClient

    (tmp_path / "ids.jsonl").write_text("".join(
        json.dumps({"sample_id": i, "input_ids": [7, 8, i]}) + "\n" for i in range(20)))
    modes = [{"name": "hot", "sampling": {"temperature": 1.0}},
             {"name": "cold", "weight": 3, "sampling": {"temperature": 0.2, "top_p": 0.9}}]
    manifest = write_manifest(tmp_path, [{"name": "d", "path": "ids.jsonl",
                                          "input": "input_ids", "modes": modes}])
    sent: dict[int, dict[str, Any]] = {}

    def reply(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/generate":
            return httpx.Response(200, json={"model_path": "sim/kimi", "version": "test"})
        body = json.loads(request.content)
        sent[body["input_ids"][2]] = body["sampling_params"]
        return httpx.Response(200, json={
            "text": "x", "output_ids": [1, 2], "meta_info": {
                "id": body["rid"], "prompt_tokens": 3, "completion_tokens": 2,
                "cached_tokens": 0, "finish_reason": {"type": "stop", "matched": 163586},
                "e2e_latency": 0.01}})

    options = GenerateOptions(seed=1, progress_interval=60, max_new_tokens=32)
    async with SGLangClient("http://mock", transport=httpx.MockTransport(reply)) as client:
        await run_generation(load_manifest(manifest), client, tmp_path / "out", options)
    records = {r["sample_id"]: r["mode"] for r in jsonl(tmp_path / "out/d/raw_responses.jsonl")}
    assert Counter(records.values()) == {"hot": 5, "cold": 15}
    for sample_id, mode in records.items():
        expected = ({"temperature": 1.0, "top_p": 1.0} if mode == "hot"
                    else {"temperature": 0.2, "top_p": 0.9})
        assert sent[sample_id] == {**expected, "top_k": -1, "max_new_tokens": 32}


def test_skipped_duplicates_leave_the_others_modes_as_drawn(tmp_path: Path,
                                                            shared_sim: ServerProcess) -> None:
    rows = tmp_path / "ids.jsonl"
    with open(rows, "w") as out:
        for i in range(120):  # every fourth row copies the one before it
            ids = [11, 12, 13 + (i - 1 if i % 4 == 3 else i)]
            out.write(json.dumps({"sample_id": i, "input_ids": ids}) + "\n")
    modes = [{"name": "a", "weight": 3}, {"name": "b", "sampling": {"temperature": 0.5}}]
    whole = write_manifest(tmp_path, [{"name": "d", "path": str(rows), "input": "input_ids",
                                       "modes": modes}])
    assert generate(whole, shared_sim, tmp_path / "whole").returncode == 0
    drawn = {r["sample_id"]: r["mode"] for r in jsonl(tmp_path / "whole/d/raw_responses.jsonl")}
    assert Counter(drawn.values()) == {"a": 90, "b": 30}
    deduped = write_manifest(tmp_path, [{"name": "d", "path": str(rows), "input": "input_ids",
                                         "modes": modes, "dedup": "exact", "max_samples": 40}])
    done = generate(deduped, shared_sim, tmp_path / "deduped")
    assert done.returncode == 0, done.stderr
    records = jsonl(tmp_path / "deduped/d/raw_responses.jsonl")
    assert len(records) == 40 and all(r["sample_id"] % 4 != 3 for r in records)
    assert all(drawn[r["sample_id"]] == r["mode"] for r in records)
    counts = Counter(r["mode"] for r in records)
    assert abs(counts["a"] - 30) <= 3  # the copies skipped before the cut shift it a little


def test_a_run_made_without_modes_is_not_resumed_with_them(tmp_path: Path,
                                                            shared_sim: ServerProcess) -> None:
    plain = write_manifest(tmp_path, [{"name": "g", "path": str(GLAIVE), "input": "messages",
                                       "max_samples": 10}],
                           sampling={"temperature": 1.0, "max_new_tokens": 96})
    out = tmp_path / "out"
    assert generate(plain, shared_sim, out).returncode == 0
    manifest = json.loads((out / "run.json").read_text())
    del manifest["datasets"]["g"]["modes"]  # as a run of an earlier version wrote it
    (out / "run.json").write_text(json.dumps(manifest))
    refused = generate(glaive(tmp_path, max_samples=10), shared_sim, out)
    assert refused.returncode == 2, refused.stderr
    assert "datasets.g.modes changed from none to think 0.75" in refused.stderr
