"""Duplicate prompts, skipped before they are sent: a dataset's ``dedup: exact | near``.

Sending a prompt twice costs GPU time for no new data, so a dataset with ``dedup`` on drops
its later copies before anything is sent. What is compared is a prompt's content: its token
ids when it has ids (``input_ids``, or ``messages`` rendered by the tokenizer), else the
normalised words of its text (:func:`workbench.sketch.word_hashes`: lowercase, NFKC,
punctuation stripped). Two prompts are

    exact_duplicate   when their contents have the same 64-bit digest (BLAKE2b)
    near_duplicate    (``dedup: near`` only) when the MinHash estimate of the Jaccard
                      similarity of their shingles (3 ids or words, 128 entries: the
                      sketch's defaults) reaches ``dedup_threshold`` (0.55 by default),
                      compared on what varies: each dataset's template (the shingles half
                      of its first 1,000 prompts hold: a system prompt, tool schemas, the
                      chat template's markers; :mod:`workbench.sketch.template`) left out;
                      an exact copy is still called an exact one

Datasets are checked in manifest order, each against the prompts the datasets before it keep
(those they send or sent; ``dedup: off`` on a dataset sends all of its own and still counts as
kept for the ones after it) and against its own earlier rows in file order. The first
occurrence is kept; a later copy is skipped: never sent, not in prompts.jsonl, not counted in
``max_samples``, and written to ``OUT/<dataset>/skipped.jsonl`` as one :class:`Skipped` a
line, naming the kept prompt it copies (a copy of a copy names the first one). A prompt
without content (a text of punctuation alone) is never a duplicate.

Resume: what is skipped is a pure function of the prompts and of the samples already
finished, so a resume finds the same set. A finished sample is never skipped after the fact:
when a copy finished in an earlier session (dedup off then, or another mode), it is kept, and
when the first occurrence of its group is unfinished, that one is skipped in its place.
skipped.jsonl is rewritten whole each session (a temp file renamed over it), never appended.

All sketches are computed by the vectorised functions of :mod:`workbench.sketch` over
one flat array of the contents, a block of rows at a time (bounded memory), never prompt by
prompt in Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator, Sequence
from typing import Any, Literal, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from workbench import sketch
from workbench.config import DedupMode
from workbench.generate.prompts import Prompt
from workbench.rundir.files import write_lines_atomic
from workbench.rundir.layout import DatasetDir
from workbench.rundir.records import SampleId, encode_line

__all__ = [
    "NUM_PERM",
    "SHINGLE",
    "Deduper",
    "DuplicateOf",
    "Rule",
    "Sketches",
    "Skipped",
    "dedup_line",
    "dedup_record",
    "mode_text",
    "sketch_prompts",
    "write_skipped",
]

SHINGLE = sketch.DEFAULT_SHINGLE  # ids (or words) per shingle of the near-duplicate sketch
NUM_PERM = sketch.DEFAULT_NUM_PERM  # MinHash signature entries per prompt
BLOCK_IDS = 1 << 23  # content ids sketched at a time (64 MiB of uint64)

Rule = Literal["exact_duplicate", "near_duplicate"]
U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class DuplicateOf(msgspec.Struct):
    """The kept prompt a skipped one copies."""

    dataset: str
    sample_id: SampleId


class Skipped(msgspec.Struct):
    """One skipped prompt, one line of skipped.jsonl: which, why, and the prompt it copies."""

    sample_id: SampleId
    rule: Rule
    of: DuplicateOf


class Sketches(NamedTuple):
    """A dataset's prompts as the comparison sees them, one row each: the content's digest,
    its MinHash signature (None when no dataset compares near copies) and whether it has no
    content at all; and the template the signatures leave out."""

    digests: U64
    signatures: U64 | None
    empty: npt.NDArray[np.bool_]
    template: sketch.Template | None = None


# ------------------------------------------------------------------------------ sketches


def _content(prompt: Prompt) -> U64:
    """A prompt's content as uint64: its token ids, else its text's word hashes."""
    if prompt.input_ids is not None:
        return np.asarray(prompt.input_ids, dtype=np.uint64)
    return np.asarray(sketch.word_hashes(prompt.text or ""), dtype=np.uint64)


def _blocks(prompts: Sequence[Prompt]) -> Iterator[Sequence[Prompt]]:
    """Consecutive runs of prompts holding about BLOCK_IDS ids each (at least one prompt)."""
    start, size = 0, 0
    for end, prompt in enumerate(prompts, start=1):
        size += prompt.prompt_tokens
        if size >= BLOCK_IDS:
            yield prompts[start:end]
            start, size = end, 0
    if start < len(prompts):
        yield prompts[start:]


def _flatten(prompts: Sequence[Prompt]) -> tuple[U64, I64, I64]:
    """The contents of `prompts` as one flat uint64 array, with each row's start and end."""
    if all(p.input_ids is not None for p in prompts):
        lists = [p.input_ids or [] for p in prompts]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.uint64,
                           count=int(lengths.sum()))
    else:
        arrays = [_content(p) for p in prompts]
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.uint64)
    ends = np.cumsum(lengths, dtype=np.int64)
    return flat, ends - lengths, ends


