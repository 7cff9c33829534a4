"""Figures kept as the records are written: what a first validation would compute again.

The data-quality figures of a reply (:mod:`workbench.analyze.quality`) are pure functions of
its output ids: the digest (exact duplicates), the repeated-n-gram share (loops; the
reasoning and the answer apart) and the MinHash signature (near duplicates). Computing them
means a few passes over every id, three times what validation alone costs; generate has the
ids in memory when it writes each record, so it computes them there, a batch of records at a
time in a thread of its own, and appends them to a store beside the dataset::

    <dataset>/.workbench-cache/reply-figures-<key>.bin

Given benchmarks (``generate --decontaminate``), each reply's overlap with them (the bit mask
of the benchmarks one of whose word n-grams it holds) goes to a second store,
``reply-overlaps-<key>.bin`` (:data:`OVERLAP_ENTRY`), keyed by the benchmark files' content and
the tokenizer that reads the ids as words.

The prompts' figures (digest and signature of each sample id's first prompt, ids or the
normalised words of its text; for a conversation regenerated turn by turn, its first turn's
prompt, which every later turn's prompt holds) and their overlaps are kept as appended caches of prompts.jsonl
(:func:`prompt_rows`, :mod:`workbench.rundir.cache`): generate computes them in a thread once it
has written the file, before the replies come, so validate finds them ready.

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
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from workbench import loops, sketch
from workbench.rundir.cache import AppendedCache, cache_key, file_stamp, store_path
from workbench.rundir.prompt_reader import PromptContents, iter_prompt_contents
from workbench.rundir.records import SampleId

__all__ = [
    "ENTRY",
    "OVERLAP_ENTRY",
    "FigureAppender",
    "FigureStore",
    "PromptFigureKeeper",
    "PromptFigures",
    "PromptRows",
    "ReplyFigures",
    "chosen_prompts",
    "concat",
    "figures_path",
    "load_figures",
    "overlaps_path",
    "prompt_figures",
    "prompt_rows",
    "reply_figures",
    "reply_overlaps",
]

FIGURES_VERSION = 2  # bump when an entry's meaning changes (2: the digest of sketch.digest)
NUM_PERM = sketch.DEFAULT_NUM_PERM
SIGNATURE_DTYPE = np.uint16  # signatures kept as 16-bit values (b-bit MinHash): a quarter of
# the bytes; two different entries agree by chance once in 65,536, which moves no estimate

ENTRY = np.dtype([("digest", "<u8"), ("repeat", "<f8"), ("signature", "<u2", (NUM_PERM,))])
OVERLAP_ENTRY = np.dtype([("digest", "<u8"), ("overlap", "<i8")])  # benchmarks' bit mask

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
    return _store_path(folder, "reply-figures", (think_end, ngram, sketch.DEFAULT_SHINGLE,
                                                 NUM_PERM))


def overlaps_path(folder: Path, decontaminate: sketch.Decontamination) -> Path:
    """The store of dataset folder `folder` for the replies' overlaps with these benchmarks
    read through this decoder."""
    return _store_path(folder, "reply-overlaps", decontaminate.key)


def _store_path(folder: Path, kind: str, settings: object) -> Path:
    return store_path(folder, kind, (FIGURES_VERSION, settings, sketch.MAX_ROW_IDS))


class FigureStore:
    """The entries of a store (:data:`ENTRY` or :data:`OVERLAP_ENTRY`), found by digest."""

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

    def take(self, index: np.ndarray) -> np.ndarray:
        """The entries at `index` (a structured array)."""
        return self._entries[index]


def load_figures(path: Path, entry: np.dtype[np.void] = ENTRY) -> FigureStore | None:
    """The store at path (its whole entries of type `entry`), or None when there is none or
    it cannot be read."""
    return _load(str(path), entry, *_stamp(path))


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        info = path.stat()
    except OSError:
        return (-1, -1, -1)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=4)  # one store a dataset, read once per process while unchanged
def _load(path: str, entry: np.dtype[np.void], inode: int, size: int,
          mtime: int) -> FigureStore | None:
    if size < entry.itemsize:
        return None
    try:
        with open(path, "rb") as file:
            data = file.read(size - size % entry.itemsize)
    except OSError:
        return None
    return FigureStore(np.frombuffer(data, dtype=entry))


def reply_figures(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, split: np.ndarray,
                  ngram: int, known: FigureStore | None = None) -> ReplyFigures:
    """The figures of rows ids[starts[i]:ends[i]], each split at its position `split[i]`
    (-1: not split; see :func:`workbench.sketch.split_repeat_share`): those `known` holds
    taken from it, the others computed."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if known is None:  # nothing to look up: every figure in one pass
        made = sketch.row_figures(ids, starts, ends, split, ngram, num_perm=NUM_PERM)
        return ReplyFigures(made.digest, made.repeat, made.signature.astype(SIGNATURE_DTYPE))
    count = len(starts)
    digest = sketch.digest(ids, starts, ends)
    repeat = np.zeros(count, dtype=np.float64)
    signature = np.zeros((count, NUM_PERM), dtype=SIGNATURE_DTYPE)
    found, missing = _known(known, digest)
    if len(found[0]):
        picked = known.take(found[1])
        repeat[found[0]], signature[found[0]] = picked["repeat"], picked["signature"]
    if len(missing):
        made = sketch.row_figures(ids, starts[missing], ends[missing],
                                  np.asarray(split)[missing], ngram, num_perm=NUM_PERM)
        repeat[missing], signature[missing] = made.repeat, made.signature
    return ReplyFigures(digest, repeat, signature)


