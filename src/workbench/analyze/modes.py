"""Datasets that mix modes (``modes``: e.g. 75% of the conversations with thinking on, 25%
with it off) as the token-distribution report's "Modes" section shows them.

    mode_datasets   the datasets that mix modes
    mode_frames     per such dataset the mix asked for against the mix written (a table,
                    and a long frame for bars), each mode's completion tokens (quartiles)
                    and its reasoning and answer tokens, and the deployment sample the
                    modes were taken from (Modes)

Shaped from the record frame (:func:`workbench.analyze.frames.record_frame`, its ``mode``
column) and run.json's modes, from one scan of the run. The figures count as ``workbench
stats`` does (:class:`workbench.analyze.stats.ModeStats`): the shares asked for are run.json's
weights over their sum; the mix written is of the records, or in a dataset regenerated turn by
turn (``turns: each``) of its conversations (distinct sample ids of its records with a turn);
the median and quartiles are nearest-rank, so the median is ``workbench stats``' p50. Modes
are in run.json's order, then modes only the records name (by name), then the records
without a mode (:data:`~workbench.analyze.stats.NO_MODE`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.analyze.frames import RunSource, labelled, record_frame, scanned
from workbench.analyze.scan import RunScan
from workbench.analyze.stats import NO_MODE, requested_mix
from workbench.profiles import ModelProfile, reasoning_expected
from workbench.rundir.columns import Columns
from workbench.rundir.layout import DatasetDir

__all__ = [
    "BAR_COLUMNS",
    "MIX_COLUMNS",
    "REQUESTED",
    "TOKEN_COLUMNS",
    "WRITTEN",
    "Modes",
    "mode_datasets",
    "mode_frames",
]

MIX_COLUMNS = ["dataset", "mode", "wanted", "records", "record_share", "conversations",
               "conversation_share", "written", "of"]
BAR_COLUMNS = ["dataset", "mode", "mix", "share", "count"]
TOKEN_COLUMNS = ["dataset", "mode", "reasoning", "records", "counted", "completion_tokens",
                 "mean", "min", "q1", "median", "q3", "max", "mean_reasoning", "mean_answer"]
REQUESTED, WRITTEN = "requested", "written"  # the two bars of a mode


@dataclass(frozen=True, slots=True)
class Modes:
    """The modes of a run's datasets that mix them, as the report draws them.

    ``mix``: per dataset and mode the share asked for (``wanted``, NaN for a mode run.json
    does not name), its records and their share, its conversations and their share (NA
    outside a turns dataset), and ``written``: the share to set against ``wanted``, of
    ``of`` ("records" or "conversations"). ``bars``: the same shares long, one row per
    dataset, mode and ``mix`` (REQUESTED or WRITTEN), with the count written. ``tokens``:
    per dataset and mode whether its replies should hold reasoning, its records, those with
    a completion count (``counted``), their completion tokens in total, mean, min,
    quartiles and max, and the mean reasoning and answer tokens of a reply. ``sources``:
    per mixing dataset the deployment sample its modes were taken from (None: written in
    the manifest). Every frame's ``dataset`` is categorical over all the run's datasets
    (a dataset keeps its colour across the report).
    """

    datasets: tuple[str, ...]
    mode_datasets: tuple[str, ...]
    sources: Mapping[str, str | None]
    mix: pd.DataFrame
    bars: pd.DataFrame
    tokens: pd.DataFrame

    @property
    def empty(self) -> bool:
        """No dataset of the run mixes modes: the report has no Modes section."""
        return not self.mode_datasets


def _mixes(ds: DatasetDir | None, columns: Columns) -> bool:
    said = ds is not None and bool(ds.modes)
    return said or any(mode is not None for mode in columns.mode)


def mode_datasets(scan: RunScan) -> tuple[str, ...]:
    """The datasets that mix modes: run.json gives them modes, or their records name one."""
    settings = {ds.name: ds for ds in scan.run.datasets}
    return tuple(name for name, file in scan.files.items()
                 if _mixes(settings.get(name), file.columns))


def _is_turns(ds: DatasetDir | None, records: pd.DataFrame) -> bool:
    said = ds is not None and ds.settings.get("turns") == "each"
    return said or bool(records["turn"].notna().any())


def _order(wanted: Mapping[str, float], records: pd.DataFrame) -> list[str | None]:
    """run.json's modes, then those only the records name (by name), then None (records
    without a mode) when there are such records."""
    named = {str(mode) for mode in records["mode"].dropna()}
    order: list[str | None] = [*wanted, *sorted(named - set(wanted))]
    return [*order, None] if records["mode"].isna().any() else order


def _of_mode(records: pd.DataFrame, mode: str | None) -> pd.DataFrame:
    column = records["mode"]
    return records[column.isna()] if mode is None else records[column.eq(mode).fillna(False)]


def _conversations(part: pd.DataFrame) -> int:
    return int(part.loc[part["turn"].notna(), "sample_id"].nunique())


def _share(part: float, whole: float) -> float:
    return part / whole if whole else np.nan


def _mix(name: str, ds: DatasetDir | None, records: pd.DataFrame) -> pd.DataFrame:
    """One dataset's modes: asked for against written."""
    wanted = requested_mix(ds) if ds is not None else {}
    turns = _is_turns(ds, records)
    parts = {mode: _of_mode(records, mode) for mode in _order(wanted, records)}
    conversations = {mode: _conversations(part) for mode, part in parts.items()}
    all_records, all_conversations = len(records), sum(conversations.values())
    rows = []
    for mode, part in parts.items():
        own = conversations[mode] if turns else None
        record_share = _share(len(part), all_records)
        conversation_share = _share(own, all_conversations) if own is not None else np.nan
        rows.append({"dataset": name, "mode": NO_MODE if mode is None else mode,
                     "wanted": wanted.get(mode, np.nan) if mode is not None else np.nan,
                     "records": len(part), "record_share": record_share, "conversations": own,
                     "conversation_share": conversation_share,
                     "written": conversation_share if turns else record_share,
                     "of": "conversations" if turns else "records"})
    frame = pd.DataFrame(rows, columns=MIX_COLUMNS)
    frame["conversations"] = pd.array(frame["conversations"].tolist(), dtype="Int64")
    return frame


