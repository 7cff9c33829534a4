"""One sequence of a /generate call inside the simulator: what it asked, its planned output,
its engine request (the server creates jobs, the HTTP layer waits on them, replies read them).
"""

from __future__ import annotations

from workbench.sim.completion import Completion
from workbench.sim.engine import Engine
from workbench.sim.protocol import GenerateItem
from workbench.sim.request import Request

__all__ = ["Job"]


class Job:
    """One sequence of a /generate call: what it asked, its output, its engine request."""

    __slots__ = ("completion", "engine", "item", "rank", "reasoning_length", "request", "text")

    def __init__(
        self,
        item: GenerateItem,
        completion: Completion,
        request: Request,
        engine: Engine,
        rank: int = 0,
    ) -> None:
        self.item = item
        self.completion = completion
        self.request = request
        self.engine = engine
        self.rank = rank
        self.text = (0, "")  # (ids rendered, their text) of a running request
        self.reasoning_length: int | None = None
