"""Every cache of a run, in one place: what is kept, in which of three shapes, and why.

A cache keeps what a read found for the next reader, in a ``.workbench-cache/`` folder beside
what was read (a dataset's folder, or OUT for the run as a whole). Every kind is best effort
(one that cannot be read is ignored, one that cannot be written is skipped) and is used only
for exactly what it was computed from, so a cache never changes a number, only saves the
work, and deleting the folder is always safe. The kinds, each declared by its owner:

    kind                  shape     owner: what it keeps
    scan                  appended  rundir/columns.py: the scan of raw_responses.jsonl (every
                                    record's columns and the validation tallies)
    prompts               appended  rundir/prompt_scan.py: one read of prompts.jsonl (ids,
                                    first lines, lengths, problems)
    prompt-figures        appended  rundir/figures.py: each prompt's digest and signature
    prompt-overlaps       appended  rundir/figures.py: each prompt's benchmark overlaps
    digest                appended  report/provenance.py: the 4 MiB block digests of a
                                    report's input files
    quality-prompt-flags  keyed     analyze/quality.py: the prompt rules across a run
                                    (duplicates, near duplicates, contamination)
    reply-figures         store     rundir/figures.py: each reply's digest, repeated-n-gram
                                    share and signature, written by generate
    reply-overlaps        store     rundir/figures.py: each reply's benchmark overlaps, written
                                    by generate

(The stats' :class:`~workbench.rundir.cursor.Cursor` offsets are kept in memory only, by a
live collector between two refreshes.)

The three shapes, and why each:

    appended   (:class:`AppendedCache`, ``<kind>-<key>.msgpack``) the value is a fold over a
               file that is only ever appended to (raw_responses.jsonl, errors.jsonl,
               prompts.jsonl: written before the requests, appended to by a resume), kept with
               the byte offset (a line start) it was read to, so the next reader reads only
               the bytes appended since. It holds the :data:`Stamp` the file had before the
               read (device, inode, size, modification and change times: any write moves the
               change time, even one that restores the modification time) and a digest of a
               dozen 4 KiB blocks spread over the bytes before the offset, the last one ending
               at it. Used as is while the stamp is unchanged. A file of another size (same
               device and inode, still as long as the offset: it grew, or a resume cut its
               torn last line) whose blocks still give that digest is read only after the
               offset; any other change (another inode, cut before the offset, rewritten at
               the same size, a sampled block changed) makes it read again from the start. A
               rewrite that changes the size and keeps every sampled block goes unnoticed:
               writers only append. The value is not kept when the stamp taken before the
               read tells that the file changed otherwise than in size meanwhile.
    keyed      (:class:`KeyedCache`, ``<kind>-<key>.msgpack``) a value computed from several
               files at once, with nothing to continue from: its key names everything it was
               computed from (the stamps of the files it read among them); one of a kind is
               kept, the one last saved.
    store      (:func:`store_path`, ``<kind>-<key>.bin``) figures the writer computes while it
               writes each reply, before any reader exists: fixed-size entries appended, found
               by the reply's digest (its content), never by its line or the file's stamp,
               which change on every write, a resume or a line moved aside. A crash or a full
               disk loses at most the last entry. `<key>` names the settings the figures
               depend on, not the workbench version: a newer reader takes an older writer's.

The msgpack kinds are keyed on everything the kept value depends on (cache format, workbench
version and the caller's settings, :func:`cache_key`).

On a filesystem whose timestamps are coarser than its writes, a same-size rewrite in the
clock tick the stamp was taken in leaves the stamp as it was (since Linux 6.13, a file on
ext4, xfs, btrfs or tmpfs whose times were read gets a fine-grained change time when next
written).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec

import workbench
from workbench.rundir.files import write_atomic
from workbench.rundir.layout import CACHE_DIR

__all__ = [
    "AppendedCache",
    "KeyedCache",
    "Stamp",
    "cache_key",
    "file_stamp",
    "store_path",
]

_FORMAT = 3
_PROBES = 12  # blocks before the offset compared when a file changed size
_PROBE_BYTES = 4096

T = TypeVar("T")

Stamp = tuple[int, int, int, int, int]
"""(device, inode, size, modification time, change time) of a file, times in ns."""
_Change = Literal["same", "resized", "changed"]


def file_stamp(path: Path) -> Stamp | None:
    """The :data:`Stamp` of path now; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _Appended(msgspec.Struct):
    """One cache file of an append-only file: its stamp before the read, the offset read to,
    the digest of the sampled blocks before it, and what was read up to it."""

    format: int
    version: str
    key: str
    stamp: Stamp
    offset: int
    probe: bytes
    value: msgspec.Raw


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Appended)


