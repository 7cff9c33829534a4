"""One generation session: the server probed, the run directory locked, the plan sent.

:func:`run_generation` is the one call the CLI, the demo and notebooks use: it refuses a
dataset named like one of the run directory's own entries (``run.json``, ...), loads the
prompts (bad input fails before any server is asked), reads the server's ``/server_info``
and ``/model_info`` (an unreachable server raises ServerUnreachable), checks the resume,
sends one 1-token preflight request when asked (a reply that is not SGLang's shape, or a
refused request, fails the run before anything is written), asks the server once per
``render: server`` dataset whether it gives back the token ids of the chat prompts it
renders (a ConfigError naming the dataset's key when not), then holds the run
directory's writer lock while it runs. :func:`run_with_view` does the same under
``asyncio.run`` with Ctrl-C / SIGTERM handling and a progress view.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workbench.config import Manifest
from workbench.errors import BadRequest, ProtocolError, RequestFailed
from workbench.generate.dispatch import Runner
from workbench.generate.launched import LaunchedServer, LaunchSettings, launched_server
from workbench.generate.plan import GenerateOptions, model_name
from workbench.generate.progress import RunSummary
from workbench.generate.prompts import Prompt
from workbench.generate.rendering import check_server_renders
from workbench.generate.views import View
from workbench.generate.watchdog import Detection, WatchdogSettings
from workbench.rundir.layout import check_dataset_names
from workbench.rundir.lock import hold_run_lock
from workbench.rundir.storage import storage_error
from workbench.server.client import SGLangClient, api_key_from_env, request_timeout
from workbench.server.info import gpu_count

__all__ = ["preflight", "probe_server", "run_generation", "run_with_view"]


async def preflight(client: SGLangClient, prompt: Prompt, *, attempts: int = 3) -> None:
    """One request of one token built from `prompt`, before anything is written.

    A reply that is not SGLang's shape (ProtocolError) or a refused request (BadRequest: 401,
    404, ...) raises: every request of the run would fail the same way. Retryable failures
    are tried `attempts` times, then left to the run's own retries.
    """
    payload: dict[str, Any] = {
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "rid": f"workbench-preflight-{random.getrandbits(64):016x}",
    }
    if prompt.input_ids is not None:
        payload["input_ids"] = prompt.input_ids[:1]
    else:
        payload["text"] = (prompt.text or " ")[:64]
    for attempt in range(attempts):
        try:
            await client.generate(payload)
            return
        except (BadRequest, ProtocolError):
            raise
        except RequestFailed:
            await asyncio.sleep(0.5 * 2**attempt)


async def probe_server(client: SGLangClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """`/server_info` and `/model_info` snapshots; an unreachable server raises ServerUnreachable."""
    server_info = await client.server_info()
    try:
        model_info = await client.model_info()
    except RequestFailed:
        model_info = {}
    return server_info, model_info


async def serving_gpus(client: SGLangClient, server_info: Mapping[str, Any]) -> int | None:
    """The GPUs behind `client`: its /server_info's count, or for an sglang-router (whose
    /server_info names no parallelism, only `workers_count`) the first worker's count times
    the workers; 0 for a server on the CPU (`device` "cpu": its cost is said in CPU-hours);
    None when no server says."""
    if str(server_info.get("device", "")).lower() == "cpu":
        return 0
    gpus = gpu_count(server_info)
    if gpus is not None or "workers_count" not in server_info:
        return gpus
    try:
        workers = await client.workers()
        if not workers:
            return None
        async with SGLangClient(workers[0]["url"], api_key=api_key_from_env(),
                                timeout=10.0) as worker:
            per_worker = gpu_count(await worker.server_info())
    except RequestFailed:
        return None
    return None if per_worker is None else per_worker * len(workers)


async def run_generation(
    manifest: Manifest,
    client: SGLangClient,
    out: Path | str,
    options: GenerateOptions = GenerateOptions(),
    *,
    on_start: Callable[[Runner], None] | None = None,
    on_progress: Callable[[Runner], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    watchdog: WatchdogSettings | None = None,
    on_watchdog: Callable[[Detection], None] | None = None,
) -> RunSummary:
    """Load the prompts, probe the server, prepare the output directory and run; the one call
    the CLI and notebooks use.

    `on_start` receives the prepared runner (e.g. to install signal handlers calling
    `runner.request_stop`). `watchdog`: its thresholds (default: on, with
    :class:`WatchdogSettings`' defaults); `on_watchdog` gets each of its detections.
    """
    check_dataset_names(manifest)
    runner = Runner(manifest, client, out, options, on_progress=on_progress, on_event=on_event,
                    watchdog=watchdog, on_watchdog=on_watchdog)
    runner.load()
    server_info, model_info = await probe_server(client)
    runner.check_resume(server_info, model_info)
    runner.serving_gpus = await serving_gpus(client, server_info)
    first = runner.first_prompt()
    if options.preflight and first is not None:
        await preflight(client, first)
    for spec, _sampling, prompt in runner.plan.server_rendered():  # render: server works
        await check_server_renders(client, spec, prompt, model_name(server_info, model_info))
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(out, exc) from None
    with hold_run_lock(out):  # held while writing: a second writer is refused, the monitor sees it
        runner.open(server_info, model_info)
        await runner.probe_renderings()
        if on_start is not None:
            on_start(runner)
        return await runner.run()


def _install_stop_signals(runner: Runner, say: Callable[[str], None]) -> None:
    """SIGINT and SIGTERM: the first stops sending (and says so), the second stops at once."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        runner.request_stop()
        if runner.stop_requests == 1:
            say("stopping: letting in-flight requests finish (signal again to stop now)")

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


def run_with_view(manifest: Manifest, server: str | None, out: Path, options: GenerateOptions,
                  view: View, say_stopping: Callable[[str], None],
                  watchdog: WatchdogSettings | None = None,
                  launch: LaunchSettings | None = None) -> RunSummary:
    """A whole session under ``asyncio.run``: its own client (the API key from the
    environment), signal handling (`say_stopping` gets the note of a first signal), the
    watchdog (its detections are view events) and the view's updates; the view is stopped
    however the run ends. With `launch`, the run starts its own server (`server` unused),
    restarted when it dies or the watchdog says it stalled or degraded."""
    timeout = request_timeout(options.request_timeout)

    async def go() -> RunSummary:
        if launch is None:
            assert server is not None, "a server URL or a server to launch"
            return await session(server, None)
        async with launched_server(launch, out, say_stopping) as launched:
            return await session(launched.url, launched)

    async def session(url: str, launched: LaunchedServer | None) -> RunSummary:
        def on_start(runner: Runner) -> None:
            _install_stop_signals(runner, say_stopping)
            if launched is not None:
                launched.attach(runner)
            view.start(runner)

        async with SGLangClient(url, api_key=api_key_from_env(), timeout=timeout) as client:
            return await run_generation(
                manifest, client, out, options, on_start=on_start, on_progress=view.update,
                on_event=view.event, watchdog=watchdog,
                on_watchdog=launched.on_watchdog if launched is not None else None)

    try:
        return asyncio.run(go())
    finally:
        view.stop()
