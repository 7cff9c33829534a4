"""The per-row facts of output ids: the compiled pass against the numpy passes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analyze import id_facts as module
from workbench.analyze.id_facts import IdFacts, id_facts

VOCAB, SPECIAL, END, START = 100, 90, 95, 94
NOT_SPECIAL = np.array([END, START, 99])


def test_the_extra_compiles_the_pass() -> None:
    assert module._kernel() is not None, "the test extra installs numba"


def facts(rows: list[list[int]], **settings_: object) -> IdFacts:
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    ends = np.cumsum(lengths)
    ids = np.array([i for row in rows for i in row], dtype=np.int64)
    options = {"vocab_size": VOCAB, "think_end": END, "think_start": START,
               "special_start": SPECIAL, "not_special": NOT_SPECIAL, **settings_}
    return id_facts(ids, ends - lengths, ends, **options)  # type: ignore[arg-type]


@pytest.fixture(params=["compiled", "numpy"])
def either(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setattr(module, "_kernel", lambda: None)
    return str(request.param)


def test_each_fact_of_a_reply(either: str) -> None:
    found = facts([[1, 2, 95, 7, 95], [94, 94, 3, 95], [91, 99, 92, 95, 100], [], [5, -1, 200]])
    assert found.bad_vocab.tolist() == [-1, -1, 4, -1, 1]
    assert found.special.tolist() == [0, 0, 2, 0, 0]  # 91 and 92; 99, the think ids aside
    assert found.end_count.tolist() == [2, 1, 1, 0, 0]
    assert found.end_first.tolist() == [2, 3, 3, -1, -1]
    assert found.after_end.tolist() == [7, -1, 100, -1, -1]  # the row's end: -1
    assert found.start_count.tolist() == [0, 2, 0, 0, 0]


def test_without_think_ids_or_specials_nothing_is_looked_for(either: str) -> None:
    found = facts([[95, 94, 91]], think_end=None, think_start=None, special_start=None)
    assert found.end_count.tolist() == [0] and found.end_first.tolist() == [-1]
    assert found.after_end.tolist() == [-1] and found.start_count.tolist() == [0]
    assert found.special.tolist() == [0]


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.integers(-2, 105), max_size=12), max_size=8),
       think_end=st.sampled_from([None, END]), think_start=st.sampled_from([None, START]),
       special_start=st.sampled_from([None, SPECIAL, 0]))
def test_the_compiled_pass_gives_the_numpy_facts(
    rows: list[list[int]], think_end: int | None, think_start: int | None,
    special_start: int | None,
) -> None:
    options = {"think_end": think_end, "think_start": think_start, "special_start": special_start}
    compiled = facts(rows, **options)
    kernel = module._kernel
    try:
        module._kernel = lambda: None  # type: ignore[assignment]
        numpy = facts(rows, **options)
    finally:
        module._kernel = kernel
    for name, got, want in zip(IdFacts._fields, compiled, numpy, strict=True):
        assert got.tolist() == want.tolist(), name
