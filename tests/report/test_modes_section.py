"""The token-distribution report's "Modes" section, on a small hand-made run whose datasets mix
modes: the mix requested against written and the completion tokens per mode agree with the
files (and with `workbench stats`), a record of a mode without thinking is all answer, the
figures draw the shaped frames, the deployment sample is named; a run without modes has no
such section. The notebook's cells run in this process (no kernel) on both runs; one real
report rendering checks what papermill records and the HTML."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from conftest import ROOT, make_record, write_records

from workbench.analyze import explore
from workbench.analyze.modes import REQUESTED, WRITTEN, mode_frames
from workbench.analyze.stats import collect_stats
from workbench.report import plots
from workbench.report.plots import Rendered
from workbench.rundir.records import Record

THINK_END, IM_END = 163607, 163586
T0 = 1_750_000_000.0
SAMPLE = "/srv/deploy/requests.jsonl"
# "chat": sample id -> (mode, reasoning ids, answer ids); think 4, direct 1
CHAT = {0: ("think", 10, 5), 1: ("think", 20, 5), 2: ("direct", 0, 6), 3: ("think", 30, 9),
        4: ("think", 5, 3)}
# "tools" (turns: each): conversation -> (mode, reasoning and answer ids of each turn)
TOOLS = {"c0": ("thinking=true", [(4, 2), (6, 2)]), "c1": ("thinking=false", [(0, 3)]),
         "c2": ("thinking=true", [(8, 1)])}
MODES = [{"name": "think", "weight": 0.75, "chat_template_kwargs": {"thinking": True},
          "sampling": None},
         {"name": "direct", "weight": 0.25, "chat_template_kwargs": {"thinking": False},
          "sampling": {"temperature": 0.6}}]
DEPLOYMENT = [{"name": "thinking=true", "weight": 2, "chat_template_kwargs": {"thinking": True},
               "sampling": None},
              {"name": "thinking=false", "weight": 1, "chat_template_kwargs": {"thinking": False},
               "sampling": None}]


def reply(reasoning: int, answer: int, mode: str) -> list[int]:
    """A thinking reply: reasoning ids, the think-end id, the answer; else the answer only."""
    think = [9] * reasoning + [THINK_END] if mode in ("think", "thinking=true") else []
    return think + [8] * answer + [IM_END]


def record(sid: Any, ids: list[int], mode: str | None, ts: float, turn: int | None = None) -> Record:
    return make_record(sid, ids, mode=mode, turn=turn, prompt_tokens=12, ts=ts)


def write(folder: Path, records: list[Record]) -> None:
    write_records(folder, records)


def write_run(out: Path, *, modes: bool = True) -> Path:
    """"chat" (think 0.75 / direct 0.25, CHAT), "tools" (turns: each, modes from a deployment
    sample, TOOLS) and "plain"; without `modes`, "plain" alone."""
    plain = [record(i, reply(4, 4, "think"), None, T0 + i) for i in range(3)]
    write(out / "plain", plain)
    datasets: dict[str, Any] = {"plain": {"prompts": 3, "sampling": {"max_new_tokens": 64}}}
    if modes:
        write(out / "chat", [record(sid, reply(r, a, mode), mode, T0 + sid)
                             for sid, (mode, r, a) in CHAT.items()])
        write(out / "tools", [record(sid, reply(r, a, mode), mode, T0 + 10, turn)
                              for sid, (mode, turns) in TOOLS.items()
                              for turn, (r, a) in enumerate(turns)])
        datasets["chat"] = {"prompts": 5, "modes": MODES, "modes_source": None,
                            "sampling": {"max_new_tokens": 64}}
        datasets["tools"] = {"prompts": 3, "turns": "each", "modes": DEPLOYMENT,
                             "modes_source": SAMPLE, "sampling": {"max_new_tokens": 64}}
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "created": T0,
                                              "updated": T0 + 30, "datasets": datasets}))
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "out")


def rows(frame: Any, *columns: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in frame[list(columns)].astype(object).itertuples(index=False)]


# --- the shaped frames -----------------------------------------------------------------------


def test_the_mix_requested_against_written(run: Path) -> None:
    modes = mode_frames(run)
    assert modes.mode_datasets == ("chat", "tools") and not modes.empty
    assert dict(modes.sources) == {"chat": None, "tools": SAMPLE}
    assert rows(modes.mix, "dataset", "mode", "wanted", "records", "written", "of") == [
        ("chat", "think", 0.75, 4, 0.8, "records"), ("chat", "direct", 0.25, 1, 0.2, "records"),
        ("tools", "thinking=true", 2 / 3, 3, 2 / 3, "conversations"),
        ("tools", "thinking=false", 1 / 3, 1, 1 / 3, "conversations")]
    assert rows(modes.mix[modes.mix["dataset"] == "tools"], "conversations") == [(2,), (1,)]
    assert modes.mix["conversations"][modes.mix["dataset"] == "chat"].isna().all()
    bars = modes.bars[modes.bars["dataset"] == "chat"]
    assert rows(bars, "mode", "mix", "share") == [
        ("think", REQUESTED, 0.75), ("direct", REQUESTED, 0.25), ("think", WRITTEN, 0.8),
        ("direct", WRITTEN, 0.2)]
    assert bars["count"].isna().tolist() == [True, True, False, False]  # the count written
    assert bars["count"].dropna().tolist() == [4.0, 1.0]


def test_the_completion_tokens_per_mode(run: Path) -> None:
    tokens = mode_frames(run).tokens
    chat = tokens[tokens["dataset"] == "chat"]
    # think replies: 17, 27, 41 and 10 tokens; the direct one 7
    assert rows(chat, "mode", "reasoning", "records", "completion_tokens", "mean", "min", "q1",
                "median", "q3", "max") == [
        ("think", True, 4, 95, 23.75, 10.0, 10.0, 17.0, 27.0, 41.0),
        ("direct", False, 1, 7, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0)]
    assert rows(chat, "mean_reasoning", "mean_answer") == [(16.25, 5.5), (0.0, 6.0)]
    stats = collect_stats(run).datasets["chat"].modes
    assert stats is not None
    assert [(m.name, m.records, m.completion_tokens, m.median_completion_tokens)
            for m in stats.modes] == rows(chat, "mode", "records", "completion_tokens", "median")


def test_a_record_of_a_mode_without_thinking_is_all_answer(run: Path) -> None:
    frame = explore.record_frame(run)
    assert str(frame["mode"].dtype) == "string"
    assert list(frame.columns) == [*explore.RECORD_COLUMNS, "time"]
    direct = frame[frame["mode"] == "direct"].iloc[0]
    assert (direct["reasoning_tokens"], direct["answer_tokens"]) == (0, 6)
    assert direct["closed"] is pd_na()
    think = frame[(frame["dataset"] == "chat") & (frame["sample_id"] == 0)].iloc[0]
    assert (think["reasoning_tokens"], think["answer_tokens"], think["closed"]) == (10, 5, True)
    assert frame.loc[frame["dataset"] == "plain", "mode"].isna().all()


def pd_na() -> Any:
    import pandas as pd

    return pd.NA


def test_reasoning_is_expected_where_any_mode_thinks(tmp_path: Path) -> None:
    off = {"thinking": False}
    (tmp_path / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": {
        "quiet": {"chat_template_kwargs": off, "modes": MODES},
        "silent": {"modes": [{**MODES[1], "name": "a"}, {**MODES[1], "name": "b"}]},
        "plain": {"chat_template_kwargs": off}}}))
    reasoning = explore.run_overview(tmp_path).reasoning
    assert dict(reasoning) == {"quiet": True, "silent": False, "plain": False}


def test_a_run_without_modes_has_no_section(tmp_path: Path) -> None:
    modes = mode_frames(write_run(tmp_path / "out", modes=False))
    assert modes.empty and modes.mix.empty and modes.tokens.empty and modes.bars.empty
    assert plots.modes_view(modes) is None
    assert plots.mode_mix_figure(modes) is None and plots.mode_tokens_figure(modes) is None


# --- the blocks and figures ------------------------------------------------------------------


def test_the_view_holds_the_tables_and_names_the_sample(run: Path) -> None:
    view = plots.modes_view(mode_frames(run))
    assert isinstance(view, Rendered)
    assert "<h2>Modes</h2>" in view.html and SAMPLE in view.html
    assert view.data["mode_datasets"] == ["chat", "tools"]
    assert view.data["sources"] == {"chat": None, "tools": SAMPLE}
    chat = [row for row in view.data["mix"] if row["dataset"] == "chat"]
    assert [(r["mode"], r["wanted"], r["records"], r["written"]) for r in chat] == [
        ("think", 0.75, 4, 0.8), ("direct", 0.25, 1, 0.2)]
    assert "<td>think</td><td class=num>75.0%</td><td class=num>80.0%</td>" in view.html
    assert view.html.count(">conversations</th>") == 1  # the tools table's column


def test_the_figures_draw_the_shaped_frames(run: Path) -> None:
    modes = mode_frames(run)
    mix = plots.mode_mix_figure(modes)
    assert isinstance(mix, go.Figure)
    by_name = {trace.name: trace for trace in mix.data}
    assert list(by_name) == [REQUESTED, WRITTEN]
    assert list(by_name[WRITTEN].y) == pytest.approx([80.0, 20.0, 200 / 3, 100 / 3])
    assert [list(level) for level in by_name[WRITTEN].x] == [
        ["chat", "chat", "tools", "tools"], ["think", "direct", "thinking=true", "thinking=false"]]
    boxes = plots.mode_tokens_figure(modes)
    assert isinstance(boxes, go.Figure)
    (chat,) = [trace for trace in boxes.data if trace.name == "chat"]
    assert list(chat.x) == ["think", "direct"] and list(chat.median) == [17.0, 7.0]


# --- the notebook ----------------------------------------------------------------------------


@pytest.fixture
def plotly_defaults() -> Iterator[None]:
    """The notebook sets plotly's default template and renderer: put them back."""
    template, renderer = pio.templates.default, pio.renderers.default
    yield
    pio.templates.default, pio.renderers.default = template, renderer


