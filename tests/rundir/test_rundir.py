"""The run directory's owner: run.json read and written in one place, the datasets of a run
found one way, whole-file writes that leave nothing half-written, backups that never
overwrite each other."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.errors import ConfigError, DataError, StorageError
from workbench.rundir import files, manifest
from workbench.rundir.files import set_aside, write_atomic, write_lines_atomic
from workbench.rundir.layout import find_datasets
from workbench.rundir.manifest import (
    HISTORY_LIMIT,
    ManifestWatcher,
    read_manifest,
    with_session,
    write_manifest,
)
from workbench.rundir.run import check_run_dir, load_run

NO_RUN = r"not a run directory \(no run.json and no <dataset>/raw_responses.jsonl\)"


def dataset(root: Path, name: str, *files_: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for file in files_:
        (folder / file).write_text('{"sample_id": 1}\n')
    return folder


# --- run.json ------------------------------------------------------------------------------


def test_an_absent_manifest_is_empty(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) == {}


@pytest.mark.parametrize(("text", "message"), [
    ('{\n  "model": "m",\n  oops\n}', r"run.json: invalid JSON: .*line 3 column 3"),
    ("[1, 2]", r"run.json: expected a JSON object"),
])
def test_a_bad_manifest_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(DataError, match=message):
        read_manifest(tmp_path)
    with pytest.raises(DataError, match=message):
        load_run(tmp_path)


def test_an_unreadable_manifest_says_so(tmp_path: Path) -> None:
    (tmp_path / "run.json").mkdir()
    with pytest.raises(DataError, match=r"run.json: cannot read"):
        read_manifest(tmp_path)


def test_write_then_read_round_trips_and_leaves_no_temp_file(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"model": "m", "datasets": {"a": {"prompts": 3}}})
    assert read_manifest(tmp_path) == {"model": "m", "datasets": {"a": {"prompts": 3}}}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_failed_write_keeps_the_old_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_manifest(tmp_path, {"model": "old"})

    def no_space(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", no_space)
    with pytest.raises(StorageError, match=r"run.json: cannot write: No space left on device \("):
        write_manifest(tmp_path, {"model": "new"})
    assert read_manifest(tmp_path) == {"model": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_history_keeps_one_entry_per_session(tmp_path: Path) -> None:
    first = {"workbench_version": "1", "server_url": "http://a", "model": "m", "updated": 11.0}
    once = with_session(first, {}, started=10.0)
    assert once["history"] == [{"started": 10.0, "updated": 11.0, "workbench_version": "1",
                                "server_url": "http://a", "model": "m"}]
    again = with_session({**first, "updated": 12.0}, once, started=10.0)  # the same session
    assert [e["updated"] for e in again["history"]] == [12.0]
    resumed = with_session({**first, "server_url": "http://b", "updated": 21.0}, again, started=20.0)
    assert [(e["started"], e["server_url"]) for e in resumed["history"]] == [
        (10.0, "http://a"), (20.0, "http://b")]


def test_history_is_capped_and_survives_a_bad_value() -> None:
    previous = {"history": [{"started": float(i)} for i in range(HISTORY_LIMIT)]}
    kept = with_session({}, previous, started=-1.0)["history"]
    assert len(kept) == HISTORY_LIMIT and kept[0]["started"] == 1.0 and kept[-1]["started"] == -1.0
    assert len(with_session({}, {"history": "oops"}, started=1.0)["history"]) == 1


def test_the_watcher_reads_again_only_when_the_file_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Path] = []
    real = manifest.read_manifest

    def counting(out: Path) -> dict[str, object]:
        reads.append(Path(out))
        return real(out)

    monkeypatch.setattr(manifest, "read_manifest", counting)
    watcher = ManifestWatcher(tmp_path)
    assert watcher.read() == {} and reads == []
    write_manifest(tmp_path, {"n": 1})
    assert watcher.read() == {"n": 1} and watcher.read() == {"n": 1} and len(reads) == 1
    write_manifest(tmp_path, {"n": 22})
    assert watcher.read() == {"n": 22} and len(reads) == 2
    (tmp_path / "run.json").unlink()
    assert watcher.read() == {}


# --- the datasets of a run ------------------------------------------------------------------


def test_datasets_come_in_manifest_order_then_by_name(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"datasets": {"zeta": {"prompts": 1}, "alpha": ["not", "a", "dict"]}})
    dataset(tmp_path, "c_errors", "errors.jsonl")
    dataset(tmp_path, "b_prompts", "prompts.jsonl")
    dataset(tmp_path, "a_raw", "raw_responses.jsonl")
    dataset(tmp_path, "empty")
    run = load_run(tmp_path)
    assert [ds.name for ds in run.datasets] == ["zeta", "alpha", "a_raw", "b_prompts", "c_errors"]
    assert run.dataset("zeta").settings == {"prompts": 1} and run.dataset("alpha").settings == {}
    assert [ds.name for ds in load_run(tmp_path, ["c_errors", "zeta"]).datasets] == ["zeta", "c_errors"]
    with pytest.raises(ConfigError, match=r"--only: unknown dataset 'nope' \(known: zeta, alpha"):
        load_run(tmp_path, ["nope"])


def test_a_folder_of_records_is_a_run_of_one_dataset(tmp_path: Path) -> None:
    folder = dataset(tmp_path, "B1_glaive", "raw_responses.jsonl")
    assert [(ds.name, ds.folder) for ds in find_datasets(folder, {})] == [("B1_glaive", folder)]


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "absent", r"absent: not a run directory \(no such directory\)"),
    (lambda root: (root / "f.txt", (root / "f.txt").write_text("x"))[0],
     r"f.txt: not a run directory \(not a directory\)"),
    (lambda root: root, NO_RUN),
])
def test_what_is_not_a_run_says_why(tmp_path: Path, make: object, message: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(DataError, match=message):
        load_run(target)
    with pytest.raises(DataError, match=message):
        check_run_dir(target)


def test_a_run_that_has_only_started_passes_the_check(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"model": "m"})  # run.json written, no dataset folder yet
    check_run_dir(tmp_path)
    with pytest.raises(DataError, match=r"no datasets in run.json"):
        load_run(tmp_path)
    (tmp_path / "run.json").unlink()
    check_run_dir(tmp_path, need_datasets=False)
    with pytest.raises(DataError, match=NO_RUN):
        check_run_dir(tmp_path)


def test_files_and_what_writing_would_replace(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"datasets": {"a": {}}})
    dataset(tmp_path, "a", "raw_responses.jsonl", "prompts.jsonl")
    run = load_run(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in run.files()] == [
        "run.json", "a/raw_responses.jsonl", "a/prompts.jsonl"]
    assert run.owns(tmp_path / "run.json") and run.owns(tmp_path / "a" / "export.jsonl")
    assert run.owns(tmp_path / "other" / "raw_responses.jsonl")
    assert not run.owns(tmp_path / "export.jsonl") and not run.owns(tmp_path.parent / "x.jsonl")


# --- whole files and backups ----------------------------------------------------------------


def test_backups_in_the_same_second_never_overwrite_each_other(tmp_path: Path) -> None:
    raw = tmp_path / "raw_responses.jsonl"
    moved = []
    for text in ("first\n", "second\n", "third\n"):
        raw.write_text(text)
        moved.append(set_aside(raw, now=1_700_000_000.0))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_700_000_000.0))
    assert [p.name for p in moved if p] == [f"raw_responses.jsonl.{stamp}{n}.bak"
                                             for n in ("", "-2", "-3")]
    assert [p.read_text() for p in moved if p] == ["first\n", "second\n", "third\n"]
    assert not raw.exists()


def test_an_empty_or_missing_file_is_not_backed_up(tmp_path: Path) -> None:
    raw = tmp_path / "raw_responses.jsonl"
    assert set_aside(raw) is None
    raw.touch()
    assert set_aside(raw) is None and raw.exists()


def test_a_failed_whole_file_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "prompts.jsonl"
    write_atomic(target, b"old\n")

    def lines() -> Iterator[bytes]:
        yield b"new 1\n"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_lines_atomic(target, lines())
    assert target.read_bytes() == b"old\n"
    assert sorted(os.listdir(tmp_path)) == ["prompts.jsonl"]
    write_lines_atomic(target, iter([b"a\n", b"b\n"]))
    assert target.read_bytes() == b"a\nb\n"
