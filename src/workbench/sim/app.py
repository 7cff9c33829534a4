"""The simulator's HTTP API (SGLang's endpoints and shapes) and its uvicorn server.

Endpoints: POST /generate (single, batch, streaming), POST /v1/completions and
/v1/chat/completions (openai.py), GET /health, /health_generate, /server_info and
/get_server_info, /model_info and /get_model_info, /v1/models, POST /flush_cache, POST
/abort_request (`{"rid"}` or `{"abort_all": true}`: an empty 200, whether or not the rid is
known; the aborted /generate calls answer 200 with finish_reason "abort"), and GET
/metrics with --enable-metrics. With --api-key every path except the
/health ones needs `Authorization: Bearer KEY`. The per-request faults apply to /generate
only; the timed ones (stall, decay, exit) to the whole server, and a stall or a decay also
holds or slows the --fixed-latency replies.

Health: SGLang 0.5.23 serves /health and /health_generate with one handler (http_server
`health_generate`). /health_generate sends a one-token generation and answers 200 once the
scheduler sends anything back, 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s of wall-clock time)
without a word from it. /health does the same unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
is false (it is true by default), in which case it answers 200 without asking the scheduler.
The simulator's /health is that last form: it never reaches the engine, so a stalled scheduler
still answers 200 there (with SGLang's defaults a hung scheduler answers 503 after 20 s).
Its /health_generate queues its token in the engine and answers 200 once that token or any
other output is published, 503 after HEALTH_CHECK_TIMEOUT seconds without any (a stall).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, NoReturn

import msgspec
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive

from workbench.sim.calls import (
    DONE,
    Countdown,
    abort_response,
    error_abort,
    run_jobs,
    stream_jobs,
)
from workbench.sim.config import SimConfig
from workbench.sim.middleware import (
    FAULT_SCOPE_KEY,
    ApiKeyMiddleware,
    FaultMiddleware,
    InflightMiddleware,
    QuietShutdownMiddleware,
)
from workbench.sim.openai import chat_completions, completions
from workbench.sim.profiles import OutOfMemory
from workbench.sim.protocol import (
    BadAbort,
    ContractError,
    GenerateBatch,
    GenerateItem,
    InvalidRequest,
    contract_error_body,
    error_body,
    json_response,
    parse_abort,
    parse_generate,
    validation_error_body,
)
from workbench.sim.sampling import Sampling
from workbench.sim.server import SimServer

__all__ = ["create_app", "serve"]

FLUSH_MESSAGE = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
SHUTDOWN_GRACE_SECONDS = 2
HEALTH_CHECK_TIMEOUT = 20.0  # http_server: SGLANG_HEALTH_CHECK_TIMEOUT, wall-clock seconds
HEALTH_POLL_SECONDS = 0.05  # how often /health_generate looks for other output (SGLang: 1 s)
HEALTH_TIMEOUT_MESSAGE = "Abort request: the health check timed out"


def _server(request: Request) -> SimServer:
    server: SimServer = request.app.state.server
    return server


async def generate(request: Request) -> Response:
    """POST /generate."""
    server = _server(request)
    started = time.perf_counter()
    try:
        body = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        return json_response(error_body(f"Invalid JSON: {exc}"), 400)
    try:
        batch = parse_generate(body, server.model, server.limits)
    except ContractError as exc:
        return json_response(contract_error_body(str(exc)), 400)
    except InvalidRequest as exc:
        return json_response(error_body(str(exc)), 400)
    if request.scope.get(FAULT_SCOPE_KEY) == "abort":
        return _final(batch, [server.abort_reply(item, 0.0) for item in batch.items])
    latency = server.config.fixed_latency
    if latency is not None:
        await server.timed.until_running()
        latency *= server.timed.step_factor()
        await asyncio.sleep(latency)
        return _final(batch, [server.fixed_reply(item, latency) for item in batch.items])
    if batch.stream:
        return StreamingResponse(_stream(server, batch, started), media_type="text/event-stream")
    return await _complete(server, batch, started, request.receive)


def _shape(batch: GenerateBatch, replies: list[dict[str, Any]]) -> Any:
    return replies if batch.is_batch else replies[0]


def _final(batch: GenerateBatch, replies: list[dict[str, Any]]) -> Response:
    """Finished replies as JSON, or as one SSE chunk each and [DONE] for a stream."""
    if not batch.stream:
        aborted = next(filter(None, map(_error_abort_of, replies)), None)
        if aborted is not None:
            return abort_response(aborted)
        return json_response(_shape(batch, replies))
    chunks = [_sse(_indexed(batch, index, one)) for index, one in enumerate(replies)]
    return StreamingResponse(_iterate([*chunks, DONE]), media_type="text/event-stream")


def _error_abort_of(reply: dict[str, Any]) -> dict[str, Any] | None:
    return error_abort(reply["meta_info"]["finish_reason"])


async def _iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _complete(
    server: SimServer, batch: GenerateBatch, started: float, receive: Receive
) -> Response:
    jobs = await run_jobs(server, batch.items, receive)
    if jobs is None:
        return Response(status_code=499)
    e2e_latency = time.perf_counter() - started
    return _final(batch, [server.job_reply(job, e2e_latency) for job in jobs])


async def _stream(server: SimServer, batch: GenerateBatch, started: float) -> AsyncIterator[bytes]:
    """SSE chunks with cumulative text and ids as the engine publishes them, then [DONE].

    The first chunk follows the prefill with one token; `e2e_latency` is on the final chunk.
    """
    async with contextlib.aclosing(stream_jobs(server, batch.items)) as events:
        async for index, job in events:
            e2e_latency = time.perf_counter() - started if job.request.done else None
            yield _sse(_indexed(batch, index, server.job_reply(job, e2e_latency)))
    yield DONE


def _indexed(batch: GenerateBatch, index: int, chunk: dict[str, Any]) -> dict[str, Any]:
    if batch.is_batch:
        chunk["index"] = index
    return chunk


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"


async def health(request: Request) -> Response:
    """GET /health: 200 without asking the engine (SGLang's /health with
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false; see the module's docstring)."""
    return Response(status_code=200)


async def health_generate(request: Request) -> Response:
    """GET /health_generate: one token through the engine; 200 once it, or any other output,
    is published; 503 when none comes within HEALTH_CHECK_TIMEOUT seconds (the health request
    is then dropped, not counted as an abort, as http_server cancels its task)."""
    server = _server(request)
    if server.config.fixed_latency is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.timed.until_running(), HEALTH_CHECK_TIMEOUT)
        return Response(status_code=503 if server.timed.stalled() else 200)
    asked = time.perf_counter()
    token = server.model.sim_content_ids[0]
    sampling = Sampling(max_new_tokens=1, temperature=0.0)
    item = GenerateItem([token], [token], "HEALTH_CHECK", sampling)
    countdown = Countdown()
    job = server.start_job(item, stream=False, on_update=countdown.update, health=True)
    countdown.jobs = [job]
    deadline = asked + HEALTH_CHECK_TIMEOUT
    while not (countdown.event.is_set() or server.output_since(asked)):
        left = deadline - time.perf_counter()
        if left <= 0:
            job.engine.cancel(job.request, HEALTH_TIMEOUT_MESSAGE)
            return Response(status_code=503)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(countdown.event.wait(), min(left, HEALTH_POLL_SECONDS))
    return Response(status_code=200)


