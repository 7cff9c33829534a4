"""Shared fixtures: simulators on real sockets, the `workbench` command (in this process, or as
a process of its own where the process is what is tested), and bounded waits on events.

Tests wait on events (a line written, a port open, a counter moved, a process gone), never on
a pause, and never assert how long something took. `wait_until` is that wait: it polls a real
condition and fails loudly, naming it, after a timeout that only bounds a broken run (make it
generous: a loaded machine is slow, not wrong).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

# The compiled loops (numba, the fast extra) check every index here: one out of bounds raises
# instead of reading or writing past an array. Compiled so, they are cached apart from the
# loops a user's runs load (numba's cache does not tell the two apart).
os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parent / ".numba-cache"))

from workbench.cli import main as workbench_main
from workbench.demo import start_simulator
from workbench.rundir.records import PromptRecord, Record, encode_line
from workbench.server.launch import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def anyio_backend() -> str:
    """The event loop of the async tests (pytest's anyio plugin): asyncio, as the workbench."""
    return "asyncio"


SIM_FLAGS: dict[str, Any] = {"profile": "fast", "enable_metrics": True, "random_seed": 0}


@pytest.fixture(scope="session")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One simulator (SIM_FLAGS) for the tests of this worker that need only its HTTP
    contract; a test about its counters, its cache, its faults or its process starts its own
    (`start_sim`). A worker runs one test at a time: the simulator serves one test at once."""
    server = start_simulator(tmp_path_factory.mktemp("shared-sim") / "sim.log", SIM_FLAGS)
    yield server
    server.stop()


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start simulators (SIM_FLAGS and `args`) on free ports; all are stopped afterwards."""
    servers: list[ServerProcess] = []

    def start(**args: Any) -> ServerProcess:
        flags = {**SIM_FLAGS, **args}
        server = start_simulator(tmp_path / f"sim-{len(servers)}.log", flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def workbench(*args: str, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`workbench ARGS` run by the command's own `main` in this process, stdout and stderr
    captured: the same parser, verbs, messages and exit codes as `python -m workbench`, without
    a Python start-up and the whole stack's imports per call (most tests are about what a verb
    does, not about a process). `env` stands for the environment and `cwd` for the working
    folder while it runs; an error that escapes `main` is a traceback on stderr and exit 1, as
    in a process. A run that hangs is ended by pytest-timeout.
    What is about the process itself (signals, a closed pipe, the entry point, what a child
    inherits) goes through :func:`workbench_process`."""
    out, err = io.StringIO(), io.StringIO()
    with (_environment(env), _working_folder(cwd), _argv(["workbench", *args]),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        code = _exit_code(args, err)
    return subprocess.CompletedProcess(["workbench", *args], code, out.getvalue(), err.getvalue())


def _exit_code(args: tuple[str, ...], err: io.StringIO) -> int:
    """What `sys.exit(main(args))` would leave as the exit status."""
    try:
        return workbench_main(list(args))
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        err.write(f"{exc.code}\n")
        return 1
    except Exception:  # noqa: BLE001 - an uncaught error: what the interpreter would print
        err.write(traceback.format_exc())
        return 1


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _working_folder(cwd: str | os.PathLike[str] | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def workbench_process(*args: str, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `python -m workbench ARGS` as a process of its own and capture its output."""
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def write_manifest(folder: Path, datasets: list[dict[str, Any]], **top: Any) -> Path:
    """A dataset manifest (JSON is valid YAML) with the example tokenizer by default."""
    body = {"model_profile": "kimi-k2.5", "tokenizer": str(EXAMPLES / "tokenizer"),
            "sampling": {"temperature": 0.0, "max_new_tokens": 256}, "datasets": datasets, **top}
    path = folder / "datasets.yaml"
    path.write_text(json.dumps(body, indent=1))
    return path


def generate_run(base: Path, datasets: list[dict[str, Any]], server: ServerProcess) -> Path:
    """BASE/out: the datasets generated on the simulator `server`."""
    manifest = write_manifest(base, datasets)
    done = workbench("generate", "--datasets", str(manifest), "--server", server.url,
                     "--out", str(base / "out"), "--progress-interval", "30")
    assert done.returncode == 0, done.stderr
    return base / "out"


def tool_turn_rows(folder: Path, count: int) -> Path:
    """FOLDER/tool_turns.jsonl: the first `count` example multi-turn function-calling rows."""
    path = folder / "tool_turns.jsonl"
    lines = (EXAMPLES / "data" / "tool_turns.jsonl").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:count]))
    return path


BENCH = EXAMPLES / "benchmarks" / "tiny_bench.jsonl"
QUOTED = ("some recent order sends a special service after that current city. The company "
          "includes a bad team now.")  # tiny_bench's tb-3, in words the example tokenizer knows


def text_prompts(folder: Path, count: int) -> Path:
    """Text prompts of words the example tokenizer knows; every fourth quotes tiny_bench."""
    rng = random.Random(11)
    words = QUOTED.replace(".", "").split()
    path = folder / "texts.jsonl"
    with open(path, "w") as out:
        for i in range(count):
            text = " ".join(rng.choice(words) for _ in range(30))
            out.write(json.dumps({"sample_id": i, "text": f"{QUOTED} {text}" if i % 4 == 0
                                  else text}) + "\n")
    return path


IM_END = 163586  # kimi-k2.5's end id


def make_record(sample_id: Any, output_ids: list[int], *, mode: str | None = None,
                turn: int | None = None, finish: str = "stop", prompt_tokens: int = 5,
                ts: float = 1.75e9) -> Record:
    """A flat record of `output_ids` (kimi-k2.5 ids; finished at its end id unless `finish`
    says otherwise), with the optional `mode` and `turn` keys only when given."""
    made = Record(sample_id=sample_id, output_ids=output_ids, prompt_tokens=prompt_tokens,
                  completion_tokens=len(output_ids), cached_tokens=0, finish_reason=finish,
                  matched_stop=IM_END if finish == "stop" else None, e2e_latency=1.0, ts=ts)
    if mode is not None:
        made.mode = mode
    if turn is not None:
        made.turn = turn
    return made


def write_records(folder: Path, records: list[Record],
                  prompt_ids: Callable[[Record], list[int]] = lambda r: [1, 2, 3]) -> None:
    """FOLDER/raw_responses.jsonl of `records` and a prompts.jsonl line (`prompt_ids`) each."""
    folder.mkdir(parents=True)
    (folder / "raw_responses.jsonl").write_bytes(b"".join(map(encode_line, records)))
    prompts = [PromptRecord(sample_id=r.sample_id, input_ids=prompt_ids(r),
                            turn=r.turn if isinstance(r.turn, int) else None) for r in records]
    (folder / "prompts.jsonl").write_bytes(b"".join(map(encode_line, prompts)))


def one_error_line(stderr: str, ignore: str | None = None) -> str:
    """The one line of a verb's error (no traceback), lines starting with `ignore` left out."""
    lines = [line for line in stderr.strip().splitlines()
             if ignore is None or not line.startswith(ignore)]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("workbench: error: "), stderr
    return lines[0]


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_until(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> None:
    """Return once `predicate()` is true; AssertionError naming `what` after `timeout` seconds
    (`what` may be a function: told as it is then, e.g. with the last state the predicate saw)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            told = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {told}")
        time.sleep(interval)


async def wait_until_async(predicate: Callable[[], Awaitable[object]], timeout: float, what: str,
                           interval: float = 0.02) -> None:
    """`wait_until` in an async test: `predicate` is awaited, the event loop keeps running."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await anyio.sleep(interval)