def shown_values(notebook: Path, parameters: dict[str, Any]) -> dict[str, Any]:
    """Run the notebook's code cells in this process, `parameters` injected after the
    parameters cell as papermill does; the value each cell shows (its last expression's), by
    cell id."""
    space: dict[str, Any] = {}
    shown: dict[str, Any] = {}
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse("".join(cell["source"]))
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, cell["id"], "exec"), space)  # noqa: S102  (the notebook, as a kernel runs it)
        shown[cell["id"]] = (None if last is None else
                             eval(compile(ast.Expression(last.value), cell["id"], "eval"), space))
        if "parameters" in cell["metadata"].get("tags", []):
            space.update(parameters)
    return shown


@pytest.mark.usefixtures("plotly_defaults")
def test_the_notebook_shows_the_section_for_a_run_with_modes(run: Path) -> None:
    shown = shown_values(ROOT / "notebooks" / "token_distribution.ipynb",
                         {"run_dir": str(run), "sample_size": 50, "now": T0 + 60})
    view = shown["modes"]
    assert isinstance(view, Rendered) and view.data["mode_datasets"] == ["chat", "tools"]
    assert isinstance(shown["modes-mix"], go.Figure) and isinstance(shown["modes-tokens"], go.Figure)
    assert view.data == plots.modes_view(mode_frames(run)).data  # type: ignore[union-attr]


