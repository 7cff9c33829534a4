"""Crash soak of conversations regenerated turn by turn: every (sample_id, turn) exactly once.

    python bench/soak_turns.py [--cycles 12] [--copies 4] [--seed 0] [--work DIR]

Against one faulty simulator (HTTP 500/503, dropped connections, aborts; tool calls for a
share of replies), the soak starts `workbench generate` on two `turns: each` datasets (the
example multi-turn function-calling conversations, copied --copies times with fresh ids, and
plain three-turn chats) and SIGKILLs it after a random number of new records, again and again,
resuming each time; the simulator restarts in the middle of some cycles. A final run goes to
completion. After every kill and at the end it checks:

- no (sample_id, turn) twice, no unreadable or partial record;
- the prompts.jsonl line of every finished turn is byte for byte the one the cycle before saw;
- at the end, every conversation's turns are 0..j-1 without a gap, and j is the turns its row
  asks for unless its last record says why it ended; every turn has its one prompt line;
- `workbench validate --strict` passes and `workbench stats --json` counts the records read.

Figures printed: cycles, kills that landed mid-conversation, turns written, conversations
ended early by reason, duplicates, lost (finished turns gone or changed), wall time. Target:
zero duplicated, zero lost. Exit status 0 when it is met.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.chat import generation_points, parse_messages
from workbench.resources import data_dir
from workbench.server.launch import ServerProcess, find_free_port, server_command

WORDS = ["the", "city", "sends", "a", "special", "service", "after", "that", "current", "order", "the", "company", "includes", "a", "bad", "team", "now"]


@dataclass
class Result:
    cycles: int = 0
    midway: int = 0  # kills that left a conversation between two turns
    turns: int = 0
    duplicates: int = 0
    lost: int = 0
    gaps: int = 0
    unfinished: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    final_returncode: int | None = None
    validate_returncode: int | None = None
    stats_records: int | None = None
    wall: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.duplicates == self.lost == self.gaps == self.unfinished == 0
                and self.final_returncode == 0 and self.validate_returncode == 0
                and self.stats_records == self.turns)


def write_job(work: Path, copies: int, seed: int) -> tuple[Path, dict[str, dict[Any, int]]]:
    """The two datasets and their manifest; the turns each conversation asks for."""
    rng = random.Random(seed)
    rows = [json.loads(line) for line in
            (data_dir("examples") / "data" / "tool_turns.jsonl").read_text().splitlines()]
    tools = [{**row, "sample_id": f"c{k}-{row['sample_id']}"} for k in range(copies) for row in rows]
    chats = []
    for i in range(len(tools) // 2):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "you are kind"}]
        for _ in range(3):
            messages += [{"role": "user", "content": " ".join(rng.choices(WORDS, k=15))},
                         {"role": "assistant", "content": "an answer"}]
        chats.append({"sample_id": i, "messages": messages})
    asks: dict[str, dict[Any, int]] = {}
    for name, data in (("tools", tools), ("chats", chats)):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
        asks[name] = {r["sample_id"]: generation_points(
            parse_messages(r["messages"], r.get("tools")), "each") for r in data}
    manifest = {"model_profile": "kimi-k2.5", "tokenizer": str(data_dir("examples") / "tokenizer"),
                "sampling": {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 512},
                "datasets": [{"name": n, "path": f"{n}.jsonl", "input": "messages",
                              "turns": "each", "chat_template_kwargs": {"thinking": True}}
                             for n in asks]}
    path = work / "datasets.yaml"
    path.write_text(json.dumps(manifest, indent=1))
    return path, asks


def records(out: Path, name: str) -> list[dict[str, Any]]:
    path = out / name / "raw_responses.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.endswith(b"}")]


def prompt_lines(out: Path, name: str) -> dict[tuple[Any, int], bytes]:
    path = out / name / "prompts.jsonl"
    lines: dict[tuple[Any, int], bytes] = {}
    for line in path.read_bytes().splitlines(keepends=True) if path.exists() else []:
        key = json.loads(line)
        lines.setdefault((key["sample_id"], key["turn"]), line)
    return lines


def check_cycle(out: Path, names: list[str], kept: dict[str, dict[tuple[Any, int], bytes]],
                result: Result) -> None:
    """After a kill: no duplicate turn, finished turns' prompt lines unchanged (kept grows)."""
    for name in names:
        keys = Counter((r["sample_id"], r["turn"]) for r in records(out, name))
        result.duplicates = max(result.duplicates, max(keys.values(), default=1) - 1)
        lines = prompt_lines(out, name)
        for key, line in kept[name].items():
            if lines.get(key) != line or key not in keys:
                result.lost += 1
        kept[name].update({key: lines[key] for key in keys if key in lines})
        last = {r["sample_id"]: r for r in sorted(records(out, name), key=lambda r: r["turn"])}
        result.midway += any("ended" not in r for r in last.values())


