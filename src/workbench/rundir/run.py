"""A run directory as one value: its run.json and its datasets, and the run check.

:func:`load_run` is how every stage opens a run (validation and the reports' scan, the
stats, the export, the explorer, the subset comparison): the same datasets, in the same
order (:func:`workbench.rundir.layout.find_datasets`), from the same reader of run.json.
Bad input is a DataError naming the folder or the file (a CLI exit 2):

    PATH: not a run directory (no such directory | not a directory | no run.json and no
          <dataset>/raw_responses.jsonl)
    PATH/run.json: invalid JSON: ... line L column C ... | expected a JSON object
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from workbench.errors import ConfigError, DataError
from workbench.profiles import ModelProfile, get_profile
from workbench.rundir.layout import (
    DATASET_FILES,
    MANIFEST_FILE,
    RAW_FILE,
    DatasetDir,
    find_datasets,
)
from workbench.rundir.manifest import dataset_entries, manifest_path, read_manifest

__all__ = ["DEFAULT_PROFILE", "RunInfo", "check_run_dir", "load_run", "run_root"]

DEFAULT_PROFILE = "kimi-k2.5"


class RunInfo(msgspec.Struct, frozen=True):
    """A run directory as read: its run.json ({} when absent) and its dataset folders."""

    out: Path
    manifest: dict[str, Any]
    datasets: list[DatasetDir]

    @property
    def profile_name(self) -> str:
        name = self.manifest.get("model_profile")
        return name if isinstance(name, str) else DEFAULT_PROFILE

    def profile(self, override: str | None = None) -> ModelProfile:
        """The override, else run.json's model_profile, else kimi-k2.5."""
        if override is not None:
            return get_profile(override, "--model-profile")
        return get_profile(self.profile_name, f"{manifest_path(self.out)}: model_profile")

    def dataset(self, name: str) -> DatasetDir:
        """The dataset called name; ConfigError naming the known ones."""
        for ds in self.datasets:
            if ds.name == name:
                return ds
        known = ", ".join(ds.name for ds in self.datasets) or "none"
        raise ConfigError("dataset", f"unknown dataset {name!r} (known: {known})")

    def files(self) -> list[Path]:
        """run.json and every dataset's raw, prompts and errors files that exist."""
        found = [manifest_path(self.out)] if manifest_path(self.out).is_file() else []
        return found + [path for ds in self.datasets for path in ds.files()]

    def owns(self, path: Path) -> bool:
        """Whether writing path would replace one of the run's files or add a file to one
        of its dataset folders."""
        where, root = path.resolve(), self.out.resolve()
        if not where.is_relative_to(root):
            return False
        names = (MANIFEST_FILE, *DATASET_FILES)
        in_dataset = where.parent != root and any((where.parent / n).exists() for n in names)
        return where.name in names or in_dataset


def run_root(out: str | os.PathLike[str]) -> Path:
    """out as a Path; DataError unless it is a directory."""
    root = Path(out)
    if not root.is_dir():
        what = "not a directory" if root.exists() else "no such directory"
        raise DataError(root, f"not a run directory ({what})")
    return root


def load_run(
    out: str | os.PathLike[str], only: Sequence[str] = (), *, need_datasets: bool = True
) -> RunInfo:
    """The run in directory `out`, its datasets narrowed to `only` (ConfigError naming an
    unknown one). DataError when `out` is not a run: no directory, a bad run.json, or (with
    `need_datasets`) no dataset at all."""
    root = run_root(out)
    manifest = read_manifest(root)
    datasets = find_datasets(root, dataset_entries(manifest))
    if need_datasets and not datasets:
        raise _no_datasets(root)
    return RunInfo(root, manifest, _select(datasets, only))


def check_run_dir(out: str | os.PathLike[str], *, need_datasets: bool = True) -> None:
    """DataError unless `out` is a directory whose run.json (when present) is a JSON object
    and which holds run.json or a dataset (or anything, without `need_datasets`)."""
    run = load_run(out, need_datasets=False)
    if need_datasets and not run.datasets and not manifest_path(run.out).is_file():
        raise _no_datasets(run.out)


def _no_datasets(root: Path) -> DataError:
    where = f"no datasets in {MANIFEST_FILE}" if manifest_path(root).is_file() else f"no {MANIFEST_FILE}"
    return DataError(root, f"not a run directory ({where} and no <dataset>/{RAW_FILE})")


def _select(datasets: list[DatasetDir], only: Sequence[str]) -> list[DatasetDir]:
    if not only:
        return datasets
    names = [ds.name for ds in datasets]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ConfigError("--only", f"unknown dataset {unknown[0]!r} (known: {', '.join(names)})")
    return [ds for ds in datasets if ds.name in only]
