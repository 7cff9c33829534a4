"""Export of datasets that mix modes: each row carries its record's mode, --only-mode keeps
some modes, the filters and the conversations follow each record's mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, generate_run, jsonl, tool_turn_rows, workbench, write_manifest
from test_export import END, PROMPT, TE, export, plant, record, rows

from workbench.errors import ConfigError
from workbench.export.exporter import format_summary
from workbench.rundir.records import Record
from workbench.server.launch import ServerProcess
from workbench.tokenizer import load_tokenizer

TS = 163606
MODES = [{"name": "think", "weight": 3, "chat_template_kwargs": {"thinking": True},
          "sampling": {}},
         {"name": "direct", "weight": 1, "chat_template_kwargs": {"thinking": False},
          "sampling": {}}]
ANSWER = [201, 202, END]


def moded(sid: Any, ids: list[int] | None, mode: str) -> Record:
    found = record(sid, ids)
    found.mode = mode
    return found


def two_datasets(run: Path) -> Path:
    """"ds" mixes modes (think: samples 0 and 2, direct: sample 1), "plain" does not."""
    plant(run, "ds", [moded(0, None, "think"), moded(1, ANSWER, "direct"),
                      moded(2, None, "think")], {i: PROMPT for i in range(3)},
          {"input": "input_ids", "modes": MODES})
    plant(run, "plain", [record(0)], {0: PROMPT})
    return run


# --- rows --------------------------------------------------------------------------------------


def test_tokens_rows_carry_their_mode(tmp_path: Path) -> None:
    summary = export(two_datasets(tmp_path / "run"), tmp_path / "out.jsonl")
    got = rows(tmp_path / "out.jsonl")
    assert [(row["id"], row.get("mode")) for row in got] == [
        ("ds/0", "think"), ("ds/1", "direct"), ("ds/2", "think"), ("plain/0", None)]
    assert list(got[1]) == ["id", "dataset", "mode", "input_ids", "loss_mask"]
    assert list(got[3]) == ["id", "dataset", "input_ids", "loss_mask"]
    assert got[1]["input_ids"] == [*PROMPT, *ANSWER]
    assert summary.datasets["ds"].modes == {"think": 2, "direct": 1}
    assert "  ds: 3 written (direct 1, think 2); dropped: none" in format_summary(summary)
    data = summary.to_builtins()["datasets"]
    assert data["ds"]["modes"] == {"think": 2, "direct": 1} and "modes" not in data["plain"]


def test_parquet_has_a_mode_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run = two_datasets(tmp_path / "run")
    export(run, tmp_path / "out.jsonl")
    export(run, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "dataset", "mode", "input_ids", "loss_mask"]
    assert table.to_pylist() == [{"mode": None, **row} for row in rows(tmp_path / "out.jsonl")]


def test_only_mode_keeps_the_rows_of_that_mode(tmp_path: Path) -> None:
    run = two_datasets(tmp_path / "run")
    summary = export(run, tmp_path / "out.jsonl", only_mode=("direct",))
    assert [(row["id"], row["mode"]) for row in rows(tmp_path / "out.jsonl")] == [
        ("ds/1", "direct")]
    assert summary.datasets["ds"].dropped == {"other_mode": 2}
    assert summary.datasets["plain"].dropped == {"other_mode": 1}  # no mode: not kept
    both = export(run, tmp_path / "both.jsonl", only_mode=("think", "direct"), only=("ds",))
    assert both.rows == 3 and both.datasets["ds"].dropped == {}


def test_only_mode_with_limit_and_shuffle(tmp_path: Path) -> None:
    run = two_datasets(tmp_path / "run")
    summary = export(run, tmp_path / "out.jsonl", only_mode=("think",), limit=1, shuffle=True,
                     only=("ds",))
    [row] = rows(tmp_path / "out.jsonl")
    assert row["mode"] == "think"
    assert summary.datasets["ds"].dropped == {"other_mode": 1, "limit": 1}


def test_an_unknown_mode_is_one_line_naming_the_known(tmp_path: Path) -> None:
    run = two_datasets(tmp_path / "run")
    with pytest.raises(ConfigError) as caught:
        export(run, tmp_path / "out.jsonl", only_mode=("think", "nope"))
    assert str(caught.value) == "--only-mode: unknown mode 'nope' (known: think, direct)"
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(ConfigError, match=r"--only-mode: unknown mode 'think' \(known: none: "
                                          r"no dataset exported mixes modes\)"):
        export(run, tmp_path / "out.jsonl", only_mode=("think",), only=("plain",))


def test_the_cli_flag_repeats_or_takes_a_list(tmp_path: Path) -> None:
    run = two_datasets(tmp_path / "run")
    done = workbench("export", str(run), "--to", str(tmp_path / "a.jsonl"), "--only-mode",
                     "think", "--only-mode", "direct", "--only", "ds")
    assert done.returncode == 0, done.stderr
    assert len(rows(tmp_path / "a.jsonl")) == 3 and "(direct 1, think 2)" in done.stdout
    done = workbench("export", str(run), "--to", str(tmp_path / "b.jsonl"), "--only-mode",
                     "direct,think", "--only", "ds")
    assert done.returncode == 0 and len(rows(tmp_path / "b.jsonl")) == 3
    done = workbench("export", str(run), "--to", str(tmp_path / "c.jsonl"), "--only-mode", "x")
    assert done.returncode == 2 and done.stderr == (
        "workbench: error: --only-mode: unknown mode 'x' (known: think, direct)\n")


# --- trainers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_a_trainers_rows_name_the_mode_when_every_row_has_one(tmp_path: Path,
                                                              trainer: str) -> None:
    run = two_datasets(tmp_path / "run")
    export(run, tmp_path / "all.jsonl", trainer=trainer, only=("ds",))
    got = rows(tmp_path / "all.jsonl")
    assert all(list(row) == ["mode", "input_ids", "loss_mask"] for row in got)
    assert [row["mode"] for row in got] == ["think", "direct", "think"]
    manifest = json.loads((tmp_path / "all.jsonl.manifest.json").read_text())
    assert manifest["fields"] == ["mode", "input_ids", "loss_mask"]
    assert manifest["row_fields"] == ["id", "dataset", "prompt", "total", "digest", "mode"]
    assert [row[-1] for row in manifest["rows"]] == ["think", "direct", "think"]
    assert manifest["datasets"]["ds"]["rows_by_mode"] == {"think": 2, "direct": 1}
    assert [m["name"] for m in manifest["datasets"]["ds"]["modes"]] == ["think", "direct"]


def test_a_trainers_rows_of_a_mixed_run_keep_the_mode_in_the_manifest(tmp_path: Path) -> None:
    run = two_datasets(tmp_path / "run")
    export(run, tmp_path / "mixed.jsonl", trainer="speculators")
    assert all(list(row) == ["input_ids", "loss_mask"] for row in rows(tmp_path / "mixed.jsonl"))
    manifest = json.loads((tmp_path / "mixed.jsonl.manifest.json").read_text())
    assert manifest["fields"] == ["input_ids", "loss_mask"]
    assert [row[-1] for row in manifest["rows"]] == ["think", "direct", "think", None]
    assert "modes" not in manifest["datasets"]["plain"]
    export(run, tmp_path / "kept.jsonl", trainer="speculators", only_mode=("think",))
    kept = rows(tmp_path / "kept.jsonl")  # every row kept has a mode
    assert [list(row) for row in kept] == [["mode", "input_ids", "loss_mask"]] * 2


# --- filters and conversations follow the mode -------------------------------------------------


def test_the_drop_rules_follow_each_records_mode(tmp_path: Path) -> None:
    records = [moded(0, None, "think"), moded(1, [7, 8, END], "think"),
               moded(2, ANSWER, "direct"), moded(3, [7, TE, 8, END], "direct")]
    plant(tmp_path / "run", "ds", records, {i: PROMPT for i in range(4)},
          {"input": "input_ids", "modes": MODES})
    summary = export(tmp_path / "run", tmp_path / "a.jsonl", drop=("reasoning_unclosed",))
    assert [row["id"] for row in rows(tmp_path / "a.jsonl")] == ["ds/0", "ds/2", "ds/3"]
    assert summary.datasets["ds"].dropped == {"reasoning_unclosed": 1}
    summary = export(tmp_path / "run", tmp_path / "b.jsonl", drop=("mode_mismatch",))
    assert [row["id"] for row in rows(tmp_path / "b.jsonl")] == ["ds/0", "ds/2"]
    assert summary.datasets["ds"].dropped == {"mode_mismatch": 2}


def test_conversations_split_and_render_with_each_records_mode(tmp_path: Path) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    source = tmp_path / "chat.jsonl"
    messages = {i: [{"role": "user", "content": f"question {i}"}] for i in range(2)}
    source.write_text("".join(json.dumps({"sample_id": i, "messages": m}) + "\n"
                              for i, m in messages.items()))

    def sent(i: int, thinking: bool) -> list[int]:
        return list(tok.encode(tok.apply_chat_template(
            messages[i], tokenize=False, add_generation_prompt=True, thinking=thinking)))

    answer, thought = list(tok.encode("hello there")), list(tok.encode("some recent order"))
    settings = {"path": str(source), "input": "messages", "modes": MODES}
    manifest = write_manifest(tmp_path, [{"name": "chat", **settings}])
    plant(tmp_path / "run", "chat", [moded(0, [*thought, TE, *answer, END], "think"),
                                     moded(1, [*answer, END], "direct")],
          {0: sent(0, True), 1: sent(1, False)}, settings, manifest_file=str(manifest))
    summary = export(tmp_path / "run", tmp_path / "conv.jsonl", format="conversations")
    think, direct = rows(tmp_path / "conv.jsonl")
    assert (think["mode"], direct["mode"]) == ("think", "direct")
    assert list(direct) == ["id", "dataset", "mode", "conversations"]
    assert think["conversations"][-1] == {"role": "assistant", "content": "hello there",
                                          "reasoning_content": "some recent order"}
    assert direct["conversations"][-1] == {"role": "assistant", "content": "hello there",
                                           "reasoning_content": ""}
    # the system prompt the template put in, found with each mode's own arguments
    assert [m["role"] for m in direct["conversations"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in think["conversations"]] == ["system", "user", "assistant"]
    assert summary.datasets["chat"].modes == {"think": 1, "direct": 1}


# --- a run made on the simulator ---------------------------------------------------------------


@pytest.mark.integration
def test_conversations_regenerated_turn_by_turn_keep_their_mode(
        tmp_path: Path, shared_sim: ServerProcess) -> None:
    rows_file = tool_turn_rows(tmp_path, 16)
    modes = [{"name": "on", "chat_template_kwargs": {"thinking": True}},
             {"name": "off", "chat_template_kwargs": {"thinking": False}}]
    out = generate_run(tmp_path, [{"name": "t", "path": str(rows_file), "input": "messages",
                                   "turns": "each", "modes": modes}], shared_sim)
    drawn = {r["sample_id"]: r["mode"] for r in jsonl(out / "t" / "raw_responses.jsonl")}
    summary = export(out, tmp_path / "conv.jsonl", format="conversations")
    got = rows(tmp_path / "conv.jsonl")
    assert len(got) > 8 and all(row["mode"] == drawn[row["id"].split("/", 1)[1]] for row in got)
    assert all(list(row)[:4] == ["id", "turns", "dataset", "mode"] for row in got)
    off = [row for row in got if row["mode"] == "off"]
    assert off and all(m.get("reasoning_content", "") == "" for row in off
                       for m in row["conversations"] if m["role"] == "assistant")
    assert sum(summary.datasets["t"].modes.values()) == len(got)
    export(out, tmp_path / "tokens.jsonl", only_mode=("off",))
    assert {row["mode"] for row in rows(tmp_path / "tokens.jsonl")} == {"off"}
