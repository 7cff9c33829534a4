"""Words: text normalised to words, and a stable 64-bit hash of each.

    normalise_words  text to lowercase NFKC words without punctuation
    word_hashes      a stable 64-bit hash of each normalised word of a text
    hash_word_rows   (word hashes, starts, ends) of many rows of words, back to back

A word's hash is a polynomial over its UTF-8 bytes, mixed with its length (splitmix64 with
constant seeds), never Python's salted ``hash()``: equal words hash equal in any process.
"""

from __future__ import annotations

import functools
import string
import sys
import unicodedata
from collections.abc import Sequence

import numpy as np

from workbench.sketch.hashing import mix

__all__ = ["hash_word_rows", "normalise_words", "word_hashes"]

_U64 = np.uint64

# Seeds of the word hash (fixed: equal across processes).
_SEED_BYTES = 0xBE5466CF34E90C6C
_SEED_LENGTH = 0xC0AC29B7C97C50DD


@functools.cache
def _punctuation() -> dict[int, str]:
    """str.translate table: every Unicode punctuation character and ASCII symbol to a space."""
    marks = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)).startswith("P")]
    return dict.fromkeys([*marks, *map(ord, string.punctuation)], " ")


def normalise_words(text: str) -> list[str]:
    """The words of text: Unicode NFKC, lowercase, punctuation (and ASCII symbols) replaced by
    spaces, split on whitespace. "Hello,World!" and "hello world" give the same words."""
    return unicodedata.normalize("NFKC", text).lower().translate(_punctuation()).split()


@functools.cache
def _byte_values() -> np.ndarray:
    values = mix(np.arange(256, dtype=_U64), _SEED_BYTES)
    values.flags.writeable = False
    return values


_BASE = 0x100000001B3 * 2 + 1  # odd


@functools.cache
def _powers(count: int) -> np.ndarray:
    """_BASE ** j modulo 2**64 for j < count."""
    powers = np.full(count, _BASE, dtype=_U64)
    powers[0] = 1
    np.cumprod(powers, out=powers)
    powers.flags.writeable = False
    return powers


def _hash_spaced(data: bytes) -> np.ndarray:
    """The hash of each space-separated word of data (single spaces, no leading or trailing
    one): sum_j v(byte_j) * B**j over the word's bytes (j from the word's start), with one
    prefix sum over all of data, then mixed with the length."""
    if not data:
        return np.zeros(0, dtype=_U64)
    raw = np.frombuffer(data, dtype=np.uint8)
    spaces = np.flatnonzero(raw == 32)
    begin = np.concatenate([[0], spaces + 1])
    end = np.concatenate([spaces, [len(raw)]])
    marks = np.zeros(len(raw), dtype=np.int64)
    marks[begin[1:]] = begin[1:]
    local = np.arange(len(raw), dtype=np.int64) - np.maximum.accumulate(marks)
    longest = int(local.max()) + 1
    powers = _powers(1 << max(4, (longest - 1).bit_length()))
    prefix = np.zeros(len(raw) + 1, dtype=_U64)
    np.cumsum(_byte_values()[raw] * powers[local], out=prefix[1:])
    words = prefix[end] - prefix[begin]
    return mix(words ^ mix((end - begin).view(_U64), _SEED_LENGTH), _SEED_BYTES)


def hash_word_rows(rows: Sequence[list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word hashes, starts, ends) of rows of normalised words, the rows back to back."""
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(counts)
    hashes = _hash_spaced(" ".join(" ".join(words) for words in rows if words).encode())
    return hashes, ends - counts, ends


def word_hashes(text: str) -> np.ndarray:
    """A stable 64-bit hash of each normalised word of text (uint64, in order; see
    :func:`normalise_words`): equal words hash equal in any process."""
    return hash_word_rows([normalise_words(text)])[0]
