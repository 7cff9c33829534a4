"""Export on small planted runs: exact ids and masks, both formats, every filter, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import EXAMPLES, write_manifest

import workbench.export.sinks as sinks_module
from workbench.errors import ConfigError, DataError
from workbench.export.exporter import export_run, format_summary
from workbench.export.options import ExportOptions
from workbench.rundir.records import PromptRecord, Record, encode_line
from workbench.tokenizer import load_tokenizer

TS, TE, END = 163606, 163607, 163586
PROMPT = [163594, 101, 102, 163606]


def record(sid: Any, ids: list[int] | None = None, *, finish: str = "stop",
           completion: int | None = None, prompt_tokens: int = 4) -> Record:
    ids = [300, 301, TE, 302, END] if ids is None else ids
    return Record(sample_id=sid, output_ids=ids, prompt_tokens=prompt_tokens,
                  completion_tokens=len(ids) if completion is None else completion,
                  cached_tokens=0, finish_reason=finish, matched_stop=None,
                  e2e_latency=1.0, ts=1.75e9)


def plant(out: Path, name: str, records: list[Any], prompts: dict[Any, Any] | None,
          settings: dict[str, Any] | None = None, *, tail: bytes = b"", **run: Any) -> Path:
    """A run: records (Record, dict or bytes lines), prompts {sid: ids | text}, run.json."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    data = b"".join(r if isinstance(r, bytes) else encode_line(r) for r in records)
    (folder / "raw_responses.jsonl").write_bytes(data + tail)
    if prompts is not None:
        (folder / "prompts.jsonl").write_bytes(b"".join(
            encode_line(PromptRecord(sid, text=p) if isinstance(p, str) else PromptRecord(sid, p))
            for sid, p in prompts.items()))
    manifest_path = out / "run.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {
        "model_profile": "kimi-k2.5", "datasets": {}}
    manifest["datasets"][name] = settings or {"input": "input_ids"}
    manifest.update(run)
    manifest_path.write_text(json.dumps(manifest))
    return folder


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def export(out: Path, to: Path, **options: Any) -> Any:
    return export_run(out, to, ExportOptions(**options))


# --- tokens ----------------------------------------------------------------------------------


