"""The compiled pass of the digest, the loop share and the signatures against the numpy passes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import sketch
from workbench.sketch import MAX_ROW_IDS, compiled, row_figures
from workbench.sketch.minhash import signatures
from workbench.sketch.repeats import digest, split_repeat_share

VOCAB = 160_000


def numpy_figures(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, split: np.ndarray,
                  n: int, num_perm: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (digest(ids, starts, ends), split_repeat_share(ids, starts, ends, split, n),
            signatures(ids, starts, sketch.clipped(starts, ends), num_perm=num_perm))


def assert_same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    for name, mine, theirs in zip(("digest", "repeat", "signature"), got, want, strict=True):
        np.testing.assert_array_equal(mine, theirs, err_msg=name)  # bit for bit


def test_the_extra_compiles_the_pass() -> None:
    assert compiled._kernel() is not None, "the test extra installs numba"


@st.composite
def blocks(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Rows of loops (a short pattern repeated), of few distinct ids and of random ids, apart
    or back to back, each split at a position of its own or not at all."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = draw(st.integers(0, 30))
    gap = draw(st.integers(0, 2))
    alphabet = draw(st.sampled_from([1, 3, 40, VOCAB]))
    lengths = rng.integers(0, draw(st.sampled_from([4, 40, 600, 3000])), rows)
    parts = []
    for length in lengths.tolist():
        if rng.random() < 0.5:
            pattern = rng.integers(0, alphabet, rng.integers(1, 25))
            parts.append(np.resize(pattern, length))
        else:
            parts.append(rng.integers(0, alphabet, length))
        parts.append(np.full(gap, 7))
    ids = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths + gap) - gap
    starts = ends - lengths
    split = np.array([rng.integers(-1, length) if length else -1 for length in lengths.tolist()],
                     dtype=np.int64)
    return ids, starts, ends, split, draw(st.sampled_from([1, 2, 3, 10]))


@settings(max_examples=150, deadline=None)
@given(blocks())
def test_the_pass_gives_the_numpy_passes_figures(block: tuple) -> None:
    ids, starts, ends, split, n = block
    found = row_figures(ids, starts, ends, split, n)
    assert_same(found, numpy_figures(ids, starts, ends, split, n))
    np.testing.assert_array_equal(compiled.digest(ids, starts, ends), found.digest)
    assert found.digest.dtype == np.uint64 and found.repeat.dtype == np.float64
    assert found.signature.dtype == np.uint64


def test_a_loop_scores_its_share_and_a_random_reply_none() -> None:
    rng = np.random.default_rng(3)
    loop = np.resize(rng.integers(0, VOCAB, 7), 400)
    half = np.concatenate([rng.integers(0, VOCAB, 400), loop])
    rows = [loop, rng.integers(0, VOCAB, 800), half]
    ids = np.concatenate(rows)
    ends = np.cumsum([len(row) for row in rows])
    repeat = row_figures(ids, ends - [len(row) for row in rows], ends, np.full(3, -1)).repeat
    assert repeat[0] == 1.0 and repeat[1] == 0.0
    assert 0.49 <= repeat[2] <= 0.51


def test_an_answer_restating_its_reasoning_is_no_loop() -> None:
    rng = np.random.default_rng(4)
    reasoning = rng.integers(0, VOCAB, 300)
    ids = np.concatenate([reasoning, [VOCAB], reasoning])
    one = (np.zeros(1, dtype=np.int64), np.full(1, len(ids), dtype=np.int64))
    apart = row_figures(ids, *one, np.array([300])).repeat
    whole = row_figures(ids, *one, np.array([-1])).repeat
    assert apart[0] == 0.0 and whole[0] > 0.99


@pytest.mark.parametrize(("split", "length"), [
    (-1, MAX_ROW_IDS + 110_000), (5, MAX_ROW_IDS + 110_000), (MAX_ROW_IDS + 10, MAX_ROW_IDS + 110_000),
    (-1, 2 * MAX_ROW_IDS + 70_000), (2 * MAX_ROW_IDS + 3, 2 * MAX_ROW_IDS + 70_000),
])
def test_a_row_past_the_cut_is_looked_at_as_the_numpy_passes_do(split: int, length: int) -> None:
    rng = np.random.default_rng(5)
    row = np.concatenate([rng.integers(0, VOCAB, length - 60_000),
                          np.resize(rng.integers(0, VOCAB, 9), 60_000)])
    ids = np.concatenate([rng.integers(0, VOCAB, 30), row])
    starts, ends = np.array([0, 30]), np.array([30, len(ids)])
    split = np.array([-1, split])
    assert_same(row_figures(ids, starts, ends, split), numpy_figures(ids, starts, ends, split, 10))


def test_the_share_alone_and_other_signature_widths() -> None:
    rng = np.random.default_rng(6)
    lengths = np.array([0, 1, 2, 3, 5, 40, 700])
    ids = rng.integers(0, 50, int(lengths.sum()))
    ends = np.cumsum(lengths)
    starts, split = ends - lengths, np.full(len(lengths), -1)
    alone = row_figures(ids, starts, ends, split, num_perm=0)
    assert alone.signature.shape == (len(lengths), 0)
    for width in (1, 7, 256):
        found = row_figures(ids, starts, ends, split, num_perm=width)
        assert_same(found, numpy_figures(ids, starts, ends, split, 10, width))
        np.testing.assert_array_equal(found.repeat, alone.repeat)
        np.testing.assert_array_equal(found.digest, alone.digest)


def test_without_numba_the_numpy_passes_run(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    ids = np.resize(rng.integers(0, VOCAB, 11), 500)
    block = (ids, np.array([0, 100]), np.array([100, 500]), np.array([-1, 50]))
    want = row_figures(*block)
    monkeypatch.setattr(compiled, "_kernel", lambda: None)
    assert_same(row_figures(*block), want)
    np.testing.assert_array_equal(compiled.digest(*block[:3]), want.digest)
    assert row_figures(*block, num_perm=0).signature.shape == (2, 0)


@pytest.mark.parametrize("bounds", [([0], [9]), ([-1], [2]), ([3], [2])])
def test_rows_outside_the_ids_are_refused(bounds: tuple[list[int], list[int]]) -> None:
    with pytest.raises(ValueError, match="outside the token array"):
        row_figures(np.arange(4), np.array(bounds[0]), np.array(bounds[1]), np.array([-1]))
    with pytest.raises(ValueError, match="outside the token array"):
        compiled.digest(np.arange(4), np.array(bounds[0]), np.array(bounds[1]))


@pytest.mark.parametrize("settings_", [{"n": 0}, {"shingle": 0}, {"num_perm": 5000}])
def test_bad_settings_are_refused(settings_: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="num_perm"):
        row_figures(np.arange(4), np.array([0]), np.array([4]), np.array([-1]), **settings_)
