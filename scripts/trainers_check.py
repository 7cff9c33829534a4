#!/usr/bin/env python3
"""Load a demo run's exports with the trainers' own loaders (SpecForge, vLLM speculators).

    make trainers-check            # both steps; the trainers live in their own venv
    python scripts/trainers_check.py export OUT    # workbench venv: demo run + exports
    python scripts/trainers_check.py load OUT      # trainers venv: their loaders, compared

`export` runs the demo's generation on the simulator into OUT/run and writes, with the
workbench command, OUT/tokens.jsonl, OUT/specforge.jsonl and OUT/speculators.jsonl (`--for`,
with a max_length that fits), OUT/specforge-2048.jsonl (`--for specforge --max-length 2048`,
SpecForge's default) and OUT/conversations.jsonl; and of the conversations regenerated turn by
turn (B4_tool_turns) OUT/specforge-turns.jsonl, OUT/speculators-turns.jsonl (one row per
turn, naming its conversation and turn) and OUT/conversations-turns.jsonl (each conversation
with every regenerated turn); each command's output is kept in OUT/*.txt.

`load` imports only the trainers (no workbench) and checks against OUT/tokens.jsonl, the exact
reference (the ids the server saw and produced, by row id):

  - SpecForge `prepare_prompt_tasks` on tokens.jsonl, specforge.jsonl (its manifest's max_length)
    and specforge-2048.jsonl (rows kept and cut as that export's manifest counts them);
  - speculators `prepare-data` then `ArrowDataset` on tokens.jsonl and speculators.jsonl (rows
    come back shuffled; they are matched by the digest the manifest keeps);
  - conversations.jsonl through SpecForge's `kimi-k2-thinking` template path and through
    speculators' per-turn renderer, with vLLM's render endpoint replaced by the same chat
    template applied locally (no vLLM here);
  - the turn rows through both loaders (exact, by (id, turn) and by digest), and the
    conversations with every regenerated turn through both template paths (info).

It prints one line per check with rows exact of rows expected and exits 1 if a check that
must be exact is not.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CHATS = "B1_glaive,B2_code"
TURNS = "B4_tool_turns"  # the demo's conversations regenerated turn by turn
Row = tuple[tuple[int, ...], tuple[int, ...]]
Key = tuple[str, int | None]  # a row's conversation id and turn (None: a single-turn row)


# ----------------------------------------------------------------------------- export step


def run_export(out: Path) -> None:
    """Generate the demo run on the simulator and write every export (workbench venv)."""
    from workbench.demo import start_simulator

    out.mkdir(parents=True, exist_ok=True)
    # A run already there is resumed: only what the demo manifest added or changed since is
    # generated (--force: what it changed is sent again, the records it replaces moved aside).
    server = start_simulator(out / "sim.log", {"profile": "fast", "random_seed": 0,
                                                "speed": 50.0})
    try:
        workbench(out / "generate.txt", "generate", "--datasets",
                  str(ROOT / "params" / "datasets.demo.yaml"), "--server", server.url,
                  "--out", str(out / "run"), "--force")
    finally:
        server.stop()
    run = str(out / "run")
    workbench(out / "tokens.txt", "export", run, "--to", str(out / "tokens.jsonl"))
    for trainer in ("specforge", "speculators"):
        workbench(out / f"{trainer}.txt", "export", run, "--to", str(out / f"{trainer}.jsonl"),
                  "--for", trainer)
    workbench(out / "specforge-2048.txt", "export", run, "--to",
              str(out / "specforge-2048.jsonl"), "--for", "specforge", "--max-length", "2048")
    workbench(out / "conversations.txt", "export", run, "--to",
              str(out / "conversations.jsonl"), "--format", "conversations", "--only", CHATS)
    for trainer in ("specforge", "speculators"):  # every row a turn: each names id and turn
        workbench(out / f"{trainer}-turns.txt", "export", run, "--to",
                  str(out / f"{trainer}-turns.jsonl"), "--for", trainer, "--only", TURNS)
    workbench(out / "conversations-turns.txt", "export", run, "--to",
              str(out / "conversations-turns.jsonl"), "--format", "conversations",
              "--only", TURNS)


def workbench(log: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, check=False)
    log.write_text(done.stdout + done.stderr)
    print(f"$ workbench {' '.join(args)}\n{done.stdout}{done.stderr}", end="")
    if done.returncode:
        raise SystemExit(f"workbench {args[0]} failed with exit code {done.returncode}")


# ------------------------------------------------------------------------------- load step


def digest(ids: Sequence[int]) -> str:
    """The manifest's row digest (workbench.export.trainers.row_digest)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=8).hexdigest()


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reference(out: Path) -> dict[Key, Row]:
    """(id, turn) -> (input_ids, loss_mask) of the exact tokens export."""
    return {(row["id"], row.get("turn")): (tuple(row["input_ids"]), tuple(row["loss_mask"]))
            for row in jsonl(out / "tokens.jsonl")}


