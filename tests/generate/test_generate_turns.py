"""Conversations regenerated turn by turn (`turns: each`): every assistant turn against the
model's own earlier turns, one record per turn, a kill mid-conversation resumed at its next turn."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, jsonl, tool_turn_rows, wait_until, workbench, write_manifest

from workbench.chat import assistant_message, last_turn_messages, parse_messages, parse_reply
from workbench.config import load_manifest
from workbench.errors import ConfigError
from workbench.generate.session import run_generation
from workbench.profiles import get_profile
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess
from workbench.tokenizer import decode, encode_messages, load_tokenizer

WORDS = ["the", "city", "sends", "a", "special", "service", "after", "that", "current", "order", "the", "company", "includes", "a", "bad", "team", "now"]
USERS = 3


def chat_rows(folder: Path, count: int, seed: int = 5) -> Path:
    """Rows of a system message and USERS user turns, each answered by the data."""
    rng = random.Random(seed)
    path = folder / "chats.jsonl"
    with open(path, "w") as out:
        for i in range(count):
            messages: list[dict[str, Any]] = [{"role": "system", "content": "you are kind"}]
            for _ in range(USERS):
                messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=12))})
                messages.append({"role": "assistant", "content": "the data answer"})
            out.write(json.dumps({"sample_id": i, "messages": messages}) + "\n")
    return path


def expected_history(row: dict[str, Any], replies: list[list[int]],
                     tokenizer: Any) -> list[dict[str, Any]]:
    """Turn len(replies)'s history: the row's messages up to that turn, the data's answers
    replaced by the model's own replies."""
    profile = get_profile("kimi-k2.5")
    history: list[dict[str, Any]] = []
    answered = 0
    for message in row["messages"]:
        if message["role"] != "assistant":
            history.append(message)
            continue
        if answered == len(replies):
            break
        reply = parse_reply(replies[answered], profile, lambda ids: decode(tokenizer, ids))
        history.append(assistant_message(reply))
        answered += 1
    return history


def expected_prompt(row: dict[str, Any], replies: list[list[int]], tokenizer: Any) -> list[int]:
    """Turn len(replies)'s prompt as the tokenizer's chat template renders its history."""
    return encode_messages(tokenizer, expected_history(row, replies, tokenizer), {"thinking": True})


def server_prompt(url: str, history: list[dict[str, Any]]) -> list[int]:
    """The prompt ids the server renders for a history (one token generated)."""
    reply = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": history, "max_tokens": 1, "return_prompt_token_ids": True}, timeout=60)
    reply.raise_for_status()
    ids: list[int] = reply.json()["choices"][0]["prompt_token_ids"]
    return ids


def by_key(lines: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(line["sample_id"], line["turn"]): line for line in lines}


def check_turns(records: list[dict[str, Any]], conversations: int) -> None:
    """Every (sample_id, turn) once; each conversation's turns 0..j-1 without a gap, all
    USERS of them unless its last one says why it ended (a turn cut at max_new_tokens)."""
    keys = Counter((r["sample_id"], r["turn"]) for r in records)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    last = {r["sample_id"]: r for r in sorted(records, key=lambda r: r["turn"])}
    assert set(last) == set(range(conversations))
    for sample_id, record in last.items():
        turns = record["turn"] + 1
        assert {k for (i, k) in keys if i == sample_id} == set(range(turns))
        if turns < USERS:
            assert record["ended"] == "truncated" and record["finish_reason"] == "length"
        else:
            assert "ended" not in record
    assert all("ended" not in r for r in records if r is not last[r["sample_id"]])


def test_each_turn_is_generated_against_the_models_own_turns(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    rows = chat_rows(tmp_path, 6)
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(rows), "input": "messages",
                                          "turns": "each", "chat_template_kwargs": {"thinking": True}}])
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(tmp_path / "out"), "--progress-interval", "30")
    assert done.returncode == 0, done.stderr
    records = jsonl(tmp_path / "out" / "chat" / "raw_responses.jsonl")
    prompts = by_key(jsonl(tmp_path / "out" / "chat" / "prompts.jsonl"))
    check_turns(records, 6)
    assert set(prompts) == {(r["sample_id"], r["turn"]) for r in records}
    tokenizer = load_tokenizer(EXAMPLES / "tokenizer")
    data = {row["sample_id"]: row for row in jsonl(rows)}
    replies = {(r["sample_id"], r["turn"]): r["output_ids"] for r in records}
    for (sample_id, turn), line in prompts.items():
        own = [replies[sample_id, k] for k in range(turn)]
        assert line["input_ids"] == expected_prompt(data[sample_id], own, tokenizer), (sample_id, turn)
    for record in records:  # the server counted the prompt it was sent
        assert record["prompt_tokens"] == len(prompts[record["sample_id"], record["turn"]]["input_ids"])


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    wait_until(lambda: lines_in(path) >= count or proc.poll() is not None, 300,
               f"{count} records in {path}")


