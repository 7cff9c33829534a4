"""Datasets regenerated turn by turn in the reports, on a small hand-made run: the
conversation frames agree with `workbench stats`, the figures draw them, a run without such a
dataset says so, and the records' turn stands beside their sample id (examples, explorer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest

from workbench.analyze import explore
from workbench.analyze.scan import scan_run
from workbench.analyze.stats import collect_stats
from workbench.report import plots
from workbench.report.explorer import Explorer
from workbench.rundir.records import PromptRecord, Record, encode_line

IM_END = 163586
T0 = 1_750_000_000.0
SCRIPT = "<script>window.__pwned=1</script>"

# conversation -> (completion tokens of each turn, why it ended after its last one)
CONVERSATIONS: dict[Any, tuple[list[int], str | None]] = {
    "c0": ([10, 20, 30], None),
    "c1": ([40], "no_call"),
    "c2": ([50, 60], "more_calls"),
    "c3": ([70], "no_call"),
    SCRIPT: ([5, 6, 7], "truncated"),
}


def _turn_record(sid: Any, turn: int, tokens: int, ended: str | None, ts: float) -> Record:
    record = Record(sample_id=sid, output_ids=[9] * (tokens - 1) + [IM_END], prompt_tokens=20,
                    completion_tokens=tokens, cached_tokens=0, finish_reason="stop",
                    matched_stop=IM_END, e2e_latency=1.0, ts=ts, turn=turn)
    if ended is not None:
        record.ended = ended
    return record


def write_turns_run(out: Path) -> Path:
    """"tools" (turns: each, CONVERSATIONS, the same sample id twice as a duplicate prompt)
    and "single" (one reply per prompt)."""
    tools, prompts, ts = [], [], T0
    for sid, (tokens, ended) in CONVERSATIONS.items():
        for turn, count in enumerate(tokens):
            last = turn == len(tokens) - 1
            tools.append(_turn_record(sid, turn, count, ended if last else None, ts))
            prompts.append(PromptRecord(sample_id=sid, input_ids=[1, 2, 3, turn], turn=turn))
            ts += 1
    single = [Record(sample_id=i, output_ids=[9, IM_END], prompt_tokens=5, completion_tokens=2,
                     cached_tokens=0, finish_reason="stop", matched_stop=IM_END, e2e_latency=1.0,
                     ts=T0 + i) for i in range(3)]
    files = {"tools": (tools, prompts),
             "single": (single, [PromptRecord(sample_id=i, input_ids=[4, 5]) for i in range(3)])}
    for name, (records, sent) in files.items():
        folder = out / name
        folder.mkdir(parents=True)
        (folder / "raw_responses.jsonl").write_bytes(b"".join(encode_line(r) for r in records))
        (folder / "prompts.jsonl").write_bytes(b"".join(encode_line(p) for p in sent))
    datasets = {"tools": {"prompts": 5, "turns": "each", "target_turns": len(tools),
                          "sampling": {"max_new_tokens": 64}},
                "single": {"prompts": 3, "turns": "last", "sampling": {"max_new_tokens": 64}}}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "created": T0,
                                              "updated": T0 + 30, "datasets": datasets}))
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_turns_run(tmp_path / "out")


def test_the_conversation_frames_count_as_stats_does(run: Path) -> None:
    conversations = explore.conversation_frames(run)
    stats = collect_stats(run).datasets["tools"].turns
    assert stats is not None and conversations.turn_datasets == ("tools",)
    assert list(conversations.summary["dataset"].cat.categories) == ["tools", "single"]  # colours
    summary = conversations.summary.iloc[0]
    assert (summary["conversations"], summary["turns"], summary["max_turns"]) == (
        stats.conversations, stats.turns, stats.max_turns) == (5, 10, 3)
    assert summary["mean_turns"] == pytest.approx(stats.mean_turns)
    assert summary["ended_early"] == sum(stats.ended.values()) == 4
    per = conversations.per_conversation
    assert dict(zip(per["turns"], per["conversations"], strict=True)) == {1: 2, 2: 1, 3: 2}
    by_turn = conversations.turn_tokens
    assert [(t, r, c) for t, r, c in zip(by_turn["turn"], by_turn["records"],
                                         by_turn["completion_tokens"], strict=True)] == list(stats.by_turn)
    first = by_turn.iloc[0]  # turn 0: 10, 40, 50, 70, 5
    assert (first["min"], first["median"], first["max"], first["mean"]) == (5, 40, 70, 35)
    ended = conversations.ended
    assert dict(zip(ended["reason"], ended["conversations"], strict=True)) == dict(stats.ended)
    assert ended["reason"].iloc[0] == "no_call"  # the most frequent first
    assert ended.set_index("reason").loc["no_call", "share"] == pytest.approx(2 / 5)
    assert "no tool" in ended.set_index("reason").loc["no_call", "meaning"]


def test_the_figures_draw_the_frames(run: Path) -> None:
    conversations = explore.conversation_frames(scan_run(run))
    hist = plots.turns_per_conversation_figure(conversations.per_conversation)
    assert isinstance(hist, go.Figure) and [t.name for t in hist.data] == ["tools"]
    assert list(hist.data[0].x) == [1, 2, 3] and list(hist.data[0].y) == pytest.approx([40, 20, 40])
    boxes = plots.turn_tokens_figure(conversations.turn_tokens)
    box = boxes.data[0]
    assert box.type == "box" and list(box.x) == ["turn 0", "turn 1", "turn 2"]
    assert list(box.median) == [40, 20, 18.5] and list(box.upperfence) == [70, 60, 30]
    ended = plots.ended_figure(conversations.ended, turn_datasets=conversations.turn_datasets)
    bar = ended.data[0]
    assert list(bar.y) == ["no_call", "more_calls", "truncated"] and list(bar.x) == [2, 1, 1]
    assert bar.text[0] == "2 (40.0%)" and "no tool" in bar.customdata[0]
    view = plots.conversations_view(conversations)
    assert view.data["turn_datasets"] == ["tools"] and view.data["summary"][0]["conversations"] == 5
    assert "turns per conversation" in view.html


def test_a_run_without_turns_says_so(run: Path) -> None:
    for name in ("tools",):
        (run / name / "raw_responses.jsonl").unlink()
        (run / name / "prompts.jsonl").unlink()
        (run / name).rmdir()
    manifest = json.loads((run / "run.json").read_text())
    del manifest["datasets"]["tools"]
    (run / "run.json").write_text(json.dumps(manifest))
    conversations = explore.conversation_frames(run)
    assert conversations.empty and conversations.summary.empty
    view = plots.conversations_view(conversations)
    assert plots.NO_TURNS in view.html and view.data["turn_datasets"] == []
    for fig in (plots.turns_per_conversation_figure(conversations.per_conversation),
                plots.turn_tokens_figure(conversations.turn_tokens),
                plots.ended_figure(conversations.ended, turn_datasets=conversations.turn_datasets)):
        assert isinstance(fig, go.Figure) and not fig.data
        assert "turns: each" in fig.layout.annotations[0].text


def test_examples_name_the_turn_beside_the_sample_id(run: Path) -> None:
    scan = scan_run(run)
    examples = explore.examples_table(scan)
    columns = list(examples.columns)
    assert columns[columns.index("sample_id") + 1] == "turn"
    tools = examples[examples["dataset"] == "tools"]
    assert not tools.empty and tools["turn"].notna().all()
    assert examples[examples["dataset"] == "single"]["turn"].isna().all()
    html = plots.examples_view(examples).html
    assert "<th>sample_id</th><th>turn</th>" in html and SCRIPT not in html  # escaped


def test_the_explorer_names_a_records_turn(run: Path) -> None:
    app = Explorer(run, interactive=False)
    columns = list(app.records.columns)
    assert columns[columns.index("sample_id") + 1] == "turn"
    line = int(app.records[(app.records["dataset"] == "tools") & (app.records["turn"] == 2)]["line"].iloc[0])
    assert app.turn_of("tools", line) == 2 and app.turn_of("single", 1) is None
    app.open("tools", line)
    assert " · turn 2" in app.viewer_content().html
    hover = [str(text) for trace in app.scatter().data if trace.hovertext is not None
             for text in trace.hovertext]
    assert any(" · turn 2<br>" in text for text in hover)
    assert not any("turn" in text for text in hover if text.startswith("sample 0<"))