@pytest.mark.usefixtures("plotly_defaults")
def test_the_notebook_runs_on_a_run_without_modes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "out", modes=False)
    shown = shown_values(ROOT / "notebooks" / "token_distribution.ipynb",
                         {"run_dir": str(run), "sample_size": 50, "now": T0 + 60})
    assert shown["modes"] is None and shown["modes-mix"] is None and shown["modes-tokens"] is None
    assert isinstance(shown["summary"], Rendered)  # the sections before and after still show
    assert shown["budget-table"] is not None


@pytest.mark.integration
def test_the_rendered_report_records_the_section(run: Path) -> None:
    from workbench.report.render import cell_data, run_report

    result = run_report("token_distribution", None, {"run_dir": str(run), "sample_size": 50},
                        run.parent / "reports")
    shown = cell_data(result.notebook_path, "modes")
    stats = json.loads(json.dumps(collect_stats(run).to_dict()))["datasets"]
    for name in ("chat", "tools"):
        expected = [(m["mode"], m["wanted_share"], m["records"], m["completion_tokens"])
                    for m in stats[name]["modes"]["by_mode"]]
        mix = [r for r in shown["mix"] if r["dataset"] == name]
        tokens = [r for r in shown["tokens"] if r["dataset"] == name]
        assert [(r["mode"], round(r["wanted"], 4), r["records"], t["completion_tokens"])
                for r, t in zip(mix, tokens, strict=True)] == expected
    html = Path(result.html_path).read_text()
    assert "<h2>Modes</h2>" in html and SAMPLE in html
