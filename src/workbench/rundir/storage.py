"""Writing a run's files when the machine says no: a full disk, an I/O error, a read-only
file system.

:func:`storage_error` turns the OSError of a failed write into one
:class:`~workbench.errors.StorageError` line naming the file, the reason and the free space
left where it lives (``raw_responses.jsonl: cannot write: No space left on device (0 B
free)``); :func:`free_bytes` is that free space. :func:`writing` turns every failed write of a
block into the StorageError of the file or folder the user named (not a temp file beside it);
``DISK_ERRNOS`` are the errors that are about the disk, whatever file they name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from workbench.errors import StorageError
from workbench.text import format_bytes

__all__ = ["DISK_ERRNOS", "free_bytes", "storage_error", "writing"]

# a full disk or quota, a read-only file system, an I/O error, a file past the size limit
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes free to an unprivileged writer on the file system of path (or of its nearest
    existing folder); None when that cannot be told."""
    for folder in (Path(path), *Path(path).parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def storage_error(path: str | os.PathLike[str], exc: OSError) -> StorageError:
    """The StorageError of a failed write of path: its reason and the space left."""
    free = free_bytes(Path(path).parent)
    reason = exc.strerror or str(exc) or type(exc).__name__
    if free is not None:
        reason = f"{reason} ({format_bytes(free)} free)"
    return StorageError(path, reason, free, exc.errno)


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Inside, an OSError (a write that failed, a folder that could not be made) is raised as
    the StorageError of path: the file or folder the user asked for."""
    try:
        yield
    except OSError as exc:
        raise storage_error(path, exc) from None
