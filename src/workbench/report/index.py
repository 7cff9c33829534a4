"""The renderings in a reports folder, and ``index.html``: one page to browse them all.

A rendering is a folder ``OUT/NAME-<YYYYmmdd-HHMMSS>[-k]/`` holding ``report.json``
(:mod:`workbench.report.provenance`), the executed notebook and, when it finished, its HTML.
:func:`renderings` reads them (newest first); :func:`write_index` writes ``OUT/index.html``:
one table per report (the report with the newest rendering first), one row per rendering,
newest first: its time, the run it read, whether its inputs changed since the previous
rendering of that report and run, its cell errors (or why it failed), and relative links to
its HTML and its executed notebook. The page has its style inline and no script: it opens
offline, from the folder or a copy of it. :func:`workbench.report.render.run_report`
rewrites it after every rendering.

:func:`prune` removes a report's older renderings, keeping the newest N and always the one
``NAME-latest`` points at.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.report.provenance import MANIFEST
from workbench.rundir.storage import storage_error

__all__ = ["INDEX", "Rendering", "latest_rendering", "prune", "renderings", "write_index"]

INDEX = "index.html"


@dataclass(frozen=True, slots=True)
class Rendering:
    """One report folder as its report.json describes it."""

    name: str
    folder: Path
    started: float
    finished: float | None
    run: str | None
    inputs_changed: bool | None  # None: the first rendering of this report and run
    cell_errors: int | None
    error: str | None

    @property
    def html(self) -> Path | None:
        path = self.folder / f"{self.name}.html"
        return path if self.finished is not None and path.is_file() else None

    @property
    def notebook(self) -> Path | None:
        path = self.folder / f"{self.name}.ipynb"
        return path if path.is_file() else None

    @property
    def ok(self) -> bool:
        return self.finished is not None and self.error is None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _rendering(folder: Path) -> Rendering | None:
    """The folder's rendering; None when it holds no readable report.json."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("report"), str):
        return None
    started = _number(manifest.get("started"))
    changed = manifest.get("inputs_changed")
    errors = manifest.get("cell_errors")
    return Rendering(
        name=manifest["report"], folder=folder, started=started if started is not None else 0.0,
        finished=_number(manifest.get("finished")),
        run=manifest["run"] if isinstance(manifest.get("run"), str) else None,
        inputs_changed=changed if isinstance(changed, bool) else None,
        cell_errors=errors if isinstance(errors, int) and not isinstance(errors, bool) else None,
        error=str(manifest["error"]) if manifest.get("error") is not None else None)


def renderings(out_dir: str | os.PathLike[str], name: str | None = None) -> list[Rendering]:
    """The renderings in `out_dir` (of report `name` only, when given), newest first; the
    ``-latest`` links are not read (their target is)."""
    root = Path(out_dir)
    if not root.is_dir():
        return []
    found = [r for folder in root.iterdir()
             if folder.is_dir() and not folder.is_symlink() and (r := _rendering(folder)) is not None]
    chosen = [r for r in found if name is None or r.name == name]
    return sorted(chosen, key=lambda r: (r.started, r.folder.name), reverse=True)


def latest_rendering(out_dir: str | os.PathLike[str], name: str, run: str | None) -> Rendering | None:
    """The newest finished rendering of report `name` that read `run`, or None."""
    return next((r for r in renderings(out_dir, name) if r.ok and r.run == run), None)


def _latest_target(out_dir: Path, name: str) -> Path | None:
    link = out_dir / f"{name}-latest"
    with contextlib.suppress(OSError):
        if link.is_symlink():
            return link.resolve()
    return None


def prune(out_dir: str | os.PathLike[str], name: str, keep: int) -> list[Path]:
    """Remove report `name`'s renderings but the newest `keep` (at least 1) and the one
    ``NAME-latest`` points at; the folders removed."""
    root = Path(out_dir)
    latest = _latest_target(root, name)
    removed = []
    for rendering in renderings(root, name)[max(1, keep):]:
        if latest is not None and rendering.folder.resolve() == latest:
            continue
        shutil.rmtree(rendering.folder, ignore_errors=True)
        removed.append(rendering.folder)
    return removed