def check_end(out: Path, asks: dict[str, dict[Any, int]], result: Result) -> None:
    for name, wanted in asks.items():
        rows = records(out, name)
        lines = prompt_lines(out, name)
        by_id: dict[Any, list[dict[str, Any]]] = {}
        for row in rows:
            by_id.setdefault(row["sample_id"], []).append(row)
        result.turns += len(rows)
        for sample_id, points in wanted.items():
            turns = sorted(by_id.get(sample_id, []), key=lambda r: r["turn"])
            result.gaps += [r["turn"] for r in turns] != list(range(len(turns)))
            result.lost += sum((sample_id, r["turn"]) not in lines for r in turns)
            if turns and "ended" in turns[-1]:
                result.ended[turns[-1]["ended"]] += 1
            elif len(turns) != points:
                result.unfinished += 1


def run(args: argparse.Namespace, work: Path) -> Result:
    result = Result()
    rng = random.Random(args.seed)
    manifest, asks = write_job(work, args.copies, args.seed)
    port = find_free_port()
    sim_argv = server_command("sim", port=port, python=sys.executable, args={
        "profile": "fast", "speed": 0.5, "random_seed": args.seed, "fault_error_rate": 0.04,
        "fault_drop_rate": 0.03, "fault_abort_rate": 0.03, "fault_seed": args.seed})
    url = f"http://127.0.0.1:{port}"
    sim = ServerProcess(sim_argv, url=url, log_path=work / "sim.log")
    sim.start()
    sim.wait_ready(60)
    out = work / "out"
    argv = [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest),
            "--server", url, "--out", str(out), "--concurrency", "16", "--max-attempts", "8"]
    names = list(asks)
    kept: dict[str, dict[tuple[Any, int], bytes]] = {name: {} for name in names}
    start = time.perf_counter()
    try:
        for cycle in range(args.cycles):
            before = sum(len(records(out, n)) for n in names)
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            target = before + rng.randint(5, 60)
            while proc.poll() is None and sum(len(records(out, n)) for n in names) < target:
                time.sleep(0.05)
            if cycle % 4 == 2:
                sim.stop()
                sim.wait_port_free(port)
                sim = ServerProcess(sim_argv, url=url, log_path=work / "sim.log")
                sim.start()
                sim.wait_ready(60)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            result.cycles += 1
            check_cycle(out, names, kept, result)
        final = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        result.final_returncode = final.returncode
        check_cycle(out, names, kept, result)
        check_end(out, asks, result)
        validate = subprocess.run([sys.executable, "-m", "workbench", "validate", str(out),
                                   "--strict"], capture_output=True, text=True)
        result.validate_returncode = validate.returncode
        stats = subprocess.run([sys.executable, "-m", "workbench", "stats", str(out), "--json"],
                               capture_output=True, text=True)
        result.stats_records = sum(d["records"] for d in json.loads(stats.stdout)["datasets"].values())
    finally:
        sim.stop()
    result.wall = time.perf_counter() - start
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--copies", type=int, default=4, help="copies of the example conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        result = run(args, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="workbench-soak-turns-") as tmp:
            result = run(args, Path(tmp))
    print(f"cycles {result.cycles} (kills mid-conversation: {result.midway}), turns written "
          f"{result.turns}, stats counts {result.stats_records}")
    print(f"duplicated {result.duplicates}, lost {result.lost}, gaps {result.gaps}, unfinished "
          f"conversations {result.unfinished}")
    print(f"ended early: {dict(result.ended)}")
    print(f"final run exit {result.final_returncode}, validate --strict exit "
          f"{result.validate_returncode}; {result.wall:.0f}s")
    print("PASS" if result.ok else "MISS")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
