"""What a report was made from, so that it can be made again and compared.

A report folder holds, next to the executed notebook and its HTML:

    params.yaml    every parameter of the notebook as it ran (defaults filled in, paths
                   absolute, ``now`` pinned): ``workbench report NAME --params params.yaml``
                   runs it again
    report.json    the report's name and time, the notebook's digest, Python and package
                   versions, and each input file read: its path, byte length and digest
                   (``bytes_after`` too when it grew while the report ran); for the index
                   of reports (:mod:`workbench.report.index`) also ``run`` (the run_dir or
                   sweep_dir it read), ``inputs_changed`` (since the previous rendering of
                   the same report and run: true, false, or null for the first), and once
                   it ran ``cell_errors`` (error outputs in the executed notebook) or
                   ``error`` (why the rendering failed or stopped)

Input files are those of the path parameters: a run directory's ``run.json`` and each
dataset's ``raw_responses.jsonl``, ``prompts.jsonl`` and ``errors.jsonl``; every file of a
tokenizer or sweep folder; a parameter file. :func:`compare_inputs` tells, per input,
whether it is unchanged, grew (its first recorded bytes unchanged), changed, missing or new.

Digests. A run's data files (raw, prompts, errors) get Dropbox's content hash
(``content_hash``: the sha256 of the sha256 digests of each 4 MiB block), whose whole blocks
are kept in the dataset's cache (an appended cache, :mod:`workbench.rundir.cache`): a report of
a run that grew reads only its last block and what was appended, not the whole run again.
Like the scan, it trusts the cached blocks while the file is unchanged or only grew (see
:mod:`workbench.rundir.cache`). Every other file gets its plain ``sha256``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import ConfigError, DataError
from workbench.rundir.cache import AppendedCache, file_stamp
from workbench.rundir.layout import DATASET_FILES
from workbench.rundir.run import load_run

__all__ = [
    "CONTENT_BLOCK",
    "MANIFEST",
    "PARAMS",
    "InputChange",
    "changed_since",
    "compare_inputs",
    "content_hash",
    "digest",
    "input_files",
    "package_versions",
    "read_manifest",
    "record_failure",
    "run_of",
    "write_manifest",
    "write_parameters",
]

PARAMS = "params.yaml"
MANIFEST = "report.json"
PACKAGES = ("workbench", "numpy", "pandas", "pyarrow", "msgspec", "plotly", "papermill", "nbconvert",
            "nbformat", "ipykernel", "jupyterlab", "ipywidgets", "anywidget", "transformers", "tokenizers")
_CHUNK = 1 << 20
CONTENT_BLOCK = 4 << 20  # Dropbox's content hash block
_BLOCKS: AppendedCache[list[bytes]] = AppendedCache("digest", list[bytes])


def digest(path: Path, length: int | None = None) -> tuple[int, str]:
    """(bytes read, sha256 hex) of the file's first `length` bytes (all of it by default)."""
    sha, read = hashlib.sha256(), 0
    with path.open("rb") as file:
        while length is None or read < length:
            chunk = file.read(_CHUNK if length is None else min(_CHUNK, length - read))
            if not chunk:
                break
            sha.update(chunk)
            read += len(chunk)
    return read, sha.hexdigest()


def content_hash(path: Path, length: int | None = None, *, cache: bool = False) -> tuple[int, str]:
    """(bytes read, hex) of Dropbox's content hash of the file's first `length` bytes (all of
    it, as long as it was when opened, by default): the sha256 of the concatenated sha256
    digests of each 4 MiB block. With `cache`, the digests of the whole blocks before the
    last newline are kept beside the file (see the module docstring; a torn last line may
    be cut off when a run resumes) and taken from there while they fit it."""
    key = f"{path.name}-4MiB"  # one cache file per file of the folder
    stamp = file_stamp(path) if cache else None  # before any read: what the kept blocks fit
    found = _BLOCKS.load(path, key) if cache else None
    blocks: list[bytes] = []
    read = lines_end = 0
    with path.open("rb") as file:
        end = os.fstat(file.fileno()).st_size if length is None else length
        if found is not None and found[1] <= end and len(found[0]) * CONTENT_BLOCK == found[1]:
            blocks, read = found
            lines_end = read
            file.seek(read)
        while read < end and (block := file.read(min(CONTENT_BLOCK, end - read))):
            blocks.append(hashlib.sha256(block).digest())
            if (newline := block.rfind(b"\n")) >= 0:
                lines_end = read + newline + 1
            read += len(block)
            if len(block) < CONTENT_BLOCK:
                break  # the file's end (or `length`)
    kept = lines_end // CONTENT_BLOCK
    if cache and kept * CONTENT_BLOCK > (found[1] if found else 0):
        _BLOCKS.save(path, key, blocks[:kept], kept * CONTENT_BLOCK, stamp)
    return read, hashlib.sha256(b"".join(blocks)).hexdigest()


def _files_of(path: Path) -> list[Path]:
    """path itself, a run's files, or every file of another folder."""
    if path.is_file():
        return [path]
    try:
        run = load_run(path, need_datasets=False)
    except DataError:
        run = None
    if run is not None and (run.manifest or run.datasets):
        return run.files()
    return sorted(p for p in path.rglob("*") if p.is_file())