def sketch_prompts(prompts: Sequence[Prompt], near: bool) -> Sketches:
    """The digests of `prompts` (and with `near` their signatures, without the template of
    their first TEMPLATE_ROWS), a block at a time."""
    digests: list[U64] = []
    signatures: list[U64] = []
    empty: list[npt.NDArray[np.bool_]] = []
    template = sketch.template_shingles(*_flatten(prompts[:sketch.TEMPLATE_ROWS]),
                                        shingle=SHINGLE) if near else None
    for block in _blocks(prompts):
        flat, starts, ends = _flatten(block)
        digests.append(sketch.digest(flat, starts, ends))
        if near:
            signatures.append(np.asarray(
                sketch.signatures(flat, starts, sketch.clipped(starts, ends), shingle=SHINGLE,
                                  num_perm=NUM_PERM,
                                  exclude=None if template is None else template.shingles),
                dtype=np.uint64))
        empty.append(ends == starts)
    return Sketches(
        _concat(digests, np.uint64),
        (np.concatenate(signatures) if signatures else np.zeros((0, NUM_PERM), np.uint64))
        if near else None,
        _concat(empty, np.bool_), template)


def _concat(parts: list[Any], dtype: Any) -> Any:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


# ----------------------------------------------------------------------------- the groups


def _roots(parent: I64) -> I64:
    """Each row's first occurrence: follow `parent` (an earlier row, or -1) to a row that has
    none (pointer jumping: a few vectorised passes, whatever the chains' length)."""
    root = np.where(parent < 0, np.arange(len(parent), dtype=np.int64), parent)
    while True:
        jumped = root[root]
        if np.array_equal(jumped, root):
            return root
        root = jumped


def _parents(mode: DedupMode, threshold: float, kept: Sketches, new: Sketches) -> I64:
    """For each row of `new`: the earlier row it copies, as an index into the kept rows
    followed by the new ones, else -1 (every row when `mode` is off)."""
    count = len(new.digests)
    if mode == "off" or count == 0:
        return np.full(count, -1, dtype=np.int64)
    offset = len(kept.digests)
    digests = np.concatenate([kept.digests, new.digests])
    parent = np.asarray(sketch.exact_duplicates(digests), dtype=np.int64)[offset:]
    if mode == "near":
        assert kept.signatures is not None and new.signatures is not None
        signatures = np.concatenate([kept.signatures, new.signatures])
        near = np.asarray(sketch.near_duplicates(signatures, threshold=threshold),
                          dtype=np.int64)[offset:]
        parent = np.where(parent >= 0, parent, near)
    empty = np.concatenate([kept.empty, new.empty])
    copies = (parent >= 0) & ~new.empty
    copies[copies] &= ~empty[parent[copies]]
    return np.where(copies, parent, -1)


def _representatives(root: I64, parent: I64, finished: npt.NDArray[np.bool_],
                     offset: int) -> I64:
    """Which row each group keeps: its first occurrence (`root`), except that a group whose
    first occurrence is an unfinished row of this dataset (index >= offset) and that holds
    finished copies keeps the first of those instead. Indexed like `root`; local rows (this
    dataset's) start at `offset`."""
    keep = np.arange(len(root), dtype=np.int64)
    finished_copies = np.flatnonzero((parent >= 0) & finished) + offset
    roots = root[finished_copies]
    local = roots >= offset
    local[local] &= ~finished[roots[local] - offset]
    roots, copies = roots[local], finished_copies[local]
    groups, first = np.unique(roots, return_index=True)  # copies are sorted: the first wins
    keep[groups] = copies[first]
    return keep


# ------------------------------------------------------------------------------ the deduper


