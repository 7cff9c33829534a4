"""Where exported rows go: JSON lines, Parquet row groups, or a trainer's JSONL.

    tokens rows        {"id", "dataset", "input_ids", "loss_mask"}: the prompt's ids then the
                       output's, loss_mask 0 over the prompt and 1 over the output. JSONL, or
                       Parquet (input_ids list<int32>, loss_mask list<int8>, one zstd row
                       group per ROW_GROUP_ROWS rows). A row of a generated turn of a
                       conversation (``turns: each``) also has ``turn`` (int) after ``id``,
                       the conversation's; a Parquet file of a run with such a dataset has a
                       ``turn`` column (int32, null for single-turn rows)
    conversations      {"id", "dataset", "conversations"[, "tools"]}, JSONL only; a
                       conversation regenerated turn by turn, one row with all its turns:
                       {"id", "turns", "dataset", "conversations"[, "tools"]} (threads.py)
    --for TRAINER      {"input_ids", "loss_mask"} only, JSONL only; each row's id, lengths and
                       digest (and turn) are kept for the manifest written beside the file.
                       When every row is a turn of a conversation (every dataset exported is
                       ``turns: each``), {"id", "turn", "input_ids", "loss_mask"}: both
                       trainers ignore the extra keys when every row has them (a key on some
                       rows only breaks speculators' loader, HF datasets' JSON reader)

Rows are written to a temporary file beside the target and renamed over it at the end
(:func:`atomic_sink`), so a failed export leaves the target as it was; temp files of the
target that a killed export left are removed first (:mod:`workbench.rundir.files`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeAlias

import msgspec
import numpy as np

from workbench.errors import ConfigError
from workbench.export.options import ExportFormat
from workbench.export.trainers import RowEntry, row_digest
from workbench.rundir.files import remove_stale_temps, temp_path

__all__ = ["JSONL_SUFFIXES", "PARQUET_SUFFIXES", "ROW_GROUP_ROWS", "ConversationLine", "OutRow",
           "Sink", "ThreadLine", "Tokens", "TrainerSink", "atomic_sink", "sink_factory"]

JSONL_SUFFIXES = (".jsonl", ".json")

PARQUET_SUFFIXES = (".parquet", ".pq")

ROW_GROUP_ROWS = 1024


class TokensLine(msgspec.Struct):
    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]


class TurnTokensLine(msgspec.Struct):
    id: str
    turn: int
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]


class ConversationLine(msgspec.Struct, omit_defaults=True):
    id: str
    dataset: str
    conversations: list[Any]
    tools: list[Any] | None = None


class Tokens(NamedTuple):
    id: str
    dataset: str
    prompt_ids: list[int]
    output_ids: list[int]
    turn: int | None = None  # the generated turn of the conversation `id` (turns: each)


class ThreadLine(msgspec.Struct, omit_defaults=True):
    """A conversation regenerated turn by turn, all its turns (threads.py)."""

    id: str
    turns: int
    dataset: str
    conversations: list[Any]
    tools: list[Any] | None = None


OutRow: TypeAlias = Tokens | ConversationLine | ThreadLine


class Sink(Protocol):
    def write(self, row: Any) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Rows as JSON lines; a tokens row gets its input_ids and loss_mask built here."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed in close)
        self._encode = msgspec.json.Encoder().encode

    def write(self, row: OutRow) -> None:
        line: TokensLine | TurnTokensLine | ConversationLine | ThreadLine
        if isinstance(row, Tokens):
            prompt, output = row.prompt_ids, row.output_ids
            mask = [0] * len(prompt) + [1] * len(output)
            line = (TokensLine(row.id, row.dataset, prompt + output, mask) if row.turn is None
                    else TurnTokensLine(row.id, row.turn, row.dataset, prompt + output, mask))
        else:
            line = row
        self._file.write(self._encode(line) + b"\n")

    def close(self) -> None:
        self._file.close()


class TrainerSink(JsonlSink):
    """Rows as a trainer reads them ({input_ids, loss_mask}; with `named`, every row a turn,
    {id, turn, input_ids, loss_mask}); each row's id, lengths and digest go to `entries`
    (row number = position) for the manifest."""

    def __init__(self, path: Path, named: bool = False) -> None:
        super().__init__(path)
        self.named = named
        self.entries: list[RowEntry] = []

    def write(self, row: OutRow) -> None:
        assert isinstance(row, Tokens)
        ids = row.prompt_ids + row.output_ids
        mask = [0] * len(row.prompt_ids) + [1] * len(row.output_ids)
        line: TrainerLine | NamedTrainerLine = TrainerLine(ids, mask)
        if self.named:
            assert row.turn is not None
            line = NamedTrainerLine(row.id, row.turn, ids, mask)
        self._file.write(self._encode(line) + b"\n")
        self.entries.append(RowEntry(row.id, row.dataset, len(row.prompt_ids), len(ids),
                                     row_digest(ids), row.turn))


class TrainerLine(msgspec.Struct):
    input_ids: list[int]
    loss_mask: list[int]


class NamedTrainerLine(msgspec.Struct):
    id: str
    turn: int
    input_ids: list[int]
    loss_mask: list[int]


class ParquetSink:
    """Tokens rows in Parquet row groups of ROW_GROUP_ROWS rows (zstd-compressed); with
    `turns`, a ``turn`` column after ``id``."""

    def __init__(self, path: Path, turns: bool = False) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self._turns = turns
        turn = [("turn", pa.int32())] if turns else []
        self._schema = pa.schema([("id", pa.string()), *turn, ("dataset", pa.string()),
                                  ("input_ids", pa.list_(pa.int32())),
                                  ("loss_mask", pa.list_(pa.int8()))])
        self._writer = pq.ParquetWriter(  # ids: zstd; dictionaries only where values repeat
            path, self._schema, compression="zstd",
            use_dictionary=["dataset", "loss_mask.list.element"])
        self._rows: list[Tokens] = []

    def write(self, row: OutRow) -> None:
        assert isinstance(row, Tokens) and (self._turns or row.turn is None)
        self._rows.append(row)
        if len(self._rows) >= ROW_GROUP_ROWS:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        pa = self._pa
        prompt = np.fromiter((len(r.prompt_ids) for r in rows), dtype=np.int64, count=len(rows))
        output = np.fromiter((len(r.output_ids) for r in rows), dtype=np.int64, count=len(rows))
        offsets = pa.array(np.concatenate([[0], np.cumsum(prompt + output)]).astype(np.int32))
        flat: list[int] = []
        for r in rows:
            flat.extend(r.prompt_ids)
            flat.extend(r.output_ids)
        ids = pa.array(np.fromiter(flat, dtype=np.int32, count=len(flat)))
        mask = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), len(rows)),
                         np.column_stack([prompt, output]).ravel())
        turn = [pa.array([r.turn for r in rows], type=pa.int32())] if self._turns else []
        table = pa.Table.from_arrays(
            [pa.array([r.id for r in rows]), *turn, pa.array([r.dataset for r in rows]),
             pa.ListArray.from_arrays(offsets, ids),
             pa.ListArray.from_arrays(offsets, pa.array(mask))],
            schema=self._schema)
        self._writer.write_table(table, row_group_size=len(rows))


def sink_factory(target: Path, fmt: ExportFormat, trainer: str | None = None,
                 turns: bool = False, named: bool = False) -> Callable[[Path], Sink]:
    """The sink type of target's file type (`turns`: the rows may be turns of
    conversations, which a Parquet file gives a column; `named`: every row is one, which a
    trainer's row names)."""
    suffix = target.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return functools.partial(TrainerSink, named=named) if trainer else JsonlSink
    if suffix in PARQUET_SUFFIXES:
        if trainer:
            raise ConfigError("--to", f"{trainer}'s file loader reads JSON/JSONL only, not "
                                      f"Parquet: write {target.with_suffix('.jsonl').name}")
        if fmt == "conversations":
            raise ConfigError("--to", "the conversations format writes JSONL (.jsonl); "
                                      "Parquet is for the tokens format")
        return functools.partial(ParquetSink, turns=turns)
    known = ", ".join((*JSONL_SUFFIXES, *PARQUET_SUFFIXES))
    raise ConfigError("--to", f"unknown file type {suffix or '(none)'!r} of {target} "
                              f"(known: {known})")


@contextlib.contextmanager
def atomic_sink(target: Path, fmt: ExportFormat, trainer: str | None,
                turns: bool = False, named: bool = False) -> Iterator[Sink]:
    """A sink on a temporary file next to target, renamed over it only on success."""
    make = sink_factory(target, fmt, trainer, turns, named)
    if not target.parent.is_dir():
        raise ConfigError("--to", f"directory not found: {target.parent}")
    remove_stale_temps(target)
    tmp = temp_path(target)
    sink = make(tmp)
    try:
        yield sink
        sink.close()
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(Exception):
            sink.close()
        tmp.unlink(missing_ok=True)
