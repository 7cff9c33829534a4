"""Input digests of report.json: Dropbox's content hash of a run's files, kept per block."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from workbench.report import provenance
from workbench.report.provenance import CONTENT_BLOCK, content_hash

MiB = 1 << 20


def dropbox_hash(data: bytes) -> str:
    """Dropbox's reference: sha256 over the sha256 of each 4 MiB block."""
    blocks = [data[k:k + 4 * MiB] for k in range(0, len(data), 4 * MiB)]
    return hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).hexdigest()


def payload(size: int, seed: int = 0) -> bytes:
    return hashlib.shake_256(str(seed).encode()).digest(size) if size else b""


@pytest.mark.parametrize("size", [0, 1, CONTENT_BLOCK - 1, CONTENT_BLOCK, CONTENT_BLOCK + 1, 9 * MiB + 7])
def test_content_hash_is_dropboxs(size: int, tmp_path: Path) -> None:
    data = payload(size)
    path = tmp_path / "raw_responses.jsonl"
    path.write_bytes(data)
    assert content_hash(path) == (size, dropbox_hash(data))
    assert content_hash(path, cache=True) == (size, dropbox_hash(data))
    assert content_hash(path, cache=True) == (size, dropbox_hash(data))  # from the cache
    cut = size // 3
    assert content_hash(path, cut) == (cut, dropbox_hash(data[:cut]))
    assert content_hash(path, size + 10) == (size, dropbox_hash(data))  # shorter than asked


def hashed_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the blocks content_hash digests from now on."""
    sizes: list[int] = []
    real = hashlib.sha256

    def spy(data: bytes = b"") -> object:
        sizes.append(len(data))
        return real(data)

    monkeypatch.setattr(provenance.hashlib, "sha256", spy)
    return sizes


def test_a_grown_file_is_read_from_its_last_whole_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "raw_responses.jsonl"
    data = payload(9 * MiB + 5)
    path.write_bytes(data)
    content_hash(path, cache=True)
    more = payload(300, seed=1)
    with path.open("ab") as file:
        file.write(more)
    expected = dropbox_hash(data + more)
    sizes = hashed_bytes(monkeypatch)
    assert content_hash(path, cache=True) == (len(data) + 300, expected)
    assert sizes == [1 * MiB + 5 + 300, 3 * 32]  # the last block only, then the digest of digests


def test_a_rewritten_or_shrunk_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "raw_responses.jsonl"
    path.write_bytes(payload(9 * MiB))
    content_hash(path, cache=True)
    replaced = payload(9 * MiB, seed=2)  # a new file (new inode) with the same size
    (tmp_path / "new").write_bytes(replaced)
    os.replace(tmp_path / "new", path)
    assert content_hash(path, cache=True) == (len(replaced), dropbox_hash(replaced))
    with path.open("r+b") as file:  # the same inode, shorter
        file.truncate(5 * MiB)
    assert content_hash(path, cache=True) == (5 * MiB, dropbox_hash(replaced[:5 * MiB]))
    with path.open("r+b") as file:  # the same inode, the bytes before the cached offset changed
        file.seek(4 * MiB - 10)
        file.write(b"x" * 10)
    changed = path.read_bytes()
    assert content_hash(path, cache=True) == (len(changed), dropbox_hash(changed))


def test_blocks_after_the_last_newline_are_not_kept(tmp_path: Path) -> None:
    """A resumed run cuts its torn last line and appends past it: blocks of that line, kept,
    would stand for bytes the file no longer has (even where the bytes before them match)."""
    path = tmp_path / "raw_responses.jsonl"
    lines, torn = b"a\n" * (3 * MiB), b"y" * (6 * MiB)  # a 6 MiB last line without its newline
    path.write_bytes(lines + torn)
    content_hash(path, cache=True)
    with path.open("r+b") as file:
        file.truncate(len(lines))
    more = b"z\n" * (3 * MiB - 128) + b"y" * 256 + b"\n"  # the same bytes before 12 MiB as before
    with path.open("ab") as file:
        file.write(more)
    assert content_hash(path, cache=True) == (len(lines) + len(more), dropbox_hash(lines + more))


def test_run_files_get_the_content_hash_and_others_sha256(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ds").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    raw = run / "ds" / "raw_responses.jsonl"
    raw.write_bytes(payload(5 * MiB))
    (run / "ds" / "prompts.jsonl").write_bytes(payload(5 * MiB, seed=3) + b"\n")  # its own cache
    files = provenance.input_files({"run_dir": str(run)}, ("run_dir",))
    inputs = {Path(e["path"]).name: e for e in provenance.write_manifest(tmp_path, "r", raw, files, 0.0)}
    assert inputs["raw_responses.jsonl"]["content_hash"] == dropbox_hash(raw.read_bytes())
    assert inputs["run.json"]["sha256"] == hashlib.sha256(b"{}").hexdigest()
    assert sorted(p.name for p in (run / "ds" / ".workbench-cache").glob("digest-*")) == [
        "digest-prompts.jsonl-4MiB.msgpack", "digest-raw_responses.jsonl-4MiB.msgpack"]
    assert content_hash(raw, cache=True)[1] == inputs["raw_responses.jsonl"]["content_hash"]
    with raw.open("ab") as file:
        file.write(b"more\n")
    changes = {Path(c.path).name: c.state for c in provenance.compare_inputs(provenance.read_manifest(tmp_path), files)}
    assert changes == {"run.json": "unchanged", "raw_responses.jsonl": "grew", "prompts.jsonl": "unchanged"}
    with raw.open("r+b") as file:
        file.write(b"edit")
    changes = {Path(c.path).name: c.state for c in provenance.compare_inputs(provenance.read_manifest(tmp_path), files)}
    assert changes["raw_responses.jsonl"] == "changed"