@pytest.mark.parametrize("render", ["tokenizer", "server"])
def test_a_kill_mid_conversation_resumes_at_its_next_turn(
        tmp_path: Path, start_sim: Any, render: str) -> None:
    server = start_sim(speed=0.3)
    rows = chat_rows(tmp_path, 40, seed=9)
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(rows), "input": "messages",
                                          "turns": "each", "render": render}])
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest),
            "--server", server.url, "--out", str(out), "--concurrency", "8"]
    raw = out / "chat" / "raw_responses.jsonl"
    kept: dict[tuple[int, int], bytes] = {}
    midway = 0  # conversations a kill left between two turns
    for target in (15, 45):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_lines(raw, target, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finished = {(r["sample_id"], r["turn"]) for r in jsonl(raw)}
        last = {r["sample_id"]: r for r in sorted(jsonl(raw), key=lambda r: r["turn"])}
        midway += sum(1 for r in last.values() if r["turn"] < USERS - 1 and "ended" not in r)
        for line in (out / "chat" / "prompts.jsonl").read_bytes().splitlines(keepends=True):
            key = json.loads(line)
            if (key["sample_id"], key["turn"]) in finished:
                kept.setdefault((key["sample_id"], key["turn"]), line)
    assert 0 < len(finished) < 120 and midway > 0, "the kills should land mid-conversation"
    final = workbench(*argv[3:])
    assert final.returncode == 0, final.stderr
    records = jsonl(raw)
    check_turns(records, 40)
    after = {}
    for line in (out / "chat" / "prompts.jsonl").read_bytes().splitlines(keepends=True):
        key = json.loads(line)
        after[key["sample_id"], key["turn"]] = line
    assert set(after) == {(r["sample_id"], r["turn"]) for r in records}
    assert all(after[key] == line for key, line in kept.items())  # byte for byte
    tokenizer = load_tokenizer(EXAMPLES / "tokenizer")
    data = {row["sample_id"]: row for row in jsonl(rows)}
    replies = {(r["sample_id"], r["turn"]): r["output_ids"] for r in records}
    for (sample_id, turn), line in after.items():
        own = [replies[sample_id, k] for k in range(turn)]
        history = expected_history(data[sample_id], own, tokenizer)
        expected = (encode_messages(tokenizer, history, {}) if render == "tokenizer"
                    else server_prompt(server.url, history))
        assert json.loads(line)["input_ids"] == expected, (sample_id, turn)


@pytest.mark.parametrize("render", ["tokenizer", "server"])
def test_a_later_turn_edited_in_the_data_refuses_the_resume(
        tmp_path: Path, shared_sim: ServerProcess, render: str) -> None:
    rows = chat_rows(tmp_path, 4)
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(rows), "input": "messages",
                                          "turns": "each", "render": render}])
    argv = ["generate", "--datasets", str(manifest), "--server", shared_sim.url,
            "--out", str(tmp_path / "out"), "--progress-interval", "30"]
    assert workbench(*argv).returncode == 0
    prompts = (tmp_path / "out" / "chat" / "prompts.jsonl").read_bytes()
    if render == "server":  # the server's ids, with the digest of what it rendered them from
        assert all("history" in json.loads(line) for line in prompts.splitlines())
    assert workbench(*argv).returncode == 0  # nothing left: nothing rewritten
    assert (tmp_path / "out" / "chat" / "prompts.jsonl").read_bytes() == prompts
    records = jsonl(tmp_path / "out" / "chat" / "raw_responses.jsonl")
    sample_id = next(r["sample_id"] for r in records if r["turn"] == 2)
    data = jsonl(rows)
    data[sample_id]["messages"][3]["content"] = "the company sends a bad order"  # turn 1's user
    rows.write_text("".join(json.dumps(row) + "\n" for row in data))
    refused = workbench(*argv)
    assert refused.returncode == 2
    assert (f"dataset chat: 1 finished samples were sent another prompt than the manifest "
            f"builds now from {rows} (e.g. sample_id {sample_id}") in refused.stderr


def test_cut_turns_go_on_when_the_dataset_says_continue(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    rows = chat_rows(tmp_path, 5)
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(rows), "input": "messages",
                                          "turns": "each", "truncated": "continue",
                                          "sampling": {"max_new_tokens": 8}}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(out), "--progress-interval", "30")
    assert done.returncode == 0, done.stderr
    records = jsonl(out / "chat" / "raw_responses.jsonl")
    assert {r["finish_reason"] for r in records} == {"length"}  # every turn cut ...
    check_turns([{**r, "finish_reason": "stop"} for r in records], 5)  # ... and none ended
    checked = workbench("validate", str(out), "--json")
    findings = {f["rule"] for f in json.loads(checked.stdout)["datasets"]["chat"]["findings"]}
    assert "turn_prompt_mismatch" not in findings, checked.stdout[:2000]


