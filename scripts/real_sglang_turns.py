"""The `turns` step of scripts/real_sglang_check.py: conversations regenerated turn by turn on
a real SGLang, killed and resumed, each turn's prompt held against the rendering it follows.

Two `turns: each` datasets of the same rows (the example multi-turn function-calling
conversations, tools declared, and three-turn plain chats): `tok` renders each turn with the
tokenizer's chat template (`render: tokenizer`, ids to /generate), `srv` lets the server render
it (`render: server`, /v1/chat/completions with return_token_ids). The run is SIGKILLed once
it has written a few records and resumed to the end. Checked:

- every (sample_id, turn) once, each conversation's turns without a gap, complete or ended
  with a reason; the prompts.jsonl lines of the turns finished before the kill unchanged;
- `tok`: each turn's prompt ids are the tokenizer's rendering of its history (the data's
  messages with the model's own earlier turns, rebuilt from the records), and the server
  counted them (prompt_tokens);
- `srv`: each turn's prompt ids are what SGLang renders for that history (asked again,
  /v1/chat/completions with return_prompt_token_ids, one token);
- run.json's `rendering` of each dataset: with tools, the two renderings differ (SGLang
  0.5.23 adds "defer_loading": null to each tool), and generate said so;
- modes: both datasets mix `think` and `direct` (thinking on and off) half and half; each
  conversation keeps one mode on every turn, the mix is exact within one conversation, and
  each turn's prompt above is rendered with its own mode's template arguments (SGLang is sent
  them as `chat_template_kwargs`).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from workbench.chat import (
    ChatRow,
    Reply,
    counted_finishes,
    next_turn,
    parse_messages,
    parse_reply,
)
from workbench.profiles import get_profile
from workbench.resources import data_dir
from workbench.tokenizer import decode, encode_messages, load_tokenizer

__all__ = ["step_turns"]

DATASETS = {"tok": "tokenizer", "srv": "server"}
MODES = {"think": {"thinking": True}, "direct": {"thinking": False}}


def write_job(folder: Path, model: Path, rows: int, max_new_tokens: int) -> Path:
    """The conversations (tool rows and plain chats) and a manifest of the two datasets."""
    folder.mkdir(parents=True, exist_ok=True)
    source = (data_dir("examples") / "data" / "tool_turns.jsonl").read_text().splitlines()
    data = [json.loads(line) for line in source[:rows]]
    for i in range(rows // 2):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "you are kind"}]
        for k in range(3):
            messages += [{"role": "user", "content": f"tell me about the city number {i + k}"},
                         {"role": "assistant", "content": "an answer"}]
        data.append({"sample_id": f"chat-{i}", "messages": messages})
    (folder / "turns.jsonl").write_text("".join(json.dumps(row) + "\n" for row in data))
    modes = ", ".join(f"{{name: {name}, chat_template_kwargs: {json.dumps(kwargs)}}}"
                      for name, kwargs in MODES.items())
    datasets = "".join(
        f"  - {{name: {name}, path: turns.jsonl, input: messages, turns: each, render: {how},"
        f" truncated: continue, modes: [{modes}]}}\n"
        for name, how in DATASETS.items())
    manifest = folder / "datasets.yaml"
    manifest.write_text("# written by scripts/real_sglang_turns.py\nmodel_profile: kimi-k2.5\n"
                        f"tokenizer: {model.resolve()}\n"
                        f"sampling: {{temperature: 0.0, top_p: 1.0, top_k: -1, "
                        f"max_new_tokens: {max_new_tokens}}}\nconcurrency: 8\n"
                        f"datasets:\n{datasets}")
    return manifest


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]


def prompt_lines(run: Path, name: str) -> dict[tuple[Any, int], bytes]:
    path = run / name / "prompts.jsonl"
    found: dict[tuple[Any, int], bytes] = {}
    for line in path.read_bytes().splitlines(keepends=True) if path.exists() else []:
        key = json.loads(line)
        found.setdefault((key["sample_id"], key["turn"]), line)
    return found


def histories(rows: dict[Any, ChatRow], records: list[dict[str, Any]],
              tokenizer: Any) -> dict[tuple[Any, int], list[dict[str, Any]]]:
    """Each recorded turn's history, rebuilt from the data and the records before it."""
    profile = get_profile("kimi-k2.5")
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for record in records:
        by_id.setdefault(record["sample_id"], []).append(record)
    found: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for sample_id, turns in by_id.items():
        turns.sort(key=lambda r: r["turn"])
        replies: list[Reply] = []
        for record in turns:
            finishes = counted_finishes([r["finish_reason"] for r in turns[:len(replies)]],
                                        "continue")  # the manifest's truncated: continue
            history = next_turn(rows[sample_id], replies, finish_reasons=finishes)
            if isinstance(history, list):
                found[sample_id, record["turn"]] = history
            replies.append(parse_reply(record["output_ids"], profile,
                                       lambda ids: decode(tokenizer, ids)))
    return found


def server_prompt(url: str, history: list[dict[str, Any]], tools: Any,
                  kwargs: dict[str, Any]) -> list[int]:
    body: dict[str, Any] = {"messages": history, "max_tokens": 1, "temperature": 0.0,
                            "return_prompt_token_ids": True, "chat_template_kwargs": kwargs}
    if tools is not None:
        body["tools"] = tools
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    ids: list[int] = reply.json()["choices"][0]["prompt_token_ids"]
    return ids


