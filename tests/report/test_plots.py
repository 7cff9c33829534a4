"""Figure builders and report blocks, and the shaping they draw, on a small hand-made run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from workbench.analyze import explore
from workbench.analyze.stats import collect_stats
from workbench.analyze.validate import validate_run
from workbench.errors import ConfigError
from workbench.report import plots
from workbench.report.jupyter import DATA_MIME, REPORT_ENV
from workbench.rundir.records import PromptRecord, Record, encode_line

THINK_END, IM_END = 163607, 163586
SCRIPT = "<script>window.__pwned=1</script>"
T0 = 1_750_000_000.0


def record(sid: Any, ids: list[int], *, finish: str = "stop", ts: float = T0, prompt: int = 10) -> Record:
    return Record(sample_id=sid, output_ids=ids, prompt_tokens=prompt, completion_tokens=len(ids),
                  cached_tokens=0, finish_reason=finish, matched_stop=IM_END if finish == "stop" else None,
                  e2e_latency=1.0, ts=ts)


def write_run(out: Path) -> Path:
    """Two datasets: "a" (thinking on, one reply cut, one unclosed), "b" (thinking off)."""
    a = [record(0, [1, 2, 3, THINK_END, 4, 5, IM_END], ts=T0),
         record(1, [1] * 8, finish="length", ts=T0 + 10),
         record(2, [1, 2, IM_END], ts=T0 + 20),
         record(SCRIPT, [7, THINK_END, IM_END], ts=T0 + 30)]
    b = [record(i, [9] * (i + 1) + [IM_END], ts=T0 + i, prompt=100 * (i + 1)) for i in range(5)]
    for name, rows in (("a", a), ("b", b)):
        folder = out / name
        folder.mkdir(parents=True)
        (folder / "raw_responses.jsonl").write_bytes(b"".join(encode_line(r) for r in rows))
        prompts = [r.sample_id for r in rows if r.sample_id != SCRIPT]
        (folder / "prompts.jsonl").write_bytes(
            b"".join(encode_line(PromptRecord(sample_id=p, input_ids=[1, 2])) for p in prompts))
    manifest = {
        "model": "m", "model_profile": "kimi-k2.5", "created": T0, "updated": T0 + 30,
        "datasets": {
            "a": {"prompts": 4, "max_tokens": 100, "sampling": {"max_new_tokens": 8},
                  "chat_template_kwargs": {"thinking": True}},
            "b": {"prompts": 6, "sampling": {"max_new_tokens": 16}, "chat_template_kwargs": {"thinking": False}},
        },
    }
    (out / "run.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "out")


@pytest.fixture
def frame(run: Path) -> pd.DataFrame:
    return explore.record_frame(run)


# --- shaping ---------------------------------------------------------------------------------


def test_record_frame_splits_at_the_think_end_id(frame: pd.DataFrame) -> None:
    a = frame[frame["dataset"] == "a"].set_index("line")
    assert a.loc[1, ["reasoning_tokens", "answer_tokens", "closed"]].tolist() == [3, 2, True]
    assert a.loc[2, ["reasoning_tokens", "answer_tokens", "closed"]].tolist() == [8, 0, False]
    assert a.loc[3, ["reasoning_tokens", "answer_tokens", "closed"]].tolist() == [2, 0, False]
    b = frame[frame["dataset"] == "b"]
    assert b["closed"].isna().all() and b["reasoning_tokens"].eq(0).all()  # thinking off
    assert b["answer_tokens"].tolist() == [1, 2, 3, 4, 5]
    assert list(frame["dataset"].cat.categories) == ["a", "b"]


def test_distributions_share_bins_and_sum_to_one(frame: pd.DataFrame) -> None:
    for log in (False, True):
        hist = explore.histogram(frame, log=log, bins=5)
        assert hist.groupby("dataset", observed=True)["share"].sum().round(9).tolist() == [1.0, 1.0]
        assert hist.groupby("dataset", observed=True)["count"].sum().tolist() == [4, 5]
    curve = explore.cdf(frame)
    assert curve.groupby("dataset", observed=True)["fraction"].max().tolist() == [1.0, 1.0]


def test_reasoning_summary_and_finish_mix(run: Path, frame: pd.DataFrame) -> None:
    summary = explore.reasoning_summary(frame)
    assert summary["dataset"].tolist() == ["a"]  # b has thinking off
    assert summary.loc[0, "unclosed"] == 2 and summary.loc[0, "unclosed_stop"] == 1
    mix = explore.finish_mix(frame, explore.run_overview(run))
    a = mix[mix["dataset"] == "a"].set_index("reason")
    assert a["count"].to_dict() == {"stop": 3, "length": 1}
    assert a["truncation_rate"].iloc[0] == 0.25 and a["max_new_tokens"].iloc[0] == 8


def test_budget_table_remaining_and_projection(run: Path, frame: pd.DataFrame) -> None:
    stats = collect_stats(run, now=T0 + 40)
    table = explore.budget_table(stats, frame).set_index("dataset")
    assert table.loc["a", "max_tokens"] == 100 and table.loc["a", "budget_used"] == pytest.approx(21 / 100)
    assert table.loc["b", "remaining_tokens"] == pytest.approx(1 * (20 / 5))  # 1 record left, mean 4
    assert table.loc["b", "tokens_per_s_run"] == pytest.approx(20 / 5)  # 20 tokens from T0-1 to T0+4
    assert table.loc["a", "finished"] and table.loc["a", "remaining_tokens"] == 0  # 4 of 4 records
    assert table.loc["total", "remaining_tokens"] == pytest.approx(0 + 4)
    assert table.loc["b", "projected_s"] == pytest.approx(4 / stats.datasets["b"].tokens_per_s)


def test_filters_and_unknown_dataset(frame: pd.DataFrame) -> None:
    assert len(explore.filter_records(frame, truncated=True)) == 1
    assert len(explore.filter_records(frame, unclosed=True)) == 2
    assert len(explore.filter_records(frame, dataset="b", min_completion_tokens=4)) == 3
    assert len(explore.filter_records(frame, finish_reason="stop", dataset="a")) == 3
    with pytest.raises(ConfigError, match="dataset: unknown dataset 'c' \\(known: a, b\\)"):
        explore.filter_records(frame, dataset="c")


def test_samples_as_ids_without_a_tokenizer(run: Path, frame: pd.DataFrame) -> None:
    shown = explore.samples(run, frame[frame["dataset"] == "a"], n=10)
    first = shown[0]
    assert (first.reasoning, first.answer, first.decoded) == ("1 2 3 </think>", "4 5 <end>", False)
    assert [s.sample_id for s in shown] == [0, 1, 2, SCRIPT]
    assert shown[1].answer == "" and shown[1].reasoning == " ".join(["1"] * 8)


def test_validation_shaping(run: Path) -> None:
    report = validate_run(run, workers=1)
    table = explore.findings_table(report)
    assert set(table["dataset"]) == {"a", "b"}
    assert ("a", "orphan_response") in set(zip(table["dataset"], table["rule"], strict=True))
    examples = explore.examples_table(report, run, chars=40)
    orphan = examples[examples["rule"] == "orphan_response"].iloc[0]
    assert orphan["sample_id"] == SCRIPT and orphan["excerpt"] == "7 </think> <end>"
    over = explore.findings_over_time(run, buckets=3)
    assert over["seconds"].iloc[0] == 10
    unclosed = over[(over["dataset"] == "a") & (over["rule"] == "reasoning_unclosed")]
    assert unclosed["count"].sum() == 1 and unclosed["records"].sum() == 4


# --- blocks and figures ----------------------------------------------------------------------


def test_blocks_escape_model_text_and_carry_data(run: Path, frame: pd.DataFrame) -> None:
    block = plots.samples_view(explore.samples(run, frame, n=20))
    bundle = block._repr_mimebundle_()
    assert SCRIPT not in bundle["text/html"] and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in bundle["text/html"]
    assert SCRIPT in json.dumps(bundle[DATA_MIME])
    report = validate_run(run, workers=1)
    for view in (plots.examples_view(explore.examples_table(report, run)),
                 plots.findings_view(explore.findings_table(report)), plots.validation_banner(report)):
        assert SCRIPT not in view.html
    assert plots.validation_banner(report).data == report.to_builtins()


def test_stats_view_data_is_the_stats_json(run: Path) -> None:
    stats = collect_stats(run, now=T0 + 40)
    view = plots.stats_view(stats)
    assert view.data == stats.to_dict()
    assert "<td>total</td>" in view.html and "done/target" in view.html


def test_header_names_the_run(run: Path) -> None:
    header = plots.report_header(explore.run_overview(run, now=T0 + 60), "Token distribution")
    assert "<h1>Token distribution</h1>" in header.html and str(run.resolve()) in header.html
    assert "2025-06-15 15:07:10 UTC" in header.html  # T0 + 30, the run's last update


def test_figures_have_a_trace_per_dataset_and_labelled_axes(frame: pd.DataFrame, run: Path) -> None:
    overview = explore.run_overview(run)
    figures = [
        plots.histogram_figure(explore.histogram(frame, log=True), log=True),
        plots.cdf_figure(explore.cdf(frame), log=True, max_new_tokens=overview.max_new_tokens),
        plots.scatter_figure(explore.sample_records(frame, 10)),
        plots.explore_scatter(explore.sample_records(frame, 3)),
    ]
    for fig in figures:
        legend = [t.name for t in fig.data if t.showlegend is not False]
        assert isinstance(fig, go.Figure) and legend[:2] == ["a", "b"]
        assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    assert figures[0].layout.xaxis.type == "log" and figures[1].layout.xaxis.type == "log"
    caps = [a.text for a in figures[1].layout.annotations]
    assert caps == ["max_new_tokens 8<br>a", "max_new_tokens 16<br>b"]
    assert figures[0].data[0].line.color == figures[1].data[0].line.color == plots.PALETTE[0]
    assert [b.label for b in figures[3].layout.updatemenus[0].buttons] == ["all datasets", "a", "b"]
    assert "&lt;script&gt;" in json.dumps([list(t.hovertext) for t in figures[2].data[:2]])
    assert sorted(int(line) for t in figures[2].data[:2] for line in t.customdata) == [1, 2, 3, 4]


def test_log_axes_tick_powers_of_ten_as_plain_numbers(frame: pd.DataFrame) -> None:
    figures = [plots.histogram_figure(explore.histogram(frame, log=True), log=True),
               plots.scatter_figure(frame, log=True)]
    for axis in (figures[0].layout.xaxis, figures[1].layout.xaxis, figures[1].layout.yaxis):
        assert axis.type == "log" and axis.dtick == 1 and axis.tickformat == "~s"
        assert axis.minor.dtick == "D1"  # minor grid lines only, without labels


def test_legend_markers_are_circles_and_never_the_truncated_cross(frame: pd.DataFrame) -> None:
    b_first_cut = frame.copy()
    b_first_cut.loc[b_first_cut["dataset"] == "b", "finish_reason"] = "length"  # all of b truncated
    scatter = plots.scatter_figure(b_first_cut)
    legend = {t.name: t.marker.symbol for t in scatter.data if t.showlegend is not False}
    assert legend == {"a": "circle", "b": "circle", "truncated (finish length)": "x"}
    crosses = [t for t in scatter.data if t.marker.symbol == "x" and t.name == "b"]
    assert len(crosses) == 1 and len(crosses[0].x) == 5 and crosses[0].legendgroup == "b"
    reasoning = plots.reasoning_figure(explore.reasoning_summary(frame), frame)
    unclosed = [t for t in reasoning.data if t.type == "scatter" and t.marker.symbol == "diamond-open"]
    assert [t.name for t in unclosed] == ["a", "no think-end id"] and len(unclosed[0].x) == 2
    assert all(t.marker.symbol != "x" for t in reasoning.data if t.type == "scatter")
    menu = plots.explore_scatter(b_first_cut).layout.updatemenus[0].buttons
    only_b = dict(zip([t.legendgroup for t in scatter.data], menu[2].args[0]["visible"], strict=True))
    assert only_b["b"] and not only_b["a"]


def test_time_buckets_of_few_records_are_not_drawn_as_an_alarm(run: Path) -> None:
    over = explore.findings_over_time(run, buckets=3, min_records=2)
    a = over[(over["dataset"] == "a") & (over["rule"] == "truncated")]
    assert a["enough"].tolist() == (a["records"] >= 2).tolist() and not a["enough"].all()
    fig = plots.findings_over_time_figure(over)
    line = next(t for t in fig.data if t.name == "truncated")
    few = next(t for t in fig.data if t.name == "truncated (few records)")
    drawn = [y for y in line.y[:len(a)] if y is not None and not math.isnan(y)]
    assert len(drawn) == int(a["enough"].sum())  # the line skips the small buckets
    assert few.mode == "markers" and few.marker.color == "#9aa5b1" and len(few.x) == int((~a["enough"]).sum())
    assert "too few records" in few.customdata[0][2] and few.customdata[0][1] < 2


def test_figures_of_tables(frame: pd.DataFrame, run: Path) -> None:
    overview = explore.run_overview(run)
    mix = plots.finish_mix_figure(explore.finish_mix(frame, overview))
    assert [t.name for t in mix.data] == ["stop", "length"]
    reasoning = plots.reasoning_figure(explore.reasoning_summary(frame), frame)
    legend = [t.name for t in reasoning.data if t.showlegend is not False]
    assert legend == ["reasoning (mean)", "answer (mean)", "a", "no think-end id"]
    budget = plots.budget_figure(explore.budget_table(collect_stats(run, now=T0 + 40), frame))
    assert list(budget.data[0].y) == ["a", "b"]
    report = validate_run(run, workers=1)
    assert plots.findings_figure(explore.findings_table(report)).data
    over = plots.findings_over_time_figure(explore.findings_over_time(run, buckets=3))
    assert {t.name for t in over.data} >= {"a: records written", "b: records written", "reasoning_unclosed"}


def test_empty_inputs_give_a_figure_with_a_message() -> None:
    empty = pd.DataFrame(columns=["dataset", "left", "right", "count", "share"])
    fig = plots.histogram_figure(empty)
    assert fig.layout.annotations[0].text == "no records"


def test_lab_figures_carry_data_not_plotly_js(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPORT_ENV, raising=False)
    plots.setup_notebook()
    bundle = pio.renderers._build_mime_bundle(go.Figure(go.Scatter(x=[1], y=[2])).to_dict())
    assert set(bundle) == {"application/vnd.plotly.v1+json"}
    assert len(json.dumps(bundle)) < 20_000


def test_offline_renderer_inlines_plotly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPORT_ENV, "1")
    plots.setup_notebook()
    fig = go.Figure(go.Scatter(x=[1], y=[2]))
    first = pio.renderers._build_mime_bundle(fig.to_dict(), "workbench")
    second = pio.renderers._build_mime_bundle(fig.to_dict(), "workbench")
    assert len(first["text/html"]) > 1_000_000 > len(second["text/html"])
    assert "application/vnd.plotly.v1+json" in second and "mathjax" not in second["text/html"].lower()


# --- figures that say what is so ------------------------------------------------------------


def _budget_stopped(run: Path, extra_prompt: Any = None) -> Path:
    """Dataset "a" of the run stopped by its budget short of a larger target (run.json's
    budget_reached, as the runner writes it); `extra_prompt` adds a prompt it never sent."""
    manifest = json.loads((run / "run.json").read_text())
    manifest["datasets"]["a"].update(prompts=10, budget_reached=True)
    (run / "run.json").write_text(json.dumps(manifest))
    if extra_prompt is not None:
        with (run / "a" / "prompts.jsonl").open("ab") as f:
            f.write(encode_line(PromptRecord(sample_id=extra_prompt, input_ids=[1, 2])))
    return run


def test_a_dataset_stopped_by_its_budget_is_not_running(run: Path, frame: pd.DataFrame) -> None:
    _budget_stopped(run)
    stats = collect_stats(run, now=T0 + 40)
    assert stats.datasets["a"].finished  # 4 of 10 records, 21 of 100 tokens: run.json says stopped
    assert stats.datasets["a"].budget_reached and not stats.datasets["b"].budget_reached
    table = explore.budget_table(stats, frame).set_index("dataset")
    assert table.loc["a", "state"] == "budget reached" and table.loc["a", "finished"]
    assert table.loc["a", "remaining_tokens"] == 0 and table.loc["a", "projected_s"] == 0
    assert table.loc["b", "state"] == "running" and table.loc["b", "remaining_tokens"] == pytest.approx(4)
    assert table.loc["total", "state"] == "running"  # b still runs
    assert table.loc["total", "remaining_tokens"] == pytest.approx(table.loc["b", "remaining_tokens"])
    budget = plots.budget_view(explore.budget_table(stats, frame)).html
    row_a = re.search(r"<tr class=\"\"><td>a</td>.*?</tr>", budget)
    assert row_a and "budget reached" in row_a.group(0) and row_a.group(0).endswith("<td class=num>-</td></tr>")
    view = plots.stats_view(stats)
    rows = re.findall(r"<tr class=\"[^\"]*\"><td>(\w+)</td>(.*?)</tr>", view.html)
    progress = {name: cells for name, cells in rows if "/10<" in cells or "/6<" in cells or "/16<" in cells}
    assert progress["a"].endswith("<td class=num>budget reached</td>")
    assert "budget reached" not in progress["b"] and "running" not in progress["b"]  # an ETA
    assert "prepared tok: " in view.html and "failed: " in view.html and "missing: " in view.html
    assert plots.budget_figure(explore.budget_table(stats, frame)).data[1].text[0].endswith(
        "budget reached")


def test_an_info_finding_never_outweighs_a_warning(run: Path) -> None:
    report = validate_run(_budget_stopped(run, extra_prompt=77), workers=1, cache=False)
    table = explore.findings_table(report)
    unsent = table[table["rule"] == "unsent_budget"].iloc[0]
    assert unsent["severity"] == "info" and unsent["unit"] == "prompts" and unsent["base"] == 4
    assert unsent["count"] == 1 and unsent["rate"] == pytest.approx(1 / 4)
    info = pd.DataFrame([{"dataset": "a", "rule": "unsent_budget", "severity": "info", "count": 222,
                          "rate": 0.74, "records": 78, "default_severity": "info", "base": 300, "unit": "prompts"},
                         {"dataset": "a", "rule": "truncated", "severity": "warning", "count": 4,
                          "rate": 0.05, "records": 78, "default_severity": "warning", "base": 78, "unit": "records"}])
    info["dataset"] = pd.Categorical(info["dataset"], categories=["a"])
    fig = plots.findings_figure(info)
    drawn = [rule for t in fig.data for rule in t.y]
    assert drawn == ["truncated"] and max(x for t in fig.data for x in t.x) == pytest.approx(5.0)
    note = " ".join(a.text for a in fig.layout.annotations)
    assert "info, not drawn" in note and "unsent_budget: a 74.0% (222 of 300 prompts)" in note
    view = plots.findings_view(info).html
    assert "<td class=num>222</td><td class=num>74.00%</td><td class=num>300 prompts</td>" in view
    only_info = plots.findings_figure(info[info["severity"] == "info"])
    assert not only_info.data and "no error or warning finding" in only_info.layout.annotations[0].text


def test_examples_of_unsent_prompts_name_their_sample_id(run: Path) -> None:
    report = validate_run(_budget_stopped(run, extra_prompt=77), workers=1, cache=False)
    examples = explore.examples_table(report, run)
    unsent = examples[examples["rule"] == "unsent_budget"].iloc[0]
    assert (unsent["file"], unsent["line"], unsent["sample_id"]) == ("prompts.jsonl", 4, 77)
    html_rows = plots.examples_view(examples).html
    assert "<td>prompts.jsonl:4</td><td>77</td>" in html_rows and "(a prompt: no reply)" in html_rows


def test_text_boxes_break_lines_between_words() -> None:
    css = plots.REPORT_CSS
    code = next(rule for rule in css.splitlines() if rule.startswith(".wb-report .wb-code{"))
    assert "word-break:normal" in code  # over JupyterLab's `pre {word-break: break-all}`
    assert ".wb-report .wb-table .wb-code{min-width:" in css  # a table never squeezes it to a column of letters


def test_log_axes_are_chosen_by_the_data(frame: pd.DataFrame) -> None:
    assert not explore.wants_log(np.array([100.0, 120, 150, 300, 900]))  # < 2 decades, no long tail
    assert explore.wants_log(np.array([3.0, 50, 80, 120, 9000]))  # more than two decades
    assert explore.wants_log(np.array([40.0, 120, 140, 150, 160, 2048]))  # max 14x the median
    assert not explore.wants_log(np.array([0.0, 0, 5]))  # one positive value
    chosen = explore.log_axes(frame)
    assert chosen == {"prompt_tokens": False, "completion_tokens": False}  # 10..500 in a, 2..6 in b
    long_tail = frame.assign(prompt_tokens=frame["prompt_tokens"] * 0 + 10)
    long_tail.loc[long_tail.index[-1], "prompt_tokens"] = 5000
    assert explore.log_axes(long_tail)["prompt_tokens"] is True
    assert explore.log_axes(frame, False) == {"prompt_tokens": False, "completion_tokens": False}
    scatter = plots.scatter_figure(frame, log={"prompt_tokens": True, "completion_tokens": False})
    assert scatter.layout.xaxis.type == "log" and scatter.layout.yaxis.type != "log"
    assert scatter.layout.xaxis.title.text == "prompt tokens (log)"
    curves = pd.DataFrame({"dataset": ["a", "a"], "group": ["whole", "sent"], "value": [10, 5000],
                           "fraction": [1.0, 1.0]})
    assert plots.subset_lengths_figure(curves, log=True).layout.xaxis.type == "log"


def test_histograms_are_outlines_that_never_blend(frame: pd.DataFrame) -> None:
    fig = plots.histogram_figure(explore.histogram(frame))
    assert [t.name for t in fig.data] == ["a", "b"]
    assert all(t.fill in (None, "none") and t.fillcolor is None for t in fig.data)
    assert fig.data[0].line.color != fig.data[1].line.color


def test_findings_over_time_reads_counts_and_rates_on_their_own_axes(run: Path) -> None:
    over = explore.findings_over_time(run, buckets=3, min_records=2)
    fig = plots.findings_over_time_figure(over, min_records=2)
    written = [t for t in fig.data if str(t.name).endswith("records written")]
    assert {t.yaxis for t in written} == {"y"}  # the top panel: records, never on a % axis
    rates = [t for t in fig.data if t.name == "truncated" and t.x[0] is not None]
    assert rates and {t.yaxis for t in rates} <= {"y2", "y3"}
    assert fig.layout.yaxis.title.text == "records" and fig.layout.yaxis2.title.text == "% failing"
    key = next(t for t in fig.data if t.legendgroup == "few" and t.showlegend is not False)
    assert key.marker.symbol == "circle-open" and "fewer than 2 records" in key.name
    one = over[over["start"] == over["start"].min()]  # a single bucket
    single = plots.findings_over_time_figure(one, min_records=2)
    low, high = single.layout.xaxis.range
    assert pd.Timestamp(high) - pd.Timestamp(low) == pd.Timedelta(seconds=int(one["seconds"].iloc[0]))


def test_subset_view_says_when_no_chi_square_test_ran(run: Path) -> None:
    from workbench.analyze.subset import compare_subsets

    comparison = compare_subsets(run)
    assert comparison.share_tests.empty and len(comparison.lengths) == 2
    view = plots.subset_view(comparison).html
    assert "No chi-square test of shares: no dataset file has a source-like field (source, " in view
    tested = comparison.share_tests.assign(dataset=["a"], field=["source"], levels=[2], tvd=[0.0],
                                           chi2=[0.0], chi2_p=[1.0], biased=[False])
    some = plots.subset_view(type(comparison)(comparison.lengths, comparison.length_curves,
                                              comparison.shares, tested)).html
    assert "No chi-square test of shares: the file of b has no source-like field" in some
