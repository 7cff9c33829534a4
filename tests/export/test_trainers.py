"""Exports for the drafter trainers: their rows, the manifest, length figures, and how a demo
run's rows fare when a trainer re-renders them through the example (Kimi-K2.5-like) template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, jsonl, workbench
from test_export import END, PROMPT, TE, export, plant, record

from workbench.errors import ConfigError
from workbench.export.exporter import format_summary
from workbench.export.trainers import row_digest
from workbench.tokenizer import load_tokenizer

THINK, IM_ASSISTANT = 163606, 163588
CHATS = ("B1_glaive", "B2_code")  # the demo's datasets with messages


def two_datasets(run: Path) -> None:
    plant(run, "a", [record(0), record(1, [7] * 30 + [END])], {0: PROMPT, 1: PROMPT})
    plant(run, "b", [record("x", [5, END])], {"x": [1] * 40})


def test_for_a_trainer_writes_its_two_fields_and_a_manifest(tmp_path: Path) -> None:
    two_datasets(tmp_path / "run")
    target = tmp_path / "train.jsonl"
    summary = export(tmp_path / "run", target, trainer="specforge")
    written = jsonl(target)
    assert [sorted(row) for row in written] == [["input_ids", "loss_mask"]] * 3
    assert written[1] == {"input_ids": [*PROMPT, *[7] * 30, END], "loss_mask": [0] * 4 + [1] * 31}
    manifest = json.loads((tmp_path / "train.jsonl.manifest.json").read_text())
    assert manifest["row_fields"] == ["id", "dataset", "prompt", "total", "digest"]
    assert manifest["rows"] == [
        ["a/0", "a", 4, 9, row_digest(written[0]["input_ids"])],
        ["a/1", "a", 4, 35, row_digest(written[1]["input_ids"])],
        ["b/x", "b", 40, 42, row_digest(written[2]["input_ids"])]]
    assert manifest["datasets"]["a"]["rows"] == 2 and manifest["model"]["model_profile"] == "kimi-k2.5"
    assert manifest["lengths"]["all"] == {"rows": 3, "p50": 35, "p90": 42, "p99": 42, "max": 42,
                                          "cut": 0, "dropped": 0}
    report = summary.trainer
    assert report.max_length == 256 and report.fits
    assert report.command.endswith(f"data.prompts_path={target} data.max_length=256")
    text = format_summary(summary)
    assert "train with: specforge train -c YOUR_CONFIG.yaml" in text and "none cut" in text


def test_a_given_max_length_counts_the_rows_it_cuts_and_drops(tmp_path: Path) -> None:
    two_datasets(tmp_path / "run")
    summary = export(tmp_path / "run", tmp_path / "t.jsonl", trainer="speculators", max_length=20)
    lengths = summary.trainer.lengths
    assert (lengths["a"].cut, lengths["a"].dropped) == (1, 0)
    assert (lengths["b"].cut, lengths["b"].dropped) == (1, 1)
    assert (lengths["all"].cut, lengths["all"].dropped) == (2, 1) and not summary.trainer.fits
    assert "--seq-length 20" in summary.trainer.command
    fitting = export(tmp_path / "run", tmp_path / "t.jsonl", trainer="specforge")
    assert fitting.trainer.at_default.cut == 0 and "default" not in format_summary(fitting)
    assert "b: 1 rows; 42/42/42/42; 1 rows cut, 1 of them left with no supervised token" in (
        format_summary(summary))


@pytest.mark.parametrize(("options", "message"), [
    ({"trainer": "axolotl"}, "--for: unknown trainer 'axolotl'"),
    ({"max_length": 100}, "--max-length: goes with --for"),
    ({"trainer": "specforge", "max_length": 0}, "--max-length: expected a number of at least 1"),
    ({"trainer": "specforge", "format": "conversations"}, "--format: --for specforge writes token rows"),
])
def test_bad_trainer_options(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    two_datasets(tmp_path / "run")
    with pytest.raises(ConfigError, match=message):
        export(tmp_path / "run", tmp_path / "t.jsonl", **options)
    assert not (tmp_path / "t.jsonl").exists()


def test_parquet_for_a_trainer_is_one_line_and_exit_2(tmp_path: Path) -> None:
    two_datasets(tmp_path / "run")
    done = workbench("export", str(tmp_path / "run"), "--to", str(tmp_path / "t.parquet"),
                     "--for", "speculators")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("workbench: error: --to: speculators's file loader reads JSON/JSONL "
                           "only, not Parquet: write t.jsonl\n")


# --- a demo run through the example template ---------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.demo import start_simulator

    folder = tmp_path_factory.mktemp("demo")
    server = start_simulator(folder / "sim.log", {"profile": "fast", "random_seed": 0,
                                                   "speed": 50.0})
    try:
        done = workbench("generate", "--datasets", str(EXAMPLES.parent / "params" /
                                                      "datasets.demo.yaml"),
                         "--server", server.url, "--out", str(folder / "run"))
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    return folder / "run"


def test_every_demo_row_round_trips_except_the_reasoning_the_template_drops(
    demo_run: Path, tmp_path: Path
) -> None:
    """Decode, re-render, re-encode every finished demo reply: the prompt and the reply's text
    come back exactly, and Kimi-K2.5's template renders the finished turn as history, an
    empty <think></think> and the answer: the reasoning is what is lost, nothing else."""
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    export(demo_run, tmp_path / "tokens.jsonl", only=CHATS)
    summary = export(demo_run, tmp_path / "conv.jsonl", format="conversations", only=CHATS)
    tokens = {row["id"]: row for row in jsonl(tmp_path / "tokens.jsonl")}
    conversations = jsonl(tmp_path / "conv.jsonl")
    truncated = sum(summary.datasets[name].dropped.get("truncated", 0) for name in summary.datasets)
    assert truncated > 0 and len(conversations) == len(tokens) - truncated
    for row in conversations:
        ids, mask = tokens[row["id"]]["input_ids"], tokens[row["id"]]["loss_mask"]
        prompt, output = ids[: mask.index(1)], ids[mask.index(1):]
        *messages, turn = row["conversations"]
        assert messages[0]["role"] == "system"  # the template's default one made explicit
        assert tok.encode(tok.apply_chat_template(messages, tokenize=False, thinking=True,
                                                  add_generation_prompt=True)) == prompt
        cut = output.index(TE)
        assert tok.encode(turn["reasoning_content"]) == output[:cut]
        assert tok.encode(turn["content"]) == output[cut + 1: -1]
        rendered = tok.encode(tok.apply_chat_template(row["conversations"], tokenize=False,
                                                      thinking=True))
        assert rendered == [*prompt, TE, *output[cut + 1:]] != ids
    assert all(ds.exact == 0 for ds in summary.datasets.values())


def test_conversations_leave_truncated_replies_out_unless_kept(demo_run: Path,
                                                               tmp_path: Path) -> None:
    kept = export(demo_run, tmp_path / "all.jsonl", format="conversations", keep_truncated=True,
                  only=CHATS)
    dropped = export(demo_run, tmp_path / "c.jsonl", format="conversations", only=CHATS)
    for name, ds in dropped.datasets.items():
        assert ds.written + ds.dropped.get("truncated", 0) == kept.datasets[name].written
    assert sum(ds.dropped.get("truncated", 0) for ds in dropped.datasets.values()) > 0
    assert "dropped: truncated " in format_summary(dropped)


def test_inline_reasoning_sits_between_the_models_think_tags(demo_run: Path,
                                                              tmp_path: Path) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    export(demo_run, tmp_path / "c.jsonl", format="conversations", reasoning="inline",
           only=("B2_code",))
    for row in jsonl(tmp_path / "c.jsonl"):
        turn = row["conversations"][-1]
        assert set(turn) == {"role", "content"}
        ids = tok.encode(turn["content"])
        assert ids[0] == THINK and ids.count(TE) == 1 and IM_ASSISTANT not in ids


def test_auto_carries_the_reasoning_the_way_the_template_gives_back(demo_run: Path,
                                                                    tmp_path: Path) -> None:
    """A template that renders a history turn's content as is (no empty think block): the
    reasoning inline between the think tags re-renders exactly, so `auto` picks it."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(EXAMPLES / "tokenizer", tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace(
        "<think></think>{{ message['content'] or '' }}", "{{ message['content'] or '' }}", 1)
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    auto = export(demo_run, tmp_path / "auto.jsonl", format="conversations", only=CHATS,
                  tokenizer=str(tokenizer))
    field = export(demo_run, tmp_path / "field.jsonl", format="conversations", only=CHATS,
                   tokenizer=str(tokenizer), reasoning="field")
    for name in CHATS:
        assert auto.datasets[name].exact == auto.datasets[name].written > 0
        assert field.datasets[name].exact == 0
    assert all(set(row["conversations"][-1]) == {"role", "content"}
               for row in jsonl(tmp_path / "auto.jsonl"))
    written = auto.datasets["B1_glaive"].written
    assert f"{written} of {written} re-render to the generated ids" in format_summary(auto)


def test_the_trainers_default_max_length_is_called_out_when_it_cuts(demo_run: Path,
                                                                    tmp_path: Path) -> None:
    summary = export(demo_run, tmp_path / "t.jsonl", trainer="specforge")
    longest = summary.trainer.lengths["all"].max
    assert longest > 2048 and summary.trainer.max_length >= longest
    at_default = summary.trainer.at_default
    cut = export(demo_run, tmp_path / "t.jsonl", trainer="specforge", max_length=2048)
    assert (at_default.cut, at_default.dropped) == (cut.trainer.lengths["all"].cut,
                                                    cut.trainer.lengths["all"].dropped)
    assert (f"specforge's default data.max_length 2,048 would cut {at_default.cut:,} rows and "
            f"drop {at_default.dropped:,} of them") in format_summary(summary)
