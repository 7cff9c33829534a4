"""One line of a monitor frame fitted to a width, never wrapped.

A line is a sequence of :class:`Part` s, each with a full form, maybe a shorter one, and a
rank (0: always kept; higher: given up earlier). :func:`fit_line` tries, in this order, until
the line fits: every part in full; the parts in their short form, least important first; a
shrinkable part (a path) cut from the left; the parts dropped, least important first; and
last the line cut with an ellipsis (rich's :meth:`~rich.text.Text.truncate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

__all__ = ["Part", "cut", "fit_line", "shrink_left"]

MIN_SHRUNK = 12  # a shrunk part keeps at least this many characters


@dataclass(frozen=True, slots=True)
class Part:
    """One phrase of a line: `sep` goes before it unless it comes first (a space instead
    after a part that ends with a colon)."""

    full: str
    short: str | None = None
    rank: int = 0
    sep: str = "  "
    shrink: bool = False


def cut(text: str, width: int | None) -> str:
    """`text` ending in an ellipsis when it is longer than `width`."""
    if width is None or len(text) <= width:
        return text
    line = Text(text)
    line.truncate(width, overflow="ellipsis")
    return line.plain


def shrink_left(text: str, width: int) -> str:
    """`text` cut from the left to `width` characters: `…/runs/demo`."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1:]


def _join(parts: Sequence[Part], forms: dict[int, str]) -> str:
    line = ""
    for index, part in enumerate(parts):
        if index not in forms:
            continue
        if line:
            line += " " if line.endswith(":") and part.sep.strip() in ("", ",") else part.sep
        line += forms[index]
    return line


def _shrunk(parts: Sequence[Part], forms: dict[int, str], width: int) -> dict[int, str]:
    """forms with the shrinkable parts cut from the left so that the line fits, when they
    can keep MIN_SHRUNK characters."""
    excess = len(_join(parts, forms)) - width
    result = dict(forms)
    for index in [i for i in forms if parts[i].shrink]:
        if excess <= 0:
            break
        room = len(result[index]) - excess
        if room >= MIN_SHRUNK:
            result[index] = shrink_left(result[index], room)
            excess = 0
    return result


def fit_line(parts: Sequence[Part], width: int | None) -> str:
    """The parts as one line of at most `width` characters (all in full without a width)."""
    forms = {i: part.full for i, part in enumerate(parts)}
    if width is None:
        return _join(parts, forms)
    least_first = sorted(range(len(parts)), key=lambda i: (-parts[i].rank, -i))
    candidates = [dict(forms)]
    for index in least_first:
        if parts[index].short is not None:
            forms[index] = parts[index].short or ""
            candidates.append(dict(forms))
    shortened = len(candidates) - 1  # from here on a shrinkable part may be cut
    for index in least_first:
        if parts[index].rank > 0:
            del forms[index]
            candidates.append(dict(forms))
    for number, candidate in enumerate(candidates):
        attempts = [candidate] if number < shortened else [candidate, _shrunk(parts, candidate, width)]
        for attempt in attempts:
            line = _join(parts, attempt)
            if len(line) <= width:
                return line
    return cut(_join(parts, candidates[-1]), width)
