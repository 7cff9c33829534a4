"""One sequence as the engine holds it: its prompt size and blocks, planned output, progress.

A `Request` moves WAITING -> RUNNING -> FINISHED (`RequestState`); a retraction sends a
running one back to WAITING. The queue and the batch (`workbench.sim.batch`) move it, the
engine (`workbench.sim.engine`) stamps its times when a step is published, and the server's
job (`workbench.sim.job`) holds it for the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

__all__ = ["Request", "RequestState"]


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One sequence in the engine: its prompt size and blocks, planned output, progress."""

    __slots__ = (
        "abort_message",
        "abort_status",
        "aborted_in_queue",
        "admitted_at",
        "arrival",
        "cached_tokens",
        "finished_at",
        "first_token_at",
        "generated",
        "hashes",
        "health",
        "host_cached_tokens",
        "last_output_at",
        "max_new_tokens",
        "on_update",
        "output_ids",
        "prompt_len",
        "published",
        "retractions",
        "state",
        "stream",
    )

    def __init__(
        self,
        prompt_len: int,
        output_ids: list[int],
        max_new_tokens: int,
        *,
        hashes: list[int] | None = None,
        stream: bool = False,
        on_update: Callable[[], None] | None = None,
        health: bool = False,
    ) -> None:
        self.prompt_len = prompt_len
        self.output_ids = output_ids
        self.max_new_tokens = max_new_tokens
        self.hashes = hashes or []
        self.stream = stream
        self.on_update = on_update
        self.health = health
        self.generated = 0
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.abort_message: str | None = None
        self.abort_status: int | None = 503
        self.aborted_in_queue = False
        self.retractions = 0
        self.published = 0
        self.admitted_at: float | None = None
        self.last_output_at: float | None = None
        self.state = RequestState.WAITING
        self.arrival = 0.0
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    @property
    def kv_tokens(self) -> int:
        """Tokens this request holds in the pool while it runs."""
        return self.prompt_len + self.generated

    @property
    def finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def aborted(self) -> bool:
        return self.abort_message is not None

    @property
    def done(self) -> bool:
        """Finished and published: what a client may see (the engine state runs a step ahead)."""
        return self.finished_at is not None

