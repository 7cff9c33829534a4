"""What the explorer shows of the records it selected: how many pass the filters (and the
filters in plain words), sample cards, one record in full, and the scatter of them with a
dataset menu. Model text is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.report.plots.blocks import Rendered, count_text, escaped, html_table, is_nan
from workbench.report.plots.distributions import scatter_figure
from workbench.report.plots.figures import series_groups
from workbench.report.plots.style import HEIGHT

__all__ = [
    "NO_MATCH",
    "explore_scatter",
    "record_view",
    "samples_view",
    "selection_view",
]

_FILTER_NAMES = {"dataset": "dataset", "mode": "mode", "finish_reason": "finish reason",
                 "rule": "failing rule", "sample_id": "sample id"}


def _listed(value: object) -> str:
    values = list(value) if isinstance(value, list | tuple | set) else [value]
    return ", ".join(str(v) for v in values)


def _span(low: object, high: object) -> str:
    if low is not None and high is not None:
        return f"{count_text(low)} to {count_text(high)}"
    return f"at least {count_text(low)}" if low is not None else f"at most {count_text(high)}"


def _filter_words(filters: Mapping[str, Any], searched: tuple[int, int] | None) -> list[str]:
    """The active filters in plain words: ``dataset: a, b``, ``completion tokens: 10 to 300``,
    ``reply contains "x" (searched the first 5,000 of 9,000 records)``."""
    said = [f"{_FILTER_NAMES[key]}: {_listed(filters[key])}" for key in _FILTER_NAMES if key in filters]
    for column in ("completion_tokens", "prompt_tokens"):
        low, high = filters.get(f"min_{column}"), filters.get(f"max_{column}")
        if low is not None or high is not None:
            said.append(f"{column.replace('_', ' ')}: {_span(low, high)}")
    if filters.get("truncated"):
        said.append("truncated replies only (finish length)")
    if filters.get("unclosed"):
        said.append("reasoning without a think-end id only")
    if filters.get("search"):
        part = ""
        if searched is not None and searched[0] < searched[1]:
            part = f" (searched the first {searched[0]:,} of {searched[1]:,} records)"
        said.append(f'reply contains "{filters["search"]}"{part}')
    return said


def selection_view(selected: pd.DataFrame, frame: pd.DataFrame, filters: Mapping[str, Any], *,
                   searched: tuple[int, int] | None = None, compact: bool = False) -> Rendered:
    """How many records pass the explore filters, per dataset, and the filters in plain words
    (`searched`: how many of how many records a text search read). `compact`: one line per
    fact (the explorer's status line) instead of a table."""
    active = {k: v for k, v in filters.items() if v not in (None, False, "")}
    words = "; ".join(_filter_words(active, searched)) or "none (every record)"
    counts = selected.groupby("dataset", observed=True).size()
    totals = frame.groupby("dataset", observed=True).size()
    parts = [(str(name), int(counts.get(name, 0)), int(total)) for name, total in totals.items()]
    data = {"selected": len(selected), "records": len(frame), "filters": active}
    head = f"<b>{len(selected):,}</b> of {len(frame):,} records selected"
    empty = (' <span class="wb-empty">No record matches these filters: clear one, or press Reset.</span>'
             if selected.empty and len(frame) else "")
    if compact:
        per = " · ".join(f"{escaped(name)} {n:,} of {total:,}" for name, n, total in parts)
        return Rendered(f'<div class="wb-report wb-selection"><p class="wb-note">{head} ({per}).{empty}</p>'
                        f'<p class="wb-note">Filters: {escaped(words)}.</p></div>', data)
    table = html_table(["dataset", "selected", "records"], [[name, f"{n:,}", f"{total:,}"] for name, n, total in parts],
                       numeric=(1, 2))
    return Rendered(f'<div class="wb-report"><p class="wb-note">Filters: {escaped(words)}. {head}.{empty}</p>'
                    f"{table}</div>", data)


def _turn_of(shown: Any) -> int | None:
    """A record's turn of its conversation (None for a single-turn one)."""
    return getattr(shown, "turn", None)


def _where(shown: Any) -> str:
    """What names a record beside its sample id: its turn of a conversation regenerated turn
    by turn and its mode in a dataset that mixes modes (" · turn 2 · mode direct")."""
    turn, mode = _turn_of(shown), getattr(shown, "mode", None)
    return ("" if turn is None else f" · turn {turn}") + ("" if not mode else f" · mode {mode}")


def _shown_data(shown: Any) -> dict[str, Any]:
    """A sample's or a record's data; ``turn`` only for a record of a conversation, ``mode``
    only for a record of a dataset that mixes modes."""
    data: dict[str, Any] = shown.to_dict()
    for key in ("turn", "mode"):
        if data.get(key) is None:
            data.pop(key, None)
    return data


def samples_view(samples: Sequence[Any]) -> Rendered:
    """Cards of sample records (explore.samples): reasoning and answer, escaped; a record
    of a conversation regenerated turn by turn names its turn beside the sample id."""
    cards = [_sample_card(s) for s in samples]
    body = "".join(cards) or '<p class="wb-note">No record matches the filters.</p>'
    return Rendered(f'<div class="wb-report">{body}</div>', [_shown_data(s) for s in samples])


def _sample_card(s: Any) -> str:
    title = (f"{s.dataset} · line {s.line} · sample {s.sample_id}{_where(s)} · finish {s.finish_reason} · "
             f"{count_text(s.prompt_tokens)} prompt / {count_text(s.completion_tokens)} completion tokens")
    kind = "decoded text" if s.decoded else "token ids (no tokenizer given)"
    parts = [("Reasoning", s.reasoning)] if s.reasoning is not None else []
    parts.append(("Answer", s.answer))
    blocks = "".join(f'<div class="wb-part">{escaped(name)} ({escaped(kind)})</div>'
                     f'<pre class="wb-code">{escaped(text) or "(empty)"}</pre>' for name, text in parts)
    cut = '<div class="wb-note">cut at the character limit</div>' if s.cut else ""
    return f'<div class="wb-card"><h4>{escaped(title)}</h4>{blocks}{cut}</div>'


def _stop_text(detail: Any) -> str:
    """The matched stop as its token's name and id (``<|im_end|> (163586)``), or as given."""
    if detail.matched_stop is None:
        return "-"
    name = getattr(detail, "matched_stop_name", None)
    return f"{name} ({detail.matched_stop})" if name and name != str(detail.matched_stop) else str(detail.matched_stop)


def record_view(detail: Any | None, *, notice: str | None = None) -> Rendered:
    """One record in full (explore.record_detail): counts, findings, prompt, reasoning and
    answer, model text escaped; the data is the detail itself (its ``turn`` only for a record
    of a conversation regenerated turn by turn, named beside the sample id). `notice` says
    first, in a warning box, what the user must know about it (filtered out, not found);
    without a detail the notice alone is shown."""
    said = f'<p class="wb-notice">{escaped(notice)}</p>' if notice else ""
    if detail is None:
        return Rendered(f'<div class="wb-report"><div class="wb-card wb-record-missing">{said}</div></div>',
                        {"notice": notice})
    title = f"{detail.dataset} · line {detail.line} · sample {detail.sample_id}{_where(detail)}"
    facts = [("finish reason", detail.finish_reason or "-"), ("matched stop", _stop_text(detail)),
             ("prompt tokens", count_text(detail.prompt_tokens)), ("completion tokens", count_text(detail.completion_tokens)),
             ("cached tokens", count_text(detail.cached_tokens))]
    counts = ('<p class="wb-facts">' + "".join(  # wraps in a narrow panel, unlike a table's columns
        f'<span style="display:inline-block;margin:0 16px 4px 0"><span class="wb-key">{escaped(key)}</span> '
        f"<b>{escaped(value)}</b></span>" for key, value in facts) + "</p>")
    found = "".join(f"<li><b>{escaped(rule)}</b>: {escaped(text)}</li>" for rule, text in detail.findings)
    findings = f"<ul>{found}</ul>" if found else '<p class="wb-note">no per-record findings</p>'
    kind = "decoded, special tokens shown" if detail.decoded else "token ids (no tokenizer given)"
    parts = [("Prompt", detail.prompt if detail.prompt is not None else "(not in prompts.jsonl)")]
    parts += [("Reasoning", detail.reasoning)] if detail.reasoning is not None else []
    parts.append(("Answer", detail.answer))
    blocks = "".join(f'<div class="wb-part">{escaped(name)} ({escaped(kind)})</div>'
                     f'<pre class="wb-code wb-record-{name.lower()}">{escaped(text) or "(empty)"}</pre>'
                     for name, text in parts)
    data = {**_shown_data(detail), "notice": notice}
    return Rendered(f'<div class="wb-report"><div class="wb-card wb-record">{said}<h4>{escaped(title)}</h4>'
                    f"{counts}{findings}{blocks}</div></div>", data)


NO_MATCH = "no records match the filters"


def _count_axis(values: Sequence[pd.Series]) -> dict[str, Any]:
    """A linear count axis from 0 to just past the largest value (0 to 1 when there is none),
    ticked at whole numbers: never the -1 to 1 plotly picks for a column of zeros."""
    tops = [float(v.max()) for v in values if len(v) and not is_nan(v.max())]
    top = max(tops, default=0.0)
    if top < 5:
        return {"range": [0, max(top, 1.0) * 1.08], "autorange": False, "tickmode": "linear", "tick0": 0, "dtick": 1}
    return {"range": [0, top * 1.05], "autorange": False, "tickmode": "auto", "rangemode": "nonnegative"}


def _keep_legend(fig: go.Figure) -> None:
    """Give a legend trace with no points one empty point: plotly.js leaves traces without
    data out of the legend, so a dataset whose points are all truncated lost its entry."""
    for trace in fig.data:
        if trace.showlegend is not False and trace.x is not None and len(trace.x) == 0:
            trace.update(x=[None], y=[None], customdata=None, hovertext=None)


def _no_match(fig: go.Figure) -> go.Figure:
    """An empty figure at the usual height, saying why it is empty."""
    fig.update_layout(height=HEIGHT)
    for note in fig.layout.annotations:
        note.text = NO_MATCH
    return fig


def explore_scatter(sample: pd.DataFrame, *, x: str = "prompt_tokens", y: str = "completion_tokens",
                    log: bool = False, title: str = "Records: pick a dataset in the menu",
                    compare: pd.DataFrame | None = None, compare_label: str = "run B",
                    menu: bool = True) -> go.Figure:
    """The explorer's scatter_figure: every dataset in the legend (even with only truncated
    points), count axes from 0, the usual height when empty; with `menu`, a dataset menu
    (plotly buttons: works offline, without widgets)."""
    fig = scatter_figure(sample, x=x, y=y, log=log, title=title, compare=compare, compare_label=compare_label)
    if not menu:  # the legend from the left under the title: it wraps, never runs off
        fig.update_layout(legend={"x": 0.0, "xanchor": "left"}, title={"y": 0.98, "yanchor": "top"},
                          margin={"t": 80})
    if not fig.data:
        return _no_match(fig)
    _keep_legend(fig)
    if not log:
        both = [sample] + ([compare] if compare is not None else [])
        fig.update_layout(height=HEIGHT, xaxis=_count_axis([f[x] for f in both]),
                          yaxis=_count_axis([f[y] for f in both]))
    present = [name for name, _ in series_groups(sample)]
    if not menu or not present:
        return fig
    groups = [trace.legendgroup for trace in fig.data]

    def showing(names: Sequence[str]) -> list[bool]:
        return [group in names or group not in present for group in groups]

    buttons = [{"label": "all datasets", "method": "update", "args": [{"visible": showing(present)}]}]
    buttons += [{"label": name, "method": "update", "args": [{"visible": showing([name])}]}
                for name in present]
    fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "down", "x": 0.0, "y": 1.02,
                                    "xanchor": "left", "yanchor": "bottom"}], margin={"t": 110})
    return fig
