"""Stats on a run whose datasets mix modes (`modes`): the mix asked for (run.json's weights as
shares) against the mix written (records per mode; conversations per mode in a `turns: each`
dataset), and each mode's completion tokens, counted exactly as the files hold them; a dataset
without modes reads as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_record

from workbench.analyze.stats import StatsCollector, collect_stats
from workbench.analyze.stats_text import format_stats_table, render_stats
from workbench.rundir.records import Record, encode_line

NOW = 1_750_000_000.0
END = 163586
THINK = {"name": "think", "weight": 0.75, "chat_template_kwargs": {"thinking": True},
         "sampling": None}
DIRECT = {"name": "direct", "weight": 0.25, "chat_template_kwargs": {"thinking": False},
          "sampling": {"temperature": 0.6}}
# "mixed": sample id -> (mode, completion tokens); 6 think, 2 direct
MIXED = {0: ("think", 10), 1: ("think", 20), 2: ("direct", 5), 3: ("think", 30),
         4: ("think", 40), 5: ("direct", 7), 6: ("think", 50), 7: ("think", 61)}
# "conv" (turns: each): conversation -> (mode, completion tokens of each turn)
CONV = {0: ("thinking=true", [11, 12, 13]), 1: ("thinking=true", [14]),
        2: ("thinking=false", [3, 4]), 3: ("thinking=true", [15, 16])}
SAMPLE = "/deploy/requests.jsonl"


def record(sid: int, tokens: int, mode: str | None, turn: int | None = None) -> Record:
    return make_record(sid, [9] * (tokens - 1) + [END], mode=mode, turn=turn, prompt_tokens=4,
                       ts=NOW - 10)


def mixed_records() -> list[Record]:
    return [record(sid, tokens, mode) for sid, (mode, tokens) in MIXED.items()]


def conv_records() -> list[Record]:
    return [record(sid, tokens, mode, turn) for sid, (mode, turns) in CONV.items()
            for turn, tokens in enumerate(turns)]


def write_raw(folder: Path, records: list[Record]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))


def plant(out: Path) -> Path:
    """"mixed" (think 0.75 / direct 0.25, single replies), "conv" (turns: each, modes from a
    deployment sample of 3 thinking and 1 non-thinking requests) and "plain" (no modes)."""
    write_raw(out / "mixed", mixed_records())
    write_raw(out / "conv", conv_records())
    write_raw(out / "plain", [record(i, 8, None) for i in range(3)])
    deployment = [{"name": "thinking=true", "weight": 3, "chat_template_kwargs": {"thinking": True},
                   "sampling": None},
                  {"name": "thinking=false", "weight": 1,
                   "chat_template_kwargs": {"thinking": False}, "sampling": None}]
    datasets: dict[str, Any] = {
        "mixed": {"prompts": 8, "modes": [THINK, DIRECT], "modes_source": None},
        "conv": {"prompts": 4, "turns": "each", "modes": deployment, "modes_source": SAMPLE},
        "plain": {"prompts": 3, "modes": None, "modes_source": None},
    }
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                              "datasets": datasets}))
    return out


def by_mode(stats: Any, name: str) -> dict[str | None, Any]:
    modes = stats.datasets[name].modes
    assert modes is not None
    return {mode.name: mode for mode in modes.modes}


# --- the figures -----------------------------------------------------------------------------


def test_records_per_mode_against_the_weights(tmp_path: Path) -> None:
    stats = collect_stats(plant(tmp_path / "run"), now=NOW)
    mixed = stats.datasets["mixed"].modes
    assert mixed is not None and (mixed.source, mixed.unit) == (None, "records")
    think, direct = mixed.modes
    assert (think.name, think.wanted, think.records, think.written) == ("think", 0.75, 6, 0.75)
    assert (direct.name, direct.wanted, direct.records, direct.written) == ("direct", 0.25, 2, 0.25)
    assert think.conversations is None and direct.conversations is None
    assert (think.completion_tokens, think.counted, think.median_completion_tokens) == (211, 6, 30)
    assert think.mean_completion_tokens == pytest.approx(211 / 6)
    assert (direct.completion_tokens, direct.mean_completion_tokens,
            direct.median_completion_tokens) == (12, 6.0, 5)


def test_a_turns_dataset_counts_conversations_and_records_per_mode(tmp_path: Path) -> None:
    stats = collect_stats(plant(tmp_path / "run"), now=NOW)
    conv = stats.datasets["conv"].modes
    assert conv is not None and (conv.source, conv.unit) == (SAMPLE, "conversations")
    modes = by_mode(stats, "conv")
    on, off = modes["thinking=true"], modes["thinking=false"]
    assert (on.conversations, on.records, on.completion_tokens) == (3, 6, 81)
    assert (off.conversations, off.records, off.completion_tokens) == (1, 2, 7)
    assert (on.wanted, on.written, on.record_share) == (0.75, 0.75, 0.75)
    assert (off.wanted, off.written, off.record_share) == (0.25, 0.25, 0.25)
    assert (on.median_completion_tokens, off.median_completion_tokens) == (13, 3)


def test_the_json_carries_the_mix_and_the_tokens_per_mode(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    shown = json.loads(render_stats(run, as_json=True, now=NOW))["datasets"]
    assert shown["mixed"]["modes"] == {"source": None, "written_of": "records", "by_mode": [
        {"mode": "think", "wanted_share": 0.75, "records": 6, "record_share": 0.75,
         "conversations": None, "conversation_share": None, "completion_tokens": 211,
         "mean_completion_tokens": 35.167, "median_completion_tokens": 30},
        {"mode": "direct", "wanted_share": 0.25, "records": 2, "record_share": 0.25,
         "conversations": None, "conversation_share": None, "completion_tokens": 12,
         "mean_completion_tokens": 6.0, "median_completion_tokens": 5}]}
    conv = shown["conv"]["modes"]
    assert conv["source"] == SAMPLE and conv["written_of"] == "conversations"
    assert [(m["mode"], m["conversations"], m["conversation_share"], m["records"])
            for m in conv["by_mode"]] == [("thinking=true", 3, 0.75, 6),
                                          ("thinking=false", 1, 0.25, 2)]
    assert "modes" not in shown["plain"] and "modes" not in json.loads(
        render_stats(run, as_json=True, now=NOW))["total"]


def test_the_text_shows_each_mixing_dataset_and_names_the_sample(tmp_path: Path) -> None:
    text = format_stats_table(collect_stats(plant(tmp_path / "run"), now=NOW))
    lines = text.splitlines()
    head = lines.index("mixed: modes, wanted against written (share of records)")
    assert [line.split() for line in lines[head + 1: head + 4]] == [
        ["mode", "wanted", "written", "records", "completion", "tok", "avg", "p50"],
        ["think", "75.0%", "75.0%", "6", "211", "35", "30"],
        ["direct", "25.0%", "25.0%", "2", "12", "6", "5"]]
    head = lines.index("conv: modes, wanted against written (share of conversations), taken "
                       f"from the deployment sample {SAMPLE}")
    assert [line.split() for line in lines[head + 1: head + 4]] == [
        ["mode", "wanted", "written", "conversations", "records", "completion", "tok", "avg", "p50"],
        ["thinking=true", "75.0%", "75.0%", "3", "6", "81", "14", "13"],
        ["thinking=false", "25.0%", "25.0%", "1", "2", "7", "4", "3"]]
    assert not any(line.startswith("plain: modes") for line in lines)


def test_a_dataset_without_modes_reads_as_before(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    alone = tmp_path / "alone"
    write_raw(alone / "plain", [record(i, 8, None) for i in range(3)])
    (alone / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": {
        "plain": {"prompts": 3}}}))

    def figures(out: Path) -> dict[str, Any]:
        shown = collect_stats(out, now=NOW).datasets["plain"].to_dict()
        return {k: v for k, v in shown.items() if k != "last_write"}

    assert figures(alone) == figures(run)
    assert collect_stats(alone, now=NOW).datasets["plain"].modes is None
    assert "modes" not in render_stats(alone, now=NOW)


# --- while the run is written, and edge cases ------------------------------------------------


def test_counting_as_the_file_grows_equals_a_fresh_count(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    raw = run / "mixed" / "raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    raw.write_bytes(b"".join(lines[:3]) + lines[3][:20])  # a torn line being written
    collector = StatsCollector(run)
    early = by_mode(collector.refresh(NOW), "mixed")
    assert (early["think"].records, early["direct"].records) == (2, 1)
    assert early["think"].written == pytest.approx(2 / 3)
    with raw.open("ab") as handle:
        handle.write(lines[3][20:] + b"".join(lines[4:]))
    grown = collector.refresh(NOW).datasets["mixed"].modes
    assert grown == collect_stats(run, now=NOW).datasets["mixed"].modes
    assert [(m.name, m.records) for m in grown.modes] == [("think", 6), ("direct", 2)]


def test_a_mixing_dataset_before_its_first_record_lists_its_modes(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    (run / "mixed" / "raw_responses.jsonl").write_bytes(b"")
    modes = by_mode(collect_stats(run, now=NOW), "mixed")
    assert [(m.wanted, m.records, m.written, m.median_completion_tokens)
            for m in modes.values()] == [(0.75, 0, None, None), (0.25, 0, None, None)]


def test_records_without_a_mode_or_with_an_unknown_one_are_counted_apart(tmp_path: Path) -> None:
    run = plant(tmp_path / "run")
    extra = [record(20, 9, None), record(21, 100, "other")]
    write_raw(run / "mixed", [*extra[:1], *mixed_records(), *extra[1:]])
    modes = by_mode(collect_stats(run, now=NOW), "mixed")
    assert list(modes) == ["think", "direct", "other", None]
    assert (modes["other"].wanted, modes["other"].records) == (None, 1)
    assert (modes[None].records, modes[None].completion_tokens) == (1, 9)
    assert modes["think"].written == pytest.approx(6 / 10)
    assert "(no mode)" in format_stats_table(collect_stats(run, now=NOW))


def test_records_that_name_modes_run_json_does_not_still_count(tmp_path: Path) -> None:
    """A run.json without `modes` (older, or edited): the records' modes are the mix, the
    records before the first one that names a mode counted without one."""
    out = tmp_path / "run"
    write_raw(out / "mixed", [record(20, 9, None), *mixed_records()])
    (out / "run.json").write_text(json.dumps({"datasets": {"mixed": {"prompts": 9}}}))
    modes = by_mode(collect_stats(out, now=NOW), "mixed")
    assert [(name, m.wanted, m.records, m.completion_tokens, m.median_completion_tokens)
            for name, m in modes.items()] == [("direct", None, 2, 12, 5),
                                              ("think", None, 6, 211, 30), (None, None, 1, 9, 9)]


def test_stats_from_a_scan_count_the_same_modes(tmp_path: Path) -> None:
    from workbench.analyze.scan import scan_run

    run = plant(tmp_path / "run")
    scanned = collect_stats(run, now=NOW, scan=scan_run(run, workers=1))
    fresh = collect_stats(run, now=NOW)
    for name in ("mixed", "conv"):
        assert scanned.datasets[name].modes == fresh.datasets[name].modes
