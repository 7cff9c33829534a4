"""The workbench figure style, and where figures render.

    PALETTE           a dataset's colour, by its position in the ``dataset`` categories
    REASON_COLORS, SEVERITY_COLORS, PART_COLORS
                      the fixed colours of finish reasons, severities, reasoning and answer
    TEMPLATE, HEIGHT, FONT
                      the plotly template every figure is drawn in
    setup_notebook    the template as plotly's default, and the renderer for where the
                      notebook runs
    OfflineRenderer   figures as HTML that opens offline: plotly.js inlined once
"""

from __future__ import annotations

import os
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

from workbench.report.jupyter import REPORT_ENV, fast_jupyter_imports

__all__ = [
    "FONT",
    "HEIGHT",
    "PALETTE",
    "PART_COLORS",
    "REASON_COLORS",
    "SEVERITY_COLORS",
    "TEMPLATE",
    "OfflineRenderer",
    "setup_notebook",
]

PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B",
           "#9D755D", "#FF9DA6", "#79706E")
REASON_COLORS = {"stop": "#4C9F70", "length": "#E3A33B", "abort": "#C62828", "missing": "#A0A0A0"}
SEVERITY_COLORS = {"error": "#C62828", "warning": "#E67E00", "info": "#1F6FB2", "ok": "#2E7D32"}
PART_COLORS = {"reasoning": "#334E68", "answer": "#9FB3C8"}
FONT = "Inter, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
TEMPLATE = "workbench"
HEIGHT = 420


def _template() -> go.layout.Template:
    layout = go.Layout(
        font={"family": FONT, "size": 13, "color": "#1f2933"},
        title={"x": 0.0, "xanchor": "left", "font": {"size": 16}},
        colorway=list(PALETTE),
        margin={"l": 70, "r": 30, "t": 70, "b": 60},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1.0},
        hoverlabel={"font": {"family": FONT}},
        height=HEIGHT,
    )
    return go.layout.Template(layout=layout)


class OfflineRenderer(MimetypeRenderer):  # type: ignore[misc]
    """Figures as HTML that needs no network: plotly.js inlined in the first figure drawn
    (an exported notebook is read top to bottom), no MathJax; plus the plotly mimetype,
    which JupyterLab draws instead."""

    def __init__(self) -> None:
        self.drawn: list[bool] = []  # shared by the shallow copies plotly renders with

    def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, Any]:
        markup = pio.to_html(
            fig_dict, include_plotlyjs=not self.drawn, include_mathjax=False, full_html=False,
            default_width="100%", config={"displaylogo": False, "responsive": True}, validate=False)
        self.drawn.append(True)
        return {**pio.renderers["plotly_mimetype"].to_mimebundle(fig_dict), "text/html": markup}


def setup_notebook(offline: bool | None = None) -> None:
    """Figures in the workbench style, rendered for where the notebook runs.

    In a report run (`offline`, by default when :data:`REPORT_ENV` is set, as
    :mod:`workbench.report.render` does for its kernels) with plotly.js inlined once
    (OfflineRenderer), so the exported HTML opens offline. Elsewhere (JupyterLab) only the
    plotly mimetype, which Lab draws with its own plotly.js: a saved notebook then holds the
    figures' data, not a copy of the library (megabytes per save).
    """
    fast_jupyter_imports()  # plotly's renderers import nbformat
    # merged once: a "plotly_white+workbench" default is merged again for every figure
    pio.templates[TEMPLATE] = pio.templates.merge_templates("plotly_white", _template())
    pio.templates.default = TEMPLATE
    if offline is None:
        offline = os.environ.get(REPORT_ENV) == "1"
    if offline:
        pio.renderers[TEMPLATE] = OfflineRenderer()
        pio.renderers.default = TEMPLATE
    else:
        pio.renderers.default = "plotly_mimetype"
