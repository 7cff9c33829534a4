"""The caches beside each dataset (``<dataset>/.workbench-cache/``): reads kept for the next reader.

Best effort (a cache that cannot be read is ignored, one that cannot be
written is skipped) and keyed on everything the kept value depends on (cache format,
workbench version and the caller's settings, :func:`cache_key`), so a cache never changes a
number; deleting the folder is always safe. Each is kept with the :data:`Stamp` its file had
before the read (device, inode, size, modification and change times: any write moves the
change time, even one that restores the modification time) and is used only for the bytes
the file held then:

    appended   what was read of an append-only file (raw_responses.jsonl, errors.jsonl,
               prompts.jsonl: written before the requests, appended to by a resume) up
               to a byte offset (a line start), with a digest of a dozen 4 KiB blocks spread
               over the bytes before that offset, the last one ending at it. Used as is while
               the stamp is unchanged. A file of another size (same device and inode, still
               as long as the offset: it grew, or a resume cut its torn last line) whose
               blocks still give that digest is read only after the offset; any other change
               (another inode, cut before the offset, rewritten at the same size, a sampled
               block changed) makes it read again from the start. A rewrite that changes the
               size and keeps every sampled block goes unnoticed: writers only append. The
               value is not kept when the stamp taken before the read tells that the file
               changed otherwise than in size meanwhile.
               :func:`load_appended`, :func:`save_appended`.
    keyed      a value whose key names everything it was computed from (the stamps of the
               files it read among them), in a folder's cache: one of a kind is kept, the
               one last saved. :func:`load_keyed`, :func:`save_keyed`.

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
from typing import Any, Literal, TypeVar

import msgspec

import workbench
from workbench.rundir.files import write_atomic
from workbench.rundir.layout import CACHE_DIR

__all__ = [
    "Stamp",
    "cache_key",
    "file_stamp",
    "load_appended",
    "load_keyed",
    "save_appended",
    "save_keyed",
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


def load_appended(path: Path, kind: str, key: str | None, value_type: type[T]) -> tuple[T, int] | None:
    """(what was kept of kind for path, the offset it was read to), or None when there is no
    usable cache: none, unreadable, other settings, or path's bytes before that offset may
    have changed (see the module docstring). Key None takes the newest usable one of any key."""
    if key is not None:
        return _usable(path, _cache_file(path, kind, key), key, value_type)
    try:
        paths = sorted((path.parent / CACHE_DIR).glob(f"{kind}-*.msgpack"),
                       key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    return next(filter(None, (_usable(path, cache, None, value_type) for cache in paths)), None)


def _usable(path: Path, cache: Path, key: str | None, value_type: type[T]) -> tuple[T, int] | None:
    try:
        cached = _DECODER.decode(cache.read_bytes())
        same = (
            cached.format == _FORMAT and cached.version == workbench.__version__
            and (key is None or cached.key == key) and _holds(path, cached)
        )  # fmt: skip
        return (msgspec.msgpack.decode(cached.value, type=value_type), cached.offset) if same else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _holds(path: Path, cached: _Appended) -> bool:
    """Whether path still holds the bytes before cached.offset that cached.value was read from."""
    change = _change(cached.stamp, file_stamp(path), cached.offset)
    return change == "same" or (change == "resized" and _probe(path, cached.offset) == cached.probe)


def save_appended(
    path: Path, kind: str, key: str, value: Any, offset: int, stamp: Stamp | None
) -> None:
    """Keep value (what was read of path up to offset) for the next reader; stamp is path's
    :func:`file_stamp` taken before that read. Best effort, and nothing when path changed
    since otherwise than in size (appended to while it was read)."""
    if stamp is None or _change(stamp, file_stamp(path), offset) == "changed":
        return
    with contextlib.suppress(OSError, OverflowError):  # ids past 64 bits: not cached
        raw = msgspec.Raw(_ENCODER.encode(value))
        _write(_cache_file(path, kind, key), _ENCODER.encode(
            _Appended(_FORMAT, workbench.__version__, key, stamp, offset, _probe(path, offset),
                      raw)))


def _cache_file(path: Path, kind: str, key: str) -> Path:
    return _kind_file(path.parent, kind, key)


def _kind_file(folder: Path, kind: str, key: str) -> Path:
    return folder / CACHE_DIR / f"{kind}-{key}.msgpack"


class _Keyed(msgspec.Struct):
    format: int
    version: str
    key: str
    value: msgspec.Raw


def load_keyed(folder: Path, kind: str, key: str, value_type: type[T]) -> T | None:
    """The value of kind kept in folder's cache under key, or None."""
    try:
        kept = msgspec.msgpack.decode(_kind_file(folder, kind, key).read_bytes(),
                                      type=_Keyed)
        if (kept.format, kept.version, kept.key) != (_FORMAT, workbench.__version__, key):
            return None
        return msgspec.msgpack.decode(kept.value, type=value_type)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def save_keyed(folder: Path, kind: str, key: str, value: Any) -> None:
    """Keep value of kind under key in folder's cache, in place of any other of its kind;
    best effort."""
    path = _kind_file(folder, kind, key)
    with contextlib.suppress(OSError, OverflowError):
        raw = msgspec.Raw(_ENCODER.encode(value))
        _write(path, _ENCODER.encode(_Keyed(_FORMAT, workbench.__version__, key, raw)))
        for other in path.parent.glob(f"{kind}-*.msgpack"):
            if other != path:
                other.unlink(missing_ok=True)


def _write(path: Path, data: bytes) -> None:
    """data into path atomically; nothing when it cannot be written (a full disk, a read-only
    folder), and no temp file left behind then either."""
    with contextlib.suppress(OSError):
        write_atomic(path, data)
