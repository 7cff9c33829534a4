"""The monitor's view of datasets that mix modes (``modes``: e.g. 75% with thinking on, 25%
with it off).

Under the table, one line per such dataset sets the share of each mode written so far against
the share asked for (run.json's weights; the figures of
:class:`workbench.analyze.stats.ModeStats`)::

    chat: modes  think 74.8% (want 75.0%)  direct 25.2% (want 25.0%)  from requests.jsonl

In a dataset regenerated turn by turn the shares are of its conversations (a conversation
draws its mode; the line says ``modes by conversation``), else of its records. A mode no
record has yet reads ``-``; records of a mode run.json does not name read ``(not asked)``,
records without a mode ``(no mode)``. ``from FILE`` names the deployment sample the modes
were taken from. The figures are counted as the file grows (only appended bytes are read),
so the line is right at every frame of a run being written.

On a narrow terminal each mode takes its short form (``think 74.8%/75.0%``), then the sample's
name goes, then the last modes (:mod:`workbench.watch.fit`). Datasets that mix no modes get no
line.
"""

from __future__ import annotations

from pathlib import PurePath

from workbench.analyze.stats import NO_MODE, DatasetStats, ModeFigures, ModeStats, RunStats
from workbench.watch.fit import Part, cut, fit_line
from workbench.watch.turns import NAME_KEPT

__all__ = ["mode_line", "mode_lines"]


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _mode_part(mode: ModeFigures, rank: int) -> Part:
    """`think 74.8% (want 75.0%)`, short `think 74.8%/75.0%`."""
    name = NO_MODE if mode.name is None else mode.name
    written = _share(mode.written)
    if mode.name is None:
        return Part(f"{name} {written}", rank=rank)
    if mode.wanted is None:
        return Part(f"{name} {written} (not asked)", f"{name} {written}/-", rank=rank)
    wanted = _share(mode.wanted)
    return Part(f"{name} {written} (want {wanted})", f"{name} {written}/{wanted}", rank=rank)


def _parts(name: str, modes: ModeStats) -> list[Part]:
    short = cut(name, NAME_KEPT)
    by = " by conversation" if modes.unit == "conversations" else ""
    parts = [Part(f"{name}:", None if short == name else f"{short}:", sep=""),
             Part(f"modes{by}", "modes", sep=" ")]
    # given up last: the first two modes (a mix of two reads whole); before them the later
    # modes, the last first; first of all the sample's name
    parts += [_mode_part(mode, 1 if index < 2 else index) for index, mode in enumerate(modes.modes)]
    if modes.source is not None:
        parts.append(Part(f"from {PurePath(modes.source).name}", rank=len(modes.modes) + 1))
    return parts


def mode_line(ds: DatasetStats, width: int | None = None) -> str:
    """One mixing dataset's modes, written against wanted, as one line fitted to `width`."""
    assert ds.modes is not None
    return fit_line(_parts(ds.name, ds.modes), width)


def mode_lines(stats: RunStats, width: int | None = None) -> list[str]:
    """One line per dataset that mixes modes, in the table's order (none without)."""
    return [mode_line(ds, width) for ds in stats.datasets.values() if ds.modes is not None]
