"""The layout of a run directory: its file names and its dataset folders.

    OUT/run.json                          the run manifest (:mod:`workbench.rundir.manifest`)
    OUT/.writer.lock                      held by the generate writing the run (lock.py)
    OUT/<dataset>/raw_responses.jsonl     one record a line (records.py: the data contract;
                                          written by appender.py, read by reader.py)
    OUT/<dataset>/raw_responses.jsonl.torn  torn last lines put aside on resume
    OUT/<dataset>/raw_responses.jsonl.rejected  lines no reader takes as a finished record
                                          (unreadable, a field missing), put aside on resume
    OUT/<dataset>/prompts.jsonl           the prompts as sent
    OUT/<dataset>/errors.jsonl            one line per failed attempt
    OUT/<dataset>/skipped.jsonl           prompts not sent: duplicates of kept ones (manifest
                                          dedup, generate/dedup.py)
    OUT/<dataset>/scores.jsonl            each reply's likelihood under the target
                                          (``workbench score``, analyze/score.py)
    OUT/<dataset>/*.bak                   an earlier run's files, moved aside by --no-resume
    OUT/<dataset>/.workbench-cache/       caches of reads (cache.py); always safe to delete

Other verbs write beside them at the top level: ``workbench explore`` explore.ipynb and
explore-lab.log (report/lab.py); ``workbench generate --launch`` server.log;
``workbench demo`` sim.log, reports/, export/ and tuning/.
:data:`RUN_ENTRIES` names every top-level entry that is not a dataset folder, and
:func:`check_dataset_names` refuses a manifest whose dataset would be named like one
(without case), before the run starts anything.

A run's datasets are the ones run.json lists (in its order), then every other folder of OUT
that holds a raw, prompts or errors file (by name). A folder that itself holds
raw_responses.jsonl and no run.json is a run of one dataset named after the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from workbench.config import Manifest, with_line
from workbench.errors import ConfigError

__all__ = [
    "BACKUP_SUFFIX",
    "CACHE_DIR",
    "DATASET_FILES",
    "ERRORS_FILE",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "PROMPTS_FILE",
    "RAW_FILE",
    "REJECTED_SUFFIX",
    "RUN_ENTRIES",
    "SCORES_FILE",
    "SCORE_LOCK_FILE",
    "SERVER_LOG",
    "SKIPPED_FILE",
    "TORN_SUFFIX",
    "DatasetDir",
    "check_dataset_names",
    "find_datasets",
    "holds_dataset_files",
]

MANIFEST_FILE = "run.json"
LOCK_FILE = ".writer.lock"
SCORE_LOCK_FILE = ".score.lock"  # held by `workbench score` (it may run beside a generate)
RAW_FILE = "raw_responses.jsonl"
PROMPTS_FILE = "prompts.jsonl"
ERRORS_FILE = "errors.jsonl"
SKIPPED_FILE = "skipped.jsonl"
SCORES_FILE = "scores.jsonl"
DATASET_FILES = (RAW_FILE, PROMPTS_FILE, ERRORS_FILE)
TORN_SUFFIX = ".torn"
REJECTED_SUFFIX = ".rejected"
BACKUP_SUFFIX = ".bak"
CACHE_DIR = ".workbench-cache"
# The top-level entries of a run directory that are not dataset folders (the module
# docstring says who writes each); a run of one dataset holds DATASET_FILES at the top too.
SERVER_LOG = "server.log"  # `generate --launch`: the server's output
RUN_ENTRIES = (MANIFEST_FILE, LOCK_FILE, SCORE_LOCK_FILE, *DATASET_FILES, SKIPPED_FILE,
               SCORES_FILE, SERVER_LOG, "explore.ipynb", "explore-lab.log", "sim.log",
               "reports", "notebooks", "export", "tuning")
# Compared without case: macOS and Windows folders do not tell `Run.json` from `run.json`.
_RESERVED = {name.lower(): name for name in RUN_ENTRIES}


class DatasetDir(msgspec.Struct, frozen=True):
    """One dataset folder of a run; `settings` is its run.json entry ({} when absent)."""

    name: str
    folder: Path
    settings: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def raw_path(self) -> Path:
        return self.folder / RAW_FILE

    @property
    def prompts_path(self) -> Path:
        return self.folder / PROMPTS_FILE

    @property
    def errors_path(self) -> Path:
        return self.folder / ERRORS_FILE

    @property
    def skipped_path(self) -> Path:
        return self.folder / SKIPPED_FILE

    @property
    def scores_path(self) -> Path:
        return self.folder / SCORES_FILE

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        kwargs = self.settings.get("chat_template_kwargs")
        return kwargs if isinstance(kwargs, dict) else {}

    @property
    def modes(self) -> list[dict[str, Any]]:
        """The modes the dataset mixes, as run.json keeps them (``name``, ``weight``,
        ``chat_template_kwargs``, ``sampling``); [] for a dataset that mixes none."""
        modes = self.settings.get("modes")
        if not isinstance(modes, list):
            return []
        return [m for m in modes if isinstance(m, dict) and isinstance(m.get("name"), str)]

    @property
    def modes_source(self) -> str | None:
        """The deployment sample the modes were taken from (None: written in the manifest)."""
        source = self.settings.get("modes_source")
        return source if isinstance(source, str) else None

    def template_kwargs(self, mode: str | None) -> dict[str, Any]:
        """The chat-template arguments a record of `mode` was generated with: its mode's over
        the dataset's (the dataset's for no mode, or one run.json does not know)."""
        base = self.chat_template_kwargs
        chosen = next((m for m in self.modes if m["name"] == mode), None) if mode else None
        extra = chosen.get("chat_template_kwargs") if chosen is not None else None
        return {**base, **extra} if isinstance(extra, dict) and extra else base

    def files(self) -> list[Path]:
        """The dataset's raw, prompts and errors files that exist."""
        return [path for path in (self.raw_path, self.prompts_path, self.errors_path)
                if path.is_file()]


def check_dataset_names(manifest: Manifest) -> None:
    """ConfigError naming the key, the manifest and its line for a dataset whose folder would
    collide with one of the run directory's own entries (RUN_ENTRIES)."""
    for index, ds in enumerate(manifest.datasets):
        taken = _RESERVED.get(ds.name.lower())
        if taken is None:
            continue
        key = f"datasets[{ds.origin.index if ds.origin else index}].name"
        message = (f"{ds.name!r} would collide with the run directory's own {taken!r} "
                   f"(reserved: {', '.join(RUN_ENTRIES)})")
        raise with_line(ConfigError(key, message, manifest.source), Path(manifest.source))


def holds_dataset_files(folder: Path) -> bool:
    """Whether folder holds a raw, prompts or errors file."""
    return any((folder / name).exists() for name in DATASET_FILES)


def find_datasets(root: Path, entries: dict[str, dict[str, Any]]) -> list[DatasetDir]:
    """The datasets of run directory root whose run.json lists `entries` (see the module
    docstring for the order); [] when there are none."""
    if not entries and (root / RAW_FILE).is_file():
        return [DatasetDir(root.resolve().name, root)]
    found = [DatasetDir(name, root / name, entry) for name, entry in entries.items()]
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in entries):
        if holds_dataset_files(folder):
            found.append(DatasetDir(folder.name, folder))
    return found
