"""`workbench stats` on a dataset that wrote nothing because every prompt failed (failed,
never done), and the total row's rate and ETA following its running datasets only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from workbench.analyze.stats import collect_stats
from workbench.analyze.stats_text import format_stats_table, render_stats
from workbench.analyze.tables import DONE, FAILED, RUNNING, budget_table, progress_state

NOW = 1_750_000_000.0


def record(sid: int, ts: float, completion: int = 100) -> dict[str, Any]:
    return {"sample_id": sid, "output_ids": [1], "prompt_tokens": 50,
            "completion_tokens": completion, "finish_reason": "stop", "e2e_latency": 1.0,
            "ts": ts}


def error(sid: int, ts: float) -> dict[str, Any]:
    return {"sample_id": sid, "attempt": 1, "error_type": "aborted", "message": "aborted",
            "ts": ts}


def plant(out: Path, name: str, records: list[dict[str, Any]],
          errors: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for file, items in (("raw_responses.jsonl", records), ("errors.jsonl", errors)):
        (folder / file).write_text("".join(json.dumps(item) + "\n" for item in items))


def run_json(out: Path, **prompts: int) -> None:
    datasets = {name: {"prompts": n} for name, n in prompts.items()}
    (out / "run.json").write_text(json.dumps({"updated": NOW - 7200, "datasets": datasets}))


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame(columns=["dataset", "ts", "e2e_latency", "completion_tokens"])


@pytest.fixture
def all_failed(tmp_path: Path) -> Path:
    """X: 30 prompts, every one aborted an hour ago, no record; Y: 3 records, done."""
    plant(tmp_path, "X", [], [error(i, NOW - 3600 + i) for i in range(30)])
    plant(tmp_path, "Y", [record(i, NOW - 3600 + i) for i in range(3)])
    run_json(tmp_path, X=30, Y=3)
    return tmp_path


def test_a_dataset_without_a_record_whose_prompts_all_failed_is_failed(all_failed: Path) -> None:
    stats = collect_stats(all_failed, now=NOW)
    x, y = stats.datasets["X"], stats.datasets["Y"]
    assert x.finished and x.all_failed and not y.all_failed and not stats.total.all_failed
    assert progress_state(x) == FAILED and progress_state(y) == DONE
    text = format_stats_table(stats)
    x_row = next(line for line in text.splitlines()[5:] if line.startswith("X "))
    assert x_row.split()[-1] == "failed"
    assert "X: no record written: all 30 prompts failed (see X/errors.jsonl)" in text.splitlines()
    assert json.loads(render_stats(all_failed, as_json=True, now=NOW))["datasets"]["X"]["all_failed"]
    table = budget_table(stats, empty_frame())
    assert list(table["state"]) == [FAILED, DONE, DONE]  # the total: one dataset wrote records


def test_a_run_that_wrote_nothing_is_failed_in_its_total_row(tmp_path: Path) -> None:
    plant(tmp_path, "X", [], [error(i, NOW - 3600) for i in range(4)])
    run_json(tmp_path, X=4)
    stats = collect_stats(tmp_path, now=NOW)
    assert stats.total.all_failed
    assert list(budget_table(stats, empty_frame())["state"]) == [FAILED, FAILED]
    total = next(line for line in format_stats_table(stats).splitlines()[5:]
                 if line.startswith("total"))
    assert total.split()[-1] == "failed"


def test_a_dataset_still_running_without_a_record_is_not_failed(tmp_path: Path) -> None:
    plant(tmp_path, "X", [], [error(i, NOW - 10) for i in range(5)])  # 5 of 30 failed so far
    run_json(tmp_path, X=30)
    stats = collect_stats(tmp_path, now=NOW)
    x = stats.datasets["X"]
    assert not x.finished and not x.all_failed and progress_state(x) == RUNNING
    assert "no record written" not in format_stats_table(stats)


def test_the_total_rate_and_eta_follow_the_running_datasets_only(tmp_path: Path) -> None:
    """A finished a minute ago (its records still in the rate window); B still runs."""
    plant(tmp_path, "A", [record(i, NOW - 180 + 10 * i, 1000) for i in range(10)])
    plant(tmp_path, "B", [record(i, NOW - 60 + 10 * i) for i in range(7)])  # 7 of 10, 1/10 s
    run_json(tmp_path, A=10, B=10)
    stats = collect_stats(tmp_path, now=NOW)
    a, b, total = stats.datasets["A"], stats.datasets["B"], stats.total
    assert a.finished and not b.finished and b.tokens_per_s and b.requests_per_s
    assert total.tokens_per_s == pytest.approx(b.tokens_per_s)
    assert total.requests_per_s == pytest.approx(b.requests_per_s)
    assert total.remaining_records == 3
    assert total.eta_s == pytest.approx(3 / b.requests_per_s)
    assert total.eta_s == pytest.approx(b.eta_s)
    row = budget_table(stats, empty_frame()).iloc[-1]
    assert row["tokens_per_s_recent"] == pytest.approx(b.tokens_per_s)
