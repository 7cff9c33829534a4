"""run.json, the run manifest: the one reader and the one writer of it.

`workbench generate` writes it when a run starts, whenever the concurrency cap moves and
when the run ends: the workbench version, the server URL (without credentials), the
server's ``/server_info`` and ``/model_info``, the options, the send-order seed, the
concurrency and its history, and per dataset its settings (``datasets.<name>``: source,
prompts, budgets, sampling, tokenizer, chat template kwargs, whether its budget stopped it).
It is replaced whole (a temp file, then a rename), so a reader never sees half of it.

``history`` keeps one entry per generate session on the run directory, oldest first (at
most :data:`HISTORY_LIMIT`): when it started and last wrote, the workbench version, the
server URL, the model and what the session adds (the dispatcher: its concurrency, null for
a session that sent nothing). A resumed run adds an entry, never replaces one; the other
keys describe the latest session that sent something.

``benchmarks`` names the benchmark files generate kept each record's overlap with
(``{"files": [absolute paths], "field": prompt field or null, "ngram": n}``; absent or null
when it was given none): a resumed run keeps looking for them, and validate, the reports and
export look for them unless told otherwise (:func:`choose_benchmarks`).

``events`` lists what the run noticed about its server (the dispatcher's watchdog), oldest
first, across sessions (at most :data:`EVENTS_LIMIT`, the latest kept): each an object
``{"ts": unix time, "kind": "stalled" | "degraded" | "recovered" | ..., "message": one line,
...figures}``. A resumed run appends to the earlier sessions' list.

Readers: :func:`read_manifest` (DataError naming the file and line when it is present but
not a JSON object), and :class:`ManifestWatcher` for a reader polling a run in progress.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from workbench.errors import DataError
from workbench.rundir.files import write_atomic
from workbench.rundir.layout import MANIFEST_FILE
from workbench.rundir.storage import storage_error
from workbench.sketch import DEFAULT_BENCHMARK_NGRAM

__all__ = [
    "EVENTS_LIMIT",
    "HISTORY_LIMIT",
    "BenchmarkChoice",
    "ManifestWatcher",
    "benchmarks_record",
    "choose_benchmarks",
    "dataset_entries",
    "manifest_path",
    "read_manifest",
    "with_events",
    "with_session",
    "write_manifest",
]

HISTORY_LIMIT = 1000
EVENTS_LIMIT = 1000
_SESSION_KEYS = ("workbench_version", "server_url", "model")


def manifest_path(out: str | os.PathLike[str]) -> Path:
    return Path(out) / MANIFEST_FILE


def read_manifest(out: str | os.PathLike[str]) -> dict[str, Any]:
    """The run.json of run directory `out`; {} when it has none. DataError naming the file
    (and the line and column of a JSON error) when it cannot be read or is no JSON object."""
    path = manifest_path(out)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    return _parsed(path, data)


def _parsed(path: Path, data: bytes) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError as exc:  # the message names the line and column
        raise DataError(path, f"invalid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise DataError(path, "expected a JSON object")
    return manifest


def dataset_entries(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``datasets`` of a manifest by name, each entry a dict ({} for one that is not)."""
    entries = manifest.get("datasets")
    if not isinstance(entries, dict):
        return {}
    return {str(name): entry if isinstance(entry, dict) else {} for name, entry in entries.items()}