def test_the_server_renders_the_last_turn_with_its_tools(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    rows = tool_turn_rows(tmp_path, 3)
    manifest = write_manifest(tmp_path, [
        {"name": "srv", "path": str(rows), "input": "messages", "render": "server"},
        {"name": "tok", "path": str(rows), "input": "messages"}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(out), "--progress-interval", "30")
    assert done.returncode == 0, done.stderr
    entries = json.loads((out / "run.json").read_text())["datasets"]
    assert entries["srv"]["rendering"]["follows"] == "server"
    assert entries["srv"]["rendering"]["compared"] == entries["srv"]["rendering"]["differ"] == 3
    assert entries["tok"]["rendering"] | {"example": None} == {
        "follows": "tokenizer", "compared": 1, "differ": 1, "example": None, "error": None}
    assert "[tok] the server renders prompts differently from the tokenizer's" in done.stdout
    assert "set render: server to follow the server's" in done.stdout
    data = {row["sample_id"]: row for row in jsonl(rows)}
    sent = {line["sample_id"]: line for line in jsonl(out / "srv" / "prompts.jsonl")}
    tokenizer_sent = {line["sample_id"]: line for line in jsonl(out / "tok" / "prompts.jsonl")}
    for record in jsonl(out / "srv" / "raw_responses.jsonl"):
        row = data[record["sample_id"]]
        history = last_turn_messages(parse_messages(row["messages"], row["tools"]))
        reply = httpx.post(f"{shared_sim.url}/v1/chat/completions", json={
            "messages": history, "tools": row["tools"], "max_tokens": 1,
            "return_prompt_token_ids": True}, timeout=60).json()
        line = sent[record["sample_id"]]
        assert line["input_ids"] == reply["choices"][0]["prompt_token_ids"]
        assert record["prompt_tokens"] == len(line["input_ids"]) and "history" in line
        assert line["input_ids"] != tokenizer_sent[record["sample_id"]]["input_ids"]


def test_a_token_budget_counts_every_turn(tmp_path: Path, shared_sim: ServerProcess) -> None:
    rows = chat_rows(tmp_path, 30)
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(rows), "input": "messages",
                                          "turns": "each", "max_tokens": 3000}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(out), "--concurrency", "4", "--progress-interval", "30")
    assert done.returncode == 0, done.stderr
    records = jsonl(out / "chat" / "raw_responses.jsonl")
    tokens = sum(r["completion_tokens"] for r in records)
    # stopped at the budget: under it by one reply at the cap (the default max_new_tokens,
    # 2048) at most, as the projection keeps room for one; over it by the turns in flight
    assert 3000 - 2048 <= tokens < 3000 + 4 * 256
    assert any(r["turn"] > 0 for r in records) and len(records) < 90
    assert f"{tokens} completion tokens, budget 3000 tokens" in done.stdout
    again = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                      "--out", str(out), "--progress-interval", "30")
    assert again.returncode == 0 and jsonl(out / "chat" / "raw_responses.jsonl") == records


def openai_only(request: httpx.Request) -> httpx.Response:
    """A server whose chat completions carry no token ids (another engine, an older SGLang)."""
    if request.url.path in ("/server_info", "/model_info"):
        return httpx.Response(200, json={"model_path": "other/model", "version": "x"})
    if request.url.path == "/v1/chat/completions":
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"},
             "finish_reason": "length"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}})
    return httpx.Response(404, json={"detail": "Not Found"})


@pytest.mark.anyio
async def test_render_server_refused_before_anything_is_written(tmp_path: Path) -> None:
    rows = tool_turn_rows(tmp_path, 2)
    manifest = write_manifest(tmp_path, [{"name": "srv", "path": str(rows), "input": "messages",
                                          "turns": "each", "render": "server"}])
    async with SGLangClient("http://mock", transport=httpx.MockTransport(openai_only)) as client:
        with pytest.raises(ConfigError) as refused:
            await run_generation(load_manifest(manifest), client, tmp_path / "out")
    line = next(n for n, text in enumerate(manifest.read_text().splitlines(), 1) if '"render"' in text)
    assert str(refused.value).startswith(
        f"{manifest}:{line}: datasets[0].render: server: the server does not give back the token ids "
        "of the chat prompts it renders (dataset srv): ")
    assert "(use render: tokenizer)" in str(refused.value)
    assert not (tmp_path / "out").exists()