def test_tokens_exact_ids_and_mask(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ds", [record(7), record("b", [5, END])], {7: PROMPT, "b": [9]})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    assert rows(tmp_path / "out.jsonl") == [
        {"id": "ds/7", "dataset": "ds", "input_ids": [*PROMPT, 300, 301, TE, 302, END],
         "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1]},
        {"id": "ds/b", "dataset": "ds", "input_ids": [9, 5, END], "loss_mask": [0, 1, 1]}]
    assert summary.rows == 2 and summary.datasets["ds"].dropped == {}
    assert "wrote 2 tokens rows" in format_summary(summary)


def test_parquet_matches_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    monkeypatch.setattr(sinks_module, "ROW_GROUP_ROWS", 2)
    plant(tmp_path / "run", "ds", [record(i, [i + 10] * i + [END]) for i in range(5)],
          {i: PROMPT[: i + 1] for i in range(5)})
    assert "Parquet" not in format_summary(export(tmp_path / "run", tmp_path / "out.jsonl"))
    summary = export(tmp_path / "run", tmp_path / "out.parquet")
    assert format_summary(summary).endswith("note: SpecForge and speculators read JSON/JSONL "
                                            "only, not Parquet; for them export with --for "
                                            "specforge|speculators")
    parquet = pq.ParquetFile(tmp_path / "out.parquet")
    assert parquet.metadata.num_row_groups == 3
    assert str(parquet.schema_arrow.field("input_ids").type) == "list<element: int32>"
    assert parquet.read().to_pylist() == rows(tmp_path / "out.jsonl")


def test_prepended_prompt_suffix_is_trimmed(tmp_path: Path) -> None:
    suffixed = record(0, [102, TS, 300, TE, 302, END], completion=4)
    unrelated = record(1, [9, 9, 300, TE, 302, END], completion=4)
    plant(tmp_path / "run", "ds", [suffixed, unrelated], {0: PROMPT, 1: PROMPT})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    got = rows(tmp_path / "out.jsonl")
    assert got[0]["input_ids"] == [*PROMPT, 300, TE, 302, END]
    assert got[1]["input_ids"] == [*PROMPT, 9, 9, 300, TE, 302, END]
    assert summary.datasets["ds"].trimmed == 1


def test_resumed_run_with_torn_tail_duplicates_and_orphans(tmp_path: Path) -> None:
    recs = [record(0), record(1), record(1, [5, END]), b"\n", record(2), record(9)]
    plant(tmp_path / "run", "ds", recs, {i: PROMPT for i in range(4)},
          tail=b'{"sample_id": 3, "output_ids": [1')
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    assert [r["id"] for r in rows(tmp_path / "out.jsonl")] == ["ds/0", "ds/1", "ds/2"]
    assert rows(tmp_path / "out.jsonl")[1]["input_ids"][-3:] == [TE, 302, END]  # the first kept
    assert summary.datasets["ds"].dropped == {
        "duplicate_sample_id": 1, "orphan_response": 1, "torn_line": 1}


def test_legacy_layouts(tmp_path: Path) -> None:
    meta = {"sample_id": 0, "text": "x", "output_ids": [5, END],
            "meta_info": {"prompt_tokens": 4, "completion_tokens": 2,
                          "finish_reason": {"type": "stop", "matched": END}}}
    openai = {"custom_id": 1, "output_ids": [6, END],
              "response": {"body": {"usage": {"prompt_tokens": 4, "completion_tokens": 2},
                                    "choices": [{"finish_reason": "stop"}]}}}
    plant(tmp_path / "run", "ds", [meta, openai, {"sample_id": 2}], {0: [1], 1: [2], 2: [3]})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    assert [r["input_ids"] for r in rows(tmp_path / "out.jsonl")] == [[1, 5, END], [2, 6, END]]
    assert summary.datasets["ds"].dropped == {"missing_field": 1}


# --- filters ---------------------------------------------------------------------------------


def mixed_records() -> list[Record]:
    return [record(0), record(1, [300, 301], finish="length"), record(2, [300, 301, END]),
            record(3, [300, TE, END]), record(4), record(5, [300, TE, 1, END], finish="length")]


def test_drop_rules_in_order(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ds", mixed_records(), {i: PROMPT for i in range(6)})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl",
                     drop=("truncated", "reasoning_unclosed", "empty_answer"))
    assert [r["id"] for r in rows(tmp_path / "out.jsonl")] == ["ds/0", "ds/4"]
    assert summary.datasets["ds"].dropped == {
        "truncated": 2, "reasoning_unclosed": 1, "empty_answer": 1}
    summary = export(tmp_path / "run", tmp_path / "out.jsonl", drop=("empty_answer",))
    assert summary.rows == 5


def test_limit_in_file_order_counts_the_rest(tmp_path: Path) -> None:
    plant(tmp_path / "run", "a", mixed_records() + [b"junk\n"], {i: PROMPT for i in range(6)})
    plant(tmp_path / "run", "b", [record(0)], {0: PROMPT})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl", limit=2, drop=("truncated",))
    assert [r["id"] for r in rows(tmp_path / "out.jsonl")] == ["a/0", "a/2", "b/0"]
    assert summary.datasets["a"].dropped == {"truncated": 1, "limit": 3, "parse_error": 1}
    assert summary.datasets["b"].written == 1


def test_shuffle_is_seeded_and_limit_draws_per_dataset(tmp_path: Path) -> None:
    for name in ("a", "b"):
        plant(tmp_path / "run", name, [record(i) for i in range(20)], {i: PROMPT for i in range(20)})
    export(tmp_path / "run", tmp_path / "plain.jsonl")
    orders = []
    for seed in (1, 1, 2):
        export(tmp_path / "run", tmp_path / "out.jsonl", shuffle=True, seed=seed)
        orders.append([r["id"] for r in rows(tmp_path / "out.jsonl")])
    assert orders[0] == orders[1] != orders[2]
    assert sorted(orders[0]) == sorted(r["id"] for r in rows(tmp_path / "plain.jsonl"))
    assert rows(tmp_path / "out.jsonl")[0]["loss_mask"][:4] == [0, 0, 0, 0]
    summary = export(tmp_path / "run", tmp_path / "out.jsonl", shuffle=True, limit=5)
    ids = [r["id"] for r in rows(tmp_path / "out.jsonl")]
    assert sum(i.startswith("a/") for i in ids) == 5 and len(ids) == 10
    assert summary.datasets["a"].dropped == {"limit": 15}


def test_only_selects_datasets(tmp_path: Path) -> None:
    plant(tmp_path / "run", "a", [record(0)], {0: PROMPT})
    plant(tmp_path / "run", "b", [record(0)], {0: PROMPT})
    assert list(export(tmp_path / "run", tmp_path / "o.jsonl", only=("b",)).datasets) == ["b"]


# --- text prompts and conversations (the example tokenizer) ----------------------------------


def chat_run(tmp_path: Path, records: list[Record], **settings: Any) -> Path:
    source = tmp_path / "chat.jsonl"
    source.write_text("\n".join(json.dumps({"sample_id": i, "messages": [  # no final newline
        {"role": "user", "content": f"question {i}"}]}) for i in range(3)))
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(source),
                                          "input": "messages", **settings}])
    plant(tmp_path / "run", "chat", records, {i: PROMPT for i in range(3)},
          {"path": str(source), "input": "messages", **settings}, manifest_file=str(manifest))
    return tmp_path / "run"


