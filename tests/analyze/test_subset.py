"""The sent subset against the whole dataset: a head-of-file subset of a sorted, grouped file
is flagged, a random one is not, and the report shows the section."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

import workbench.analyze.subset as subset_module
from workbench.analyze.scan import scan_run
from workbench.analyze.subset import compare_subsets
from workbench.report.plots import subset_lengths_figure, subset_view
from workbench.rundir.layout import CACHE_DIR


def plant_run(root: Path, sent: list[int], count: int = 600) -> None:
    """A dataset file sorted by prompt length whose `source` follows the length, its
    prompts.jsonl, and records for the `sent` rows."""
    data = root / "data.jsonl"
    rows = [{"sample_id": i, "input_ids": [5] * (20 + i), "source": "short" if i < count // 2 else "long"}
            for i in range(count)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = root / "run" / "A"
    folder.mkdir(parents=True)
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps({"sample_id": r["sample_id"], "input_ids": r["input_ids"]}) + "\n" for r in rows))
    (folder / "raw_responses.jsonl").write_text("".join(
        json.dumps({"sample_id": i, "output_ids": [1], "prompt_tokens": 20 + i, "completion_tokens": 1,
                    "finish_reason": "stop"}) + "\n" for i in sent))
    (root / "run" / "run.json").write_text(json.dumps(
        {"datasets": {"A": {"path": str(data), "id_field": "sample_id", "prompts": count}}}))


def test_the_head_of_a_sorted_file_is_flagged(tmp_path: Path) -> None:
    plant_run(tmp_path, sent=list(range(120)))
    result = compare_subsets(tmp_path / "run")
    row = result.lengths.iloc[0]
    assert (row.dataset, row.whole, row.sent) == ("A", 600, 120)
    assert row.mean_ratio < 0.4 and row.ks_p < 0.001 and row.biased
    test = result.share_tests.iloc[0]
    assert (test.field, test.levels) == ("source", 2) and test.biased
    shares = result.shares.set_index("value")
    assert shares.loc["short", "sent_share"] == 1.0 and shares.loc["short", "whole_share"] == 0.5
    assert "biased" in subset_view(result).html


def test_a_random_subset_is_fair(tmp_path: Path) -> None:
    plant_run(tmp_path, sent=random.Random(0).sample(range(600), 120))
    result = compare_subsets(tmp_path / "run")
    row = result.lengths.iloc[0]
    assert abs(row.mean_ratio - 1) < 0.1 and not row.biased
    assert not result.share_tests.iloc[0].biased
    curves = result.length_curves
    assert set(curves["group"]) == {"whole", "sent"} and curves["fraction"].max() == 1.0
    assert len(subset_lengths_figure(curves).data) == 2


def test_prompt_lengths_are_kept_while_prompts_are_unchanged(tmp_path: Path) -> None:
    plant_run(tmp_path, sent=list(range(0, 600, 5)))
    first = compare_subsets(tmp_path / "run")
    prompts = tmp_path / "run" / "A" / "prompts.jsonl"
    assert list((prompts.parent / CACHE_DIR).glob("prompts-*"))
    again = compare_subsets(tmp_path / "run")
    pd.testing.assert_frame_equal(first.lengths, again.lengths)
    pd.testing.assert_frame_equal(first.length_curves, again.length_curves)
    # a rewritten prompts file is read again, never answered from the kept lengths
    prompts.write_text("".join(json.dumps({"sample_id": i, "input_ids": [5] * 3}) + "\n"
                               for i in range(600)))
    assert compare_subsets(tmp_path / "run").lengths.iloc[0].mean_whole == 3


def test_the_ids_of_a_scan_give_the_same_comparison_without_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant_run(tmp_path, sent=list(range(0, 600, 3)))
    run = tmp_path / "run"
    read = compare_subsets(run)
    scan = scan_run(run)
    monkeypatch.setattr(subset_module, "read_sample_ids", lambda path: pytest.fail(f"read {path}"))
    scanned = compare_subsets(run, scan=scan)
    for name in ("lengths", "length_curves", "shares", "share_tests"):
        pd.testing.assert_frame_equal(getattr(read, name), getattr(scanned, name))
