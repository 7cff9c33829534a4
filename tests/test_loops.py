"""When the compiled loops may be loaded: big work only, unless they are loaded already."""

from __future__ import annotations

import threading

import pytest

from workbench import loops


def test_small_work_does_not_load_the_loops_and_big_work_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loops, "MIN_BYTES", 100)
    name = "workbench.not_a_loaded_module"
    assert loops.wanted(name)  # outside any work: wanted
    with loops.sized(99):
        assert not loops.wanted(name)
        assert loops.wanted("workbench.loops")  # loaded already: free to use
        with loops.sized(100):
            assert not loops.wanted(name)  # inside small work, big work loads nothing new
    with loops.sized(100):
        assert loops.wanted(name)
    assert loops.wanted(name)


def test_the_context_is_left_however_the_work_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops, "MIN_BYTES", 100)
    with pytest.raises(RuntimeError), loops.sized(1):
        raise RuntimeError
    assert loops.wanted("workbench.not_a_loaded_module")


def test_a_loader_runs_once_and_a_missing_numba_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops, "MIN_BYTES", 100)
    calls: list[str] = []

    @loops.compiled("workbench.not_a_loaded_module")
    def present() -> str:
        calls.append("present")
        return "loops"

    @loops.compiled("workbench.not_a_loaded_module")
    def missing() -> str:
        calls.append("missing")
        raise ImportError("No module named 'numba'")

    with loops.sized(1):
        assert present() is None and calls == []  # small work: not even imported
    assert present() == "loops" and present() == "loops"
    assert missing() is None and missing() is None
    assert calls == ["present", "missing"]


def test_small_work_holds_in_its_own_thread_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops, "MIN_BYTES", 100)
    name = "workbench.not_a_loaded_module"
    seen: list[bool] = []
    with loops.sized(1):
        thread = threading.Thread(target=lambda: seen.append(loops.wanted(name)))
        thread.start()
        thread.join()
        assert not loops.wanted(name)
    assert seen == [True]