def test_conversations_split_at_think_end(tmp_path: Path) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    run = chat_run(tmp_path, [record(2, [300, 301, TE, 302, 303, END]), record(0, [300, 301],
                                                                               finish="length")])
    export(run, tmp_path / "conv.jsonl", format="conversations", keep_truncated=True)
    first, second = rows(tmp_path / "conv.jsonl")
    assert first["id"] == "chat/2"
    assert first["conversations"] == [
        {"role": "user", "content": "question 2"},
        {"role": "assistant", "content": tok.decode([302, 303]),
         "reasoning_content": tok.decode([300, 301])}]
    assert second["conversations"][1] == {"role": "assistant", "content": "",
                                          "reasoning_content": tok.decode([300, 301])}


def test_conversations_with_thinking_off_are_all_content(tmp_path: Path) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    run = chat_run(tmp_path, [record(1, [300, 301, END])], chat_template_kwargs={"thinking": False})
    export(run, tmp_path / "conv.jsonl", format="conversations")
    assert rows(tmp_path / "conv.jsonl")[0]["conversations"][1] == {
        "role": "assistant", "content": tok.decode([300, 301]), "reasoning_content": ""}


def test_conversations_carry_tools_only_when_the_prompt_was_rendered_with_them(
    tmp_path: Path
) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [{"role": "system", "content": "you are kimi"}, {"role": "user", "content": "weather"}]
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps({"sample_id": i, "messages": messages, "tools": tools})
                              + "\n" for i in range(2)))
    seen = [list(tok.encode(tok.apply_chat_template(messages, tools=t, tokenize=False,
                                                     add_generation_prompt=True)))
            for t in (tools, None)]
    manifest = write_manifest(tmp_path, [{"name": "chat", "path": str(source),
                                          "input": "messages"}])
    plant(tmp_path / "run", "chat", [record(0), record(1)], {0: seen[0], 1: seen[1]},
          {"path": str(source), "input": "messages"}, manifest_file=str(manifest))
    export(tmp_path / "run", tmp_path / "conv.jsonl", format="conversations")
    with_tools, without = rows(tmp_path / "conv.jsonl")
    assert with_tools["tools"] == tools and "tools" not in without


def test_text_prompts_are_tokenized(tmp_path: Path) -> None:
    tok = load_tokenizer(EXAMPLES / "tokenizer")
    text = "write a function that returns the answer"
    ids = list(tok.encode(text))
    manifest = write_manifest(tmp_path, [{"name": "t", "path": str(EXAMPLES / "data/texts.jsonl"),
                                          "input": "text"}])
    plant(tmp_path / "run", "t", [record(0, prompt_tokens=len(ids)), record(1, prompt_tokens=99)],
          {0: text, 1: text}, {"input": "text"}, manifest_file=str(manifest))
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    assert rows(tmp_path / "out.jsonl")[0]["input_ids"] == [*ids, 300, 301, TE, 302, END]
    assert summary.datasets["t"].dropped == {"prompt_tokens_mismatch": 1}


