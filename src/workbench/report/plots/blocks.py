"""Report blocks as HTML, and the parts every block is built of.

A block is a :class:`Rendered`: HTML in which every value is escaped (:func:`escaped`:
model text and sample ids can hold ``<script>``), plus, for the blocks tests and tools read
back, the data shown as JSON under :data:`~workbench.report.jupyter.DATA_MIME`.

    Rendered          a block of report HTML, and the data it shows
    Html, escaped     markup built here from escaped parts; the escaping of any other value
    html_table, pill  a table (numeric columns right-aligned, row classes); a coloured label
    pct, count_text, utc_text, is_nan
                      a share, a count or a time as people read it ("-" when unknown)
    json_rows         a frame as the JSON-ready rows a block carries
    REPORT_CSS, report_header
                      the reports' style sheet, carried by the header (title and run facts)
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from workbench.report.jupyter import DATA_MIME
from workbench.report.plots.style import FONT
from workbench.text import format_count

__all__ = [
    "REPORT_CSS",
    "Html",
    "Rendered",
    "count_text",
    "escaped",
    "html_table",
    "is_nan",
    "json_rows",
    "pct",
    "pill",
    "report_header",
    "utc_text",
]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A block of report HTML; `data` (JSON-ready) travels with it under DATA_MIME."""

    html: str
    data: Any = None

    def _repr_mimebundle_(
        self, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
    ) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/html": self.html, "text/plain": _plain(self.html)}
        if self.data is not None:
            bundle[DATA_MIME] = self.data
        return bundle

    def _repr_html_(self) -> str:
        return self.html


def _plain(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<style.*?</style>|<[^>]+>", " ", markup, flags=re.DOTALL)).strip()[:2000]


class Html(str):
    """Markup built here from escaped parts: inserted as is."""


def escaped(value: object) -> str:
    return value if isinstance(value, Html) else html.escape("" if value is None else str(value))


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, numeric: Iterable[int] = (),
               row_classes: Sequence[str] | None = None, caption: str | None = None) -> Html:
    right = set(numeric)

    def cells(tag: str, values: Sequence[object]) -> str:
        return "".join(f'<{tag}{" class=num" if i in right else ""}>{escaped(v)}</{tag}>'
                       for i, v in enumerate(values))

    classes = row_classes or [""] * len(rows)
    body = "".join(f'<tr class="{c}">{cells("td", r)}</tr>' for r, c in zip(rows, classes, strict=True))
    head = f"<caption>{escaped(caption)}</caption>" if caption else ""
    return Html(f'<table class="wb-table">{head}<thead><tr>{cells("th", headers)}</tr></thead>'
                f"<tbody>{body}</tbody></table>")


def pill(label: str, color: str) -> Html:
    return Html(f'<span class="wb-pill" style="background:{color}">{escaped(label)}</span>')


def pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or is_nan(value) else f"{value:.{digits}%}"


def is_nan(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def count_text(value: object) -> str:
    return "-" if is_nan(value) else format_count(float(value))  # type: ignore[arg-type]


def utc_text(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def json_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame as JSON-ready rows (NA and NaN as null, numpy scalars as Python ones)."""
    import json

    return json.loads(frame.to_json(orient="records", date_format="iso"))  # type: ignore[no-any-return]


REPORT_CSS = """
.wb-report{font-family:__FONT__;color:#1f2933}
.wb-header{border-bottom:3px solid #4C78A8;padding:4px 0 14px;margin-bottom:8px}
.wb-kicker{text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:#4C78A8;font-weight:600}
.wb-report .wb-header h1{font-size:28px;margin:4px 0 12px;font-weight:650}
.wb-meta{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:5px 32px;font-size:13px}
.wb-item{display:flex;gap:12px;min-width:0}
.wb-key{color:#616e7c;font-weight:500;flex:0 0 130px}
.wb-value{font-family:ui-monospace,Menlo,Consolas,monospace;overflow-wrap:anywhere;min-width:0}
.wb-table{border-collapse:collapse;font-size:13px;margin:6px 0 14px;min-width:50%}
.wb-table caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0 6px;color:#323f4b}
.wb-report .wb-table th{background:#f1f4f8;color:#323f4b;font-weight:600;text-align:left;padding:6px 10px;border:0;border-bottom:2px solid #cbd2d9;white-space:nowrap}
.wb-report .wb-table td{padding:5px 10px;border:0;border-bottom:1px solid #e4e7eb;vertical-align:top;text-align:left;background:none}
.wb-report .wb-table .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.wb-report .wb-table tr.total td{font-weight:650;border-top:2px solid #9aa5b1;background:#fafbfc}
.wb-table tr.sev-error td:first-child{box-shadow:inset 4px 0 #C62828}
.wb-table tr.sev-warning td:first-child{box-shadow:inset 4px 0 #E67E00}
.wb-table tr.sev-info td:first-child{box-shadow:inset 4px 0 #1F6FB2}
.wb-table tr.sev-ok td:first-child{box-shadow:inset 4px 0 #2E7D32}
.wb-pill{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600}
.wb-report .wb-banner{border-radius:8px;padding:16px 20px;margin:8px 0 16px;color:#fff}
.wb-banner .wb-big{font-size:22px;font-weight:700}.wb-banner .wb-sub{font-size:14px;margin-top:4px;opacity:.95}
.wb-banner.pass{background:#2E7D32}.wb-banner.fail{background:#C62828}.wb-banner.concern{background:#B45F06}
.wb-report .wb-code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere;margin:0;max-height:14em;overflow:auto;background:#f7f9fb;padding:4px 6px;border-radius:4px}
.wb-report .wb-table .wb-code{min-width:36ch;max-width:80ch}
.wb-report .wb-flag{white-space:nowrap;font-family:ui-monospace,Menlo,Consolas,monospace}
.wb-report .wb-card{border:1px solid #d9e2ec;border-radius:8px;padding:10px 14px;margin:10px 0}
.wb-report .wb-card h4{margin:0 0 6px;font-size:14px;font-weight:650}.wb-report .wb-part{font-size:12px;color:#616e7c;margin:6px 0 2px;font-weight:600}
.wb-report .wb-note{color:#616e7c;font-size:13px;margin:2px 0 10px}
""".replace("__FONT__", FONT)


def report_header(overview: Any, title: str) -> Rendered:
    """The report's title and run facts (a RunOverview); also carries REPORT_CSS."""
    rows = [
        ("Run directory", str(overview.run_dir)), ("Model", overview.model or "-"),
        ("Model profile", overview.model_profile), ("Server", overview.server_url or "-"),
        ("Run started", utc_text(overview.created)), ("Run updated", utc_text(overview.updated)),
        ("Datasets", ", ".join(overview.datasets)), ("Report generated", utc_text(overview.generated)),
    ]
    items = "".join(f'<div class="wb-item"><span class="wb-key">{escaped(k)}</span>'
                    f'<span class="wb-value">{escaped(v)}</span></div>' for k, v in rows)
    version = f" · workbench {overview.workbench_version}" if overview.workbench_version else ""
    return Rendered(
        f'<div class="wb-report"><style>{REPORT_CSS}</style><div class="wb-header">'
        f'<div class="wb-kicker">EAGLE-3 data workbench{escaped(version)}</div><h1>{escaped(title)}</h1>'
        f'<div class="wb-meta">{items}</div></div></div>'
    )
