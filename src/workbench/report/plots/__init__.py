"""Figures and report blocks drawn from shaped data (see :mod:`workbench.analyze.explore`).

Figure builders return :class:`plotly.graph_objects.Figure` and compute no statistics: the
frames they take already hold every number drawn. Report blocks (header, tables, banner,
samples) return :class:`Rendered`: HTML in which every value is escaped (model text and
sample ids can hold ``<script>``), plus, for the blocks tests and tools read back, the data
shown as JSON under :data:`DATA_MIME`.

Colours are stable across a report: a dataset's colour is its position in the ``dataset``
categories of the frame (every shaped frame lists all of the run's datasets there);
finish reasons and severities have fixed colours.

What a report shows is so, and says what it rests on:

- a state is said as it is: a dataset its ``max_tokens`` budget stopped says "budget reached"
  (tables.progress_state), never an ETA, and a total agrees with its rows;
- a claim shows its threshold: a finding's count says what it is out of (records, or
  prompts), a rule's limit is drawn where its rate is;
- a marker the text names is the one drawn, and the legend says what each means:
  TRUNCATED_SYMBOL crosses, UNCLOSED_SYMBOL open diamonds, FEW_SYMBOL grey open circles;
- units fit the range: token axes are logarithmic where the data want it
  (frames.log_axes), counts and rates never share an axis;
- an info finding never outweighs a warning: findings_figure draws errors and warnings
  and lists the info findings;
- overlapping distributions are outlines, never translucent fills that blend.

:func:`setup_notebook` makes figures render, in a report run, with plotly.js inlined once
in the notebook (so an exported HTML file opens offline; see :class:`OfflineRenderer`) and
with the plotly mimetype as well; in JupyterLab with the mimetype only (Lab draws it), so
saving a notebook never stores plotly.js.

The package, by concern; what notebooks, the explorer and tests call is re-exported here
(``from workbench.report import plots; plots.histogram_figure(...)``):

    style          colours, the plotly template, setup_notebook, OfflineRenderer
    blocks         Rendered, escaped HTML tables, the reports' CSS and header
    figures        what figures share: a dataset's colour, the empty figure, log axes
    progress       where a run stands: stats_view, budget_view, budget_figure
    distributions  token distributions: histogram, CDF, scatter, reasoning, finish reasons
    conversations  datasets regenerated turn by turn: turns per conversation, tokens by
                   turn index, conversations ended early
    modes          datasets that mix modes: the mix requested against written, completion
                   tokens by mode (absent, None, for a run without such a dataset)
    findings       the validation report: banner, findings and examples, findings figures
    quality        duplicates, benchmark contamination, loops, on-policy scores
    subset         the sent subset against the whole dataset
    selection      the explorer: the records selected, sample cards, one record, its scatter
"""

from __future__ import annotations

from workbench.report.plots.blocks import REPORT_CSS, Rendered, report_header
from workbench.report.plots.conversations import (
    NO_TURNS,
    conversations_view,
    ended_figure,
    turn_tokens_figure,
    turns_per_conversation_figure,
)
from workbench.report.plots.distributions import (
    COMPARED,
    TRUNCATED_SYMBOL,
    UNCLOSED_SYMBOL,
    cdf_figure,
    finish_mix_figure,
    histogram_figure,
    reasoning_figure,
    scatter_figure,
)
from workbench.report.plots.findings import (
    FEW_SYMBOL,
    examples_view,
    findings_figure,
    findings_over_time_figure,
    findings_view,
    validation_banner,
)
from workbench.report.plots.modes import (
    MIX_COLORS,
    mode_mix_figure,
    mode_tokens_figure,
    modes_view,
)
from workbench.report.plots.progress import budget_figure, budget_view, stats_view
from workbench.report.plots.quality import (
    contamination_view,
    quality_view,
    repetition_figure,
    scores_figure,
    scores_view,
)
from workbench.report.plots.selection import (
    NO_MATCH,
    explore_scatter,
    record_view,
    samples_view,
    selection_view,
)
from workbench.report.plots.style import (
    HEIGHT,
    PALETTE,
    REASON_COLORS,
    SEVERITY_COLORS,
    OfflineRenderer,
    setup_notebook,
)
from workbench.report.plots.subset import subset_lengths_figure, subset_view

__all__ = [
    "COMPARED",
    "FEW_SYMBOL",
    "HEIGHT",
    "MIX_COLORS",
    "NO_MATCH",
    "NO_TURNS",
    "PALETTE",
    "REASON_COLORS",
    "REPORT_CSS",
    "SEVERITY_COLORS",
    "TRUNCATED_SYMBOL",
    "UNCLOSED_SYMBOL",
    "OfflineRenderer",
    "Rendered",
    "budget_figure",
    "budget_view",
    "cdf_figure",
    "contamination_view",
    "conversations_view",
    "ended_figure",
    "examples_view",
    "explore_scatter",
    "findings_figure",
    "findings_over_time_figure",
    "findings_view",
    "finish_mix_figure",
    "histogram_figure",
    "mode_mix_figure",
    "mode_tokens_figure",
    "modes_view",
    "quality_view",
    "reasoning_figure",
    "record_view",
    "repetition_figure",
    "report_header",
    "samples_view",
    "scatter_figure",
    "scores_figure",
    "scores_view",
    "selection_view",
    "setup_notebook",
    "stats_view",
    "subset_lengths_figure",
    "subset_view",
    "turn_tokens_figure",
    "turns_per_conversation_figure",
    "validation_banner",
]
