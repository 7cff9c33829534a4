"""The caches beside each dataset (``<dataset>/.workbench-cache/``): reads kept for the next reader.

Two kinds, both best effort (a cache that cannot be read is ignored, one that cannot be
written is skipped) and keyed on everything the kept value depends on (cache format,
workbench version and the caller's settings, :func:`cache_key`), so a cache never changes a
number; deleting the folder is always safe.

    appended   what was read of an append-only file (raw_responses.jsonl, errors.jsonl) up
               to a byte offset (a line start), with the file's identity (device, inode) and
               the bytes just before that offset. The next reader of a file that grew reads
               only the bytes after it; a file that shrank, was replaced or whose last bytes
               before the offset changed is read again from the start (an in-place rewrite
               that keeps those bytes goes unnoticed: writers only append).
               :func:`load_appended`, :func:`save_appended`.
    summary    what was read of a file read whole (prompts.jsonl, written once before the
               requests), used while its identity, size and modification time are those it
               was read with. :func:`load_summary`, :func:`save_summary`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import msgspec

import workbench
from workbench.rundir.layout import CACHE_DIR

__all__ = [
    "Stamp",
    "cache_key",
    "file_stamp",
    "load_appended",
    "load_summary",
    "save_appended",
    "save_summary",
]

_FORMAT = 2
_TAIL_BYTES = 256

T = TypeVar("T")


class _Appended(msgspec.Struct):
    """One cache file of an append-only file: its identity, the offset read (and the bytes
    just before it) and what was read up to it."""

    format: int
    version: str
    key: str
    ident: tuple[int, int]
    offset: int
    tail: bytes
    value: msgspec.Raw


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Appended)


def cache_key(*parts: Any) -> str:
    """A short digest of the settings a scan depends on (with the format and version)."""
    text = repr((_FORMAT, workbench.__version__, *parts))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tail(raw: Path, offset: int) -> bytes:
    start = max(0, offset - _TAIL_BYTES)
    with open(raw, "rb") as file:
        file.seek(start)
        return file.read(offset - start)


def load_appended(path: Path, kind: str, key: str | None, value_type: type[T]) -> tuple[T, int] | None:
    """(what was kept of kind for path, the offset it was read to), or None when there is no
    usable cache: none, unreadable, other settings, or path shrank, was replaced or its
    last bytes before that offset changed. Key None takes the newest usable one of any key."""
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
        st = os.stat(path)
        same = (
            cached.format == _FORMAT and cached.version == workbench.__version__
            and (key is None or cached.key == key)
            and cached.ident == (st.st_dev, st.st_ino) and st.st_size >= cached.offset
            and _tail(path, cached.offset) == cached.tail
        )  # fmt: skip
        return (msgspec.msgpack.decode(cached.value, type=value_type), cached.offset) if same else None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def save_appended(path: Path, kind: str, key: str, value: Any, offset: int) -> None:
    """Keep value (what was read of path up to offset) for the next reader; best effort."""
    with contextlib.suppress(OSError, OverflowError):  # ids past 64 bits: not cached
        st = os.stat(path)
        raw = msgspec.Raw(_ENCODER.encode(value))
        _write(_cache_file(path, kind, key), _ENCODER.encode(
            _Appended(_FORMAT, workbench.__version__, key, (st.st_dev, st.st_ino), offset,
                      _tail(path, offset), raw)))


Stamp = tuple[int, int, int, int]


class _Summary(msgspec.Struct):
    """One summary file: what was read of a file with this stamp."""

    format: int
    version: str
    key: str
    stamp: Stamp
    value: msgspec.Raw


def file_stamp(path: Path) -> Stamp | None:
    """(device, inode, size, modification time) of path; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _cache_file(path: Path, kind: str, key: str) -> Path:
    return path.parent / CACHE_DIR / f"{kind}-{key}.msgpack"


def load_summary(path: Path, kind: str, key: str, value_type: type[T]) -> T | None:
    """The summary of kind saved for path as it is now, or None."""
    try:
        cached = msgspec.msgpack.decode(_cache_file(path, kind, key).read_bytes(),
                                        type=_Summary)
        if (cached.format, cached.version, cached.key) != (_FORMAT, workbench.__version__, key):
            return None
        if cached.stamp != file_stamp(path):
            return None
        return msgspec.msgpack.decode(cached.value, type=value_type)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def save_summary(path: Path, kind: str, key: str, stamp: Stamp | None, value: Any) -> None:
    """Keep value, read from path when it had stamp (taken before reading); best effort."""
    if stamp is None or file_stamp(path) != stamp:
        return  # changed while read: not worth keeping
    try:
        raw = msgspec.Raw(_ENCODER.encode(value))
    except OverflowError:
        return  # an id past 64 bits (msgpack's range): read again next time
    _write(_cache_file(path, kind, key),
           _ENCODER.encode(_Summary(_FORMAT, workbench.__version__, key, stamp, raw)))


def _write(path: Path, data: bytes) -> None:
    """data into path atomically; nothing when the folder cannot be written."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as file:
            file.write(data)
        try:
            os.chmod(file.name, 0o644)  # like the run's other files, not the temp file's 0600
            os.replace(file.name, path)
        except OSError:
            os.unlink(file.name)
            raise
