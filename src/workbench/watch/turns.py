"""The monitor's view of datasets regenerated turn by turn (``turns: each``).

Such a dataset's records are turns, not prompts: its row's done/target reads ``195/195
turns`` (run.json's ``target_turns``, as ``workbench stats`` counts it), and under the table
one line per such dataset says its conversations, turns per conversation and the
conversations ended early by reason (the figures of
:class:`workbench.analyze.stats.TurnStats`)::

    tools: 120 conversations, 1.62 turns each (max 6); ended early 88 (no_call 35, more_calls 25, ...)

On a narrow terminal the line takes its short phrases (the two most frequent reasons,
``1.62/conv``, a long dataset name cut) and gives up the least important parts, the reasons first
(:mod:`workbench.watch.fit`). Single-turn datasets get no line; their rows are unchanged.
"""

from __future__ import annotations

from workbench.analyze.stats import DatasetStats, RunStats, TurnStats
from workbench.rundir.manifest import dataset_entries
from workbench.watch.fit import Part, cut, fit_line

__all__ = ["NAME_KEPT", "SHOWN_REASONS", "TURNS_UNIT", "conversation_line", "conversation_lines", "turns_datasets"]

TURNS_UNIT = "turns"  # after a turns dataset's done/target
SHOWN_REASONS = 2  # early-end reasons a shortened line still names
NAME_KEPT = 12  # a long dataset name is cut to this many characters when the line needs room


def turns_datasets(stats: RunStats) -> frozenset[str]:
    """The datasets regenerated turn by turn: run.json says ``turns: each``, or their records
    carry a turn (a run.json that does not say)."""
    entries = dataset_entries(stats.manifest)
    return frozenset(name for name, ds in stats.datasets.items()
                     if ds.turns is not None or entries.get(name, {}).get("turns") == "each")


def _ended_parts(turns: TurnStats) -> list[Part]:
    """`ended early 88 (no_call 35, more_calls 25, ...)`, the most frequent reason first;
    shorter: the first SHOWN_REASONS reasons, then none."""
    total = sum(turns.ended.values())
    if not total:
        return [Part("none ended early", rank=2, sep="; ")]
    reasons = sorted(turns.ended.items(), key=lambda item: (-item[1], item[0]))
    said = [f"{reason} {count:,}" for reason, count in reasons]
    short = None if len(said) <= SHOWN_REASONS else "(" + ", ".join(said[:SHOWN_REASONS]) + ", …)"
    return [Part(f"ended early {total:,}", rank=2, sep="; "),
            Part("(" + ", ".join(said) + ")", short, rank=4, sep=" ")]


def _parts(ds: DatasetStats) -> list[Part]:
    short = cut(ds.name, NAME_KEPT)
    head = Part(f"{ds.name}:", None if short == ds.name else f"{short}:", sep="")
    turns = ds.turns
    if turns is None:
        return [head, Part("no turn written yet", sep=" ")]
    mean = "-" if turns.mean_turns is None else f"{turns.mean_turns:.2f}"
    return [
        head,
        Part(f"{turns.conversations:,} conversations", rank=1, sep=" "),
        Part(f"{mean} turns each (max {turns.max_turns:,})", f"{mean}/conv (max {turns.max_turns:,})",
             rank=3, sep=", "),
        *_ended_parts(turns),
    ]


def conversation_line(ds: DatasetStats, width: int | None = None) -> str:
    """One turns dataset's conversations as one line fitted to `width`."""
    return fit_line(_parts(ds), width)


def conversation_lines(stats: RunStats, width: int | None = None) -> list[str]:
    """One line per dataset regenerated turn by turn, in the table's order (none without)."""
    names = turns_datasets(stats)
    return [conversation_line(ds, width) for name, ds in stats.datasets.items() if name in names]
