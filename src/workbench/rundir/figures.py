"""Reply figures kept as the replies are written: what a first validation would compute again.

The data-quality figures of a reply (:mod:`workbench.analyze.quality`) are pure functions of
its output ids: the digest (exact duplicates), the repeated-n-gram share (loops; the
reasoning and the answer apart) and the MinHash signature (near duplicates). Computing them
means a few passes over every id, three times what validation alone costs; generate has the
ids in memory when it writes each record, so it computes them there, a batch of records at a
time in a thread of its own, and appends them to a store beside the dataset::

    <dataset>/.workbench-cache/reply-figures-<key>.bin

The prompts' figures (digest and signature of each sample id's first prompt, ids or the
normalised words of its text) are kept as an appended cache of prompts.jsonl
(:func:`prompt_figures`, :mod:`workbench.rundir.cache`): generate computes them in a thread
once it has written the file, before the replies come, so validate finds them ready.

The reply store is content-addressed: one fixed-size entry per reply (:data:`ENTRY`: digest,
repeated-n-gram share, signature) found by the reply's digest, which the scan computes anyway.
A reply edited, rewritten or torn since has another digest and is computed as before, so the
store can never change a number, only save the work; entries of the same content are equal,
so a resent prompt's second entry is harmless. `<key>` names what the figures depend on (the
think-end id the share splits at, the n-gram, the sketch's settings): a validation with other
settings or another profile computes them. Best effort like every cache: an entry that cannot
be written is left out (a full disk never stops a run for it), a torn last entry is ignored,
and deleting the folder is always safe.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from workbench import sketch
from workbench.rundir.cache import cache_key, file_stamp, load_appended, save_appended
from workbench.rundir.layout import CACHE_DIR
from workbench.rundir.records import PromptContents, SampleId, iter_prompt_contents

__all__ = [
    "ENTRY",
    "FigureAppender",
    "FigureStore",
    "PromptFigureKeeper",
    "PromptFigures",
    "ReplyFigures",
    "chosen_prompts",
    "concat",
    "figures_path",
    "load_figures",
    "prompt_figures",
    "reply_figures",
]

FIGURES_VERSION = 1  # bump when an entry's meaning changes
NUM_PERM = sketch.DEFAULT_NUM_PERM
SIGNATURE_DTYPE = np.uint16  # signatures kept as 16-bit values (b-bit MinHash): a quarter of
# the bytes; two different entries agree by chance once in 65,536, which moves no estimate

ENTRY = np.dtype([("digest", "<u8"), ("repeat", "<f8"), ("signature", "<u2", (NUM_PERM,))])

_BATCH = 64  # records computed together (a few numpy passes a batch, not a record)


class ReplyFigures(NamedTuple):
    """Per row: digest (uint64), repeated-n-gram share (float64), signature ((rows,
    NUM_PERM) uint16)."""

    digest: np.ndarray
    repeat: np.ndarray
    signature: np.ndarray


def figures_path(folder: Path, think_end: int | None, ngram: int) -> Path:
    """The store of dataset folder `folder` for figures split at `think_end` (None: not
    split) with `ngram`-grams."""
    key = hashlib.sha256(repr((FIGURES_VERSION, think_end, ngram, sketch.DEFAULT_SHINGLE,
                               NUM_PERM, sketch.MAX_ROW_IDS)).encode()).hexdigest()[:16]
    return Path(folder) / CACHE_DIR / f"reply-figures-{key}.bin"


class FigureStore:
    """The entries of a store, found by digest."""

    def __init__(self, entries: np.ndarray) -> None:
        order = np.argsort(entries["digest"], kind="stable")
        self._digests = entries["digest"][order]
        self._entries = entries[order]

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, digests: np.ndarray) -> np.ndarray:
        """Per digest, the index of its entry, or -1 (int64)."""
        if not len(self._digests):
            return np.full(len(digests), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._digests, digests), len(self._digests) - 1)
        return np.where(self._digests[at] == digests, at, -1)

    def take(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(repeat, signature) of the entries at `index`."""
        picked = self._entries[index]
        return picked["repeat"], picked["signature"]


def load_figures(path: Path) -> FigureStore | None:
    """The store at path (its whole entries), or None when there is none or it cannot be read."""
    return _load(str(path), *_stamp(path))


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        info = path.stat()
    except OSError:
        return (-1, -1, -1)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=4)  # one store a dataset, read once per process while unchanged