def manifest_key(row: list[Any], fields: list[str]) -> Key:
    """A manifest row's (id, turn)."""
    return row[0], row[fields.index("turn")] if "turn" in fields else None


def manifest(path: Path) -> dict[str, Any]:
    return json.loads(path.with_name(path.name + ".manifest.json").read_text())


class Report:
    """Result lines, printed at the end (the trainers' own output goes to OUT/load.log)."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.lines: list[str] = []

    def line(self, name: str, exact: int, expected: int, *, must: bool = True,
             note: str = "", what: str = "rows exact") -> None:
        ok = exact == expected
        if must and not ok:
            self.failed.append(name)
        mark = "ok  " if ok else ("FAIL" if must else "info")
        self.lines.append(f"{mark} {name}: {exact} of {expected} {what}{note}")


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 (Python's and the native libraries' output) into log."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "ab") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def specforge_rows(path: Path, max_length: int, tokenizer: Any = None, **options: Any
                   ) -> list[Row]:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    settings = {"chat_template": None, "is_preformatted": False, "train_only_last_turn": False,
                "cache_dir": None, "cache_key": None, "num_proc": None, **options}
    tasks = prepare_prompt_tasks(path, tokenizer, max_length=max_length, **settings)
    return [(tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks]


def check_specforge(out: Path, ref: dict[Key, Row], report: Report) -> None:
    tokens = jsonl(out / "tokens.jsonl")
    got = specforge_rows(out / "tokens.jsonl", 1 << 20)
    want = [(tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in tokens]
    report.line("specforge prepare_prompt_tasks tokens.jsonl", same(got, want), len(want))
    for name in ("specforge", "specforge-2048"):
        path = out / f"{name}.jsonl"
        facts = manifest(path)
        length = facts["max_length"]
        got = specforge_rows(path, length)
        kept = [row for row in facts["rows"] if row[2] < length]
        want = [tuple(part[:length] for part in ref[manifest_key(row, facts["row_fields"])])
                for row in kept]
        dropped = len(facts["rows"]) - len(got)
        cut = dropped + sum(row[3] > length for row in kept)  # every row over max_length
        figures = facts["lengths"]["all"]
        note = (f" (max_length {length}: {cut} rows cut, {dropped} of them dropped; the "
                f"export printed {figures['cut']} cut, {figures['dropped']} dropped)")
        report.line(f"specforge prepare_prompt_tasks {path.name}", same(got, want), len(want),
                    note=note)
        if (cut, dropped) != (figures["cut"], figures["dropped"]):
            report.failed.append(f"{name} cut/dropped counts")


def same(got: Sequence[Row], want: Sequence[Row]) -> int:
    """Rows equal position by position (a length mismatch counts as missing rows)."""
    return sum(a == b for a, b in zip(got, want)) if len(got) == len(want) else 0


def speculators_rows(out: Path, path: Path, seq_length: int, *,
                     render: Callable[..., list[int]] | None = None) -> list[Row]:
    """`speculators prepare-data` on path, read back with ArrowDataset's own loading."""
    target = out / f"{path.stem}.prepared"
    if render is None:
        command = [str(Path(sys.executable).with_name("speculators")), "prepare-data",
                   "--model", str(EXAMPLES / "tokenizer"), "--data", str(path),
                   "--output", str(target), "--seq-length", str(seq_length), "--overwrite"]
        subprocess.run(command, check=True, capture_output=True, text=True)
    else:
        prepare_with_local_render(path, target, seq_length, render)
    from speculators.train.data import ArrowDataset

    data = ArrowDataset(seq_length, target, on_missing="skip").data
    return [(tuple(row["input_ids"]), tuple(row["loss_mask"])) for row in data]


def prepare_with_local_render(path: Path, target: Path, seq_length: int,
                              render: Callable[..., list[int]]) -> None:
    """prepare-data's own preprocessing, its vLLM render call replaced by `render`."""
    from speculators.data_generation import preprocessing

    preprocessing.render_conversation = render
    dataset, _ = preprocessing.load_and_preprocess_dataset(
        str(EXAMPLES / "tokenizer"), [str(path)], seq_length=seq_length,
        build_dataset_num_proc=1, render_endpoint="local-template")
    dataset.save_to_disk(str(target))


def check_speculators(out: Path, ref: dict[Key, Row], report: Report) -> None:
    by_digest = {digest(ids): (ids, mask) for ids, mask in ref.values()}
    for path in (out / "tokens.jsonl", out / "speculators.jsonl"):
        length = manifest(out / "speculators.jsonl")["max_length"]
        got = speculators_rows(out, path, length)
        exact = sum(by_digest.get(digest(ids)) == (ids, mask) for ids, mask in got)
        report.line(f"speculators prepare-data + ArrowDataset {path.name}", exact, len(ref),
                    note=f" ({len(got)} rows loaded, seq_length {length})")


