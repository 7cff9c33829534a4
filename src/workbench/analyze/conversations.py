"""Datasets regenerated turn by turn (``turns: each``) as the token-distribution report's
"Conversations" section shows them: one record per generated assistant turn, its ``turn``
(0-based) and, on the turn after which its conversation could not go on, ``ended`` (a reason
of :data:`workbench.chat.END_REASONS`).

    turn_datasets         the datasets regenerated turn by turn
    conversation_frames   per such dataset its conversations, turns per conversation,
                          completion tokens by turn index (quartiles) and the
                          conversations ended early by reason (Conversations)

Shaped from the record frame (:func:`workbench.analyze.frames.record_frame`, its ``turn`` and
``ended`` columns), from one scan of the run. The figures count as ``workbench stats`` does
(:class:`workbench.analyze.stats.TurnStats`): a conversation is a sample id, its turns are
its records with a turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.analyze.frames import RunSource, labelled, record_frame, scanned
from workbench.analyze.scan import RunScan
from workbench.chat import END_REASONS
from workbench.rundir.columns import Columns
from workbench.rundir.layout import DatasetDir

__all__ = [
    "ENDED_COLUMNS",
    "PER_CONVERSATION_COLUMNS",
    "SUMMARY_COLUMNS",
    "TURN_TOKEN_COLUMNS",
    "Conversations",
    "conversation_frames",
    "turn_datasets",
]

SUMMARY_COLUMNS = ["dataset", "conversations", "turns", "mean_turns", "max_turns", "ended_early",
                   "ended_share"]
PER_CONVERSATION_COLUMNS = ["dataset", "turns", "conversations", "share"]
TURN_TOKEN_COLUMNS = ["dataset", "turn", "records", "counted", "completion_tokens", "mean", "min",
                      "q1", "median", "q3", "max"]
ENDED_COLUMNS = ["dataset", "reason", "conversations", "share", "meaning"]


@dataclass(frozen=True, slots=True)
class Conversations:
    """The conversations of a run's turns datasets, as the report draws them.

    ``summary``: per turns dataset its conversations, turns (records), mean and max turns per
    conversation, conversations ended early and their share. ``per_conversation``: how many
    conversations have n turns (``share`` of the dataset's conversations).
    ``turn_tokens``: per turn index its records, those with a completion count
    (``counted``), their completion tokens in total, mean, min, quartiles and max.
    ``ended``: conversations ended early per reason, with its share of the dataset's
    conversations and what the reason means. Every frame's ``dataset`` is categorical over
    all the run's datasets (a dataset keeps its colour across the report).
    """

    datasets: tuple[str, ...]
    turn_datasets: tuple[str, ...]
    summary: pd.DataFrame
    per_conversation: pd.DataFrame
    turn_tokens: pd.DataFrame
    ended: pd.DataFrame

    @property
    def empty(self) -> bool:
        """No dataset of the run is regenerated turn by turn."""
        return not self.turn_datasets


def _is_turns(ds: DatasetDir | None, columns: Columns) -> bool:
    said = ds is not None and ds.settings.get("turns") == "each"
    return said or any(turn is not None for turn in columns.turn)


def turn_datasets(scan: RunScan) -> tuple[str, ...]:
    """The datasets regenerated turn by turn: run.json says ``turns: each``, or their records
    carry a turn."""
    settings = {ds.name: ds for ds in scan.run.datasets}
    return tuple(name for name, file in scan.files.items()
                 if _is_turns(settings.get(name), file.columns))


def _summary(name: str, records: pd.DataFrame) -> dict[str, Any]:
    per = records.groupby("sample_id", sort=False).size()
    ended = int(records["ended"].notna().sum())
    conversations = len(per)
    return {"dataset": name, "conversations": conversations, "turns": len(records),
            "mean_turns": len(records) / conversations if conversations else np.nan,
            "max_turns": int(per.max()) if conversations else 0, "ended_early": ended,
            "ended_share": ended / conversations if conversations else np.nan}


def _per_conversation(name: str, records: pd.DataFrame) -> pd.DataFrame:
    counts = records.groupby("sample_id", sort=False).size().value_counts().sort_index()
    total = max(1, int(counts.sum()))
    return pd.DataFrame({"dataset": name, "turns": counts.index.astype("int64"),
                         "conversations": counts.to_numpy(dtype="int64"),
                         "share": counts.to_numpy(dtype="float64") / total})


def _turn_row(name: str, turn: int, group: pd.DataFrame) -> dict[str, Any]:
    known = group["completion_tokens"].dropna().to_numpy(dtype="float64")
    q = np.quantile(known, [0.0, 0.25, 0.5, 0.75, 1.0]) if known.size else [np.nan] * 5
    return {"dataset": name, "turn": int(turn), "records": len(group), "counted": int(known.size),
            "completion_tokens": int(known.sum()), "mean": known.mean() if known.size else np.nan,
            "min": q[0], "q1": q[1], "median": q[2], "q3": q[3], "max": q[4]}


def _turn_tokens(name: str, records: pd.DataFrame) -> pd.DataFrame:
    rows = [_turn_row(name, int(turn), group)
            for turn, group in records.groupby("turn", sort=True)]
    return pd.DataFrame(rows, columns=TURN_TOKEN_COLUMNS)


def _ended(name: str, records: pd.DataFrame, conversations: int) -> pd.DataFrame:
    counts = records["ended"].dropna().astype(str).value_counts()
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return pd.DataFrame([{"dataset": name, "reason": reason, "conversations": int(count),
                          "share": count / conversations if conversations else np.nan,
                          "meaning": END_REASONS.get(reason, "")} for reason, count in ordered],
                        columns=ENDED_COLUMNS)


def _frame(parts: Sequence[pd.DataFrame], columns: list[str], names: Sequence[str]) -> pd.DataFrame:
    kept = [part for part in parts if not part.empty]
    frame = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=columns)
    return labelled(frame[columns], names)


def _turn_records(scan: RunScan, chosen: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Per chosen dataset, its records that have a turn (rows of the record frame)."""
    if not chosen:
        return {}
    frame = record_frame(scan, datasets=chosen)
    frame = frame[frame["turn"].notna()]
    names = frame["dataset"].astype(str)
    return {name: frame[names == name] for name in chosen}


def conversation_frames(source: RunSource, *, model_profile: str | None = None) -> Conversations:
    """The conversations of every dataset regenerated turn by turn (see
    :class:`Conversations`); empty frames when the run has none. `source`: the run directory
    or its scan (:func:`workbench.analyze.scan.scan_run`), read once."""
    scan = scanned(source, model_profile)
    names = [ds.name for ds in scan.run.datasets] or list(scan.files)
    chosen = turn_datasets(scan)
    records = _turn_records(scan, chosen)
    summary = [_summary(name, part) for name, part in records.items()]
    counts = [int(row["conversations"]) for row in summary]
    return Conversations(
        datasets=tuple(names),
        turn_datasets=chosen,
        summary=labelled(pd.DataFrame(summary, columns=SUMMARY_COLUMNS), names),
        per_conversation=_frame([_per_conversation(n, r) for n, r in records.items()],
                                PER_CONVERSATION_COLUMNS, names),
        turn_tokens=_frame([_turn_tokens(n, r) for n, r in records.items()], TURN_TOKEN_COLUMNS, names),
        ended=_frame([_ended(n, r, c) for (n, r), c in zip(records.items(), counts, strict=True)],
                     ENDED_COLUMNS, names),
    )
