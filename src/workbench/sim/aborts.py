"""The server's unfinished jobs by rid, and the aborts that find them.

The server knows its unfinished jobs by rid, as the tokenizer manager's `rid_to_state`
(health checks left out), for POST /abort_request (`LiveJobs.abort_request`): an unknown or
empty rid is ignored; a known one aborts, on every rank, each request whose rid starts with
it (the scheduler matches by prefix); and `abort_all` aborts everything. While a stall fault
holds the scheduler, aborts wait for its end. A client that goes away aborts its own jobs
(`LiveJobs.cancel`). Each abort the tokenizer manager sends is counted in the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from workbench.sim.engine import Engine, EngineLoop
from workbench.sim.job import Job
from workbench.sim.metrics import SimMetrics
from workbench.sim.request import Request

__all__ = ["CLIENT_GONE_MESSAGE", "LiveJobs"]

CLIENT_GONE_MESSAGE = "Abort request: the client disconnected"


class LiveJobs:
    """The unfinished jobs of a server over its ranks' engine loops."""

    def __init__(self, loops: Sequence[EngineLoop], metrics: SimMetrics) -> None:
        self.loops = loops
        self.metrics = metrics
        self._live: set[Job] = set()  # unfinished jobs, health checks left out

    def add(self, job: Job) -> None:
        """Know a job until it is done (its request published finished) or cancelled."""
        self._live.add(job)

    def updated(self, job: Job, on_update: Callable[[], None]) -> None:
        """A job's request published: forget it once done, then tell its waiter."""
        if job.request.done:
            self._live.discard(job)
        on_update()

    def cancel(self, job: Job) -> None:
        """Abort a job whose client went away (the tokenizer manager's abort, counted)."""
        self._live.discard(job)
        if job.engine.cancel(job.request, CLIENT_GONE_MESSAGE):
            self.metrics.abort_sent()

    def abort_request(self, rid: str, *, abort_all: bool = False) -> int:
        """POST /abort_request (tokenizer_manager `abort_request`, scheduler `abort_request`);
        returns how many requests it aborted. Waiting ones are answered at once, running
        ones at the next step; during a stall the abort waits for its end (and counts 0)."""
        if not abort_all and not self._knows(rid):
            return 0
        self.metrics.abort_sent()
        if abort_all:
            matches: Callable[[Request], bool] = _everything
        else:
            matches = {job.request for job in self._live if job.item.rid.startswith(rid)}.__contains__
        aborted = 0

        def run(engine: Engine) -> None:
            nonlocal aborted
            aborted += engine.abort(matches)

        for loop in self.loops:
            loop.when_running(partial(run, loop.engine))
        return aborted

    def _knows(self, rid: str) -> bool:
        """Whether `rid` names an unfinished request (an empty one never does)."""
        return bool(rid) and any(job.item.rid == rid for job in self._live)


def _everything(request: Request) -> bool:
    """`abort_all`: every request matches."""
    return True
