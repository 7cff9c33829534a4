"""Benchmark contamination: benchmark prompts' word n-grams, and which of them rows quote.

    Benchmark        one benchmark file: its word n-grams, items, field, a content digest
    Benchmarks       the files read (JSONL or Parquet), and per row a bit mask of those quoted
    Decontamination  benchmarks with the decoder of a run's ids: which each row of ids quotes
    PROMPT_FIELDS    the fields a benchmark's prompt is looked for in, in order
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import ConfigError, DataError
from workbench.sketch.hashing import ngram_hashes, sorted_unique
from workbench.sketch.pieces import PieceDecoder
from workbench.sketch.words import hash_word_rows, normalise_words

__all__ = [
    "DEFAULT_BENCHMARK_NGRAM",
    "PROMPT_FIELDS",
    "Benchmark",
    "Benchmarks",
    "Decontamination",
]

DEFAULT_BENCHMARK_NGRAM = 13  # words per benchmark n-gram: the usual decontamination rule

PROMPT_FIELDS = ("prompt", "question", "problem", "instruction", "input", "text", "turns")

_U64 = np.uint64


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark file: its word n-grams (sorted uint64 hashes), the items read, the items
    skipped for having fewer than n words, the prompt field used, and a digest of the file's
    content with n and the field (a cache key)."""

    name: str
    path: Path
    field: str
    ngrams: np.ndarray
    items: int
    skipped: int
    digest: str


_PARQUET_SUFFIXES = (".parquet", ".pq")
_MAX_BENCHMARKS = 63  # one bit each in an int64 mask


class Benchmarks:
    """Benchmark prompts as sets of word n-gram hashes, and which of them each row quotes.

    :meth:`load` reads JSONL or Parquet files (one benchmark per file, named by its stem);
    :meth:`overlaps` gives per row a bit mask of the benchmarks (bit k: the k-th loaded) one of
    whose n-grams of normalised words the row contains.
    """

    def __init__(self, benchmarks: Sequence[Benchmark], n: int) -> None:
        if len(benchmarks) > _MAX_BENCHMARKS:
            raise ConfigError("benchmarks", f"at most {_MAX_BENCHMARKS} files, not {len(benchmarks)}")
        self.benchmarks = list(benchmarks)
        self.n = n
        hashes = np.concatenate([b.ngrams for b in benchmarks] or [np.zeros(0, _U64)])
        bits = np.repeat(np.int64(1) << np.arange(len(benchmarks), dtype=np.int64),
                         [len(b.ngrams) for b in benchmarks])
        order = np.argsort(hashes, kind="stable")
        hashes, bits = hashes[order], bits[order]
        new = np.ones(len(hashes), dtype=bool)
        new[1:] = hashes[1:] != hashes[:-1]
        self._keys = hashes[new]
        self._bits = np.bitwise_or.reduceat(bits, np.flatnonzero(new)) if len(bits) else bits

    @classmethod
    def load(cls, paths: Sequence[Path | str], field: str | None = None,
             n: int = DEFAULT_BENCHMARK_NGRAM) -> Benchmarks:
        """Read benchmark files: JSONL (one object per line) or Parquet (.parquet, .pq).

        The prompt is `field` if given, else the first of :data:`PROMPT_FIELDS` the file has
        (a list of strings is joined by newlines). DataError naming the file and line (JSONL)
        or column (Parquet) for bad JSON or a missing or non-text field. Items of fewer than
        `n` words are skipped and counted.
        """
        if n < 1:
            raise ConfigError("n", f"must be at least 1, not {n}")
        loaded: list[Benchmark] = []
        for path in map(Path, paths):
            taken = path.stem in {b.name for b in loaded}  # e.g. two test.parquet files
            name = f"{path.parent.name}/{path.stem}" if taken else path.stem
            loaded.append(_load_benchmark(path, name, field, n))
        return cls(loaded, n)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.benchmarks]

    @property
    def digest(self) -> str:
        """A digest of every file's content, in order, with n and the fields (a cache key)."""
        joined = "\n".join(b.digest for b in self.benchmarks)
        return hashlib.sha256(f"{joined}\n{self.n}".encode()).hexdigest()

    def overlaps(
        self, tokens: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
        ends: np.ndarray | Sequence[int],
    ) -> np.ndarray:
        """Per row of word hashes (:meth:`PieceDecoder.words`, :func:`word_hashes`), the bit
        mask of the benchmarks one of whose n-grams it contains (int64, 0 for none)."""
        hashes, row = ngram_hashes(tokens, starts, ends, self.n)
        result = np.zeros(len(np.asarray(starts)), dtype=np.int64)
        if not len(self._keys) or not len(hashes):
            return result
        at = np.minimum(np.searchsorted(self._keys, hashes), len(self._keys) - 1)
        hit = self._keys[at] == hashes
        np.bitwise_or.at(result, row[hit], self._bits[at[hit]])
        return result


