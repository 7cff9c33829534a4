"""Stats on small planted trees (exact numbers); the incremental collector against full scans."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench.analyze.stats as stats_module
from workbench.analyze.stats import StatsCollector, collect_stats
from workbench.analyze.stats_text import format_stats_table, render_stats
from workbench.errors import InputError

NOW = 1_750_000_000.0


# --- planting --------------------------------------------------------------------------------


def flat(
    sid: Any,
    completion: int | None,
    *,
    prompt: int | None = 100,
    reason: str = "stop",
    ts: float | None = NOW,
    cached: int | None = 0,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "sample_id": sid,
        "output_ids": [1, 2, 3],
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
        "finish_reason": reason,
        "matched_stop": None,
        "e2e_latency": 1.5,
        "ts": ts,
        "schema": 1,
    }
    return {k: v for k, v in record.items() if v is not None or k == "matched_stop"}


def legacy(
    sid: Any,
    completion: int | None,
    *,
    prompt: int = 50,
    reason: str = "stop",
    ts: float | None = None,
) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt}
    if completion is not None:
        usage["completion_tokens"] = completion
    line: dict[str, Any] = {
        "custom_id": sid,
        "response": {
            "body": {
                "usage": usage,
                "choices": [{"finish_reason": reason, "message": {"content": "x"}}],
            }
        },
    }
    if ts is not None:
        line["ts"] = ts
    return line


def meta_info(
    sid: Any,
    completion: int | None,
    *,
    prompt: int = 70,
    reason: str = "length",
    ts: float | None = NOW,
    cached: int = 5,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "finish_reason": {"type": reason, "length": completion},
        "e2e_latency": 2.0,
    }
    if completion is not None:
        meta["completion_tokens"] = completion
    return {"sample_id": sid, "text": "hi", "output_ids": [5, 6], "meta_info": meta, "ts": ts}


def lines(objs: Iterable[Any]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def write(path: Path, objs: Iterable[Any], tail: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lines(objs) + tail)
    return path


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


def manifest(out: Path, **datasets: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    entries = {
        name: {"prompts": None, "max_samples": None, "max_tokens": None, **entry}
        for name, entry in datasets.items()
    }
    (out / "run.json").write_text(json.dumps({"updated": NOW - 1000, "datasets": entries}))


def error(sid: Any, ts: float = NOW - 5, attempt: int = 1) -> dict[str, Any]:
    return {
        "sample_id": sid,
        "attempt": attempt,
        "error_type": "server_error",
        "http_status": 503,
        "message": "busy",
        "ts": ts,
    }


# --- exact numbers ---------------------------------------------------------------------------


def test_flat_dataset_exact_numbers(tmp_path: Path) -> None:
    folder = tmp_path / "A"
    reasons = ["stop", "length", "stop", "stop", "length", "stop", "stop", "length", "stop", "stop"]
    write(
        folder / "raw_responses.jsonl",
        [
            flat(i, 10 * (i + 1), prompt=100 + i, cached=i, reason=reasons[i], ts=NOW - 90 + 10 * i)
            for i in range(10)
        ],
    )
    write(folder / "errors.jsonl", [error(3), error(42), error(42, attempt=2)])
    write(
        folder / "prompts.jsonl", [{"sample_id": i, "input_ids": list(range(i))} for i in range(20)]
    )
    manifest(tmp_path, A={"prompts": 20})

    ds = collect_stats(tmp_path, now=NOW).datasets["A"]

    assert (ds.records, ds.errors, ds.failed_missing) == (10, 3, 1)
    assert (ds.prompt_tokens, ds.completion_tokens, ds.cached_tokens) == (1045, 550, 45)
    assert ds.avg_completion_tokens == 55.0
    assert ds.percentiles == (50, 90, 100) and ds.max_completion_tokens == 100
    assert ds.finish_reasons == {"stop": 7, "length": 3}
    assert ds.truncation_rate == pytest.approx(0.3)
    assert ds.layout == "flat" and ds.missing_completion_tokens == 0
    assert (ds.prepared_prompts, ds.prepared_prompt_tokens) == (20, sum(range(20)))
    # the first record (ts NOW-90) marks the start: 540 tokens and 9 records in 90 s
    assert ds.tokens_per_s == pytest.approx(6.0)
    assert ds.requests_per_s == pytest.approx(0.1)
    # 20 prompts - 10 records - 1 failed id = 9 left at 0.1 req/s
    assert ds.target_records == 20 and ds.remaining_records == 9
    assert ds.eta_s == pytest.approx(90.0) and not ds.finished


def test_full_window_and_old_records(tmp_path: Path) -> None:
    write(
        tmp_path / "A" / "raw_responses.jsonl",
        [flat(i, 100, ts=NOW - 1000 + i) for i in range(5)]  # long before the window
        + [flat(10 + i, 30, ts=NOW - 299 + 20 * i) for i in range(15)],
    )
    ds = collect_stats(tmp_path, now=NOW).datasets["A"]
    assert ds.tokens_per_s == pytest.approx(15 * 30 / 300)
    assert ds.requests_per_s == pytest.approx(15 / 300)
    assert ds.recent.window_records == 15
    assert ds.target_records is None and ds.eta_s is None


def test_layouts_and_missing_counts(tmp_path: Path) -> None:
    write(
        tmp_path / "L" / "raw_responses.jsonl",
        [legacy(f"req-{i}", None if i < 3 else 40) for i in range(5)],
    )
    write(tmp_path / "M" / "raw_responses.jsonl", [meta_info(i, 7 * i) for i in range(1, 5)])
    write(
        tmp_path / "X" / "raw_responses.jsonl",
        [flat(1, 10), legacy(2, 20, reason="length"), meta_info(3, 30, reason="stop")],
    )
    result = collect_stats(tmp_path, now=NOW)
    legacy_ds, meta_ds, mixed = (result.datasets[n] for n in ("L", "M", "X"))

    assert legacy_ds.layout == "legacy" and legacy_ds.records == 5
    assert legacy_ds.missing_completion_tokens == 3 and legacy_ds.completion_tokens == 80
    assert legacy_ds.percentiles == (40, 40, 40) and legacy_ds.prompt_tokens == 250
    assert legacy_ds.tokens_per_s is None  # no ts in these lines: no rate, not a zero
    assert legacy_ds.recent.missing_completion == 3 and legacy_ds.recent.rows == 5

    assert meta_ds.layout == "meta_info" and meta_ds.completion_tokens == 70
    assert meta_ds.cached_tokens == 20 and meta_ds.finish_reasons == {"length": 4}
    assert meta_ds.truncation_rate == 1.0

    assert mixed.layout == "mixed" and mixed.layouts == {"flat": 1, "legacy": 1, "meta_info": 1}
    assert mixed.completion_tokens == 60 and mixed.finish_reasons == {"stop": 2, "length": 1}
    assert result.total.layout == "mixed" and result.total.records == 12


def test_absent_counts_are_missing_never_zero(tmp_path: Path) -> None:
    write(
        tmp_path / "A" / "raw_responses.jsonl",
        [flat(1, 10), flat(2, None), flat(3, None, prompt=None), {"sample_id": 4}],
    )
    ds = collect_stats(tmp_path, now=NOW).datasets["A"]
    assert ds.records == 4
    assert (ds.missing_completion_tokens, ds.missing_prompt_tokens) == (3, 2)
    assert ds.avg_completion_tokens == 10.0 and ds.percentiles == (10, 10, 10)
    assert ds.finish_reasons == {"stop": 3, "missing": 1}


def test_counts_past_64_bits_are_summed_exactly_and_negative_ones_are_missing(
    tmp_path: Path,
) -> None:
    huge, below = (1 << 64) + 5, -(1 << 63) - 1  # JSON holds any integer
    write(tmp_path / "A" / "raw_responses.jsonl",
          [flat(1, huge), flat(2, below), flat(3, 7), flat(4, -3)])
    ds = collect_stats(tmp_path, now=NOW).datasets["A"]
    assert ds.records == 4 and ds.completion_tokens == huge + 7
    assert ds.missing_completion_tokens == 2  # a negative count is no count, never summed
    assert ds.max_completion_tokens == (1 << 63) - 1 and ds.percentiles[0] == 7


def test_torn_and_bad_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path / "A" / "raw_responses.jsonl",
        [flat(1, 10), flat(2, 20)],
        tail=b"not json\n" + json.dumps(flat(3, 30)).encode()[:25],
    )
    collector = StatsCollector(tmp_path)
    ds = collector.refresh(NOW).datasets["A"]
    assert (ds.records, ds.bad_lines, ds.torn_tail, ds.completion_tokens) == (2, 1, True, 30)

    append(path, json.dumps(flat(3, 30)).encode()[25:] + b"\n")
    ds = collector.refresh(NOW).datasets["A"]
    assert (ds.records, ds.bad_lines, ds.torn_tail, ds.completion_tokens) == (3, 1, False, 60)


def test_targets_budgets_and_done(tmp_path: Path) -> None:
    write(tmp_path / "S" / "raw_responses.jsonl", [flat(i, 10, ts=NOW - 10 * i) for i in range(5)])
    write(
        tmp_path / "B" / "raw_responses.jsonl",
        [flat(i, 100, ts=NOW - 50 + 10 * i) for i in range(6)],
    )
    write(tmp_path / "D" / "raw_responses.jsonl", [flat(i, 1) for i in range(3)])
    write(tmp_path / "D" / "errors.jsonl", [error(7)])
    manifest(
        tmp_path,
        S={"prompts": 100, "max_samples": 5},
        B={"prompts": 1000, "max_tokens": 1000},
        D={"prompts": 4},
    )
    result = collect_stats(tmp_path, now=NOW)
    capped, budget, done = (result.datasets[n] for n in ("S", "B", "D"))

    assert capped.target_records == 5 and capped.finished and capped.eta_s == 0.0
    # budget: 400 tokens left at 500 tokens / 50 s, before the 994 records left
    assert budget.max_tokens == 1000 and not budget.finished
    assert budget.eta_s == pytest.approx(40.0) and budget.remaining_records == pytest.approx(4.0)
    assert done.finished  # 3 records + 1 failed id reach the 4 prompts
    assert not result.total.finished and result.total.target_records == 1009


def test_a_dataset_its_budget_stopped_short_is_finished_without_an_eta(tmp_path: Path) -> None:
    """The runner stops a dataset once the next reply would not fit its budget, short of the
    budget itself; run.json says so, and the stats say "budget reached", not an ETA."""
    write(tmp_path / "B" / "raw_responses.jsonl", [flat(i, 100, ts=NOW - 50 + 10 * i) for i in range(6)])
    manifest(tmp_path, B={"prompts": 300, "max_tokens": 700, "budget_reached": True})
    result = collect_stats(tmp_path, now=NOW)
    budget = result.datasets["B"]
    assert budget.completion_tokens == 600 < budget.max_tokens
    assert budget.finished and budget.budget_reached and budget.eta_s == 0.0
    assert result.total.finished and result.to_dict()["datasets"]["B"]["budget_reached"] is True
    row = next(line for line in format_stats_table(result).splitlines()[::-1] if line.startswith("B "))
    assert row.endswith("budget reached") and "6/300" in row
    manifest(tmp_path, B={"prompts": 300, "max_tokens": 700})  # still running
    running = collect_stats(tmp_path, now=NOW).datasets["B"]
    assert not running.finished and running.eta_s is not None and running.eta_s > 0


def test_total_row(tmp_path: Path) -> None:
    write(
        tmp_path / "A" / "raw_responses.jsonl",
        [flat(i, c, ts=NOW - 100 + i) for i, c in enumerate([5, 1, 9])],
    )
    write(
        tmp_path / "B" / "raw_responses.jsonl",
        [flat(i, c, ts=NOW - 100 + i) for i, c in enumerate([7, 3])],
    )
    write(tmp_path / "B" / "errors.jsonl", [error(9), error(10)])
    manifest(tmp_path, A={"prompts": 10}, B={"prompts": 10})
    result = collect_stats(tmp_path, now=NOW)
    total = result.total
    assert list(result.datasets) == ["A", "B"]
    assert (total.records, total.errors, total.failed_missing, total.completion_tokens) == (
        5,
        2,
        2,
        25,
    )
    assert total.percentiles == (5, 9, 9) and total.max_completion_tokens == 9
    a, b = result.datasets["A"], result.datasets["B"]
    assert total.requests_per_s == pytest.approx(a.requests_per_s + b.requests_per_s)
    assert total.eta_s == pytest.approx((7 + 6) / total.requests_per_s)


def test_json_output_shape(tmp_path: Path) -> None:
    write(tmp_path / "A" / "raw_responses.jsonl", [flat(1, 10, reason="length"), flat(2, 30)])
    manifest(tmp_path, A={"prompts": 4})
    data = json.loads(render_stats(tmp_path, as_json=True, now=NOW))
    assert set(data) == {"datasets", "total"}
    ds = data["datasets"]["A"]
    expected = {
        "records": 2,
        "errors": 0,
        "prompt_tokens": 200,
        "completion_tokens": 40,
        "avg_completion_tokens": 20.0,
        "p50_completion_tokens": 10,
        "p90_completion_tokens": 30,
        "p99_completion_tokens": 30,
        "max_completion_tokens": 30,
        "cached_tokens": 0,
        "finish_reasons": {"length": 1, "stop": 1},
        "truncation_rate": 0.5,
        "layout": "flat",
        "missing_completion_tokens": 0,
    }
    assert {k: ds[k] for k in expected} == expected
    assert isinstance(ds["tokens_per_s"], float) and "eta_s" in ds
    assert data["total"]["records"] == 2 and data["total"]["completion_tokens"] == 40


def test_table_text(tmp_path: Path) -> None:
    write(
        tmp_path / "A" / "raw_responses.jsonl",
        [flat(i, 1000 + i, ts=NOW - 60 + i) for i in range(4)] + [legacy(9, None)],
    )
    text = render_stats(tmp_path, now=NOW)
    assert "dataset" in text and "total" in text and "mixed" in text
    assert "4,006" in text  # completion tokens
    assert "A: counts missing: completion_tokens in 1" in text


def test_errors_only_and_manifest_only_datasets(tmp_path: Path) -> None:
    write(tmp_path / "E" / "errors.jsonl", [error(1), error(2), error(1, attempt=2)])
    manifest(tmp_path, E={"prompts": 2}, Later={"prompts": 5})
    (tmp_path / "notes").mkdir()
    result = collect_stats(tmp_path, now=NOW)
    assert list(result.datasets) == ["E", "Later"]
    assert result.datasets["E"].errors == 3 and result.datasets["E"].failed_missing == 2
    assert result.datasets["E"].finished  # every prompt failed
    assert result.datasets["Later"].records == 0 and result.datasets["Later"].layout == "none"


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a run directory"):
        collect_stats(tmp_path / "nope")


# --- incremental reads -----------------------------------------------------------------------


def test_failed_ids_resolve_in_either_order(tmp_path: Path) -> None:
    raw = write(tmp_path / "A" / "raw_responses.jsonl", [flat(1, 10), flat("s-2", 10)])
    errors = write(tmp_path / "A" / "errors.jsonl", [error(5)])
    collector = StatsCollector(tmp_path)
    assert collector.refresh(NOW).datasets["A"].failed_missing == 1
    append(errors, lines([error(1), error("s-2"), error("s-3")]))  # 1 and s-2 already have records
    assert collector.refresh(NOW).datasets["A"].failed_missing == 2
    append(raw, lines([flat(5, 10), flat("s-3", 10)]))
    assert collector.refresh(NOW).datasets["A"].failed_missing == 0


def test_refresh_reads_only_appended_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "A" / "raw_responses.jsonl", [flat(i, 10) for i in range(50)])
    calls: list[int] = []
    real = stats_module.iter_blocks

    def spy(path: Any, *, offset: int = 0, **kwargs: Any) -> Any:
        calls.append(offset)
        return real(path, offset=offset, **kwargs)

    monkeypatch.setattr(stats_module, "iter_blocks", spy)
    collector = StatsCollector(tmp_path)
    collector.refresh(NOW)
    size = path.stat().st_size
    collector.refresh(NOW)
    assert calls == [0]  # nothing changed: not even opened
    append(path, lines([flat(50, 7)]))
    ds = collector.refresh(NOW).datasets["A"]
    assert calls == [0, size] and ds.records == 51 and ds.completion_tokens == 507


def test_rescans_shrunk_replaced_and_rewritten_files(tmp_path: Path) -> None:
    path = write(tmp_path / "A" / "raw_responses.jsonl", [flat(i, 10) for i in range(10)])
    collector = StatsCollector(tmp_path)
    assert collector.refresh(NOW).datasets["A"].records == 10

    write(path, [flat(i, 20) for i in range(4)])  # shrank, same inode
    assert collector.refresh(NOW).datasets["A"].completion_tokens == 80

    new = path.with_name("new.jsonl")
    write(new, [flat(i, 30) for i in range(4)])  # same size, another inode
    os.replace(new, path)
    assert collector.refresh(NOW).datasets["A"].completion_tokens == 120

    with open(path, "r+b") as file:  # rewritten in place (the bytes before the offset differ)
        file.write(lines([flat(i, 40, ts=NOW - 1) for i in range(5)]))
    ds = collector.refresh(NOW).datasets["A"]
    assert ds.records == 5 and ds.completion_tokens == 200

    path.unlink()
    assert collector.refresh(NOW).datasets["A"].records == 0


# --- incremental == full: property ------------------------------------------------------------

record_st = st.builds(
    lambda kind, sid, completion, reason, ts: {"flat": flat, "legacy": legacy, "meta": meta_info}[
        kind
    ](sid, completion, reason=reason, ts=ts),
    st.sampled_from(["flat", "flat", "legacy", "meta"]),
    st.one_of(st.integers(0, 12), st.sampled_from(["a", "b"])),
    st.one_of(st.none(), st.integers(0, 5000)),
    st.sampled_from(["stop", "length", "abort"]),
    st.one_of(st.none(), st.floats(NOW - 700, NOW + 400)),
)
op_st = st.one_of(
    st.tuples(
        st.just("append"), st.lists(record_st, max_size=6), st.integers(0, 40), st.booleans()
    ),
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("replace"), st.lists(record_st, max_size=6)),
    st.tuples(st.just("errors"), st.lists(st.integers(0, 14), max_size=4), st.booleans()),
    st.tuples(
        st.just("garbage"), st.sampled_from([b"{oops\n", b"\n", b"[1]\n", b'{"sample_id": [1]}\n'])
    ),
    st.tuples(st.just("remove")),
)


def _kept_aside(path: Path) -> None:
    """Keep path's inode alive under another name: a file replaced by one that then gets
    the inode just freed (and the same size and last bytes) is the cursor's documented
    limit, which no real replacement hits within a refresh."""
    if path.exists():
        os.link(path, path.with_name(f"replaced-{path.stat().st_ino}"))


def _apply(out: Path, op: tuple[Any, ...], now: float) -> bool:
    """Apply one change to the tree; True when a refresh must follow before the next change."""
    raw = out / "A" / "raw_responses.jsonl"
    kind = op[0]
    if kind == "append":
        _, records, cut, refresh = op
        data = lines(records)
        append(raw, data[: len(data) - cut] if cut < len(data) else data)
        return bool(refresh)
    if kind == "truncate":
        if raw.exists():
            os.truncate(raw, min(op[1], raw.stat().st_size))
        return True
    if kind == "replace":
        write(out / "A" / "tmp", op[1])
        _kept_aside(raw)
        os.replace(out / "A" / "tmp", raw)
        return False
    if kind == "errors":
        append(out / "A" / "errors.jsonl", lines(error(i, ts=now - 100 * (i % 5)) for i in op[1]))
        return bool(op[2])
    if kind == "garbage":
        append(raw, op[1])
        return False
    raw.unlink(missing_ok=True)
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(op_st, st.floats(0, 120)), min_size=1, max_size=12), st.integers(1, 4))
def test_incremental_equals_full_rescan(
    ops: list[tuple[tuple[Any, ...], float]], recent_rows: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "A").mkdir()
        manifest(out, A={"prompts": 9, "max_tokens": 9000})
        collector = StatsCollector(out, window=300, recent_rows=recent_rows)
        now = NOW
        for op, step in ops:
            now += step
            must_refresh = _apply(out, op, now)
            if must_refresh or step > 60:
                incremental = collector.refresh(now).to_dict()
                full = (
                    StatsCollector(out, window=300, recent_rows=recent_rows).refresh(now).to_dict()
                )
                assert incremental == full
        final = collector.refresh(now).to_dict()
        assert (
            final == StatsCollector(out, window=300, recent_rows=recent_rows).refresh(now).to_dict()
        )


PROMPT_LINES = [
    b'{"sample_id": 1, "input_ids": [1, 2, 3]}\n',
    b'{"input_ids":[4],"sample_id":2}\n',
    b'{"sample_id": 3, "input_ids": []}\n',
    b'{"sample_id": 4, "input_ids": [ ]}\n',
    b'{"sample_id": 5, "text": "hello"}\n',
    b'{"sample_id": 6, "input_ids": null}\n',
    b'{"sample_id": 7, "input_ids": [5, 6], "meta": {"input_ids": [1]}}\n',
    b'{"sample_id": 8, "input\\u005fids": [5, 6]}\n',
    b'{"sample_id": 9, "input_ids": [5, 6\n',
    b"\n",
    b'{"sample_id": 10, "input_ids": [7, 8]}\r\n',
]


def _json_counts(data: bytes) -> tuple[int, int, int]:
    """(lines, lines with an input_ids array, ids in them): what the stats count, by json."""
    lines = tokenized = tokens = 0
    for text in data.splitlines():
        if not text.strip():
            continue
        lines += 1
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value.get("input_ids"), list):
            tokenized, tokens = tokenized + 1, tokens + len(value["input_ids"])
    return lines, tokenized, tokens


@pytest.mark.parametrize("index", range(len(PROMPT_LINES)))
def test_prompt_ids_counted_in_blocks_are_exact(index: int, tmp_path: Path) -> None:
    from workbench.rundir import prompt_scan
    from workbench.rundir.prompt_reader import _prompt_rows
    from workbench.rundir.reader import Chunk

    good = b'{"sample_id": 0, "input_ids": [9, 9]}\n'
    block = _prompt_rows(Chunk(good * 3, len(good) * 3, 0), 1)  # the block path
    assert block is not None and [row.input_ids for row in block] == [2, 2, 2]
    data = good + PROMPT_LINES[index] + good
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    counted = prompt_scan.scan(path)
    assert (counted.lines, counted.tokenized, counted.tokens) == _json_counts(data)