def _load(path: str, inode: int, size: int, mtime: int) -> FigureStore | None:
    if size < ENTRY.itemsize:
        return None
    try:
        with open(path, "rb") as file:
            data = file.read(size - size % ENTRY.itemsize)
    except OSError:
        return None
    return FigureStore(np.frombuffer(data, dtype=ENTRY))


def reply_figures(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, split: np.ndarray,
                  ngram: int, known: FigureStore | None = None) -> ReplyFigures:
    """The figures of rows ids[starts[i]:ends[i]], each split at its position `split[i]`
    (-1: not split; see :func:`workbench.sketch.split_repeat_share`): those `known` holds
    taken from it, the others computed."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    count = len(starts)
    digest = sketch.digest(ids, starts, ends) if count else np.zeros(0, dtype=np.uint64)
    repeat = np.zeros(count, dtype=np.float64)
    signature = np.zeros((count, NUM_PERM), dtype=SIGNATURE_DTYPE)
    index = known.find(digest) if known is not None else np.full(count, -1, dtype=np.int64)
    found = index >= 0
    if found.any():
        repeat[found], signature[found] = known.take(index[found])  # type: ignore[union-attr]
    missing = np.flatnonzero(~found)
    if len(missing):
        first, last = starts[missing], ends[missing]
        repeat[missing] = sketch.split_repeat_share(ids, first, last,
                                                    np.asarray(split)[missing], ngram)
        signature[missing] = sketch.signatures(ids, first, sketch.clipped(first, last),
                                               num_perm=NUM_PERM).astype(SIGNATURE_DTYPE)
    return ReplyFigures(digest, repeat, signature)


def _entries(id_lists: Sequence[Sequence[int]], think_end: int | None, ngram: int) -> bytes:
    """The entries of replies given as id lists, as bytes to append."""
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    flat: list[int] = []
    for ids in id_lists:
        flat.extend(ids)
    ids = np.fromiter(flat, dtype=np.int64, count=len(flat))  # OverflowError: not a reply's
    split = np.full(len(id_lists), -1, dtype=np.int64)
    if think_end is not None and len(ids):
        at = np.flatnonzero(ids == think_end)
        rows = np.searchsorted(ends, at, side="right")
        unique, first = np.unique(rows, return_index=True)
        split[unique] = at[first] - starts[unique]
    figures = reply_figures(ids, starts, ends, split, ngram)
    entries = np.zeros(len(id_lists), dtype=ENTRY)
    entries["digest"], entries["repeat"], entries["signature"] = figures
    return entries.tobytes()


class FigureAppender:
    """Appends the figures of the replies written to a dataset's store, computed a batch at
    a time in a thread (numpy and BLAKE2b let go of the GIL: the event loop keeps going).

    :meth:`add` takes a written reply's output ids; :meth:`close` writes what is left and
    waits. A write that fails (a full disk, a read-only folder) stops the appender for the
    session: the figures left out are computed by the validation that needs them.
    """

    def __init__(self, folder: Path, think_end: int | None, ngram: int,
                 batch: int = _BATCH) -> None:
        self.path = figures_path(folder, think_end, ngram)
        self._think_end = think_end
        self._ngram = ngram
        self._batch = batch
        self._pending: list[Sequence[int]] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[None]] = []
        self.failed: str | None = None  # why the appender stopped, once it did
        self._fd = self._open()

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            size = os.fstat(fd).st_size
            if size % ENTRY.itemsize:  # a torn last entry (a crash mid-write): cut it
                os.ftruncate(fd, size - size % ENTRY.itemsize)
        except OSError as exc:
            self.failed = f"{self.path}: {exc.strerror or exc}"
            return -1
        return fd

    def add(self, output_ids: Sequence[int] | None) -> None:
        """Keep the figures of a reply now on disk (nothing for one without ids)."""
        if self._fd < 0 or not output_ids:
            return
        self._pending.append(output_ids)
        if len(self._pending) >= self._batch:
            self._submit()

    def _submit(self) -> None:
        batch, self._pending = self._pending, []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reply-figures")
        self._futures = [f for f in self._futures if not f.done()]
        self._futures.append(self._pool.submit(self._write, batch))

    def _write(self, batch: list[Sequence[int]]) -> None:
        with self._lock:
            if self._fd < 0:
                return
            try:
                data = _entries(batch, self._think_end, self._ngram)
            except (OverflowError, ValueError, TypeError):  # ids no model gives: validate's
                return
            size = None
            try:
                size = os.fstat(self._fd).st_size
                written = 0
                while written < len(data):
                    written += os.write(self._fd, data[written:])
            except OSError as exc:
                self.failed = f"{self.path}: {exc.strerror or exc}"
                if size is not None:
                    with contextlib.suppress(OSError):  # no torn entry left behind
                        os.ftruncate(self._fd, size)
                os.close(self._fd)
                self._fd = -1

    def close(self) -> None:
        """Write the figures still pending and close the store; closing twice is harmless."""
        if self._pending and self._fd >= 0:
            self._submit()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


# --- prompts ----------------------------------------------------------------------------------


class PromptFigures(msgspec.Struct):
    """The figures of a prompts file: one entry per sample id's first line, and the lines
    read (a file that grew is read from where this stopped)."""

    sample_id: list[SampleId] = msgspec.field(default_factory=list)
    line: list[int] = msgspec.field(default_factory=list)
    digest: list[int] = msgspec.field(default_factory=list)
    signature: list[bytes] = msgspec.field(default_factory=list)
    lines: int = 0

    def extend(self, other: PromptFigures) -> None:
        for name in ("sample_id", "line", "digest", "signature"):
            getattr(self, name).extend(getattr(other, name))
        self.lines += other.lines


def prompt_figures(path: Path, cache: bool = True, stop: Callable[[], bool] | None = None,
                   also: Callable[[PromptContents, list[int]], None] | None = None,
                   ) -> PromptFigures:
    """The figures of every prompt of path: kept ones, and those of the lines appended since
    (kept in turn when `cache`). When `stop()` turns true, what was read so far is kept and
    returned (a whole number of blocks: the rest is read next time). `also` is called with
    each block read and the indexes of its prompts given figures (one read for more)."""
    key = cache_key("prompt-figures", FIGURES_VERSION, sketch.DEFAULT_SHINGLE, NUM_PERM)
    found = load_appended(path, "prompt-figures", key, PromptFigures) if cache else None
    known, offset = found if found is not None else (PromptFigures(), 0)
    stamp = file_stamp(path)  # before the read: what a saved value was read from
    seen = set(known.sample_id)
    new = PromptFigures()
    end = offset
    for block in iter_prompt_contents(path, offset=offset, first_line=known.lines + 1):
        chosen = chosen_prompts(block, seen)
        if chosen:
            new.extend(_block_figures(block, chosen))
        if also is not None:
            also(block, chosen)
        new.lines = block.next_line - 1 - known.lines
        end = block.end_offset
        if stop is not None and stop():
            break
    known.extend(new)
    if cache and end > offset:
        save_appended(path, "prompt-figures", key, known, end, stamp)
    return known


def chosen_prompts(block: PromptContents, seen: set[SampleId]) -> list[int]:
    """The indexes of the block's prompts whose sample id is not in `seen` (added to it) and
    that hold ids or a text: the first prompt of each sample id (unreadable lines are
    validate's to tell)."""
    chosen: list[int] = []
    for index, (sample_id, text, has_ids) in enumerate(
            zip(block.sample_ids, block.texts, block.has_ids, strict=True)):
        if sample_id not in seen and (has_ids or text is not None):
            seen.add(sample_id)
            chosen.append(index)
    return chosen


def prompt_contents(block: PromptContents, chosen: list[int]) -> list[np.ndarray]:
    """Each chosen prompt's content: its ids, or its text's word hashes (uint64)."""
    ids = block.ids.view(np.uint64)
    return [ids[block.starts[i]:block.ends[i]] if block.has_ids[i]
            else sketch.word_hashes(block.texts[i] or "") for i in chosen]


def _block_figures(block: PromptContents, chosen: list[int]) -> PromptFigures:
    flat, starts, ends = concat(prompt_contents(block, chosen))
    signatures = sketch.signatures(flat, starts, sketch.clipped(starts, ends), num_perm=NUM_PERM)
    return PromptFigures([block.sample_ids[i] for i in chosen], [block.lines[i] for i in chosen],
                         sketch.digest(flat, starts, ends).tolist(),
                         [row.tobytes() for row in signatures.astype(SIGNATURE_DTYPE)])


def concat(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One flat array of parts and the start and end of each."""
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    ends = np.cumsum(lengths)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    return flat, ends - lengths, ends


class PromptFigureKeeper:
    """Computes and keeps the figures of prompts files in a thread, one file after another
    (generate starts it once prompts.jsonl is written; its replies take far longer)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prompt-figures", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for path in self._paths:  # once stopped, one block of each: a quick run keeps them
            with contextlib.suppress(OSError):  # best effort: validate computes what is missing
                prompt_figures(path, stop=self._stop.is_set)

    def close(self) -> None:
        """Stop after the block being read (what was read is kept) and wait for the thread."""
        self._stop.set()
        self._thread.join()
