"""The compiled pass of :mod:`workbench.analyze.id_facts` (imported only with numba)."""

from __future__ import annotations

from typing import Any

from workbench.compiling import jit

__all__ = ["facts_loop"]


@jit
def facts_loop(ids: Any, starts: Any, ends: Any, vocab_size: int, think_end: int,
               think_start: int, special_start: int, thinks: bool, starts_known: bool,
               specials: bool, expected: Any, out: Any) -> None:
    """Each row's facts into the columns of `out` (the fields of
    :class:`~workbench.analyze.id_facts.IdFacts`, in order)."""
    watch = vocab_size  # the ids below it and not negative are none of the facts'
    if specials:
        watch = min(watch, special_start)
    if thinks:
        watch = min(watch, think_end)
        if starts_known:
            watch = min(watch, think_start)
    for row in range(len(starts)):
        start, end = starts[row], ends[row]
        bad, special, end_count, end_first, after, start_count = -1, 0, 0, -1, -1, 0
        for p in range(start, end):
            value = ids[p]
            if 0 <= value < watch:
                continue
            if (value >= vocab_size or value < 0) and bad < 0:
                bad = p - start
            if specials and special_start <= value < vocab_size:
                special += 1
                for other in expected:
                    if other == value:
                        special -= 1
                        break
            if thinks:
                if value == think_end:
                    if end_count == 0:
                        end_first = p - start
                        if p + 1 < end:
                            after = ids[p + 1]
                    end_count += 1
                if starts_known and value == think_start:
                    start_count += 1
        out[0, row], out[1, row], out[2, row] = bad, special, end_count
        out[3, row], out[4, row], out[5, row] = end_first, after, start_count
