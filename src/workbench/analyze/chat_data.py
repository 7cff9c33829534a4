"""The data file of a conversations dataset, read back row by row after the run.

A ``turns: each`` dataset's later prompts are rebuilt from its data rows (validate checks
each turn's prompt, the export writes each conversation out), so the data file is read where
run.json says it is: its dataset entry's ``path``, ``input`` (``messages`` or
``conversations``), ``tools_field`` and ``id_field``. :class:`ChatData` indexes the rows of
the sample ids asked for (a JSONL file by byte offset, read back one line at a time; a
Parquet file's id, input and tools columns only) and gives each back as a
:class:`~workbench.chat.ChatRow`, parsed as the runner parsed it. A file that is gone is a
DataError naming it; so is a row that is no longer there or no longer parses (the file
changed since the run).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec

from workbench.chat import ChatRow, RowError, parse_conversations, parse_messages
from workbench.errors import DataError
from workbench.rundir.layout import DatasetDir
from workbench.rundir.records import SampleId

__all__ = ["CHANGED", "ChatData", "data_path"]

CHANGED = "the file changed since the run"

_PARQUET = (".parquet", ".pq")


def data_path(ds: DatasetDir) -> Path:
    """The dataset's data file as run.json names it; DataError when it names none or the
    file is gone."""
    path = ds.settings.get("path")
    if not isinstance(path, str) or not path:
        raise DataError(ds.raw_path.parent, f"run.json names no data file for dataset {ds.name}")
    if not Path(path).is_file():
        raise DataError(path, f"not found: the data file of dataset {ds.name} (run.json's "
                              "path), which its conversations are rebuilt from")
    return Path(path)


class ChatData:
    """The rows of `wanted` sample ids of a dataset's data file (module docstring)."""

    def __init__(self, ds: DatasetDir, wanted: Collection[SampleId]) -> None:
        self.path = data_path(ds)
        self.mode = str(ds.settings.get("input") or "messages")
        self.tools_field = str(ds.settings.get("tools_field") or "tools")
        self.id_field = str(ds.settings.get("id_field") or "sample_id")
        self.truncated = str(ds.settings.get("truncated") or "end")  # a cut turn's fate
        self._spans: dict[SampleId, tuple[int, int, int]] = {}  # id -> line, offset, size
        self._values: dict[SampleId, tuple[Any, Any]] = {}  # Parquet: id -> input, tools
        if self.path.suffix.lower() in _PARQUET:
            self._index_parquet(set(wanted))
        else:
            self._index_jsonl(set(wanted))

    def row(self, sample_id: SampleId) -> ChatRow:
        """The conversation and tools of `sample_id`; DataError when the file no longer
        holds it or it no longer parses."""
        if sample_id in self._values:
            value, tools = self._values[sample_id]
            return self._parsed(value, tools, None)
        span = self._spans.get(sample_id)
        if span is None:
            raise DataError(self.path, f"no row with {self.id_field} {sample_id!r}: {CHANGED}")
        line, offset, size = span
        data = msgspec.json.decode(_pread(self.path, offset, size))
        if not isinstance(data, dict):
            raise DataError(self.path, f"not a JSON object: {CHANGED}", line)
        return self._parsed(data.get(self.mode), data.get(self.tools_field), line)

    def _parsed(self, value: Any, tools: Any, line: int | None) -> ChatRow:
        parse = parse_messages if self.mode == "messages" else parse_conversations
        try:
            return parse(value, tools, self.mode, self.tools_field)
        except RowError as exc:
            raise DataError(self.path, f"{exc}: {CHANGED}", line) from None

    def _index_jsonl(self, wanted: set[SampleId]) -> None:
        """Where each wanted id's first line is (its number, offset and size)."""
        decoder = msgspec.json.Decoder(msgspec.defstruct(
            "_IdLine", [(self.id_field, int | str | None, None)]))
        offset = 0
        with open(self.path, "rb") as file:
            for number, text in enumerate(file, start=1):
                sample_id = _id_of(decoder, text, self.id_field) if text.strip() else None
                if sample_id in wanted and sample_id not in self._spans:
                    self._spans[sample_id] = (number, offset, len(text))
                offset += len(text)

    def _index_parquet(self, wanted: set[SampleId]) -> None:
        """The input and tools values of each wanted id (those columns read, no others)."""
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(self.path)
        except (OSError, ValueError) as exc:
            raise DataError(self.path, f"cannot read the Parquet file: {exc}") from None
        names = parquet.schema_arrow.names
        columns = [name for name in (self.id_field, self.mode, self.tools_field) if name in names]
        for batch in parquet.iter_batches(batch_size=1024, columns=columns):
            for data in batch.to_pylist():
                sample_id = data.get(self.id_field)
                if sample_id in wanted and sample_id not in self._values:
                    self._values[sample_id] = (data.get(self.mode), data.get(self.tools_field))


def _id_of(decoder: Any, text: bytes, id_field: str) -> SampleId | None:
    """The line's id (None for a line that is not an object holding one)."""
    try:
        value = getattr(decoder.decode(text), id_field)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None if isinstance(value, bool) else value


def _pread(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)