def reply_overlaps(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, digest: np.ndarray,
                   decontaminate: sketch.Decontamination,
                   known: FigureStore | None = None) -> np.ndarray:
    """Per row (digests `digest`), the bit mask of the benchmarks it overlaps (its first
    :data:`~workbench.sketch.MAX_ROW_IDS` ids): those `known` holds taken from it, the others
    computed."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    overlap = np.zeros(len(starts), dtype=np.int64)
    found, missing = _known(known, digest)
    if len(found[0]):
        overlap[found[0]] = known.take(found[1])["overlap"]  # type: ignore[union-attr]
    if len(missing):
        first = starts[missing]
        overlap[missing] = decontaminate.id_overlaps(ids, first, sketch.clipped(first, ends[missing]))
    return overlap


def _known(known: FigureStore | None, digest: np.ndarray,
           ) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """((rows found, their entries), rows missing) of `digest` in the store."""
    index = known.find(digest) if known is not None else np.full(len(digest), -1, np.int64)
    found = np.flatnonzero(index >= 0)
    return (found, index[found]), np.flatnonzero(index < 0)


class _Batch(NamedTuple):
    """Replies given as id lists, flat: row i is ids[starts[i]:ends[i]]."""

    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _flat(id_lists: Sequence[Sequence[int]]) -> _Batch:
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ends = np.cumsum(lengths)
    flat: list[int] = []
    for ids in id_lists:
        flat.extend(ids)
    ids = np.fromiter(flat, dtype=np.int64, count=len(flat))  # OverflowError: not a reply's
    return _Batch(ids, ends - lengths, ends)


def _figure_entries(batch: _Batch, think_end: int | None, ngram: int) -> np.ndarray:
    """The :data:`ENTRY` of each reply of the batch."""
    ids, starts, ends = batch
    split = np.full(len(starts), -1, dtype=np.int64)
    if think_end is not None and len(ids):
        at = np.flatnonzero(ids == think_end)
        rows = np.searchsorted(ends, at, side="right")
        unique, first = np.unique(rows, return_index=True)
        split[unique] = at[first] - starts[unique]
    figures = reply_figures(ids, starts, ends, split, ngram)
    entries = np.zeros(len(starts), dtype=ENTRY)
    entries["digest"], entries["repeat"], entries["signature"] = figures
    return entries


def _overlap_entries(batch: _Batch, digest: np.ndarray,
                     decontaminate: sketch.Decontamination) -> np.ndarray:
    entries = np.zeros(len(digest), dtype=OVERLAP_ENTRY)
    entries["digest"] = digest
    entries["overlap"] = reply_overlaps(*batch, digest, decontaminate)
    return entries


class _Sink:
    """One store appended to: whole entries, a torn one cut; closed at the first failure."""

    def __init__(self, path: Path, entry: np.dtype[np.void]) -> None:
        self.path = path
        self.failed: str | None = None
        self._fd = -1
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            size = os.fstat(self._fd).st_size
            if size % entry.itemsize:  # a torn last entry (a crash mid-write): cut it
                os.ftruncate(self._fd, size - size % entry.itemsize)
        except OSError as exc:
            self._fail(exc)

    @property
    def open(self) -> bool:
        return self._fd >= 0

    def append(self, data: bytes) -> None:
        if self._fd < 0:
            return
        size = None
        try:
            size = os.fstat(self._fd).st_size
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            if size is not None:
                with contextlib.suppress(OSError):  # no torn entry left behind
                    os.ftruncate(self._fd, size)
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = f"{self.path}: {exc.strerror or exc}"
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)


class FigureAppender:
    """Appends the figures of the replies written to a dataset's store (and, given
    benchmarks, their overlaps to theirs), computed a batch at a time in a thread (numpy and
    BLAKE2b let go of the GIL: the event loop keeps going).

    :meth:`add` takes a written reply's output ids; :meth:`close` writes what is left and
    waits. A write that fails (a full disk, a read-only folder) stops that store for the
    session: the figures left out are computed by the validation that needs them.
    """

    def __init__(self, folder: Path, think_end: int | None, ngram: int, batch: int = _BATCH,
                 decontaminate: sketch.Decontamination | None = None) -> None:
        self._think_end = think_end
        self._ngram = ngram
        self._batch = batch
        self._figures = _Sink(figures_path(folder, think_end, ngram), ENTRY)
        self.path = self._figures.path
        with_ids = decontaminate is not None and decontaminate.decoder is not None
        self._decontaminate = decontaminate if with_ids else None
        self._overlaps = (_Sink(overlaps_path(folder, decontaminate), OVERLAP_ENTRY)
                          if with_ids and decontaminate is not None else None)
        self._pending: list[Sequence[int]] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def failed(self) -> str | None:
        """Why a store stopped, once one did."""
        return self._figures.failed or (self._overlaps.failed if self._overlaps else None)

    def _sinks(self) -> list[_Sink]:
        return [s for s in (self._figures, self._overlaps) if s is not None and s.open]

    def add(self, output_ids: Sequence[int] | None) -> None:
        """Keep the figures of a reply now on disk (nothing for one without ids)."""
        if not output_ids or not self._sinks():
            return
        self._pending.append(output_ids)
        if len(self._pending) >= self._batch:
            self._submit()

    def _submit(self) -> None:
        batch, self._pending = self._pending, []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reply-figures")
        self._pool.submit(self._write, batch)

    def _write(self, id_lists: list[Sequence[int]]) -> None:
        with self._lock, loops.sized(0):  # a batch at a time: numba not loaded for it
            try:
                batch = _flat(id_lists)
            except (OverflowError, ValueError, TypeError):  # ids no model gives: validate's
                return
            figures = _figure_entries(batch, self._think_end, self._ngram)
            self._figures.append(figures.tobytes())
            if self._overlaps is not None and self._overlaps.open and self._decontaminate:
                self._overlaps.append(_overlap_entries(batch, figures["digest"],
                                                       self._decontaminate).tobytes())

    def close(self) -> None:
        """Write the figures still pending and close the stores; closing twice is harmless."""
        if self._pending and self._sinks():
            self._submit()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            for sink in (self._figures, self._overlaps):
                if sink is not None:
                    sink.close()


# --- prompts ----------------------------------------------------------------------------------


class PromptFigures(msgspec.Struct):
    """The figures of a prompts file: one entry per sample id's first line, and the lines
    read (a file that grew is read from where this stopped)."""

    sample_id: list[SampleId] = msgspec.field(default_factory=list)
    line: list[int] = msgspec.field(default_factory=list)
    digest: list[int] = msgspec.field(default_factory=list)
    signature: list[bytes] = msgspec.field(default_factory=list)
    lines: int = 0
    template: bytes = b""  # the file's template (sketch.template): sorted uint64 shingle hashes
    template_rows: int = 0  # the distinct prompts it was drawn from
    template_share: float = sketch.DEFAULT_TEMPLATE_SHARE
    template_whole: bool = False  # drawn from TEMPLATE_ROWS prompts: kept as the file grows
    template_size: int = 0  # the file's size when the template was drawn

    def template_of(self) -> sketch.Template:
        """The template the signatures leave out."""
        return sketch.Template(np.frombuffer(self.template, dtype=np.uint64), self.template_rows,
                               self.template_share)

    def extend(self, other: PromptFigures) -> None:
        for name in ("sample_id", "line", "digest", "signature"):
            getattr(self, name).extend(getattr(other, name))
        self.lines += other.lines


_PROMPT_FIGURES: AppendedCache[PromptFigures] = AppendedCache("prompt-figures", PromptFigures)


def prompt_figures(path: Path, cache: bool = True, stop: Callable[[], bool] | None = None,
                   also: Callable[[PromptContents, list[int]], None] | None = None,
                   share: float = sketch.DEFAULT_TEMPLATE_SHARE) -> PromptFigures:
    """The figures of every prompt of path: kept ones, and those of the lines appended since
    (kept in turn when `cache`). When `stop()` turns true, what was read so far is kept and
    returned (a whole number of blocks: the rest is read next time). `also` is called with
    each block read and the indexes of its prompts given figures (one read for more).

    The signatures leave out the file's template (:mod:`workbench.sketch.template`, the
    shingles `share` of its first prompts hold). Kept figures whose template was drawn from
    fewer prompts than the file now holds are made again."""
    key = cache_key("prompt-figures", FIGURES_VERSION, sketch.DEFAULT_SHINGLE, NUM_PERM, share,
                    sketch.TEMPLATE_ROWS)
    stamp = file_stamp(path)  # before the read: what a saved value was read from
    found = _PROMPT_FIGURES.load(path, key) if cache else None
    size = stamp[2] if stamp is not None else 0
    if found is not None and not found[0].template_whole and size > found[0].template_size:
        found = None  # the template of a smaller file: drawn again from the prompts there are now
    known, offset = found if found is not None else (_with_template(path, share, size), 0)
    seen = set(known.sample_id)
    exclude = known.template_of().shingles
    new = PromptFigures()
    end = offset
    for block in iter_prompt_contents(path, offset=offset, first_line=known.lines + 1):
        chosen = chosen_prompts(block, seen)
        if chosen:
            new.extend(_block_figures(block, chosen, exclude))
        if also is not None:
            also(block, chosen)
        new.lines = block.next_line - 1 - known.lines
        end = block.end_offset
        if stop is not None and stop():
            break
    known.extend(new)
    if cache and end > offset:
        _PROMPT_FIGURES.save(path, key, known, end, stamp)
    return known


def _with_template(path: Path, share: float, size: int) -> PromptFigures:
    """No figures yet, and the template of prompts file path (`size` bytes before this read):
    drawn from its first TEMPLATE_ROWS prompts given figures."""
    seen: set[SampleId] = set()
    parts: list[np.ndarray] = []
    for block in iter_prompt_contents(path):
        parts += prompt_contents(block, chosen_prompts(block, seen))
        if len(parts) >= sketch.TEMPLATE_ROWS:
            break
    flat, starts, ends = concat(parts[:sketch.TEMPLATE_ROWS])
    template = sketch.template_shingles(flat, starts, ends, share=share)
    return PromptFigures(template=template.shingles.tobytes(), template_rows=template.rows,
                         template_share=share, template_whole=len(parts) >= sketch.TEMPLATE_ROWS,
                         template_size=size)


def chosen_prompts(block: PromptContents, seen: set[SampleId]) -> list[int]:
    """The indexes of the block's prompts whose sample id is not in `seen` (added to it) and
    that hold ids or a text: the first prompt of each sample id, a conversation's first
    turn (unreadable lines are validate's to tell)."""
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


def _block_figures(block: PromptContents, chosen: list[int], exclude: np.ndarray) -> PromptFigures:
    flat, starts, ends = concat(prompt_contents(block, chosen))
    signatures = sketch.signatures(flat, starts, sketch.clipped(starts, ends), num_perm=NUM_PERM,
                                   exclude=exclude)
    return PromptFigures([block.sample_ids[i] for i in chosen], [block.lines[i] for i in chosen],
                         sketch.digest(flat, starts, ends).tolist(),
                         [row.tobytes() for row in signatures.astype(SIGNATURE_DTYPE)])


def concat(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One flat array of parts and the start and end of each."""
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    ends = np.cumsum(lengths)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    return flat, ends - lengths, ends


class PromptRows(NamedTuple):
    """What the quality rules read of a prompts file: its figures, and per figure row the bit
    mask of the benchmarks the prompt overlaps (zeros without benchmarks)."""

    figures: PromptFigures
    overlap: list[int]


class _Overlaps(msgspec.Struct):
    """The overlaps of a prompts file's rows as kept: their sample ids, masks and the lines
    read."""

    sample_id: list[SampleId] = msgspec.field(default_factory=list)
    overlap: list[int] = msgspec.field(default_factory=list)
    lines: int = 0


_PROMPT_OVERLAPS: AppendedCache[_Overlaps] = AppendedCache("prompt-overlaps", _Overlaps)


def prompt_rows(path: Path, decontaminate: sketch.Decontamination | None, cache: bool = True,
                stop: Callable[[], bool] | None = None,
                share: float = sketch.DEFAULT_TEMPLATE_SHARE) -> PromptRows:
    """The figures of prompts file path (see :func:`prompt_figures`) and their benchmark
    overlaps (zeros without benchmarks), read once for both when neither was kept; with
    `cache`, those kept are taken and what is read is kept. `stop` and `share`: as
    :func:`prompt_figures`'s."""
    if decontaminate is None:
        figures = prompt_figures(path, cache, stop, share=share)
        return PromptRows(figures, [0] * len(figures.line))
    key = cache_key("prompt-overlaps", FIGURES_VERSION, decontaminate.key)
    found = _PROMPT_OVERLAPS.load(path, key) if cache else None
    if found is None:  # the overlaps read with the figures, when those are read too
        stamp = file_stamp(path)
        overlaps = _Overlaps()
        ends = [0]

        def also(block: PromptContents, chosen: list[int]) -> None:
            _add_overlaps(overlaps, block, chosen, decontaminate)
            ends[0] = block.end_offset

        figures = prompt_figures(path, cache, stop, also, share)
        if (overlaps.lines, len(overlaps.overlap)) == (figures.lines, len(figures.line)):
            # the figures were read from the start: the overlaps are whole
            if cache and ends[0]:
                _PROMPT_OVERLAPS.save(path, key, overlaps, ends[0], stamp)
            return PromptRows(figures, overlaps.overlap)
        found = (_Overlaps(), 0)
    else:
        figures = prompt_figures(path, cache, stop, share=share)
    return PromptRows(figures, _overlaps(path, len(figures.line), decontaminate, key, found,
                                         cache, stop))


def _overlaps(path: Path, rows: int, decontaminate: sketch.Decontamination, key: str,
              found: tuple[_Overlaps, int], cache: bool,
              stop: Callable[[], bool] | None = None) -> list[int]:
    """The benchmark masks of the `rows` first figure rows of prompts file path: those kept
    (`found`: what was, and the offset read to), and those of the lines after."""
    known, offset = found
    stamp = file_stamp(path)
    end = offset
    seen = set(known.sample_id)
    for block in iter_prompt_contents(path, offset=offset, first_line=known.lines + 1):
        _add_overlaps(known, block, chosen_prompts(block, seen), decontaminate)
        end = block.end_offset
        if stop is not None and stop():
            break
    if cache and end > offset:
        _PROMPT_OVERLAPS.save(path, key, known, end, stamp)
    return (known.overlap + [0] * rows)[:rows]  # a file grown between the two reads


def _add_overlaps(overlaps: _Overlaps, block: PromptContents, chosen: list[int],
                  decontaminate: sketch.Decontamination) -> None:
    overlaps.sample_id.extend(block.sample_ids[i] for i in chosen)
    overlaps.overlap.extend(_block_overlaps(block, chosen, decontaminate).tolist())
    overlaps.lines = block.next_line - 1


def _block_overlaps(block: PromptContents, chosen: list[int],
                    decontaminate: sketch.Decontamination) -> np.ndarray:
    """Per chosen prompt, the bit mask of the benchmarks it overlaps: its ids read as words,
    or its text's words."""
    overlap = np.zeros(len(chosen), dtype=np.int64)
    if not chosen:
        return overlap
    with_ids = np.fromiter((block.has_ids[i] for i in chosen), dtype=bool, count=len(chosen))
    if with_ids.any():
        flat, starts, ends = concat(prompt_contents(block, [i for i in chosen if block.has_ids[i]]))
        overlap[with_ids] = decontaminate.id_overlaps(flat.view(np.int64), starts,
                                                      sketch.clipped(starts, ends))
    texts = np.flatnonzero(~with_ids)
    if len(texts):
        overlap[texts] = decontaminate.text_overlaps([block.texts[chosen[i]] or "" for i in texts])
    return overlap


class PromptFigureKeeper:
    """Computes and keeps the figures of prompts files (and, given benchmarks, their
    overlaps) in a thread, one file after another (generate starts it once prompts.jsonl is
    written; its replies take far longer)."""

    def __init__(self, paths: Sequence[Path],
                 decontaminate: sketch.Decontamination | None = None) -> None:
        self._paths = list(paths)
        self._decontaminate = decontaminate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prompt-figures", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with loops.sized(0):  # beside generate: numba not loaded for it (used where loaded)
            for path in self._paths:  # once stopped, one block of each: a quick run keeps them
                with contextlib.suppress(OSError):  # best effort: validate computes the rest
                    prompt_rows(path, self._decontaminate, stop=self._stop.is_set)

    def close(self) -> None:
        """Stop after the block being read (what was read is kept) and wait for the thread."""
        self._stop.set()
        self._thread.join()