def local_render() -> Callable[..., list[int]]:
    """What vLLM's /v1/chat/completions/render returns, from the tokenizer's own template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(EXAMPLES / "tokenizer"))

    def render(endpoint: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None, truncate_prompt_tokens: int | None = None,
               **_: Any) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[:truncate_prompt_tokens] if truncate_prompt_tokens else ids

    return render


def check_conversations(out: Path, ref: dict[Key, Row], report: Report) -> None:
    from transformers import AutoTokenizer

    path = out / "conversations.jsonl"
    rows = jsonl(path)
    want = {ref[row["id"], None] for row in rows}
    tokenizer = AutoTokenizer.from_pretrained(str(EXAMPLES / "tokenizer"))
    got = specforge_rows(path, 1 << 16, tokenizer=tokenizer, chat_template="kimi-k2-thinking",
                         cache_dir=str(out / "specforge-cache"), cache_key="conversations",
                         num_proc=1)
    report.line("specforge kimi-k2-thinking conversations.jsonl",
                sum(row in want for row in got), len(rows), must=False,
                note=f" ({len(got)} rows loaded)")
    got = speculators_rows(out, path, 1 << 16, render=local_render())
    report.line("speculators prepare-data (local render) conversations.jsonl",
                sum(row in want for row in got), len(rows), must=False,
                note=f" ({len(got)} rows loaded)")


def check_turns(out: Path, ref: dict[Key, Row], report: Report) -> None:
    """The rows of the conversations regenerated turn by turn, each naming its conversation
    and turn, through both trainers' loaders; and the conversations with every regenerated
    turn through their chat-template paths (info: a template re-renders history its own way)."""
    turns = {key: row for key, row in ref.items() if key[1] is not None}
    path = out / "specforge-turns.jsonl"
    facts = manifest(path)
    named = sum((row["id"], row["turn"]) in turns for row in jsonl(path))
    got = specforge_rows(path, facts["max_length"])
    want = [ref[manifest_key(row, facts["row_fields"])] for row in facts["rows"]]
    report.line(f"specforge prepare_prompt_tasks {path.name}", same(got, want), len(turns),
                note=f" ({named} rows name their conversation and turn; fields {facts['fields']})")
    path = out / "speculators-turns.jsonl"
    length = manifest(path)["max_length"]
    by_digest = {digest(ids): (ids, mask) for ids, mask in turns.values()}
    got = speculators_rows(out, path, length)
    exact = sum(by_digest.get(digest(ids)) == (ids, mask) for ids, mask in got)
    report.line(f"speculators prepare-data + ArrowDataset {path.name}", exact, len(turns),
                note=f" ({len(got)} rows loaded, seq_length {length})")
    path = out / "conversations-turns.jsonl"
    rows = jsonl(path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(EXAMPLES / "tokenizer"))
    loaded = specforge_rows(path, 1 << 16, tokenizer=tokenizer, chat_template="kimi-k2-thinking",
                            cache_dir=str(out / "specforge-cache"), cache_key="turns", num_proc=1)
    report.line("specforge kimi-k2-thinking conversations-turns.jsonl", len(loaded), len(rows),
                must=False, what="conversations loaded", note=" (every regenerated turn in each)")
    log = out / "load.log"

    def refused() -> int:
        return sum("Failed to process conversation" in line and "BoundaryUnstable" in line
                   for line in log.read_text().splitlines())

    before = refused()
    loaded = speculators_rows(out, path, 1 << 16, render=local_render())
    unstable = refused() - before
    report.line("speculators prepare-data (local render) conversations-turns.jsonl", len(loaded),
                len(rows), must=False, what="conversations loaded",
                note=f" ({unstable} refused by speculators with BoundaryUnstableError: the "
                     "template drops finished turns' reasoning, so a turn's prompt is no prefix "
                     "of the whole conversation; speculators-turns.jsonl carries those turns)")


def run_load(out: Path) -> int:
    ref = reference(out)
    report = Report()
    with output_to(out / "load.log"):
        check_specforge(out, ref, report)
        check_speculators(out, ref, report)
        check_conversations(out, ref, report)
        check_turns(out, ref, report)
    print("\n".join(report.lines))
    if report.failed:
        print(f"FAILED: {', '.join(report.failed)}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check exports with the trainers' loaders.")
    parser.add_argument("step", choices=("export", "load"))
    parser.add_argument("out", type=Path, help="working folder (a demo run and its exports)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.step == "export":
        run_export(args.out)
        return 0
    return run_load(args.out)


if __name__ == "__main__":
    sys.exit(main())