def input_files(parameters: Mapping[str, Any], keys: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(parameter, file) for every file the path parameters `keys` name (see above)."""
    found: list[tuple[str, Path]] = []
    for key in keys:
        value = parameters.get(key)
        if isinstance(value, str) and value and Path(value).exists():
            found.extend((key, file.resolve()) for file in _files_of(Path(value)))
    return found


def package_versions() -> dict[str, str]:
    """Python's version and each installed package of PACKAGES with its version."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def write_parameters(folder: Path, parameters: Mapping[str, Any], name: str) -> Path:
    """params.yaml: the parameters, with a header saying how to pass them back."""
    path = folder / PARAMS
    header = (f"# Parameters of this {name} report, as it ran (defaults included, paths absolute).\n"
              f"# workbench report {name} --params {path}   or   workbench report --rerun {folder}\n")
    path.write_text(header + yaml.safe_dump(dict(parameters), sort_keys=False), encoding="utf-8")
    return path


def _inputs(files: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    rows = []
    for key, path in files:
        if path.name in DATASET_FILES:
            size, found = content_hash(path, cache=True)
            rows.append({"parameter": key, "path": str(path), "bytes": size, "content_hash": found})
        else:
            size, found = digest(path)
            rows.append({"parameter": key, "path": str(path), "bytes": size, "sha256": found})
    return rows


def run_of(parameters: Mapping[str, Any]) -> str | None:
    """The run a report reads: its ``run_dir``, else its ``sweep_dir`` (None for neither)."""
    for key in ("run_dir", "sweep_dir"):
        value = parameters.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def write_manifest(folder: Path, name: str, notebook: Path, files: list[tuple[str, Path]],
                   started: float, extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """report.json, its inputs digested now (`extra` keys added at its top level); returns
    the inputs (for :func:`finish_manifest`)."""
    inputs = _inputs(files)
    manifest = {"report": name, "started": started, "notebook": {"path": str(notebook),
                "sha256": digest(notebook)[1]}, "versions": package_versions(), "inputs": inputs,
                **(extra or {})}
    _write(folder, manifest)
    return inputs


def _write(folder: Path, manifest: Mapping[str, Any]) -> None:
    """report.json replaced whole (a reader never sees half of it)."""
    temporary = folder / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, folder / MANIFEST)


def finish_manifest(folder: Path, extra: Mapping[str, Any] | None = None) -> None:
    """Add the finishing time, `extra`, and ``bytes_after`` to each input that grew meanwhile."""
    manifest = read_manifest(folder)
    for entry in manifest["inputs"]:
        path = Path(entry["path"])
        size = path.stat().st_size if path.exists() else 0
        if size != entry["bytes"]:
            entry["bytes_after"] = size
    manifest.update(extra or {})
    manifest["finished"] = time.time()
    _write(folder, manifest)


def record_failure(folder: Path, message: str) -> None:
    """Say in report.json why the rendering did not finish (a cell raised, Ctrl-C)."""
    manifest = read_manifest(folder)
    manifest["error"] = message
    _write(folder, manifest)


def read_manifest(folder: Path) -> dict[str, Any]:
    """A report folder's report.json (ConfigError when the folder holds none)."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("--rerun", f"{folder}: not a report folder (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError("--rerun", f"{path}: unreadable: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("inputs"), list):
        raise ConfigError("--rerun", f"{path}: not a report manifest")
    return manifest


@dataclass(frozen=True, slots=True)
class InputChange:
    """One input compared with its record: unchanged, grew, changed, missing or new."""

    path: str
    state: str
    was: int | None
    now: int | None

    def line(self) -> str:
        was, now = self.was, self.now
        if self.state == "grew" and was is not None and now is not None:
            sizes = f" ({was:,} -> {now:,} bytes; the first {was:,} unchanged)"
        elif self.state == "changed" and was is not None and now is not None:
            sizes = f" ({was:,} -> {now:,} bytes)"
        elif self.state in ("new", "changed") and now is not None:
            sizes = f" ({now:,} bytes)"
        else:
            sizes = ""
        return f"{self.state}: {self.path}{sizes}"


def _compared(entry: Mapping[str, Any]) -> InputChange:
    path, was = Path(entry["path"]), int(entry["bytes"])
    if not path.is_file():
        return InputChange(str(path), "missing", was, None)
    size = path.stat().st_size
    if "content_hash" in entry:
        read, found, recorded = *content_hash(path, was), entry["content_hash"]
    else:
        read, found, recorded = *digest(path, was), entry["sha256"]
    if read == was and found == recorded:
        return InputChange(str(path), "unchanged" if size == was else "grew", was, size)
    return InputChange(str(path), "changed", was, size)


def compare_inputs(manifest: Mapping[str, Any], now: list[tuple[str, Path]]) -> list[InputChange]:
    """Each recorded input against the file as it is, then the files read now that were
    not read then (`now`: :func:`input_files` of the same parameters)."""
    changes = [_compared(entry) for entry in manifest["inputs"]]
    recorded = {entry["path"] for entry in manifest["inputs"]}
    changes += [InputChange(str(path), "new", None, path.stat().st_size)
                for _, path in now if str(path) not in recorded]
    return changes


def changed_since(manifest: Mapping[str, Any], notebook: Path,
                  now: list[tuple[str, Path]]) -> list[InputChange]:
    """What differs from a recorded rendering: its inputs (:func:`compare_inputs`, the
    unchanged ones left out), and the notebook when its digest is another one."""
    changes = [c for c in compare_inputs(manifest, now) if c.state != "unchanged"]
    recorded = manifest.get("notebook", {})
    if notebook.is_file() and digest(notebook)[1] != recorded.get("sha256"):
        size = notebook.stat().st_size
        changes.append(InputChange(str(notebook), "changed", None, size))
    return changes
