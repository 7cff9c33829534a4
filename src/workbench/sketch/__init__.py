"""Sketches of replies for data-quality checks: loops, exact and near duplicates, contamination.

Every function takes a block of rows the way the scan holds them (:mod:`workbench.analyze.scan`):
one flat array `ids` and row boundaries `starts`, `ends` (row i holds ids[starts[i]:ends[i]]),
and works with a few numpy passes over the whole block, never a Python loop over ids.

    hashing: the hashing primitives and the flat layout of rows
      ngram_hashes       the hash of every n-gram inside a row, and the row of each
    repeats: loops and exact duplicates
      repeat_share       per row: the share of ids inside an n-gram seen twice in the row (a loop)
      split_repeat_share the same with each row's reasoning and answer looked at apart
      digest             per row: a 64-bit hash of the whole sequence (exact duplicates)
      exact_duplicates   per row: the first earlier row with the same digest, or -1
    minhash: near duplicates
      signatures         per row: a MinHash signature over shingles (near duplicates)
      near_duplicates    per row: the first earlier row of estimated Jaccard >= threshold, or -1
    compiled: all at once
      row_figures        per row: its digest, split_repeat_share and signature, in one pass
                         over its ids (compiled with numba, the ``fast`` extra, where installed;
                         ``digest`` too)
    template: a dataset's template
      template_shingles  the shingles most of a dataset's rows hold, left out before MinHash
    words: words and their hashes
      normalise_words    text to lowercase NFKC words without punctuation
      word_hashes        a stable 64-bit hash of each normalised word of a text
    pieces: ids to words
      PieceDecoder       a tokenizer's ids to the hashes of their normalised words, rows at once
    benchmarks: benchmark contamination
      Benchmarks         benchmark prompts' word n-grams, and which benchmarks each row quotes
      Decontamination    benchmarks with the decoder of a run's ids: which each row of ids quotes

These, with the defaults (`DEFAULT_*`, `PROMPT_FIELDS`), `Benchmark`, `lsh_bands` and the cut
of long rows (`clipped`, `MAX_ROW_IDS`, in `hashing`), are re-exported here, so callers write
``from workbench import sketch; sketch.digest(...)``. Each submodule imports only those above
it in the list.

Every hash is a fixed function of the values (splitmix64 mixing with constant seeds, a
polynomial over the UTF-8 bytes of a word), never Python's salted ``hash()``: signatures and
digests made by different processes, or on different days, compare.
"""

from __future__ import annotations

from workbench.sketch.benchmarks import (
    DEFAULT_BENCHMARK_NGRAM,
    PROMPT_FIELDS,
    Benchmark,
    Benchmarks,
    Decontamination,
)
from workbench.sketch.compiled import RowFigures, digest, row_figures
from workbench.sketch.hashing import MAX_ROW_IDS, clipped, ngram_hashes
from workbench.sketch.minhash import (
    DEFAULT_NUM_PERM,
    DEFAULT_SHINGLE,
    DEFAULT_THRESHOLD,
    lsh_bands,
    near_duplicates,
    signatures,
)
from workbench.sketch.pieces import PieceDecoder
from workbench.sketch.repeats import (
    DEFAULT_REPEAT_NGRAM,
    exact_duplicates,
    repeat_share,
    split_repeat_share,
)
from workbench.sketch.template import (
    DEFAULT_TEMPLATE_SHARE,
    MIN_TEMPLATE_ROWS,
    PROMPT_THRESHOLD,
    TEMPLATE_ROWS,
    Template,
    template_shingles,
)
from workbench.sketch.words import normalise_words, word_hashes

__all__ = [
    "DEFAULT_BENCHMARK_NGRAM",
    "DEFAULT_NUM_PERM",
    "DEFAULT_REPEAT_NGRAM",
    "DEFAULT_SHINGLE",
    "DEFAULT_TEMPLATE_SHARE",
    "DEFAULT_THRESHOLD",
    "MAX_ROW_IDS",
    "MIN_TEMPLATE_ROWS",
    "PROMPT_FIELDS",
    "PROMPT_THRESHOLD",
    "TEMPLATE_ROWS",
    "Benchmark",
    "Benchmarks",
    "Decontamination",
    "PieceDecoder",
    "RowFigures",
    "Template",
    "clipped",
    "digest",
    "exact_duplicates",
    "lsh_bands",
    "near_duplicates",
    "ngram_hashes",
    "normalise_words",
    "repeat_share",
    "row_figures",
    "signatures",
    "split_repeat_share",
    "template_shingles",
    "word_hashes",
]
