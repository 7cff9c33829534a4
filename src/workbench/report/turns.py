"""Datasets regenerated turn by turn (``turns: each``) shaped for the reports: one record per
generated assistant turn, its ``turn`` (0-based) and, on the turn after which its
conversation could not go on, ``ended`` (a reason of :data:`workbench.chat.END_REASONS`).

    conversation_frames   the token-distribution report's "Conversations" section: per
                          dataset its conversations, turns per conversation, completion
                          tokens by turn index and the conversations ended early by reason
    record_turns          each record's turn beside its dataset and line (NA when single-turn)
    with_turns            a frame of records (dataset, line) with a ``turn`` column added
                          beside ``sample_id``
    examples_with_turns   explore.examples_table with the example records' turn

Everything is shaped from the run's one scan (:func:`workbench.analyze.scan.scan_run`, its
per-record ``turn`` and ``ended`` columns) and, for the examples that are prompts.jsonl lines,
from the prompts' summary; nothing computes what :mod:`workbench.analyze` does not give. The
figures count as ``workbench stats`` does (:class:`workbench.analyze.stats.TurnStats`): a
conversation is a sample id, its turns are its records with a turn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analyze.frames import RunSource, labelled, scanned
from workbench.analyze.readback import examples_table
from workbench.analyze.scan import RunScan
from workbench.chat import END_REASONS
from workbench.rundir import prompt_scan
from workbench.rundir.columns import Columns
from workbench.rundir.layout import PROMPTS_FILE, RAW_FILE, DatasetDir

__all__ = [
    "ENDED_COLUMNS",
    "PER_CONVERSATION_COLUMNS",
    "SUMMARY_COLUMNS",
    "TURN_TOKEN_COLUMNS",
    "Conversations",
    "conversation_frames",
    "examples_with_turns",
    "record_turns",
    "turn_datasets",
    "with_turns",
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


def _turn_records(name: str, columns: Columns) -> pd.DataFrame:
    """The records of one dataset that have a turn: sample_id, turn, completion_tokens, ended."""
    frame = pd.DataFrame({
        "sample_id": pd.Series(columns.sample_id, dtype="object"),
        "turn": pd.array(columns.turn, dtype="Int64"),
        "completion_tokens": pd.array(columns.completion_tokens, dtype="Int64"),
        "ended": pd.Series(columns.ended, dtype="object"),
    })
    frame = frame[frame["turn"].notna()]
    frame.insert(0, "dataset", name)
    return frame


def _summary(name: str, records: pd.DataFrame) -> dict[str, object]:
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


def _turn_row(name: str, turn: int, group: pd.DataFrame) -> dict[str, object]:
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


def conversation_frames(source: RunSource, *, model_profile: str | None = None) -> Conversations:
    """The conversations of every dataset regenerated turn by turn (see
    :class:`Conversations`); empty frames when the run has none. `source`: the run directory
    or its scan (:func:`workbench.analyze.scan.scan_run`), read once."""
    scan = scanned(source, model_profile)
    names = [ds.name for ds in scan.run.datasets] or list(scan.files)
    chosen = turn_datasets(scan)
    records = {name: _turn_records(name, scan.files[name].columns) for name in chosen}
    summary = [_summary(name, part) for name, part in records.items()]
    return Conversations(
        datasets=tuple(names),
        turn_datasets=chosen,
        summary=labelled(pd.DataFrame(summary, columns=SUMMARY_COLUMNS), names),
        per_conversation=_frame([_per_conversation(n, r) for n, r in records.items()],
                                PER_CONVERSATION_COLUMNS, names),
        turn_tokens=_frame([_turn_tokens(n, r) for n, r in records.items()], TURN_TOKEN_COLUMNS, names),
        ended=_frame([_ended(n, r, int(s["conversations"])) for (n, r), s in zip(records.items(), summary,
                                                                                   strict=True)],
                     ENDED_COLUMNS, names),
    )


# --- the turn of a record ---------------------------------------------------------------------


def record_turns(scan: RunScan) -> pd.DataFrame:
    """dataset, line, turn (Int64) of every record of the run's raw files."""
    parts = [pd.DataFrame({"dataset": name, "line": np.array(file.columns.line, dtype="int64"),
                           "turn": pd.array(file.columns.turn, dtype="Int64")})
             for name, file in scan.files.items()]
    kept = [part for part in parts if not part.empty]
    if not kept:
        return pd.DataFrame({"dataset": pd.Series(dtype="object"), "line": pd.Series(dtype="int64"),
                             "turn": pd.array([], dtype="Int64")})
    return pd.concat(kept, ignore_index=True)


def _beside_sample_id(frame: pd.DataFrame, turns: pd.Series) -> pd.DataFrame:
    shaped = frame.copy()
    shaped = shaped.drop(columns=["turn"], errors="ignore")
    at = list(shaped.columns).index("sample_id") + 1 if "sample_id" in shaped.columns else len(shaped.columns)
    shaped.insert(at, "turn", pd.array(turns.to_numpy(), dtype="Int64"))
    return shaped


def with_turns(frame: pd.DataFrame, scan: RunScan) -> pd.DataFrame:
    """`frame` (records: dataset, line) with each record's ``turn`` beside ``sample_id`` (NA
    for single-turn records)."""
    turns = record_turns(scan)
    keyed = turns.set_index([turns["dataset"].astype(str), "line"])["turn"]
    index = pd.MultiIndex.from_arrays([frame["dataset"].astype(str), frame["line"].astype("int64")])
    return _beside_sample_id(frame, keyed.reindex(index))


def _prompt_turns(ds: DatasetDir) -> dict[int, int | None]:
    """prompts.jsonl line -> the turn of the prompt first sent on it."""
    if not ds.prompts_path.is_file():
        return {}
    try:
        found = prompt_scan.summary(ds.prompts_path)
    except OSError:
        return {}
    return dict(zip(found.first_lines, found.turns, strict=True))


def _example_turn(file: str, dataset: str, line: int, raw: dict[tuple[str, int], object],
                  prompts: dict[str, dict[int, int | None]]) -> object:
    if file == PROMPTS_FILE:
        return prompts.get(dataset, {}).get(line)
    return raw.get((dataset, line)) if file == RAW_FILE else None


def examples_with_turns(
    scan: RunScan, *, tokenizer: str | os.PathLike[str] | None = None, chars: int = 400
) -> pd.DataFrame:
    """explore.examples_table(scan, ...) with a ``turn`` column beside ``sample_id``: the
    example record's turn (a prompts.jsonl line: its prompt's), NA for single-turn ones."""
    examples = examples_table(scan, tokenizer=tokenizer, chars=chars)
    raw = {(str(d), int(line)): turn for d, line, turn in record_turns(scan).itertuples(index=False)}
    shown = set(examples["dataset"].astype(str))
    prompts = {ds.name: _prompt_turns(ds) for ds in scan.run.datasets if ds.name in shown}
    turns = [_example_turn(str(r.file), str(r.dataset), int(r.line), raw, prompts)
             for r in examples.itertuples(index=False)]
    return _beside_sample_id(examples, pd.Series(turns, dtype="object"))