def test_text_prompts_need_a_tokenizer(tmp_path: Path) -> None:
    plant(tmp_path / "run", "t", [record(0)], {0: "hello"}, {"input": "text"})
    with pytest.raises(ConfigError, match="tokenizer: dataset t: run.json names no manifest_file"):
        export(tmp_path / "run", tmp_path / "out.jsonl")
    summary = export(tmp_path / "run", tmp_path / "out.jsonl", tokenizer=str(EXAMPLES / "tokenizer"))
    assert summary.datasets["t"].dropped == {"prompt_tokens_mismatch": 1}


def test_conversations_bad_input(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ids", [record(0)], {0: PROMPT})
    with pytest.raises(ConfigError, match="dataset ids has input 'input_ids'"):
        export(tmp_path / "run", tmp_path / "c.jsonl", format="conversations")
    source = tmp_path / "chat.jsonl"
    source.write_text(json.dumps({"sample_id": 0, "messages": []}) + "\n")
    plant(tmp_path / "run", "chat", [record(0)], {0: PROMPT}, {"path": str(source), "input": "messages"})
    with pytest.raises(ConfigError, match="tokenizer: dataset chat: run.json names no manifest_file"):
        export(tmp_path / "run", tmp_path / "c.jsonl", format="conversations", only=("chat",))
    with pytest.raises(ConfigError, match="--to: the conversations format writes JSONL"):
        export(tmp_path / "run", tmp_path / "c.parquet", format="conversations")


# --- bad input -------------------------------------------------------------------------------


def test_run_without_prompts(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ds", [record(0)], None)
    with pytest.raises(DataError, match=r"ds/prompts.jsonl: not found: the export needs"):
        export(tmp_path / "run", tmp_path / "out.jsonl")
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]


def test_failure_leaves_the_old_file_whole(tmp_path: Path) -> None:
    folder = plant(tmp_path / "run", "ds", [record(0), record(1)], {0: PROMPT})
    with (folder / "prompts.jsonl").open("ab") as fh:
        fh.write(b'{"sample_id": 1}\n')
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:2: prompt has neither input_ids nor text"):
        export(tmp_path / "run", target)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "run"]


def test_bad_prompt_lines_name_the_line(tmp_path: Path) -> None:
    folder = plant(tmp_path / "run", "ds", [record(0)], {0: PROMPT})
    with (folder / "prompts.jsonl").open("ab") as fh:
        fh.write(encode_line(PromptRecord(0, [1])) + b"{broken\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:2: duplicate sample_id 0"):
        export(tmp_path / "run", tmp_path / "out.jsonl")


@pytest.mark.parametrize(("options", "message"), [
    ({"drop": ("nope",)}, "--drop: unknown rule 'nope'"),
    ({"limit": 0}, "--limit: expected a number of at least 1"),
    ({"format": "chatml"}, "--format: unknown format 'chatml'"),
    ({"only": ("zz",)}, "--only: unknown dataset 'zz'"),
])
def test_bad_options(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    plant(tmp_path / "run", "ds", [record(0)], {0: PROMPT})
    with pytest.raises(ConfigError, match=message):
        export(tmp_path / "run", tmp_path / "out.jsonl", **options)


def test_bad_targets(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ds", [record(0)], {0: PROMPT})
    with pytest.raises(ConfigError, match="--to: unknown file type '.txt'"):
        export(tmp_path / "run", tmp_path / "out.txt")
    with pytest.raises(ConfigError, match="--to: directory not found"):
        export(tmp_path / "run", tmp_path / "no" / "out.jsonl")
    with pytest.raises(DataError, match=r"nothing: not a run directory \(no such directory\)"):
        export(tmp_path / "nothing", tmp_path / "out.jsonl")


def test_summary_is_json_ready(tmp_path: Path) -> None:
    plant(tmp_path / "run", "ds", [record(0)], {0: PROMPT})
    summary = export(tmp_path / "run", tmp_path / "out.jsonl")
    data = json.loads(msgspec.json.encode(summary.to_builtins()))
    assert data["datasets"]["ds"] == {"written": 1, "dropped": {}, "trimmed": 0, "exact": None}
    assert data["trainer"] is None
