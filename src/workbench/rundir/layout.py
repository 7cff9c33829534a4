"""The layout of a run directory: its file names and its dataset folders.

    OUT/run.json                          the run manifest (:mod:`workbench.rundir.manifest`)
    OUT/.writer.lock                      held by the generate writing the run (lock.py)
    OUT/<dataset>/raw_responses.jsonl     one record a line (records.py: the data contract)
    OUT/<dataset>/raw_responses.jsonl.torn  torn last lines put aside on resume
    OUT/<dataset>/prompts.jsonl           the prompts as sent
    OUT/<dataset>/errors.jsonl            one line per failed attempt
    OUT/<dataset>/*.bak                   an earlier run's files, moved aside by --no-resume
    OUT/<dataset>/.workbench-cache/       caches of reads (cache.py); always safe to delete

A run's datasets are the ones run.json lists (in its order), then every other folder of OUT
that holds a raw, prompts or errors file (by name). A folder that itself holds
raw_responses.jsonl and no run.json is a run of one dataset named after the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

__all__ = [
    "BACKUP_SUFFIX",
    "CACHE_DIR",
    "DATASET_FILES",
    "ERRORS_FILE",
    "LOCK_FILE",
    "MANIFEST_FILE",
    "PROMPTS_FILE",
    "RAW_FILE",
    "TORN_SUFFIX",
    "DatasetDir",
    "find_datasets",
    "holds_dataset_files",
]

MANIFEST_FILE = "run.json"
LOCK_FILE = ".writer.lock"
RAW_FILE = "raw_responses.jsonl"
PROMPTS_FILE = "prompts.jsonl"
ERRORS_FILE = "errors.jsonl"
DATASET_FILES = (RAW_FILE, PROMPTS_FILE, ERRORS_FILE)
TORN_SUFFIX = ".torn"
BACKUP_SUFFIX = ".bak"
CACHE_DIR = ".workbench-cache"


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
    def chat_template_kwargs(self) -> dict[str, Any]:
        kwargs = self.settings.get("chat_template_kwargs")
        return kwargs if isinstance(kwargs, dict) else {}

    def files(self) -> list[Path]:
        """The dataset's raw, prompts and errors files that exist."""
        return [path for path in (self.raw_path, self.prompts_path, self.errors_path)
                if path.is_file()]


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
