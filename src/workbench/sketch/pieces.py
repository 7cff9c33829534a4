"""A tokenizer's ids to the hashes of their normalised words, a block of rows at once.

:class:`PieceDecoder` holds each id's text as bytes (its piece), built once per tokenizer:
a piece is what the id adds after a plain word, so it carries its leading space whatever
the tokenizer's decoder; byte-level BPE tokenizers give their raw bytes, so a character
split over two ids joins back whole. A row's pieces, joined, are normalised and hashed as
:func:`workbench.sketch.words.word_hashes` does.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.sketch.words import hash_word_rows, normalise_words

__all__ = ["PieceDecoder"]


class PieceDecoder:
    """A tokenizer's ids to words, a block of rows at once.

    Built once per tokenizer (`digest` names the table: a cache key): `pieces` holds each
    id's text as UTF-8 bytes (index `size`, for
    ids outside the vocabulary, is empty). A piece is the text the id adds after a plain word
    (``decode([anchor, id])`` less ``decode([anchor])``), so it carries its leading space
    whatever the tokenizer's decoder (byte-level BPE, SentencePiece, word level). For byte-level
    tokenizers the raw bytes of each token are used, so a character split over two ids joins
    back whole. Special tokens are a space: they separate words and add none.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.pieces = _piece_table(tokenizer)
        self.size = len(self.pieces) - 1
        self.digest = hashlib.sha256(b"\0".join(self.pieces.tolist())).hexdigest()
        # the pieces back to back: a row's bytes are gathered by numpy, not joined by Python
        self._lengths = np.fromiter(map(len, self.pieces), dtype=np.int64, count=len(self.pieces))
        self._starts = np.cumsum(self._lengths) - self._lengths
        self._bytes = np.frombuffer(b"".join(self.pieces.tolist()), dtype=np.uint8)

    def text(self, ids: np.ndarray | Sequence[int]) -> str:
        """The text of a sequence of ids (invalid UTF-8 replaced)."""
        array = np.asarray(ids, dtype=np.int64)
        return b"".join(self.pieces[self._index(array)]).decode("utf-8", "replace")

    def words(
        self, ids: np.ndarray | Sequence[int], starts: np.ndarray | Sequence[int],
        ends: np.ndarray | Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word hashes, word starts, word ends): each row's text, normalised and hashed as
        :func:`word_hashes` does, the rows back to back (row i's words are
        hashes[word_starts[i]:word_ends[i]])."""
        index = self._index(np.asarray(ids, dtype=np.int64))
        data, offsets = self._gathered(index)
        bounds = zip(offsets[np.asarray(starts, dtype=np.int64)].tolist(),
                     offsets[np.asarray(ends, dtype=np.int64)].tolist(), strict=True)
        return hash_word_rows([normalise_words(data[a:b].decode("utf-8", "replace"))
                                for a, b in bounds])

    def _gathered(self, index: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The pieces of `index` back to back, and the byte offset of each (one more)."""
        lengths = self._lengths[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        source = np.repeat(self._starts[index] - offsets[:-1], lengths)
        source += np.arange(int(offsets[-1]), dtype=np.int64)
        return self._bytes[source].tobytes(), offsets

    def _index(self, ids: np.ndarray) -> np.ndarray:
        return np.where((ids >= 0) & (ids < self.size), ids, self.size)


def _piece_table(tokenizer: Any) -> np.ndarray:
    """Each id's text as bytes (see :class:`PieceDecoder`), an empty one at the end."""
    known = sorted(set(tokenizer.get_vocab().values()))
    size = max([len(tokenizer), *(i + 1 for i in known)])
    texts = _contextual_texts(tokenizer, known)
    raw = _byte_level_pieces(tokenizer, known, texts)
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    pieces = np.full(size + 1, b"", dtype=object)
    for i, text in zip(known, texts, strict=True):
        pieces[i] = b" " if i in special else raw.get(i, text.encode("utf-8"))
    return pieces


def _contextual_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """What each id adds to the text after a plain word (its own decode without one)."""
    anchor = _anchor(tokenizer)
    if anchor is None:
        return [tokenizer.decode([i]) for i in ids]
    prefix = tokenizer.decode([anchor])
    decoded = tokenizer.batch_decode([[anchor, i] for i in ids])
    return [text[len(prefix):] if text.startswith(prefix) else tokenizer.decode([i])
            for text, i in zip(decoded, ids, strict=True)]


def _anchor(tokenizer: Any) -> int | None:
    """The id of a plain word that decodes to itself and prefixes what follows it."""
    for word in ("the", "a", "is", "1", "x"):
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            continue
        alone = tokenizer.decode(ids)
        if alone.strip() and tokenizer.decode([ids[0], ids[0]]).startswith(alone):
            return int(ids[0])
    return None


@functools.cache
def _unicode_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _byte_level_pieces(tokenizer: Any, ids: list[int], texts: list[str]) -> dict[int, bytes]:
    """Each id's raw bytes when the tokenizer is byte-level BPE (its tokens spell bytes in
    GPT-2's alphabet, "Ġ" a space), else nothing. Byte level is taken when almost every token
    that spells valid UTF-8 spells its decoded text, and a "Ġ" token decodes to a space."""
    alphabet = _unicode_bytes()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    raw: dict[int, bytes] = {}
    agree = disagree = spaces = 0
    for i, token, text in zip(ids, tokens, texts, strict=True):
        if not isinstance(token, str) or not token or any(c not in alphabet for c in token):
            continue
        data = bytes(alphabet[c] for c in token)
        raw[i] = data
        try:
            spelled = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a character: what byte level is for
        agree, disagree = agree + (spelled == text), disagree + (spelled != text)
        spaces += token.startswith("Ġ") and text.startswith(" ")
    return raw if spaces and agree >= 0.99 * (agree + disagree) else {}
