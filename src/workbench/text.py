"""How the workbench writes numbers for people: counts, sizes, durations, rates, plain tables.

One place for these, so the stats table, the progress lines, the monitor, the reports and
the tuning summary say ``12.5m`` and ``12,345`` alike.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "format_bytes",
    "format_count",
    "format_duration",
    "format_gpu_hours",
    "format_gpus",
    "format_rate",
    "format_table",
]


def format_count(value: float | None) -> str:
    """``12,345``; ``-`` for unknown."""
    return "-" if value is None else f"{value:,.0f}"


def format_bytes(size: float | None) -> str:
    """``0 B``, ``512 B``, ``3.4 KiB``, ``12.0 MiB``, ``1.2 GiB``; ``-`` for unknown."""
    if size is None:
        return "-"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def format_duration(seconds: float | None) -> str:
    """``45s``, ``12.5m``, ``3.2h``, ``2.1d``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def format_gpu_hours(gpu_hours: float) -> str:
    """GPU-hours as the hours are shown: `0.25`, `14.6`, `1,460`."""
    if gpu_hours >= 100:
        return f"{gpu_hours:,.0f}"
    return f"{gpu_hours:.1f}" if gpu_hours >= 1 else f"{gpu_hours:.2f}"


def format_gpus(gpus: int | None) -> str:
    """`1 GPU`, `8 GPUs`."""
    return f"{gpus} GPU{'s' if gpus != 1 else ''}"


def format_rate(value: float | None) -> str:
    """``3.25``, ``42.5``, ``1,234`` per second: two decimals below 10, one below 100."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Plain aligned columns: the first ``left`` columns to the left, the others right."""
    widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])
