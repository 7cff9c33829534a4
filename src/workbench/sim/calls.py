"""The jobs of one HTTP call, as SGLang serves them: run to the end, or streamed.

:func:`run_jobs` waits for every job of a non-streaming call and cancels them when the
client disconnects first (or the handler itself is cancelled, as an in-process client that
gives up does); :func:`stream_jobs` yields a job each time
it has a chunk due (``stream_interval``). Both the native ``/generate`` (app.py) and the
OpenAI-compatible endpoints (openai.py) use them; :func:`abort_response` is how SGLang
answers a non-streaming abort that carries an error status (:func:`error_abort`: 400, 500
or 503); other aborts, such as those of POST /abort_request, are ordinary 200 replies whose
finish_reason says "abort".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from workbench.sim.job import Job
from workbench.sim.protocol import GenerateItem, error_body, json_response
from workbench.sim.server import SimServer

__all__ = ["DONE", "Countdown", "abort_response", "error_abort", "run_jobs", "stream_jobs"]

DONE = b"data: [DONE]\n\n"
# tokenizer_manager `_handle_abort_finish_reason`: the statuses that fail a non-streamed call.
ERROR_ABORT_STATUSES = (400, 500, 503)


class Countdown:
    """An event set once every watched request is done (finished and published)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.event = asyncio.Event()

    def update(self) -> None:
        if all(job.request.done for job in self.jobs):
            self.event.set()


def error_abort(finish: object) -> dict[str, Any] | None:
    """The finish_reason if it is an abort that fails a non-streamed call, else None."""
    if not isinstance(finish, dict) or finish.get("type") != "abort":
        return None
    return finish if finish.get("status_code") in ERROR_ABORT_STATUSES else None


def abort_response(finish: dict[str, Any]) -> Response:
    """A non-streaming abort as SGLang answers it (tokenizer_manager
    `_handle_abort_finish_reason`): 400 as a ValueError, other statuses as an HTTPException
    through http_server's handler (`ErrorResponse`: object, message, type, param, code)."""
    status = finish.get("status_code") or 503
    message = finish.get("message") or "Aborted"
    if status == 400:
        return json_response(error_body(message), 400)
    body = {
        "object": "error",
        "message": message,
        "type": str(status),
        "param": None,
        "code": status,
    }
    return json_response(body, status)


async def run_jobs(
    server: SimServer, items: list[GenerateItem], receive: Receive
) -> list[Job] | None:
    """Run non-streaming jobs to the end; None (jobs cancelled) if the client left first."""
    countdown = Countdown()
    countdown.jobs = [
        server.start_job(item, stream=False, on_update=countdown.update) for item in items
    ]
    try:
        finished = await _finished_before_disconnect(countdown.event, receive)
    except asyncio.CancelledError:
        _cancel_unfinished(server, countdown.jobs)
        raise
    if not finished:
        _cancel_unfinished(server, countdown.jobs)
        return None
    return countdown.jobs


async def _finished_before_disconnect(event: asyncio.Event, receive: Receive) -> bool:
    """Wait for `event`; False if the client disconnected first."""
    finished = asyncio.ensure_future(event.wait())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((finished, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        finished.cancel()
        gone.cancel()
    return event.is_set()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _due(job: Job, sent: int, default_interval: int) -> bool:
    """Whether a running job's published tokens make a chunk (output_streamer.py `accept`):
    every step at interval 1, else the first token at once and then every `interval`."""
    unsent = job.request.published - sent
    if unsent <= 0:
        return False
    interval = job.item.sampling.stream_interval or default_interval
    return interval == 1 or unsent >= interval or sent == 0


async def stream_jobs(
    server: SimServer, items: list[GenerateItem]
) -> AsyncIterator[tuple[int, Job]]:
    """(index, job) each time a streamed job has a chunk due, as the engine publishes tokens;
    a done job (`job.request.done`) comes once, last. Unfinished jobs are cancelled on exit."""
    changed = asyncio.Event()
    jobs = [server.start_job(item, stream=True, on_update=changed.set) for item in items]
    sent = [0] * len(jobs)
    pending = set(range(len(jobs)))
    interval = server.config.stream_interval
    try:
        while pending:
            await changed.wait()
            changed.clear()
            for index in sorted(pending):
                job = jobs[index]
                if job.request.done:
                    pending.discard(index)
                elif not _due(job, sent[index], interval):
                    continue
                sent[index] = job.request.published
                yield index, job
    finally:
        _cancel_unfinished(server, jobs)


def _cancel_unfinished(server: SimServer, jobs: list[Job]) -> None:
    for job in jobs:
        if not job.request.finished:
            server.cancel(job)