def _load_benchmark(path: Path, name: str, field: str | None, n: int) -> Benchmark:
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise DataError(path, f"cannot read: {exc.strerror or exc}") from None
    if path.suffix.lower() in _PARQUET_SUFFIXES:
        used, prompts = _parquet_prompts(path, content, field)
    else:
        used, prompts = _jsonl_prompts(path, content, field)
    hashes, starts, ends = hash_word_rows([normalise_words(p) for p in prompts])
    ngrams = sorted_unique(ngram_hashes(hashes, starts, ends, n)[0])
    ngrams.flags.writeable = False
    key = hashlib.sha256(content)
    key.update(f"\n{n}\n{used}".encode())
    return Benchmark(name, path, used, ngrams, len(prompts), int(np.sum(ends - starts < n)),
                     key.hexdigest())


def _jsonl_prompts(path: Path, content: bytes, field: str | None) -> tuple[str, list[str]]:
    """(the field used, each line's prompt) of a JSONL file."""
    prompts: list[str] = []
    used = field
    for number, line in enumerate(content.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(path, f"not JSON: {exc}", line=number) from None
        if not isinstance(record, dict):
            raise DataError(path, f"not a JSON object but {type(record).__name__}", line=number)
        used = used or _detect_field(record)
        if used is None:
            raise DataError(path, f"no prompt field (none of {', '.join(PROMPT_FIELDS)}): "
                                  "name the field", line=number)
        if used not in record:
            raise DataError(path, f"no field {used!r}", line=number)
        text = _prompt_text(record[used])
        if text is None:
            raise DataError(path, f"field {used!r} is not text or a list of text", line=number)
        prompts.append(text)
    return used or field or PROMPT_FIELDS[0], prompts


def _parquet_prompts(path: Path, content: bytes, field: str | None) -> tuple[str, list[str]]:
    """(the column used, each row's prompt) of a Parquet file."""
    import pyarrow as pa  # here: the sketches load with every command, Parquet seldom
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(pa.BufferReader(content))
        columns = table.schema_arrow.names
        used = field or _detect_field(columns)
        if used is None:
            raise DataError(path, f"no prompt column (none of {', '.join(PROMPT_FIELDS)}; "
                                  f"columns: {', '.join(columns)}): name the field")
        if used not in columns:
            raise DataError(path, f"no column {used!r} (columns: {', '.join(columns)})")
        values = table.read(columns=[used]).column(0).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(path, f"not a readable Parquet file: {exc}") from None
    prompts: list[str] = []
    for row, value in enumerate(values):
        text = _prompt_text(value)
        if text is None:
            raise DataError(path, f"column {used!r}, row {row}: not text or a list of text")
        prompts.append(text)
    return used, prompts


def _detect_field(names: Iterable[str]) -> str | None:
    present = set(names)
    return next((name for name in PROMPT_FIELDS if name in present), None)


def _prompt_text(value: object) -> str | None:
    """A prompt value as text: a string, or a list of strings joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


@dataclass(frozen=True)
class Decontamination:
    """Benchmarks to look for in a run, and the decoder of its ids into words."""

    benchmarks: Benchmarks
    decoder: PieceDecoder | None

    @property
    def key(self) -> str:
        """The benchmarks' digest and the decoder's (another tokenizer reads other words)."""
        return f"{self.benchmarks.digest}:{self.decoder.digest if self.decoder else 'no-ids'}"

    @property
    def names(self) -> list[str]:
        return list(self.benchmarks.names)

    @classmethod
    def load(cls, paths: Sequence[str | os.PathLike[str]], *, field: str | None = None,
             ngram: int = DEFAULT_BENCHMARK_NGRAM, tokenizer: Any = None) -> Decontamination:
        """The benchmark files (JSONL or Parquet; DataError naming a bad file and line) and
        the tokenizer that decodes the run's ids (None: ids are not looked at)."""
        benchmarks = Benchmarks.load([Path(p) for p in paths], field, n=ngram)
        return cls(benchmarks, None if tokenizer is None else PieceDecoder(tokenizer))

    def id_overlaps(self, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per row of ids, the bit mask of the benchmarks it overlaps (0 without a decoder)."""
        if self.decoder is None or not len(starts):
            return np.zeros(len(starts), dtype=np.int64)
        words, word_starts, word_ends = self.decoder.words(ids, starts, ends)
        return self.benchmarks.overlaps(words, word_starts, word_ends)

    def text_overlaps(self, texts: Sequence[str]) -> np.ndarray:
        """Per text, the bit mask of the benchmarks it overlaps."""
        words, starts, ends = hash_word_rows([normalise_words(text) for text in texts])
        return self.benchmarks.overlaps(words, starts, ends)

    def describe(self, mask: int) -> str:
        return ", ".join(name for bit, name in enumerate(self.names) if mask >> bit & 1)