class Deduper:
    """Finds each dataset's duplicates, dataset after dataset in manifest order.

    Call :meth:`check` with a dataset's prompts (file order), then :meth:`keep` with the ones
    it keeps (what it sends or sent: after its sample cap, say), before the next dataset's
    :meth:`check`. `near`: some dataset compares near copies (signatures are then computed for
    every dataset, since any may hold the kept copy).
    """

    def __init__(self, threshold: float, near: bool) -> None:
        self.threshold = threshold
        self.near = near
        empty = np.zeros(0, np.uint64)
        self._kept = Sketches(empty, np.zeros((0, NUM_PERM), np.uint64) if near else None,
                              np.zeros(0, np.bool_))
        self._owners: list[tuple[str, SampleId]] = []
        self._checked: tuple[str, Sequence[Prompt], Sketches] | None = None
        self.templates: dict[str, sketch.Template] = {}  # per dataset checked with signatures

    def check(self, name: str, mode: DedupMode, prompts: Sequence[Prompt],
              finished: Container[SampleId] = frozenset()) -> list[Skipped]:
        """The prompts of dataset `name` to skip (file order), against the kept prompts of the
        datasets checked before and its own earlier rows; `finished` samples are never
        skipped (see the module docstring)."""
        new = sketch_prompts(prompts, self.near)
        self._checked = (name, prompts, new)
        if new.template is not None:
            self.templates[name] = new.template
        parent = _parents(mode, self.threshold, self._kept, new)
        offset = len(self._kept.digests)
        full_parent = np.concatenate([np.full(offset, -1, np.int64), parent])
        root = _roots(full_parent)
        done = np.fromiter((p.sample_id in finished for p in prompts), dtype=np.bool_,
                           count=len(prompts))
        keep = _representatives(root, parent, done, offset)
        of = keep[root[offset:]]
        local = np.arange(offset, offset + len(prompts), dtype=np.int64)
        skipped = np.flatnonzero((of != local) & ~done)
        digests = np.concatenate([self._kept.digests, new.digests])
        return [self._skipped(name, prompts, int(i), int(of[i]), digests) for i in skipped]

    def _skipped(self, name: str, prompts: Sequence[Prompt], row: int, of: int,
                 digests: U64) -> Skipped:
        offset = len(self._owners)
        dataset, sample_id = (self._owners[of] if of < offset
                              else (name, prompts[of - offset].sample_id))
        same = digests[offset + row] == digests[of]
        rule: Rule = "exact_duplicate" if same else "near_duplicate"
        return Skipped(prompts[row].sample_id, rule, DuplicateOf(dataset, sample_id))

    def keep(self, sample_ids: Container[SampleId]) -> None:
        """Add the prompts of the dataset last checked whose id is in `sample_ids` to the kept
        ones the next datasets are checked against."""
        assert self._checked is not None, "keep() follows check()"
        name, prompts, new = self._checked
        self._checked = None
        mask = np.fromiter((p.sample_id in sample_ids for p in prompts), dtype=np.bool_,
                           count=len(prompts))
        kept = self._kept
        self._kept = Sketches(
            np.concatenate([kept.digests, new.digests[mask]]),
            None if kept.signatures is None or new.signatures is None
            else np.concatenate([kept.signatures, new.signatures[mask]]),
            np.concatenate([kept.empty, new.empty[mask]]))
        self._owners.extend((name, p.sample_id) for p, m in zip(prompts, mask, strict=True) if m)


# --------------------------------------------------------------------------- what is written


def write_skipped(folder: DatasetDir, skipped: Sequence[Skipped]) -> None:
    """skipped.jsonl as a whole (a temp file renamed over it); removed when nothing is
    skipped (an earlier session's list no longer holds). OSError when it cannot be written."""
    path = folder.skipped_path
    if skipped:
        write_lines_atomic(path, map(encode_line, skipped))
    else:
        path.unlink(missing_ok=True)


def _counts(skipped: Sequence[Skipped]) -> tuple[int, int]:
    exact = sum(1 for s in skipped if s.rule == "exact_duplicate")
    return exact, len(skipped) - exact


def dedup_line(skipped: Sequence[Skipped], template: sketch.Template | None = None) -> str:
    """`dedup: 3 exact, 2 near duplicates skipped`, and with `template` what the near ones
    were compared on."""
    exact, near = _counts(skipped)
    compared = f" (compared: {template.text()})" if template is not None else ""
    return f"dedup: {exact:,} exact, {near:,} near duplicates skipped{compared}"


def dedup_record(mode: DedupMode, threshold: float, skipped: Sequence[Skipped]) -> dict[str, Any]:
    """A dataset's ``dedup`` entry in run.json: its mode, the threshold (near only) and what
    was skipped, in all and by rule."""
    exact, near = _counts(skipped)
    return {"mode": mode, "threshold": threshold if mode == "near" else None,
            "skipped": len(skipped), "exact": exact, "near": near}


def mode_text(entry: object) -> str:
    """A run.json ``dedup`` entry as a line names it: `off`, `exact`, `near (0.9)`."""
    if not isinstance(entry, dict):
        return "off"
    mode = str(entry.get("mode", "off"))
    return f"near ({entry.get('threshold')})" if mode == "near" else mode
