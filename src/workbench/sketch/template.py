"""A dataset's template: the shingles most of its rows hold, left out before comparing them.

Prompts of one dataset often share most of their text: a long system prompt, the tool
schemas, few-shot examples, the chat template's own markers. Compared whole, two different
questions under one template look alike and two copies of a question with a word changed look
no more alike than any pair. So the shingles (``shingle`` consecutive ids or words) that at
least ``share`` of a dataset's first distinct rows hold are its template, and the MinHash
signatures (:func:`workbench.sketch.signatures`, ``exclude``) leave them out: rows compare on
the part that varies. Document frequency finds every shared part wherever it sits (a prefix,
a suffix, a block in between) and, at the word level, the words nearly every row holds.

The template is drawn from the first :data:`TEMPLATE_ROWS` distinct rows (exact copies count
once, so copies of one prompt do not make it a template), a fixed sample: a dataset that grows
keeps its template once it has that many rows, and the signatures already made stay valid. A
sample of fewer than :data:`MIN_TEMPLATE_ROWS` distinct rows has no template.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from workbench.sketch.hashing import as_rows, clipped, sorted_unique, windows
from workbench.sketch.minhash import DEFAULT_SHINGLE
from workbench.sketch.repeats import digest

__all__ = [
    "DEFAULT_TEMPLATE_SHARE",
    "MIN_TEMPLATE_ROWS",
    "PROMPT_THRESHOLD",
    "TEMPLATE_ROWS",
    "Template",
    "template_shingles",
]

DEFAULT_TEMPLATE_SHARE = 0.5  # a shingle at least this share of a dataset's rows hold is template
# The estimated Jaccard similarity, on what their template leaves, from which two prompts are
# near copies: a question of 40 words with three words changed keeps about 0.6 of its
# shingles; a little under it, for the estimate's spread (bench/dedup.py --prompts).
PROMPT_THRESHOLD = 0.55
TEMPLATE_ROWS = 1000  # the first distinct rows of a dataset its template is drawn from
MIN_TEMPLATE_ROWS = 10  # fewer distinct rows than this: no template (too few to tell)


class Template(NamedTuple):
    """A dataset's template: its shingles (sorted uint64 hashes, as
    :func:`workbench.sketch.signatures` hashes them), the distinct rows it was drawn from
    and the share of them each shingle is held by at least."""

    shingles: np.ndarray
    rows: int
    share: float

    @property
    def key(self) -> str:
        """A short stable name of the template (for caches)."""
        return hashlib.blake2b(self.shingles.tobytes(), digest_size=8).hexdigest()

    def text(self, what: str = "prompts") -> str:
        """What the comparison looked at, in words."""
        if not len(self.shingles):
            return f"whole {what}"
        return (f"{what} without their template, {len(self.shingles):,} shingles held by "
                f"{self.share:.0%}+ of the first {self.rows:,}")


def template_shingles(tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
                      ends: np.ndarray | Sequence[int], shingle: int = DEFAULT_SHINGLE,
                      share: float = DEFAULT_TEMPLATE_SHARE) -> Template:
    """The template of rows tokens[starts[i]:ends[i]] (their first TEMPLATE_ROWS distinct
    ones): the shingles held by at least `share` of them."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"the template share must be in (0, 1], not {share}")
    first = np.asarray(starts, dtype=np.int64)
    last = clipped(first, ends)
    distinct = _first_distinct(tokens, first, last)
    if len(distinct) < MIN_TEMPLATE_ROWS:
        return Template(np.zeros(0, dtype=np.uint64), len(distinct), share)
    rows = as_rows(tokens, first[distinct], last[distinct])
    hashes, _, row = windows(rows, shingle)
    if not len(hashes):
        return Template(np.zeros(0, dtype=np.uint64), len(distinct), share)
    need = max(2, int(np.ceil(share * len(distinct) - 1e-9)))
    return Template(_held_by(hashes, row, len(distinct), need), len(distinct), share)


def _held_by(hashes: np.ndarray, row: np.ndarray, rows: int, need: int) -> np.ndarray:
    """The distinct shingle hashes (sorted) that at least `need` of the rows hold.

    One sort of keys with the row in the low bits of the hash (a tenth of a two-key sort's
    time): shingles whose hashes differ only in those bits count as one, a chance of about
    2**-54 a pair; all shingles of a common prefix are kept.
    """
    bits = np.uint64(max(1, (rows - 1).bit_length()))
    keys = np.sort(((hashes >> bits) << bits) | row.astype(np.uint64))
    new = np.ones(len(keys), dtype=bool)  # each (shingle, row) once
    np.not_equal(keys[1:], keys[:-1], out=new[1:])
    prefix = keys[new] >> bits
    head = np.flatnonzero(np.r_[True, prefix[1:] != prefix[:-1]])
    held = np.diff(np.r_[head, len(prefix)])
    common = prefix[head][held >= need]
    return sorted_unique(hashes[np.isin(hashes >> bits, common)])


def _first_distinct(tokens: np.ndarray | Sequence[int], starts: np.ndarray,
                    ends: np.ndarray) -> np.ndarray:
    """Indexes of the first TEMPLATE_ROWS rows whose content differs from every earlier
    row's (empty rows left out)."""
    digests = digest(tokens, starts, ends)
    _, first = np.unique(digests, return_index=True)
    first = np.sort(first)
    first = first[ends[first] > starts[first]]
    return first[:TEMPLATE_ROWS]