def check_keys(kit: ModuleType, checks: Any, run: Path) -> None:
    for name in DATASETS:
        records = jsonl(run / name / "raw_responses.jsonl")
        keys = [(r["sample_id"], r["turn"]) for r in records]
        by_id: dict[Any, list[dict[str, Any]]] = {}
        for record in records:
            by_id.setdefault(record["sample_id"], []).append(record)
        gaps = sum(sorted(r["turn"] for r in turns) != list(range(len(turns)))
                   for turns in by_id.values())
        ended: dict[str, int] = {}
        for turns in by_id.values():
            last = max(turns, key=lambda r: r["turn"])
            if "ended" in last:
                ended[last["ended"]] = ended.get(last["ended"], 0) + 1
        checks.add(f"{name}_turns", len(keys) == len(set(keys)) and gaps == 0 and keys,
                   f"{len(keys)} turns of {len(by_id)} conversations, {len(keys) - len(set(keys))}"
                   f" repeated, {gaps} with a gap; ended early {ended}",
                   turns=len(keys), conversations=len(by_id), ended=ended)


def check_prompts(kit: ModuleType, checks: Any, run: Path, data: Path, url: str,
                  model: Path) -> None:
    tokenizer = load_tokenizer(model)
    raw = {json.loads(line)["sample_id"]: json.loads(line) for line in data.read_text().splitlines()}
    rows = {sid: parse_messages(row["messages"], row.get("tools")) for sid, row in raw.items()}
    for name, how in DATASETS.items():
        records = jsonl(run / name / "raw_responses.jsonl")
        sent = {key: json.loads(line)["input_ids"] for key, line in prompt_lines(run, name).items()}
        built = histories(rows, records, tokenizer)
        wrong, counted = [], 0
        for record in records:
            key = (record["sample_id"], record["turn"])
            history = built[key]
            tools = rows[key[0]].tools
            kwargs = MODES[record["mode"]]
            expected = (encode_messages(tokenizer, history, kwargs, tools=tools)
                        if how == "tokenizer" else server_prompt(url, history, tools, kwargs))
            if sent.get(key) != expected:
                wrong.append(key)
            counted += record["prompt_tokens"] == len(sent.get(key, []))
        checks.add(f"{name}_prompts", not wrong and counted == len(records),
                   f"{len(records) - len(wrong)}/{len(records)} turn prompts are the {how}'s "
                   f"rendering of their history, {counted} counted alike by the server"
                   + (f"; first wrong {wrong[0]}" if wrong else ""),
                   checked=len(records), wrong=len(wrong))


def check_modes(kit: ModuleType, checks: Any, run: Path) -> None:
    for name in DATASETS:
        records = jsonl(run / name / "raw_responses.jsonl")
        drawn: dict[Any, set[str]] = {}
        for record in records:
            drawn.setdefault(record["sample_id"], set()).add(record.get("mode", "none"))
        mixed = sum(len(modes) > 1 for modes in drawn.values())
        counts = {mode: sum(modes == {mode} for modes in drawn.values()) for mode in MODES}
        even = abs(counts["think"] - counts["direct"]) <= 1
        checks.add(f"{name}_modes", records and mixed == 0 and even,
                   f"conversations per mode {counts} (weights 1:1), {mixed} with turns in two "
                   "modes", **counts)


def check_rendering(kit: ModuleType, checks: Any, run: Path, log: str) -> None:
    entries = json.loads((run / "run.json").read_text())["datasets"]
    for name in DATASETS:
        rendering = entries[name].get("rendering") or {}
        checks.add(f"{name}_rendering", rendering.get("differ", 0) > 0
                   and "renders prompts differently" in log,
                   f"run.json rendering {rendering}", **rendering)


def step_turns(ctx: Any, checks: Any, kit: ModuleType) -> None:
    """The step (module docstring); `kit` is real_sglang_check (its server and helpers)."""
    folder = ctx.out / "turns"
    manifest = write_job(folder, ctx.model, ctx.args.turn_rows, ctx.max_new_tokens)
    run = kit.fresh_run(folder)
    with kit.sglang_server(ctx, "turns", 20000) as server:
        args = ["generate", "--datasets", str(manifest), "--server", server.url, "--out", str(run)]
        proc = kit.start_workbench(ctx, args, "turns-generate.log")
        raw = [run / name / "raw_responses.jsonl" for name in DATASETS]
        while proc.poll() is None and sum(len(jsonl(p)) for p in raw) < ctx.args.turn_kill_at:
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = {name: prompt_lines(run, name) for name in DATASETS}
        done = {name: {(r["sample_id"], r["turn"]) for r in jsonl(run / name / "raw_responses.jsonl")}
                for name in DATASETS}
        kit.say(f"killed after {sum(len(d) for d in done.values())} turns; resuming")
        result = kit.run_workbench(ctx, args, "turns-resume.log")
        checks.add("resumed", result.returncode == 0, f"resume exit {result.returncode}")
        after = {name: prompt_lines(run, name) for name in DATASETS}
        changed = sum(after[n].get(k) != before[n].get(k) for n in DATASETS for k in done[n])
        checks.add("kept", changed == 0 and any(done.values()),
                   f"{sum(len(d) for d in done.values())} turns finished before the kill, "
                   f"{changed} of their prompt lines changed by the resume")
        check_keys(kit, checks, run)
        check_modes(kit, checks, run)
        check_prompts(kit, checks, run, folder / "turns.jsonl", server.url, ctx.model)
        log = (ctx.logs / "turns-generate.log").read_text() + result.stdout + result.stderr
        check_rendering(kit, checks, run, log)