def _bars(mix: pd.DataFrame) -> pd.DataFrame:
    """The mix long: a REQUESTED and a WRITTEN row per dataset and mode."""
    written = np.where(mix["of"] == "conversations", mix["conversations"].astype("float64"),
                       mix["records"].astype("float64"))
    requested = mix.assign(mix=REQUESTED, share=mix["wanted"], count=np.nan)
    done = mix.assign(mix=WRITTEN, share=mix["written"], count=written)
    return pd.concat([requested, done], ignore_index=True)[BAR_COLUMNS]


def _token_row(name: str, mode: str | None, reasoning: bool, part: pd.DataFrame) -> dict[str, Any]:
    known = part["completion_tokens"].dropna().to_numpy(dtype="float64")
    q = (np.quantile(known, [0.0, 0.25, 0.5, 0.75, 1.0], method="inverted_cdf") if known.size
         else [np.nan] * 5)
    split = part[part["answer_tokens"].notna()]
    return {"dataset": name, "mode": NO_MODE if mode is None else mode, "reasoning": reasoning,
            "records": len(part), "counted": int(known.size),
            "completion_tokens": int(known.sum()), "mean": known.mean() if known.size else np.nan,
            "min": q[0], "q1": q[1], "median": q[2], "q3": q[3], "max": q[4],
            "mean_reasoning": split["reasoning_tokens"].astype("float64").mean(),
            "mean_answer": split["answer_tokens"].astype("float64").mean()}


def _tokens(name: str, ds: DatasetDir | None, profile: ModelProfile,
            records: pd.DataFrame) -> pd.DataFrame:
    """One dataset's completion tokens per mode, and its reasoning and answer tokens."""
    wanted = requested_mix(ds) if ds is not None else {}
    rows = []
    for mode in _order(wanted, records):
        kwargs = ds.template_kwargs(mode) if ds is not None else {}
        reasoning = reasoning_expected(profile, kwargs)
        rows.append(_token_row(name, mode, reasoning, _of_mode(records, mode)))
    return pd.DataFrame(rows, columns=TOKEN_COLUMNS)


def _frame(parts: Sequence[pd.DataFrame], columns: list[str], names: Sequence[str]) -> pd.DataFrame:
    kept = [part for part in parts if not part.empty]
    frame = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=columns)
    return labelled(frame[columns], names)


def _mode_records(scan: RunScan, chosen: Sequence[str],
                  records: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """Per chosen dataset, its rows of the record frame (`records`, else built here)."""
    if not chosen:
        return {}
    frame = record_frame(scan, datasets=chosen) if records is None else records
    names = frame["dataset"].astype(str)
    return {name: frame[names == name] for name in chosen}


def mode_frames(source: RunSource, records: pd.DataFrame | None = None, *,
                model_profile: str | None = None) -> Modes:
    """The modes of every dataset that mixes them (see :class:`Modes`); empty frames when
    the run has none. `source`: the run directory or its scan
    (:func:`workbench.analyze.scan.scan_run`), read once; `records`: the run's record frame
    of that scan, when the caller has it already."""
    scan = scanned(source, model_profile)
    names = [ds.name for ds in scan.run.datasets] or list(scan.files)
    settings = {ds.name: ds for ds in scan.run.datasets}
    chosen = mode_datasets(scan)
    parts = _mode_records(scan, chosen, records)
    mix = _frame([_mix(n, settings.get(n), r) for n, r in parts.items()], MIX_COLUMNS, names)
    return Modes(
        datasets=tuple(names),
        mode_datasets=chosen,
        sources={name: settings[name].modes_source if name in settings else None
                 for name in chosen},
        mix=mix,
        bars=labelled(_bars(mix), names) if not mix.empty else _frame([], BAR_COLUMNS, names),
        tokens=_frame([_tokens(n, settings.get(n), scan.profile, r) for n, r in parts.items()],
                      TOKEN_COLUMNS, names),
    )