_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; color: #1f2933;
  max-width: 1200px; margin: 0 auto; padding: 24px 32px 48px; font-size: 14px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin: 28px 0 6px; padding-top: 12px; border-top: 1px solid #e4e7eb; }
p.meta { color: #52606d; margin-top: 0; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid #e4e7eb; vertical-align: top; }
th { font-weight: 600; color: #52606d; }
td.run { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
span.failed { color: #b42318; }
.latest { color: #1769aa; font-size: 12px; margin-left: 6px; }
"""


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _link(path: Path | None, root: Path, label: str) -> str:
    if path is None:
        return "&mdash;"
    href = path.relative_to(root).as_posix()
    return f'<a href="{html.escape(href, quote=True)}">{html.escape(label)}</a>'


def _changed(rendering: Rendering) -> str:
    return {True: "changed", False: "unchanged", None: "first"}[rendering.inputs_changed]


def _errors(rendering: Rendering) -> str:
    if rendering.error is not None:
        return f'<span class="failed">{html.escape(rendering.error)}</span>'
    if rendering.finished is None:
        return '<span class="failed">not finished</span>'
    count = rendering.cell_errors
    return "&mdash;" if count is None else f'<span class="failed">{count}</span>' if count else "0"


def _row(rendering: Rendering, root: Path, latest: Path | None) -> str:
    mark = ('<span class="latest">latest</span>'
            if latest is not None and rendering.folder.resolve() == latest else "")
    state = "ok" if rendering.ok else "failed"
    return (f'<tr class="{state}"><td>{html.escape(_when(rendering.started))}{mark}</td>'
            f'<td class="run">{html.escape(rendering.run or "")}</td>'
            f"<td>{html.escape(_changed(rendering))}</td><td>{_errors(rendering)}</td>"
            f"<td>{_link(rendering.html, root, 'HTML')}</td>"
            f"<td>{_link(rendering.notebook, root, 'notebook')}</td></tr>")


def _group(name: str, items: list[Rendering], root: Path) -> str:
    latest = _latest_target(root, name)
    rows = "\n".join(_row(r, root, latest) for r in items)
    head = ("<tr><th>time</th><th>run</th><th>inputs</th><th>cell errors</th>"
            "<th>report</th><th>executed notebook</th></tr>")
    return (f'<h2 id="{html.escape(name, quote=True)}">{html.escape(name)} '
            f'<small>({len(items)})</small></h2>\n<table class="renderings" data-report='
            f'"{html.escape(name, quote=True)}">\n{head}\n{rows}\n</table>')


def _grouped(items: Iterable[Rendering]) -> dict[str, list[Rendering]]:
    """Renderings by report, in the order of each report's newest (items are newest first)."""
    groups: dict[str, list[Rendering]] = {}
    for rendering in items:
        groups.setdefault(rendering.name, []).append(rendering)
    return groups


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def index_html(out_dir: str | os.PathLike[str], now: float | None = None) -> str:
    """The index page of the renderings in `out_dir` (links relative to it)."""
    root = Path(out_dir)
    items = renderings(root)
    groups = _grouped(items)
    body = "\n".join(_group(name, rows, root) for name, rows in groups.items())
    stamp = _when(time.time() if now is None else now)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f"<title>Reports: {html.escape(root.resolve().name)}</title>\n<style>{_STYLE}</style>"
            f"</head>\n<body>\n<h1>Reports</h1>\n<p class=\"meta\">{_count(len(items), 'rendering')} of "
            f"{_count(len(groups), 'report')} in {html.escape(str(root.resolve()))}, listed {stamp}</p>\n"
            f"{body or '<p>No renderings yet.</p>'}\n</body></html>\n")


def write_index(out_dir: str | os.PathLike[str], now: float | None = None) -> Path:
    """Write ``OUT/index.html`` (replaced whole); its path. StorageError naming it when it
    cannot be written (no temp file is left)."""
    root = Path(out_dir)
    path = root / INDEX
    temporary = root / f".{INDEX}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        temporary.write_text(index_html(root, now), encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise storage_error(path, exc) from None
    return path
