"""Writing a run's files when the machine says no: a full disk, an I/O error, a read-only
file system.

:func:`storage_error` turns the OSError of a failed write into one
:class:`~workbench.errors.StorageError` line naming the file, the reason and the free space
left where it lives (``raw_responses.jsonl: cannot write: No space left on device (0 B
free)``); :func:`free_bytes` is that free space.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from workbench.errors import StorageError
from workbench.text import format_bytes

__all__ = ["free_bytes", "storage_error"]


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
