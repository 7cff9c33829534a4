"""The data-quality section: duplicates, benchmark contamination and degenerate replies
per dataset (quality_frames), how much of each reply is inside repeated n-grams, and the
on-policy score of each reply under the target.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from workbench.report.plots.blocks import Rendered, count_text, html_table, is_nan, json_rows
from workbench.report.plots.figures import (
    LOG_TICKS,
    empty_figure,
    hover_ids,
    series_colors,
    series_groups,
)
from workbench.report.plots.style import SEVERITY_COLORS

__all__ = [
    "contamination_view",
    "quality_view",
    "repetition_figure",
    "scores_figure",
    "scores_view",
]

_QUALITY_HEADERS = {
    "duplicate_prompt": "dup prompts", "near_duplicate_prompt": "near-dup prompts",
    "duplicate_reply": "dup replies", "near_duplicate_reply": "near-dup replies",
    "contaminated_prompt": "contam. prompts", "contaminated_reply": "contam. replies",
    "repetition": "loops", "special_heavy": "special-heavy", "no_answer": "no answer",
}


def quality_view(table: pd.DataFrame, *, benchmarks: bool = False) -> Rendered:
    """The data-quality counts per dataset (quality_frames.quality_table), each with its share
    of the dataset's records (prompts for the prompt columns)."""
    rules = [c for c in _QUALITY_HEADERS if c in table.columns]
    rows = []
    for r in table.to_dict("records"):
        cells: list[object] = [r["dataset"], count_text(r["records"]), count_text(r["prompts"])]
        for rule in rules:
            base = r["prompts"] if rule.endswith("_prompt") else r["records"]
            count = int(r[rule])
            share = f" ({count / base:.1%})" if count and base and not is_nan(base) else ""
            cells.append("-" if rule.startswith("contaminated") and not benchmarks
                         else f"{count:,}{share}")
        rows.append(cells)
    headers = ["dataset", "records", "prompts", *(_QUALITY_HEADERS[r] for r in rules)]
    body = html_table(headers, rows, numeric=range(1, len(headers)),
                      caption="Duplicates, benchmark contamination and degenerate replies")
    note = ('<p class="wb-note">dup: the same ids (prompts: ids, or normalised words of a text) '
            "as an earlier prompt or reply of the run (the first copy is not counted); near-dup: "
            "a MinHash estimate of shingle overlap at the near-duplicate threshold or more; "
            "contam.: holds an n-gram of a benchmark (<code>decontaminate</code>, else the ones "
            "generate was given; '-': none); loops and special-heavy: the repetition and "
            "special_heavy rules (a reply mostly inside repeated n-grams, or mostly special "
            "ids); no answer: reasoning that "
            "never reached an answer (no think-end id, nothing after it, or cut inside it).</p>")
    return Rendered(f'<div class="wb-report">{body}{note}</div>', json_rows(table))


def repetition_figure(hist: pd.DataFrame, threshold: float,
                      title: str = "Share of each reply inside repeated n-grams") -> go.Figure:
    """explore.histogram of quality_frames.repeat_shares, the repetition rule's limit marked;
    the y axis is logarithmic: the few replies in a loop are what matters."""
    if hist.empty:
        return empty_figure(title, "no replies with ids")
    colors, fig = series_colors(hist), go.Figure()
    for name, g in series_groups(hist):
        fig.add_trace(go.Bar(
            x=(g["left"] + g["right"]) / 2 * 100, y=g["count"], name=name,
            marker_color=colors[name], width=(g["right"] - g["left"]) * 100 * 0.9 / max(1, len(series_groups(hist))),
            customdata=list(zip(g["left"] * 100, g["right"] * 100, g["share"] * 100, strict=True)),
            hovertemplate="%{customdata[0]:.0f}–%{customdata[1]:.0f}% repeated: %{y:,} replies "
                          "(%{customdata[2]:.2f}%)<extra>" + html.escape(name) + "</extra>"))
    fig.add_vline(x=threshold * 100, line={"color": SEVERITY_COLORS["warning"], "dash": "dash"},
                  annotation_text=f"repetition rule: {threshold:.0%}", annotation_position="top")
    fig.update_layout(title={"text": title}, barmode="group", xaxis_title="% of the reply's ids "
                      "inside an n-gram that occurs twice or more in its part (reasoning or answer)",
                      yaxis_title="replies (log)",
                      xaxis={"range": [0, 100]})
    fig.update_yaxes(**LOG_TICKS)
    return fig


def contamination_view(table: pd.DataFrame, notes: Sequence[str] = ()) -> Rendered:
    """Per benchmark and dataset, the prompts and replies holding one of its n-grams
    (quality_frames.contamination_table); `notes`: lines on how the benchmarks were chosen
    (the run's, files gone), shown above."""
    said = "".join(f'<p class="wb-note">{html.escape(note)}</p>' for note in notes)
    if table.empty:
        return Rendered(f'<div class="wb-report">{said}<p class="wb-note">No benchmark looked '
                        "for: pass <code>decontaminate</code> (benchmark files), or "
                        "<code>workbench generate --decontaminate</code> to keep them with the "
                        "run.</p></div>", [])
    rows = [[r["benchmark"], f"{r['items']:,}" + (f" ({r['skipped']:,} too short)" if r["skipped"] else ""),
             r["dataset"], count_text(r["prompts"]), count_text(r["replies"])]
            for r in table.to_dict("records")]
    body = html_table(["benchmark", "items", "dataset", "prompts", "replies"], rows, numeric=(3, 4),
                      caption="Records holding an n-gram of a benchmark item")
    return Rendered(f'<div class="wb-report">{said}{body}</div>', json_rows(table))


def scores_view(scores: pd.DataFrame) -> go.Figure | Rendered:
    """:func:`scores_figure` of a scored run; a line saying how to score one otherwise."""
    if scores.empty:
        return Rendered('<div class="wb-report"><p class="wb-note">Not scored: <code>workbench '
                        "score RUN --server URL</code> adds each reply's likelihood under the "
                        "target beside the run.</p></div>", [])
    return scores_figure(scores)


def scores_figure(scores: pd.DataFrame,
                  title: str = "On-policy score: mean NLL of each reply under the target") -> go.Figure:
    """Box plots of the per-record mean NLL per dataset (quality_frames.score_frame): replies
    the target finds unlikely sit high."""
    if scores.empty:
        return empty_figure(title, "not scored")
    colors, fig = series_colors(scores), go.Figure()
    for name, g in series_groups(scores):
        fig.add_trace(go.Box(y=g["nll"], name=name, marker_color=colors[name], boxpoints="outliers",
                             customdata=hover_ids(g["sample_id"]),
                             hovertemplate="sample %{customdata}: NLL %{y:.3f}<extra></extra>"))
    fig.update_layout(title={"text": title}, yaxis_title="mean NLL per token (nats)", showlegend=False)
    return fig