def cache_key(*parts: Any) -> str:
    """A short digest of the settings a scan depends on (with the format and version)."""
    text = repr((_FORMAT, workbench.__version__, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _probe_spans(offset: int) -> list[tuple[int, int]]:
    """(start, length) of the blocks sampled before offset: _PROBES blocks spread evenly,
    the first at 0 and the last ending at offset; the whole of it when that is shorter."""
    if offset <= _PROBES * _PROBE_BYTES:
        return [(0, offset)]
    last = offset - _PROBE_BYTES
    return [(last * k // (_PROBES - 1), _PROBE_BYTES) for k in range(_PROBES)]


def _probe(path: Path, offset: int) -> bytes:
    """The digest of path's sampled blocks before offset (a few reads, whatever its size)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb", buffering=0) as file:
        for start, length in _probe_spans(offset):
            file.seek(start)
            digest.update(file.read(length))
    return digest.digest()


def _change(before: Stamp, now: Stamp | None, offset: int) -> _Change:
    """How a file with stamp `before` differs now: "same"; "resized" (the same file, still
    holding `offset` bytes, another size: appended to, or a torn tail cut, if its sampled
    blocks before `offset` are unchanged); else "changed" (gone, another file, rewritten at
    its size, or cut before `offset`)."""
    if now is None or now[:2] != before[:2] or now[2] < offset:
        return "changed"
    if now == before:
        return "same"
    return "changed" if now[2] == before[2] else "resized"


class AppendedCache(Generic[T]):
    """One kind of appended cache (the module docstring): its name, and the type of the value
    it keeps of a file."""

    def __init__(self, kind: str, value_type: Any) -> None:
        self.kind = kind
        self.value_type: type[T] = value_type

    def load(self, path: Path, key: str | None) -> tuple[T, int] | None:
        """(what was kept for path, the offset it was read to), or None when there is no
        usable cache: none, unreadable, other settings, or path's bytes before that offset
        may have changed. Key None takes the newest usable one of any key."""
        if key is not None:
            return self._usable(path, _kind_file(path.parent, self.kind, key), key)
        try:
            paths = sorted((path.parent / CACHE_DIR).glob(f"{self.kind}-*.msgpack"),
                           key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return None
        return next(filter(None, (self._usable(path, cache, None) for cache in paths)), None)

    def _usable(self, path: Path, cache: Path, key: str | None) -> tuple[T, int] | None:
        try:
            cached = _DECODER.decode(cache.read_bytes())
            same = (
                cached.format == _FORMAT and cached.version == workbench.__version__
                and (key is None or cached.key == key) and _holds(path, cached)
            )  # fmt: skip
            return ((msgspec.msgpack.decode(cached.value, type=self.value_type), cached.offset)
                    if same else None)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def save(self, path: Path, key: str, value: T, offset: int, stamp: Stamp | None) -> None:
        """Keep value (what was read of path up to offset) for the next reader; stamp is
        path's :func:`file_stamp` taken before that read. Best effort, and nothing when path
        changed since otherwise than in size (appended to while it was read)."""
        if stamp is None or _change(stamp, file_stamp(path), offset) == "changed":
            return
        with contextlib.suppress(OSError, OverflowError):  # ids past 64 bits: not cached
            raw = msgspec.Raw(_ENCODER.encode(value))
            _write(_kind_file(path.parent, self.kind, key), _ENCODER.encode(
                _Appended(_FORMAT, workbench.__version__, key, stamp, offset,
                          _probe(path, offset), raw)))


def _holds(path: Path, cached: _Appended) -> bool:
    """Whether path still holds the bytes before cached.offset that cached.value was read from."""
    change = _change(cached.stamp, file_stamp(path), cached.offset)
    return change == "same" or (change == "resized" and _probe(path, cached.offset) == cached.probe)


def _kind_file(folder: Path, kind: str, key: str) -> Path:
    return folder / CACHE_DIR / f"{kind}-{key}.msgpack"


class _Keyed(msgspec.Struct):
    format: int
    version: str
    key: str
    value: msgspec.Raw


class KeyedCache(Generic[T]):
    """One kind of keyed cache (the module docstring): its name, and the type of its value."""

    def __init__(self, kind: str, value_type: Any) -> None:
        self.kind = kind
        self.value_type: type[T] = value_type

    def load(self, folder: Path, key: str) -> T | None:
        """The value kept in folder's cache under key, or None."""
        try:
            kept = msgspec.msgpack.decode(_kind_file(folder, self.kind, key).read_bytes(),
                                          type=_Keyed)
            if (kept.format, kept.version, kept.key) != (_FORMAT, workbench.__version__, key):
                return None
            return msgspec.msgpack.decode(kept.value, type=self.value_type)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def save(self, folder: Path, key: str, value: T) -> None:
        """Keep value under key in folder's cache, in place of any other of its kind; best
        effort."""
        path = _kind_file(folder, self.kind, key)
        with contextlib.suppress(OSError, OverflowError):
            raw = msgspec.Raw(_ENCODER.encode(value))
            _write(path, _ENCODER.encode(_Keyed(_FORMAT, workbench.__version__, key, raw)))
            for other in path.parent.glob(f"{self.kind}-*.msgpack"):
                if other != path:
                    other.unlink(missing_ok=True)


def store_path(folder: Path, kind: str, settings: object) -> Path:
    """The store of `kind` in dataset folder `folder` for figures computed with `settings`
    (a store's key: its settings only, see the module docstring)."""
    key = hashlib.sha256(repr(settings).encode())
    return Path(folder) / CACHE_DIR / f"{kind}-{key.hexdigest()[:16]}.bin"


def _write(path: Path, data: bytes) -> None:
    """data into path atomically; nothing when it cannot be written (a full disk, a read-only
    folder), and no temp file left behind then either."""
    with contextlib.suppress(OSError):
        write_atomic(path, data)