async def server_info(request: Request) -> Response:
    """GET /server_info and /get_server_info."""
    return json_response(_server(request).server_info())


async def model_info(request: Request) -> Response:
    """GET /model_info and /get_model_info."""
    return json_response(_server(request).model_info())


async def models(request: Request) -> Response:
    """GET /v1/models."""
    return json_response(_server(request).models())


async def flush_cache(request: Request) -> Response:
    """POST /flush_cache: 400 while requests run or wait."""
    status = 200 if _server(request).flush_cache() else 400
    return PlainTextResponse(FLUSH_MESSAGE, status_code=status)


async def abort_request(request: Request) -> Response:
    """POST /abort_request (http_server `abort_request`): an empty 200 once the abort is sent,
    whatever it found; 400 for a body that is not an `AbortReq`."""
    try:
        body = parse_abort(await request.body())
    except BadAbort as exc:
        return json_response(validation_error_body(str(exc)), 400)
    _server(request).abort_request(body.rid, abort_all=body.abort_all)
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    """GET /metrics (only with --enable-metrics)."""
    body = _server(request).metrics.render()
    return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(
    config: SimConfig,
    *,
    log: Callable[[str], None] | None = None,
    exit_process: Callable[[int], object] = os._exit,
) -> Starlette:
    """The simulator as an ASGI app; OutOfMemory when the configuration cannot start.

    `log` receives the scheduler's log lines (none by default). The app's lifespan runs the
    --fault-exit-after timer, which calls `exit_process(1)` (`os._exit`: the process dies
    at once); an in-process client that wants that fault enters
    `app.router.lifespan_context(app)` and passes its own `exit_process`.
    """
    server = SimServer(config, log=log, exit_process=exit_process)
    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/health", health),
        Route("/health_generate", health_generate),
        Route("/server_info", server_info),
        Route("/get_server_info", server_info),
        Route("/model_info", model_info),
        Route("/get_model_info", model_info),
        Route("/v1/models", models),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
    ]
    if config.enable_metrics:
        routes.append(Route("/metrics", metrics))
    middleware = [
        Middleware(QuietShutdownMiddleware),
        Middleware(InflightMiddleware, metrics=server.metrics),
    ]
    if config.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=config.api_key))
    if server.faults.enabled:
        middleware.append(Middleware(FaultMiddleware, server=server))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        exit_timer = asyncio.create_task(server.exit_when_due())
        try:
            yield
        finally:
            exit_timer.cancel()
            await asyncio.gather(exit_timer, return_exceptions=True)
            await server.close()

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.server = server
    return app


def _log_line(line: str) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {line}", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: object) -> NoReturn:
    """Exit cleanly: uvicorn re-raises the signal it handled once its shutdown is done."""
    raise SystemExit(0)


def serve(config: SimConfig) -> None:
    """Run the simulator until SIGTERM or SIGINT; prints one ready line once listening.

    An impossible memory configuration prints an "out of memory" line to stderr and exits 1,
    as a server that cannot allocate its KV pool would.
    """
    try:
        app = create_app(config, log=_log_line)
    except OutOfMemory as exc:
        print(f"workbench sim: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_on_signal)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(uvicorn.Server(uvicorn_config)))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (a real server's throughput), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve(server: uvicorn.Server) -> None:
    sock = server.config.bind_socket()
    host, port = sock.getsockname()[:2]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        host = f"[{host}]" if ":" in host else host
        print(f"workbench sim ready on http://{host}:{port}", flush=True)
    await task
