"""Where exported rows go: JSON lines, Parquet row groups, or a trainer's JSONL.

    tokens rows        {"id", "dataset", "input_ids", "loss_mask"}: the prompt's ids then the
                       output's, loss_mask 0 over the prompt and 1 over the output. JSONL, or
                       Parquet (input_ids list<int32>, loss_mask list<int8>, one zstd row
                       group per ROW_GROUP_ROWS rows). A row of a generated turn of a
                       conversation (``turns: each``) also has ``turn`` (int) after ``id``,
                       the conversation's; a Parquet file of a run with such a dataset has a
                       ``turn`` column (int32, null for single-turn rows). A row of a record
                       with a mode (a dataset that mixes modes) has ``mode`` (str) after
                       ``dataset``; in Parquet a ``mode`` column (null for rows without)
    conversations      {"id", "dataset"[, "mode"], "conversations"[, "tools"]}, JSONL only; a
                       conversation regenerated turn by turn, one row with all its turns:
                       {"id", "turns", "dataset"[, "mode"], "conversations"[, "tools"]}
                       (threads.py)
    --for TRAINER      {"input_ids", "loss_mask"} only, JSONL only; each row's id, lengths and
                       digest (and turn, mode) are kept for the manifest written beside the
                       file. When every row is a turn of a conversation (every dataset exported
                       is ``turns: each``), {"id", "turn", "input_ids", "loss_mask"}; when
                       every row has a mode (every dataset exported mixes modes, or
                       ``--only-mode``), "mode" before "input_ids": both trainers ignore the
                       extra keys when every row has them (a key on some rows only breaks
                       speculators' loader, HF datasets' JSON reader)

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
from workbench.rundir.storage import writing

__all__ = ["JSONL_SUFFIXES", "PARQUET_SUFFIXES", "ROW_GROUP_ROWS", "ConversationLine", "OutRow",
           "RowKeys", "Sink", "ThreadLine", "Tokens", "TrainerSink", "atomic_sink",
           "sink_factory"]

JSONL_SUFFIXES = (".jsonl", ".json")

PARQUET_SUFFIXES = (".parquet", ".pq")

ROW_GROUP_ROWS = 1024


class RowKeys(NamedTuple):
    """The optional keys of an export's rows: `turns`, some rows are turns of a conversation
    (a Parquet file gets a turn column), `named`, every row is one (a trainer's row names
    it); `modes`, some rows have a mode (a Parquet column), `all_modes`, every row has one
    (a trainer's row names it)."""

    turns: bool = False
    named: bool = False
    modes: bool = False
    all_modes: bool = False


NO_KEYS = RowKeys()  # rows with none of the optional keys


class TokensLine(msgspec.Struct, kw_only=True):
    """A tokens row; `turn` and `mode` only on the rows that have one."""

    id: str
    turn: int | msgspec.UnsetType = msgspec.UNSET
    dataset: str
    mode: str | msgspec.UnsetType = msgspec.UNSET
    input_ids: list[int]
    loss_mask: list[int]


class ConversationLine(msgspec.Struct, omit_defaults=True, kw_only=True):
    id: str
    dataset: str
    mode: str | None = None
    conversations: list[Any]
    tools: list[Any] | None = None


class Tokens(NamedTuple):
    id: str
    dataset: str
    prompt_ids: list[int]
    output_ids: list[int]
    turn: int | None = None  # the generated turn of the conversation `id` (turns: each)
    mode: str | None = None  # the record's mode (a dataset that mixes modes)


def _unset(value: Any) -> Any:
    """value, or UNSET (a key left out of the row) for None."""
    return msgspec.UNSET if value is None else value


class ThreadLine(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A conversation regenerated turn by turn, all its turns (threads.py)."""

    id: str
    turns: int
    dataset: str
    mode: str | None = None
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
        line: TokensLine | ConversationLine | ThreadLine
        if isinstance(row, Tokens):
            prompt, output = row.prompt_ids, row.output_ids
            line = TokensLine(id=row.id, turn=_unset(row.turn), dataset=row.dataset,
                              mode=_unset(row.mode), input_ids=prompt + output,
                              loss_mask=[0] * len(prompt) + [1] * len(output))
        else:
            line = row
        self._file.write(self._encode(line) + b"\n")

    def close(self) -> None:
        self._file.close()


class TrainerSink(JsonlSink):
    """Rows as a trainer reads them ({input_ids, loss_mask}; with `keys.named`, every row a
    turn, {id, turn, input_ids, loss_mask}; with `keys.all_modes`, every row of a mode,
    "mode" before input_ids); each row's id, lengths and digest go to `entries` (row number
    = position) for the manifest."""

    def __init__(self, path: Path, keys: RowKeys = NO_KEYS) -> None:
        super().__init__(path)
        self.named = keys.named
        self.modes = keys.all_modes
        self.entries: list[RowEntry] = []

    def write(self, row: OutRow) -> None:
        assert isinstance(row, Tokens)
        ids = row.prompt_ids + row.output_ids
        mask = [0] * len(row.prompt_ids) + [1] * len(row.output_ids)
        line = TrainerLine(input_ids=ids, loss_mask=mask)
        if self.named:
            assert row.turn is not None
            line.id, line.turn = row.id, row.turn
        if self.modes:
            line.mode = row.mode
        self._file.write(self._encode(line) + b"\n")
        self.entries.append(RowEntry(row.id, row.dataset, len(row.prompt_ids), len(ids),
                                     row_digest(ids), row.turn, row.mode))


class TrainerLine(msgspec.Struct, kw_only=True):
    """A trainer's row: the two lists, after the row's id, turn and mode when every row of
    the file has them."""

    id: str | msgspec.UnsetType = msgspec.UNSET
    turn: int | msgspec.UnsetType = msgspec.UNSET
    mode: str | None | msgspec.UnsetType = msgspec.UNSET
    input_ids: list[int]
    loss_mask: list[int]


class ParquetSink:
    """Tokens rows in Parquet row groups of ROW_GROUP_ROWS rows (zstd-compressed); with
    `keys.turns`, a ``turn`` column after ``id``; with `keys.modes`, a ``mode`` column
    after ``dataset``."""

    def __init__(self, path: Path, keys: RowKeys = NO_KEYS) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self._turns = keys.turns
        self._modes = keys.modes
        turn = [("turn", pa.int32())] if self._turns else []
        mode = [("mode", pa.string())] if self._modes else []
        self._schema = pa.schema([("id", pa.string()), *turn, ("dataset", pa.string()), *mode,
                                  ("input_ids", pa.list_(pa.int32())),
                                  ("loss_mask", pa.list_(pa.int8()))])
        self._writer = pq.ParquetWriter(  # ids: zstd; dictionaries only where values repeat
            path, self._schema, compression="zstd",
            use_dictionary=["dataset", "mode", "loss_mask.list.element"])
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
        mode = [pa.array([r.mode for r in rows], type=pa.string())] if self._modes else []
        table = pa.Table.from_arrays(
            [pa.array([r.id for r in rows]), *turn, pa.array([r.dataset for r in rows]), *mode,
             pa.ListArray.from_arrays(offsets, ids),
             pa.ListArray.from_arrays(offsets, pa.array(mask))],
            schema=self._schema)
        self._writer.write_table(table, row_group_size=len(rows))


def sink_factory(target: Path, fmt: ExportFormat, trainer: str | None = None,
                 keys: RowKeys = NO_KEYS) -> Callable[[Path], Sink]:
    """The sink type of target's file type (`keys`: the optional keys of the rows, which a
    Parquet file gives a column and a trainer's row names when every row has them)."""
    suffix = target.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return functools.partial(TrainerSink, keys=keys) if trainer else JsonlSink
    if suffix in PARQUET_SUFFIXES:
        if trainer:
            raise ConfigError("--to", f"{trainer}'s file loader reads JSON/JSONL only, not "
                                      f"Parquet: write {target.with_suffix('.jsonl').name}")
        if fmt == "conversations":
            raise ConfigError("--to", "the conversations format writes JSONL (.jsonl); "
                                      "Parquet is for the tokens format")
        return functools.partial(ParquetSink, keys=keys)
    known = ", ".join((*JSONL_SUFFIXES, *PARQUET_SUFFIXES))
    raise ConfigError("--to", f"unknown file type {suffix or '(none)'!r} of {target} "
                              f"(known: {known})")


@contextlib.contextmanager
def atomic_sink(target: Path, fmt: ExportFormat, trainer: str | None,
                keys: RowKeys = NO_KEYS) -> Iterator[Sink]:
    """A sink on a temporary file next to target, renamed over it only on success. A temp
    file that cannot be made, closed or renamed is the StorageError of target (the file the
    user named)."""
    make = sink_factory(target, fmt, trainer, keys)
    if not target.parent.is_dir():
        raise ConfigError("--to", f"directory not found: {target.parent}")
    remove_stale_temps(target)
    tmp = temp_path(target)
    with writing(target):
        sink = make(tmp)
    try:
        yield sink
        with writing(target):
            sink.close()
            os.replace(tmp, target)
    finally:
        with contextlib.suppress(Exception):
            sink.close()
        tmp.unlink(missing_ok=True)