def with_session(manifest: Mapping[str, Any], previous: Mapping[str, Any],
                 started: float, session: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """manifest with ``history``: previous's, this session's entry (the session that started
    at `started`, with the keys of `session`) added or brought up to date."""
    history = previous.get("history")
    kept = [entry for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []
    if kept and kept[-1].get("started") == started:
        kept.pop()
    entry = {"started": started, "updated": manifest.get("updated", started),
             **{key: manifest.get(key) for key in _SESSION_KEYS}, **(session or {})}
    return {**manifest, "history": [*kept, entry][-HISTORY_LIMIT:]}


def with_events(manifest: Mapping[str, Any], previous: Mapping[str, Any],
                events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """manifest with ``events``: previous's (the earlier sessions'), then `events` (this
    session's), the latest :data:`EVENTS_LIMIT` of them."""
    earlier = previous.get("events")
    kept = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    return {**manifest, "events": [*kept, *map(dict, events)][-EVENTS_LIMIT:]}


class BenchmarkChoice(NamedTuple):
    """The benchmarks a command looks for: `files` (none: no contamination check), their
    prompt `field` and `ngram`; `recorded`: taken from run.json (not given), `gone`: files
    run.json names that are no longer there (left out)."""

    files: tuple[str, ...] = ()
    field: str | None = None
    ngram: int = DEFAULT_BENCHMARK_NGRAM
    recorded: bool = False
    gone: tuple[str, ...] = ()

    def notes(self) -> list[str]:
        """What a user is told of benchmarks they did not name: the run's looked for, and
        one line per file left out saying how to look for it again."""
        names = ", ".join(Path(p).name for p in self.files)
        taken = ([f"looking for the run's benchmarks (run.json): {names} (--no-decontaminate: none)"]
                 if self.recorded and self.files else [])
        return taken + self.gone_notes()

    def gone_notes(self) -> list[str]:
        """One line per recorded file left out, saying how to look for it again (the notes
        that ask the user for something)."""
        return [(f"{path}: a benchmark of this run (run.json) that is no longer there, so it "
                 "is not looked for (pass --decontaminate with its new place)") for path in self.gone]


def benchmarks_record(choice: BenchmarkChoice) -> dict[str, Any] | None:
    """run.json's ``benchmarks`` for the benchmarks a session looks for (None: none), the
    recorded ones that are gone still named; the paths absolute, so a reader in another
    folder finds them."""
    files = [*choice.files, *choice.gone]
    if not files:
        return None
    return {"files": [str(Path(path).expanduser().resolve()) for path in files],
            "field": choice.field, "ngram": choice.ngram}


def choose_benchmarks(manifest: Mapping[str, Any], files: Sequence[str] | None,
                      field: str | None = None, ngram: int | None = None) -> BenchmarkChoice:
    """The benchmarks to look for: `files` when given (an empty list: none), else the ones
    run.json records (its field and n-gram unless `field` / `ngram` are given) that still
    exist. A ``benchmarks`` entry of the wrong shape counts as none."""
    if files is not None:
        return BenchmarkChoice(tuple(files), field, ngram or DEFAULT_BENCHMARK_NGRAM)
    record = manifest.get("benchmarks")
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        return BenchmarkChoice(field=field, ngram=ngram or DEFAULT_BENCHMARK_NGRAM)
    paths = [path for path in record["files"] if isinstance(path, str) and path]
    recorded_field = record.get("field") if isinstance(record.get("field"), str) else None
    recorded_ngram = record.get("ngram")
    if not isinstance(recorded_ngram, int) or isinstance(recorded_ngram, bool) or recorded_ngram < 1:
        recorded_ngram = DEFAULT_BENCHMARK_NGRAM
    return BenchmarkChoice(tuple(p for p in paths if Path(p).is_file()),
                           field if field is not None else recorded_field,
                           ngram or recorded_ngram, recorded=True,
                           gone=tuple(p for p in paths if not Path(p).is_file()))


def write_manifest(out: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """run.json of `out` replaced by manifest, atomically (StorageError when it cannot be
    written: the old one stays)."""
    text = json.dumps(manifest, indent=2, default=str) + "\n"
    path = manifest_path(out)
    try:
        write_atomic(path, text.encode())
    except OSError as exc:
        raise storage_error(path, exc) from None


class ManifestWatcher:
    """run.json of a run in progress, read again only when it changed; {} while absent."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.path = manifest_path(out)
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """The manifest as it is now (DataError as :func:`read_manifest`)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._data = None, {}
            return self._data
        except OSError as exc:
            raise DataError(self.path, f"cannot read: {exc.strerror or exc}") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            self._data = read_manifest(self.path.parent)
            self._stamp = stamp
        return self._data
