#!/usr/bin/env python
"""Check the workbench end to end against a real SGLang 0.5.23 on this machine's CPU.

    .venv/bin/python scripts/real_sglang_check.py \\
        --sglang-python .venv-sglang/bin/python --model outputs/real-sglang/model \\
        --out outputs/real-sglang-check          # these are the defaults (relative to cwd)

    ... --only generate        # one step (generate, auto, watch, tune, fit, unattended, turns)
    ... --skip-tune --skip-fit # leave steps out

Steps (one server at a time; every server's log is kept under OUT/logs/):

1. generate  A manifest of two datasets (chat messages through the tokenizer, a few prompts
             over the 4096-token context; pre-tokenized ids) is sent to a server whose KV pool
             is small enough to retract. The `workbench generate` subprocess is interrupted
             four times: SIGKILL, SIGKILL, one SIGTERM (graceful: in-flight replies finish and
             are kept), two SIGTERMs (in-flight requests cancelled and aborted on the server),
             then resumed to the end. Each session runs from an idle server to an idle server,
             so its /metrics deltas are set against the records it added (see `account`).
2. auto      `--concurrency auto` against fixed caps on the same prompts, fresh --out each,
             prefix cache flushed in between; output tok/s from each run's own records.
3. watch     `workbench stats --json` and `validate --json` on the step-1 run against the
             files, and the monitor's server line (`monitor --once --server`) against
             /metrics read just before and after it, while a generate is running.
4. tune      `workbench tune --params params/tuning.real-sglang.yaml` (SGLang relaunched per
             configuration), results.csv statuses and SGLang's own failure reasons, then the
             throughput_tuning report (HTML written, no cell error).
5. fit       `workbench tune fit SWEEP --out PROFILE --configs a,b` when that verb exists.
6. unattended `workbench generate --launch SERVER.yaml` starts its own SGLang (the `server`
             section of params/tuning.real-sglang.yaml, absolute paths) for 60 pre-tokenized
             prompts; once a fifth of them are written and /metrics shows requests running,
             SGLang's scheduler process (`sglang::scheduler`, under the launched server) gets
             SIGSTOP: the server still answers /metrics but generates nothing (its /health
             does not answer). Checked: the run exits 0; run.json's events
             hold one `stalled` (after --stall-timeout, 30 s), then `server_restarting` (reason
             `stalled`) and `server_restarted`; every sample is written once; neither the
             stopped process nor any process of the run's servers is left; OUT/server.log has
             two start headers.
7. turns     Conversations regenerated turn by turn (`turns: each`, tools declared), one
             dataset rendered by the tokenizer, one by the server (`render: server`), killed
             and resumed; each turn's prompt held against the rendering it follows, the
             renderings' difference said, thinking modes mixed per conversation
             (scripts/real_sglang_turns.py).

Prints `ok`/`FAIL` per check with its figures, a summary, writes OUT/summary.json, and exits
1 when a check failed (2 on a usage error).

Accounting of a session (step 1), from an idle server to an idle server:

    Δnum_requests      = records added + 1 preflight + U
    Δgeneration_tokens = Σ completion_tokens of those records + 1 (preflight) + T
    Δprompt_tokens     = Σ prompt_tokens of those records + 1 (the preflight's one token)
                         + the prompts of the U requests

U and T are requests that ended on the server without a record, and their tokens. Exact
(U = T = 0, no abort) when nothing was in flight at the end: a run to the end, and one
SIGTERM (in-flight requests finish within --grace-period and are recorded). SIGKILL: SGLang
0.5.23 aborts a non-streamed request whose client disconnected (its tokenizer manager polls
for it every few seconds, logging "Request is disconnected from the client side"), so every
in-flight request is aborted (Δnum_aborted_requests_total = the log's disconnect lines = the
requests in flight), and T are their partial tokens (< aborted x max_new_tokens). Two
SIGTERMs: the workbench cancels them and sends /abort_request. An aborted request is counted
in num_requests_total (with its partial tokens) only when its abort finish reached the
tokenizer manager while the request's state was still there, so U <= aborted and neither is
predictable exactly. Requests refused with HTTP 400 (over-long prompts) never reach the
scheduler and are not counted by /metrics (the check says so when it sees otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from real_sglang_turns import step_turns

from workbench.generate.launched import SERVER_LOG
from workbench.rundir.reader import read_rows
from workbench.rundir.records import is_finished
from workbench.server.launch import (
    HEALTH_PATHS,
    ServerProcess,
    command_line,
    find_free_port,
    server_command,
)
from workbench.server.metrics import MetricsSnapshot, parse_metrics

STEPS = ("generate", "auto", "watch", "tune", "fit", "unattended", "turns")
CONTEXT_LEN = 4096
TOO_LONG = re.compile(r"The input \((\d+) tokens\) is longer than the model's context length "
                      r"\((\d+) tokens\)")
TUNE_FAIL_REASONS = {  # config name in params/tuning.real-sglang.yaml -> SGLang's own reasons
    "kv-fp8": ("AMX", "not supported"),
    "hicache": ("cudaHostRegister", "CUDA", "cuda", "NVIDIA"),  # dies without a GPU
}
BAD_REASON = "kill_process_tree"
# what a GPU host leaves out of params/tuning.real-sglang.yaml (--mode gpu)
GPU_TUNE_SETS = ("server.args.device=null", "server.args.attention_backend=null",
                 "server.args.mem_fraction_static=null", "server.env={}")


# --------------------------------------------------------------------------- output

_step = "-"


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] [{_step}] {message}", flush=True)


@dataclass
class Check:
    step: str
    name: str
    ok: bool | None  # None: skipped
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


class Checks:
    def __init__(self) -> None:
        self.items: list[Check] = []
        self.figures: dict[str, dict[str, Any]] = {}
        self.seconds: dict[str, float] = {}

    def add(self, name: str, ok: bool, detail: str, **figures: Any) -> bool:
        self.items.append(Check(_step, name, bool(ok), detail, figures))
        print(f"{'ok  ' if ok else 'FAIL'} {_step}/{name}: {detail}", flush=True)
        return bool(ok)

    def skip(self, name: str, reason: str) -> None:
        self.items.append(Check(_step, name, None, reason))
        print(f"skip {_step}/{name}: {reason}", flush=True)

    def note(self, **figures: Any) -> None:
        self.figures.setdefault(_step, {}).update(figures)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.items if c.ok is False]


@contextlib.contextmanager
def step(name: str, checks: Checks) -> Iterator[None]:
    global _step
    _step = name
    started = time.monotonic()
    say(f"=== step {name} ===")
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a crash of the check is a failed check, not the end
        traceback.print_exc()
        checks.add("completed", False, f"step crashed: {type(exc).__name__}: {exc}")
    finally:
        checks.seconds[name] = round(time.monotonic() - started, 1)
        say(f"=== step {name} took {checks.seconds[name]:.0f} s ===")
        _step = "-"


# --------------------------------------------------------------------------- context


@dataclass
class Context:
    sglang_python: str
    model: Path
    out: Path
    workbench: list[str]
    pool: int
    max_new_tokens: int
    args: argparse.Namespace
    monitor_probe: dict[str, Any] | None = None  # filled by step 1 during its third session

    @property
    def logs(self) -> Path:
        return self.out / "logs"


# --------------------------------------------------------------------------- server


def server_settings(ctx: Context, pool: int) -> tuple[dict[str, Any], dict[str, str]]:
    """SGLang's flags and environment for a server with a KV pool of `pool` tokens: metrics
    on, dummy weights for a model folder without any, the CPU engine in --mode cpu."""
    args: dict[str, Any] = {"enable_metrics": True, "max_total_tokens": pool}
    if not has_weights(ctx.model):
        args["load_format"] = "dummy"  # random weights from config.json
    env: dict[str, str] = {}
    if ctx.args.mode == "cpu":
        args |= {"device": "cpu", "attention_backend": "torch_native", "mem_fraction_static": 0.05}
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    return args, env


@contextlib.contextmanager
def sglang_server(ctx: Context, name: str, pool: int) -> Iterator[ServerProcess]:
    """A real SGLang on the CPU, started in its own process group with its log in OUT/logs."""
    port = find_free_port()
    args, env = server_settings(ctx, pool)
    argv = server_command("sglang", port=port, model_path=str(ctx.model), args=args,
                          python=ctx.sglang_python)
    log = ctx.logs / f"server-{name}.log"
    server = ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, env=env,
                           health_path=HEALTH_PATHS)
    say(f"starting SGLang ({name}, pool {pool} tokens): {command_line(argv, env)}")
    started = time.monotonic()
    server.start()
    try:
        server.wait_ready(timeout=420)
        say(f"SGLang ready at {server.url} after {time.monotonic() - started:.0f} s (log {log})")
        yield server
    finally:
        code = server.stop()
        say(f"SGLang {name} stopped (exit {code})")


def has_weights(model: Path) -> bool:
    return any(model.glob("*.safetensors")) or any(model.glob("*.bin"))


def metrics_text(url: str) -> str:
    response = httpx.get(url + "/metrics", timeout=10.0)
    response.raise_for_status()
    return response.text


def counters(text: str) -> dict[str, float]:
    """Every sglang: sample summed over its label sets (for what the snapshot leaves out)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("sglang:"):
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


@dataclass
class Reading:
    snap: MetricsSnapshot
    raw: dict[str, float]

    @property
    def aborted(self) -> float:
        return self.raw.get("sglang:num_aborted_requests_total", 0.0)


def read_metrics(url: str) -> Reading:
    text = metrics_text(url)
    return Reading(parse_metrics(text, at=time.monotonic()), counters(text))


def delta(after: Reading, before: Reading, name: str) -> float:
    if name == "aborted":
        return after.aborted - before.aborted
    # a labelled counter appears on /metrics only once it moved: absent is 0
    return (getattr(after.snap, name) or 0.0) - (getattr(before.snap, name) or 0.0)


def wait_idle(url: str, timeout: float = 300.0, quiet: float = 3.0) -> Reading:
    """The reading once the server is idle: no running or queued request on its gauges and
    its request and token counters still for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = read_metrics(url)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read_metrics(url)
        moved = (now.snap.requests != last.snap.requests
                 or now.snap.generation_tokens != last.snap.generation_tokens)
        if moved:
            still_since = time.monotonic()
        last = now
        idle_gauges = not (now.snap.running or 0) and not (now.snap.queued or 0)
        if time.monotonic() - still_since >= quiet and idle_gauges:
            return now
        if time.monotonic() - still_since >= 4 * quiet:  # gauges stale: counters decide
            say(f"counters still for {4 * quiet:.0f} s, gauges say running "
                f"{now.snap.running} queued {now.snap.queued}: taken as idle")
            return now
    raise TimeoutError(f"server at {url} not idle after {timeout:.0f} s")


def flush_cache(url: str) -> bool:
    for _ in range(20):
        try:
            if httpx.post(url + "/flush_cache", timeout=30.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return False


# --------------------------------------------------------------------------- the workbench


def workbench_command(ctx: Context, *args: str) -> list[str]:
    return [*ctx.workbench, *args]


def run_workbench(ctx: Context, args: Sequence[str], log_name: str,
                  timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """Run a workbench verb to the end; its stdout and stderr kept in OUT/logs/<log_name>."""
    argv = workbench_command(ctx, *args)
    say(f"$ {shlex.join(argv)}")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    log = ctx.logs / log_name
    log.write_text(f"$ {shlex.join(argv)}\n--- exit {result.returncode}\n--- stdout\n"
                   f"{result.stdout}\n--- stderr\n{result.stderr}")
    return result


def start_workbench(ctx: Context, args: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
    argv = workbench_command(ctx, *args)
    say(f"$ {shlex.join(argv)} &  (log {ctx.logs / log_name})")
    log = (ctx.logs / log_name).open("ab")
    log.write(f"\n$ {shlex.join(argv)}\n".encode())
    log.flush()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def fresh_run(folder: Path) -> Path:
    """`folder/run`, an earlier one moved aside to `run.old-<time>`."""
    run = folder / "run"
    if run.exists():
        backup = folder / f"run.old-{time.strftime('%Y%m%d-%H%M%S')}"
        run.rename(backup)
        say(f"earlier run moved aside to {backup}")
    return run


def stop_workbench(proc: subprocess.Popen[bytes]) -> None:
    """Stop a workbench subprocess still running: two SIGTERMs (the second, taken apart from
    the first, cuts what is in flight), SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # signals sent together can arrive as one
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def stream_workbench(ctx: Context, args: Sequence[str], log_name: str) -> int:
    """Run a long workbench verb, echoing its lines (prefixed) and keeping them in a log."""
    argv = workbench_command(ctx, *args)
    say(f"$ {shlex.join(argv)}")
    with (ctx.logs / log_name).open("w") as log, subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            say("  | " + line.rstrip())
        return proc.wait()


# --------------------------------------------------------------------------- run files


@dataclass
class DatasetFiles:
    records: list[Any]          # finished rows (workbench.rundir.records.Row)
    unfinished: int             # rows that are not finished records
    problems: int               # unreadable / torn lines
    errors: list[dict[str, Any]]
    retractions: int            # Σ num_retractions of the records (when the server sent it)


def read_dataset(folder: Path) -> DatasetFiles:
    raw = folder / "raw_responses.jsonl"
    rows, problems = read_rows(raw) if raw.exists() else ([], [])
    bad_lines = {p.line for p in problems}
    finished = [r for r in rows if is_finished(r, r.line not in bad_lines)]
    errors = []
    errors_path = folder / "errors.jsonl"
    if errors_path.exists():
        for line in errors_path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                errors.append(json.loads(line))
    retractions = 0
    if raw.exists():
        for line in raw.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                retractions += int(json.loads(line).get("num_retractions") or 0)
    return DatasetFiles(finished, len(rows) - len(finished), len(problems), errors, retractions)


def read_run(run: Path, names: Sequence[str]) -> dict[str, DatasetFiles]:
    return {name: read_dataset(run / name) for name in names}


def finished_count(run: Path, names: Sequence[str]) -> int:
    """Whole lines in the raw files (cheap, for deciding when to interrupt)."""
    total = 0
    for name in names:
        raw = run / name / "raw_responses.jsonl"
        with contextlib.suppress(OSError):
            total += raw.read_bytes().count(b"\n")
    return total


# --------------------------------------------------------------------------- step 1 data

ALICE = Path(__file__).resolve().parents[1] / "examples" / "text" / "alice_chapter_1.txt"


def write_manifest(folder: Path, ctx: Context, *, chat: int, pretok: int, long_ids: Sequence[int],
                   concurrency: int | str, seed: int) -> Path:
    """Two datasets: `chat` (messages, some over the context) and `pretok` (token ids)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = ALICE.read_text().split()
    with (folder / "chat.jsonl").open("w") as f:
        for i in range(chat):
            if i in long_ids:  # far over 4096 tokens after the chat template
                text = " ".join(words * (2 + i % 2))
            else:
                n = rng.randint(40, 300)
                start = rng.randrange(0, len(words) - n)
                text = " ".join(words[start:start + n])
            row = {"sample_id": i, "messages": [{"role": "user", "content": text}]}
            f.write(json.dumps(row) + "\n")
    prefixes = [[rng.randrange(1000, 150000) for _ in range(64)] for _ in range(4)]
    with (folder / "pretok.jsonl").open("w") as f:
        for i in range(pretok):
            body = [rng.randrange(1000, 150000) for _ in range(rng.randint(40, 300))]
            f.write(json.dumps({"sample_id": i, "input_ids": prefixes[i % 4] + body}) + "\n")
    manifest = folder / "datasets.yaml"
    datasets = []
    if chat:
        datasets.append("  - name: chat\n    path: chat.jsonl\n    input: messages\n"
                        "    chat_template_kwargs: {thinking: true}\n")
    if pretok:
        datasets.append("  - name: pretok\n    path: pretok.jsonl\n    input: input_ids\n")
    manifest.write_text(
        "# written by scripts/real_sglang_check.py\n"
        "model_profile: kimi-k2.5\n"
        f"tokenizer: {ctx.model.resolve()}\n"
        f"sampling: {{temperature: {ctx.args.temperature}, top_p: 1.0, top_k: -1, "
        f"max_new_tokens: {ctx.max_new_tokens}}}\n"
        f"concurrency: {concurrency}\n"
        "order: random\n"
        "datasets:\n" + "".join(datasets))
    return manifest


# --------------------------------------------------------------------------- step 1


@dataclass
class Session:
    label: str
    how: str                    # sigkill | sigterm | sigterm2 | end
    at_records: int | None      # interrupt once this session added this many lines
    exit_code: int | None = None
    before: Reading | None = None
    after: Reading | None = None
    gauges_at_stop: tuple[float | None, float | None] | None = None  # running, queued
    disconnects: int = 0        # server log lines "Request is disconnected from the client side"
    idle_after: float = 0.0     # seconds from the client's exit to an idle server
    in_flight: int = 0          # the workbench's requests in flight at the stop (see below)
    records: int = 0
    completion: int = 0
    prompt: int = 0
    cached: int = 0
    errors: int = 0
    errors_400: int = 0
    seconds: float = 0.0


def step_generate(ctx: Context, checks: Checks) -> None:
    folder = ctx.out / "generate"
    run = fresh_run(folder)
    chat, pretok = ctx.args.chat_prompts, ctx.args.pretok_prompts
    n_long = max(0, min(ctx.args.long_prompts, chat // 10))
    long_ids = [5 + i * (chat // max(1, n_long)) for i in range(n_long)]
    concurrency = ctx.args.gen_concurrency
    manifest = write_manifest(folder, ctx, chat=chat, pretok=pretok, long_ids=long_ids,
                              concurrency=concurrency, seed=1)
    names = ["chat", "pretok"]
    total = chat + pretok
    marks = [max(4, int(total * f)) for f in (0.16, 0.16, 0.14, 0.11)]  # records per session
    sessions = [Session("1-sigkill", "sigkill", marks[0]), Session("2-sigkill", "sigkill", marks[1]),
                Session("3-sigterm", "sigterm", marks[2]), Session("4-sigterm2", "sigterm2", marks[3]),
                Session("5-end", "end", None)]
    with sglang_server(ctx, "generate", ctx.pool) as server:
        url = server.url
        # a grace period long enough for the in-flight requests to finish after one SIGTERM
        cmd = ["generate", "--datasets", str(manifest), "--server", url, "--out", str(run),
               "--concurrency", str(concurrency), "--progress-interval", "2",
               "--grace-period", "600"]
        previous = wait_idle(url)
        first = previous
        done_before: dict[str, DatasetFiles] = read_run(run, names)
        for s in sessions:
            s.before = previous
            log_start = server.log_size()
            started = time.monotonic()
            proc = start_workbench(ctx, cmd, "generate-step1.log")
            try:
                s.exit_code, s.gauges_at_stop = drive_session(ctx, s, proc, run, names, url)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            s.seconds = time.monotonic() - started
            s.after = wait_idle(url)
            s.idle_after = time.monotonic() - started - s.seconds
            s.disconnects = server.read_log(log_start).decode(errors="replace").count(
                "disconnected from the client side")
            now = read_run(run, names)
            tally(s, done_before, now)
            # in flight at the stop: the fixed cap, or what was left of the prompts that can
            # succeed (the over-long ones fail at once) after this session's records
            pending = total - len(long_ids) - sum(len(f.records) for f in done_before.values())
            s.in_flight = max(0, min(concurrency, pending - s.records))
            say(f"session {s.label}: exit {s.exit_code}, {s.records} records added, "
                f"{s.errors} error lines ({s.errors_400} HTTP 400), {s.seconds:.0f} s, server "
                f"idle {s.idle_after:.0f} s after")
            done_before, previous = now, s.after
        last = previous
        server_log = server.log_path.read_text(errors="replace")
    check_generate(ctx, checks, run, names, manifest, sessions, first, last, long_ids, total,
                   server_log)


def drive_session(ctx: Context, s: Session, proc: subprocess.Popen[bytes], run: Path,
                  names: Sequence[str], url: str) -> tuple[int, tuple[float | None, float | None] | None]:
    """Wait for the interrupt mark (or the end), interrupt as the session says; the exit code
    and the running/queued gauges read just before the interrupt."""
    probed = False
    start = finished_count(run, names)
    while proc.poll() is None:
        lines = finished_count(run, names)
        if s.at_records is not None and lines - start >= s.at_records:
            reading = read_metrics(url)
            gauges = (reading.snap.running, reading.snap.queued)
            if s.how == "sigkill":
                say(f"{lines} records: SIGKILL to generate (pid {proc.pid}); gauges running "
                    f"{gauges[0]} queued {gauges[1]}")
                proc.send_signal(signal.SIGKILL)
            elif s.how == "sigterm":
                say(f"{lines} records: SIGTERM (once) to generate; gauges running {gauges[0]}")
                proc.send_signal(signal.SIGTERM)
            else:
                say(f"{lines} records: SIGTERM twice to generate; gauges running {gauges[0]}")
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=120), gauges
        if s.how == "sigterm" and not probed and lines - start >= 5:  # the server is busy
            probed = True
            ctx.monitor_probe = monitor_probe(ctx, run, url)
        time.sleep(0.2)
    return proc.wait(), None


def tally(s: Session, before: dict[str, DatasetFiles], now: dict[str, DatasetFiles]) -> None:
    for name, files in now.items():
        old = before.get(name)
        old_ids = {r.sample_id for r in old.records} if old else set()
        added = [r for r in files.records if r.sample_id not in old_ids]
        s.records += len(added)
        s.completion += sum(r.completion_tokens for r in added)
        s.prompt += sum(r.prompt_tokens for r in added)
        s.cached += sum(r.cached_tokens or 0 for r in added)
        new_errors = files.errors[len(old.errors) if old else 0:]
        s.errors += len(new_errors)
        s.errors_400 += sum(1 for e in new_errors if e.get("http_status") == 400)


def check_generate(ctx: Context, checks: Checks, run: Path, names: Sequence[str], manifest: Path,
                   sessions: list[Session], first: Reading, last: Reading,
                   long_ids: Sequence[int], total: int, server_log: str) -> None:
    files = read_run(run, names)
    expected = {"chat": set(range(ctx.args.chat_prompts)),
                "pretok": set(range(ctx.args.pretok_prompts))}
    # --- every sample once
    dupes, missing, extra = 0, 0, 0
    failed_ids: dict[str, set[Any]] = {}
    for name in names:
        ids = [r.sample_id for r in files[name].records]
        dupes += len(ids) - len(set(ids))
        err_ids = {e["sample_id"] for e in files[name].errors}
        failed_ids[name] = err_ids - set(ids)
        covered = set(ids) | failed_ids[name]
        missing += len(expected[name] - covered)
        extra += len(covered - expected[name])
    n_records = sum(len(f.records) for f in files.values())
    n_failed = sum(len(v) for v in failed_ids.values())
    checks.add("every-sample-once", dupes == 0 and missing == 0 and extra == 0
               and n_records + n_failed == total,
               f"{n_records} records + {n_failed} failed ids = {n_records + n_failed} of {total} "
               f"prompts; {dupes} duplicate records, {missing} missing, {extra} unknown ids; "
               f"unfinished lines {sum(f.unfinished for f in files.values())}",
               records=n_records, failed=n_failed, duplicates=dupes, missing=missing)
    # --- over-long prompts
    chat_errors = [e for e in files["chat"].errors if e["sample_id"] in long_ids]
    matched = [e for e in chat_errors if e.get("http_status") == 400
               and TOO_LONG.search(e.get("message", ""))]
    lens = sorted({int(m.group(1)) for e in matched if (m := TOO_LONG.search(e["message"]))})
    other_failed = (failed_ids["chat"] - set(long_ids)) | failed_ids["pretok"]
    ok = (failed_ids["chat"] >= set(long_ids) and {e["sample_id"] for e in matched} >= set(long_ids)
          and len(matched) == len(chat_errors) and not other_failed
          and all(n > CONTEXT_LEN for n in lens))
    example = matched[0]["message"] if matched else (chat_errors[0]["message"] if chat_errors else "-")
    attempts = Counter(e["sample_id"] for e in chat_errors)
    checks.add("over-long-400", ok,
               f"{len(long_ids)} over-long prompts failed with HTTP 400 ({len(matched)} error lines, "
               f"attempts per id {dict(attempts)}: a failed prompt is sent again by each resume); "
               f"prompt lengths {lens}; other failed ids {sorted(other_failed, key=str)[:5]}; "
               f"message: {example[:160]!r}")
    # --- retractions
    retracted = delta(last, first, "retracted")
    in_log = server_log.count("Retract requests")
    rec_retractions = sum(f.retractions for f in files.values())
    checks.add("retractions", retracted > 0,
               f"/metrics num_retracted_requests_total +{retracted:.0f}; log lines 'KV cache pool "
               f"is full. Retract requests.' {in_log}; Σ num_retractions in records "
               f"{rec_retractions} (killed requests retracted too are not in records)",
               retracted=retracted, log_lines=in_log, record_retractions=rec_retractions)
    # --- per-session accounting
    mnt = ctx.max_new_tokens
    rows = []
    for s in sessions:
        assert s.before is not None and s.after is not None
        d_req = delta(s.after, s.before, "requests")
        d_gen = delta(s.after, s.before, "generation_tokens")
        d_prompt = delta(s.after, s.before, "prompt_tokens")
        aborted = delta(s.after, s.before, "aborted")
        unrec = d_req - s.records - 1
        unrec_tok = d_gen - s.completion - 1
        on_server = sum(g or 0 for g in s.gauges_at_stop or ())
        rows.append({"session": s.label, "exit": s.exit_code, "records": s.records,
                     "completion": s.completion, "d_requests": d_req, "d_generation": d_gen,
                     "d_prompt": d_prompt, "prompt_in_records": s.prompt, "d_aborted": aborted,
                     "unrecorded": unrec, "unrecorded_tokens": unrec_tok,
                     "gauges_at_stop": s.gauges_at_stop, "disconnect_lines": s.disconnects,
                     "errors_400": s.errors_400, "seconds": round(s.seconds, 1),
                     "in_flight": s.in_flight, "idle_after_s": round(s.idle_after, 1)})
        figures = (f"exit {s.exit_code}; Δrequests {d_req:.0f} = {s.records} records + 1 preflight "
                   f"+ {unrec:.0f} others; Δgeneration_tokens {d_gen:.0f} = {s.completion} + 1 + "
                   f"{unrec_tok:.0f}; Δprompt_tokens {d_prompt:.0f} vs {s.prompt} + 1; "
                   f"Δaborted {aborted:.0f}; server log 'disconnected' lines {s.disconnects}; "
                   f"running+queued at the stop {on_server:.0f}; idle {s.idle_after:.0f} s after")
        if s.how in ("sigkill", "sigterm2"):
            # aborted on the server: by SGLang's own disconnect check (SIGKILL) or by the
            # workbench's /abort_request (second SIGTERM); an aborted request is counted in
            # num_requests_total (with its partial tokens) only when its abort finish reached
            # the tokenizer manager while the request's state was still there
            # one request may finish between the last look at the files and the signal
            ok = (s.in_flight - 1 <= aborted <= s.in_flight and 0 <= unrec <= aborted
                  and 0 <= unrec_tok < aborted * mnt
                  and s.exit_code == (-signal.SIGKILL if s.how == "sigkill" else 130))
            if s.how == "sigkill":
                ok = ok and s.disconnects == aborted
            checks.add(f"session-{s.label}", ok,
                       f"{figures}; {aborted:.0f} of {s.in_flight} in-flight requests aborted "
                       f"on the server, "
                       f"{unrec:.0f} of them counted with {unrec_tok:.0f} partial tokens (wasted; "
                       f"< {aborted * mnt:.0f} had they run to the end)")
        else:
            want_exit = ((1 if long_ids else 0),) if s.how == "end" else (130,)
            ok = (unrec == 0 and unrec_tok == 0 and aborted == 0 and d_prompt == s.prompt + 1
                  and s.exit_code in want_exit)
            if s.errors_400 and unrec == s.errors_400:
                figures += " (the HTTP 400 requests ARE counted by num_requests_total)"
            checks.add(f"session-{s.label}", ok,
                       f"{figures}; exact equality expected (in-flight requests finished and "
                       f"recorded{' after the SIGTERM' if s.how == 'sigterm' else ''}; "
                       f"exit {want_exit})")
    # --- whole run
    d_req = delta(last, first, "requests")
    d_gen = delta(last, first, "generation_tokens")
    d_prompt = delta(last, first, "prompt_tokens")
    d_cached = delta(last, first, "cached_tokens")
    rec_completion = sum(r.completion_tokens for f in files.values() for r in f.records)
    rec_prompt = sum(r.prompt_tokens for f in files.values() for r in f.records)
    rec_cached = sum(r.cached_tokens or 0 for f in files.values() for r in f.records)
    unrec = sum(r["unrecorded"] for r in rows)
    unrec_tok = sum(r["unrecorded_tokens"] for r in rows)
    aborted = delta(last, first, "aborted")
    n = len(sessions)
    checks.add("run-vs-metrics",
               d_req == n_records + n + unrec and d_gen == rec_completion + n + unrec_tok
               and unrec <= aborted,
               f"Δnum_requests {d_req:.0f} = {n_records} records + {n} preflights + {unrec:.0f} "
               f"aborted ones counted (of {aborted:.0f} aborted); Δgeneration_tokens {d_gen:.0f} = "
               f"{rec_completion} in records + {n} + {unrec_tok:.0f} wasted "
               f"({100 * unrec_tok / max(1, d_gen):.1f}% of the server's work); Δprompt_tokens "
               f"{d_prompt:.0f} vs {rec_prompt} in records (+{d_prompt - rec_prompt:.0f}: preflights "
               f"and the unrecorded requests' prompts); Δcached {d_cached:.0f} vs {rec_cached} in "
               f"records",
               d_requests=d_req, d_generation=d_gen, d_prompt=d_prompt, records=n_records,
               completion_in_records=rec_completion, prompt_in_records=rec_prompt,
               wasted_tokens=unrec_tok)
    lengths = Counter(r.finish_reason for f in files.values() for r in f.records)
    short = sum(1 for f in files.values() for r in f.records if r.completion_tokens != mnt)
    checks.note(sessions=rows, finish_reasons=dict(lengths), not_max_new_tokens=short,
                run_dir=str(run), manifest=str(manifest))
    say(f"finish reasons {dict(lengths)}; {short} records shorter than {mnt} tokens")


# --------------------------------------------------------------------------- monitor probe

SERVER_LINE = re.compile(r"server (?P<url>\S+): (?P<running>[\d,.k]+|-) running, "
                         r"(?P<queued>[\d,.k]+|-) queued, token usage (?P<usage>[\d.]+%|-), "
                         r"(?:server )?gen (?P<gen>[\d,.]+|-) tok/s, cache hit (?P<hit>[\d.]+%|-)")


def monitor_probe(ctx: Context, run: Path, url: str) -> dict[str, Any]:
    """`workbench monitor --once --server URL` with /metrics read just before and after."""
    before = read_metrics(url)
    result = run_workbench(ctx, ["monitor", str(run), "--server", url, "--once"],
                           "monitor-once.log", timeout=120)
    after = read_metrics(url)
    line = next((ln for ln in result.stdout.splitlines() if f"server {url}:" in ln), "")  # after
    # "run ended ...; " once the run is over
    say(f"monitor server line: {line!r}")
    return {"exit": result.returncode, "line": line, "stdout": result.stdout,
            "stderr": result.stderr, "before": before, "after": after}


def _num(text: str) -> float | None:
    if text in ("-", ""):
        return None
    text = text.replace(",", "")
    if text.endswith("%"):
        return float(text[:-1]) / 100
    if text.endswith("k"):
        return float(text[:-1]) * 1000
    return float(text)


def _between(value: float | None, a: float | None, b: float | None, slack: float = 0.0) -> bool:
    if value is None or a is None or b is None:
        return False
    return min(a, b) - slack <= value <= max(a, b) + slack


def check_monitor(checks: Checks, probe: dict[str, Any]) -> None:
    match = SERVER_LINE.search(probe["line"])
    if not match:
        checks.add("monitor-server-line", False,
                   f"no server line with figures (exit {probe['exit']}): "
                   f"{probe['stdout'][-400:]!r} {probe['stderr'][-300:]!r}")
        return
    b, a = probe["before"].snap, probe["after"].snap
    running, queued = _num(match["running"]), _num(match["queued"])
    usage, hit = _num(match["usage"]), _num(match["hit"])
    hit_b = (b.cached_tokens or 0) / b.prompt_tokens if b.prompt_tokens else None
    hit_a = (a.cached_tokens or 0) / a.prompt_tokens if a.prompt_tokens else None
    results = {
        "running": _between(running, b.running, a.running),
        "queued": _between(queued, b.queued, a.queued),
        "token usage": _between(usage, b.token_usage, a.token_usage, slack=0.006),
        "cache hit": _between(hit, hit_b, hit_a, slack=0.006),
        # one frame has no earlier reading for a rate: the server's own gauge is shown
        "gen": _between(_num(match["gen"]), b.gen_throughput, a.gen_throughput, slack=0.5),
    }
    alerts = [ln for ln in probe["stdout"].splitlines() if "ALERT" in ln]
    checks.add("monitor-server-line", all(results.values()),
               f"monitor: running {running} queued {queued} usage {usage} cache hit {hit} gen "
               f"{match['gen']} tok/s; /metrics before/after: running {b.running}/{a.running} queued "
               f"{b.queued}/{a.queued} usage {b.token_usage}/{a.token_usage} cache hit "
               f"{_fmt(hit_b)}/{_fmt(hit_a)} gen_throughput {b.gen_throughput}/"
               f"{a.gen_throughput}; mismatched: "
               f"{[k for k, v in results.items() if not v] or 'none'}; exit {probe['exit']}; "
               f"alerts {alerts[:3]}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


# --------------------------------------------------------------------------- step 2


def run_throughput(run: Path, names: Sequence[str]) -> tuple[float, int, float]:
    """Output tok/s of a run from its own records: Σ completion tokens over the span from the
    first request's start (ts - e2e_latency) to the last record's write."""
    files = read_run(run, names)
    rows = [r for f in files.values() for r in f.records]
    if not rows:
        return 0.0, 0, 0.0
    start = min(r.ts - (r.e2e_latency or 0) for r in rows)
    end = max(r.ts for r in rows)
    tokens = sum(r.completion_tokens for r in rows)
    return tokens / max(end - start, 1e-9), len(rows), end - start


def step_auto(ctx: Context, checks: Checks) -> None:
    folder = ctx.out / "auto"
    n = ctx.args.auto_prompts
    manifest = write_manifest(folder, ctx, chat=0, pretok=n, long_ids=(), concurrency="auto",
                              seed=2)
    fixed = [int(c) for c in ctx.args.fixed.split(",") if c.strip()]
    labels = ["auto", *(str(c) for c in fixed)]
    results: dict[str, dict[str, Any]] = {}
    with sglang_server(ctx, "auto", ctx.args.auto_pool or ctx.pool) as server:
        url = server.url
        for label in labels:
            run = folder / f"run-{label}"
            if run.exists():
                run.rename(folder / f"run-{label}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            flush_cache(url)
            before = wait_idle(url)
            started = time.monotonic()
            load_before = load_average()
            result = run_workbench(ctx, ["generate", "--datasets", str(manifest), "--server", url,
                                         "--out", str(run), "--concurrency", label,
                                         "--progress-interval", "5"], f"generate-auto-{label}.log")
            wall = time.monotonic() - started
            load = f"{load_before}->{load_average()}"  # other work on the machine skews a run
            after = wait_idle(url)
            rate, records, span = run_throughput(run, ["pretok"])
            stats = run_workbench(ctx, ["stats", str(run), "--json"], f"stats-auto-{label}.log")
            stats_rate = _stats_rate(stats.stdout)
            cap = _concurrency_record(run)
            retracted = delta(after, before, "retracted")
            results[label] = {"exit": result.returncode, "tok_s": round(rate, 1),
                              "records": records, "span_s": round(span, 1),
                              "wall_s": round(wall, 1), "stats_tok_s": stats_rate,
                              "retracted": retracted, "concurrency": cap, "load_average": load}
            say(f"concurrency {label}: {rate:.0f} tok/s ({records} records in {span:.0f} s; "
                f"stats says {stats_rate}); retractions +{retracted:.0f}; run.json concurrency "
                f"{cap}; load average {load}")
            checks.add(f"run-{label}", result.returncode == 0 and records == n,
                       f"exit {result.returncode}, {records}/{n} records, {rate:.0f} tok/s over "
                       f"{span:.0f} s (stats, recent window: {stats_rate}), retractions "
                       f"+{retracted:.0f}, load average {load}")
    best_label = max((str(c) for c in fixed), key=lambda k: results[k]["tok_s"])
    ratio = results["auto"]["tok_s"] / max(results[best_label]["tok_s"], 1e-9)
    table = ", ".join(f"{k}: {v['tok_s']:.0f}" for k, v in results.items())
    checks.add("auto-vs-best-fixed", ratio >= ctx.args.auto_goal,
               f"auto {results['auto']['tok_s']:.0f} tok/s / best fixed ({best_label}) "
               f"{results[best_label]['tok_s']:.0f} tok/s = {ratio:.2f} (goal >= "
               f"{ctx.args.auto_goal}); all: {table}", ratio=round(ratio, 3))
    checks.note(runs=results, ratio=round(ratio, 3), best_fixed=best_label)


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "-"


def _stats_rate(text: str) -> float | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    total = data.get("total") if isinstance(data, dict) else None
    value = total.get("tokens_per_s") if isinstance(total, dict) else None
    return round(value, 1) if isinstance(value, (int, float)) else None


def _concurrency_record(run: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((run / "run.json").read_text()).get("concurrency")
        if isinstance(record, dict):
            caps = [cap for _, cap in record.get("history") or []]
            return {"mode": record.get("mode"), "current": record.get("current"),
                    **({"first": caps[0], "min": min(caps), "max": max(caps)} if caps else {})}
    return None


# --------------------------------------------------------------------------- step 3


def step_watch(ctx: Context, checks: Checks) -> None:
    run = ctx.out / "generate" / "run"
    if not (run / "run.json").exists():
        checks.add("run-present", False, f"no step-1 run in {run} (run step generate first)")
        return
    names = sorted(p.name for p in run.iterdir() if (p / "raw_responses.jsonl").exists())
    files = read_run(run, names)
    check_stats(ctx, checks, run, files)
    check_validate(ctx, checks, run, files)
    probe = ctx.monitor_probe
    if probe is None:
        say("no monitor reading from step 1: a server and a short generate run for it")
        probe = monitor_with_load(ctx, run)
    check_monitor(checks, probe)


def check_stats(ctx: Context, checks: Checks, run: Path, files: dict[str, DatasetFiles]) -> None:
    result = run_workbench(ctx, ["stats", str(run), "--json"], "stats-step1.log")
    text = run_workbench(ctx, ["stats", str(run)], "stats-step1-table.log")
    say("stats table:\n" + text.stdout.rstrip())
    try:
        data = json.loads(result.stdout)
    except ValueError:
        checks.add("stats-json", False, f"exit {result.returncode}, not JSON: {result.stdout[:200]!r}")
        return
    datasets = data.get("datasets", {}) if isinstance(data, dict) else {}
    mismatches = []
    for name, f in files.items():
        d = datasets.get(name, {})
        ids = {r.sample_id for r in f.records}
        want = {"records": len(f.records) + f.unfinished,
                "completion_tokens": sum(r.completion_tokens for r in f.records),
                "prompt_tokens": sum(r.prompt_tokens for r in f.records),
                "cached_tokens": sum(r.cached_tokens or 0 for r in f.records),
                "errors": len(f.errors),
                "failed_missing": len({e["sample_id"] for e in f.errors} - ids),
                "finish_reasons": dict(sorted(Counter(r.finish_reason for r in f.records).items())),
                "finished": True}
        for key, value in want.items():
            if d.get(key) != value:
                mismatches.append(f"{name}.{key}: stats {d.get(key)} files {value}")
    total = data.get("total", {}) if isinstance(data, dict) else {}
    for key in ("records", "errors", "completion_tokens", "prompt_tokens"):
        summed = sum(d.get(key) or 0 for d in datasets.values())
        if total.get(key) != summed:
            mismatches.append(f"total.{key}: {total.get(key)} != sum of datasets {summed}")
    figures = {n: {k: d.get(k) for k in ("records", "errors", "failed_missing",
                                          "completion_tokens", "prompt_tokens", "cached_tokens")}
               for n, d in datasets.items()}
    checks.add("stats-equal-files", result.returncode == 0 and not mismatches and bool(datasets),
               f"exit {result.returncode}; {figures}; "
               + ("; ".join(mismatches) if mismatches else "records, errors, failed ids, "
                  "prompt/completion/cached tokens, finish reasons equal the files'"),
               mismatches=mismatches)
    checks.note(stats=data)


def check_validate(ctx: Context, checks: Checks, run: Path, files: dict[str, DatasetFiles]) -> None:
    result = run_workbench(ctx, ["validate", str(run), "--json"], "validate-step1.log")
    try:
        data = json.loads(result.stdout)
    except ValueError:
        checks.add("validate", False, f"exit {result.returncode}, not JSON: {result.stdout[:300]!r} "
                   f"{result.stderr[-300:]!r}")
        return
    counted = _validate_records(data)
    want = sum(len(f.records) + f.unfinished for f in files.values())
    checks.add("validate", result.returncode == 0 and (counted is None or counted == want),
               f"exit {result.returncode}; records checked {counted} (files hold {want}); "
               f"findings {_validate_findings(data)}")
    checks.note(validate=data)


def _validate_records(data: Any) -> int | None:
    datasets = data.get("datasets") if isinstance(data, dict) else None
    if isinstance(datasets, dict):
        return sum(d.get("records", 0) for d in datasets.values() if isinstance(d, dict))
    return None


def _validate_findings(data: Any) -> Any:
    datasets = data.get("datasets") if isinstance(data, dict) else None
    return {name: {f["rule"]: f"{f['count']} {f['severity']}" for f in d.get("findings", [])}
            for name, d in (datasets or {}).items()}


def monitor_with_load(ctx: Context, run: Path) -> dict[str, Any]:
    folder = ctx.out / "watch"
    manifest = write_manifest(folder, ctx, chat=0, pretok=120, long_ids=(), concurrency=24, seed=3)
    load_run = folder / "run"
    if load_run.exists():
        load_run.rename(folder / f"run.old-{time.strftime('%Y%m%d-%H%M%S')}")
    with sglang_server(ctx, "watch", ctx.pool) as server:
        proc = start_workbench(ctx, ["generate", "--datasets", str(manifest), "--server", server.url,
                                     "--out", str(load_run)], "generate-watch-load.log")
        try:
            while proc.poll() is None and finished_count(load_run, ["pretok"]) < 30:
                time.sleep(0.2)
            return monitor_probe(ctx, run, server.url)
        finally:
            stop_workbench(proc)


# --------------------------------------------------------------------------- step 4


def step_tune(ctx: Context, checks: Checks) -> None:
    params = Path(ctx.args.tune_params)
    out = ctx.out / "tune"
    overrides = [*(GPU_TUNE_SETS if ctx.args.mode == "gpu" else ()), *ctx.args.tune_set]
    if ctx.args.mode == "gpu" and ctx.args.model != "outputs/real-sglang/model":
        overrides.append(f"server.model_path={Path(ctx.args.model).resolve()}")
    if has_weights(ctx.model):
        overrides.append("server.args.load_format=null")  # real weights: no dummy ones
    sets = [item for s in overrides for item in ("--set", s)]
    args = ["tune", "--params", str(params), "--out", str(out), *sets]
    if out.exists() and ctx.args.tune_resume:
        args.append("--resume")
    elif out.exists():
        out.rename(ctx.out / f"tune.old-{time.strftime('%Y%m%d-%H%M%S')}")
    started = time.monotonic()
    code = stream_workbench(ctx, args, "tune.log")
    checks.add("tune-exit", code == 0, f"workbench tune exit {code} after "
               f"{time.monotonic() - started:.0f} s")
    check_results(ctx, checks, out)
    check_report(ctx, checks, out)


def check_results(ctx: Context, checks: Checks, out: Path) -> None:
    import csv

    path = out / "results.csv"
    if not path.exists():
        checks.add("results-csv", False, f"{path} missing")
        return
    rows = list(csv.DictReader(path.open()))
    by_config: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_config.setdefault(row["config"], []).append(row)
    table = []
    for config, points in by_config.items():
        for p in points:
            rate = p.get("output_throughput") or "-"
            table.append(f"{config}@{p['concurrency']}: {p['status']} "
                         + (f"{float(rate):.0f} tok/s" if rate != "-" else (p.get("reason") or "")[:90]))
    say("results.csv:\n  " + "\n  ".join(table))
    expected_fail = {name for name in TUNE_FAIL_REASONS if name in by_config}
    ok_configs = [c for c in by_config if c not in expected_fail]
    bad = [f"{c}@{p['concurrency']}: {p['status']} {p.get('reason')}" for c in ok_configs
           for p in by_config[c] if p["status"] != "ok" or not p.get("output_throughput")]
    checks.add("configs-measured", not bad and len(ok_configs) >= 1,
               f"{len(ok_configs)} configurations measured at every concurrency; "
               + (f"not ok: {bad}" if bad else "all ok"),
               throughput={f"{c}@{p['concurrency']}": _float(p.get("output_throughput"))
                           for c in ok_configs for p in by_config[c]})
    for name, markers in TUNE_FAIL_REASONS.items():
        points = by_config.get(name)
        if not points:
            checks.skip(f"failed-{name}", "configuration not in the sweep")
            continue
        reasons = {p.get("reason") or "" for p in points}
        statuses = {p["status"] for p in points}
        good = all(any(m in r for m in markers) and BAD_REASON not in r for r in reasons)
        checks.add(f"failed-{name}", "ok" not in statuses and good,
                   f"status {sorted(statuses)}; reason {min(reasons)[:220]!r} (want one of "
                   f"{list(markers)}, never {BAD_REASON!r})")
    logs = sorted(str(p.relative_to(out)) for p in out.rglob("*.log"))
    checks.note(results=rows, server_logs=logs)


def _float(text: str | None) -> float | None:
    try:
        return round(float(text), 1) if text else None
    except ValueError:
        return None


def check_report(ctx: Context, checks: Checks, sweep: Path) -> None:
    reports = ctx.out / "reports"
    result = run_workbench(ctx, ["report", "throughput_tuning", "-p", f"sweep_dir={sweep.resolve()}",
                                 "--out", str(reports)], "report-throughput_tuning.log",
                           timeout=900)
    latest = reports / "throughput_tuning-latest"
    html = latest / "throughput_tuning.html"
    notebook = latest / "throughput_tuning.ipynb"
    errors = []
    if notebook.exists():
        nb = json.loads(notebook.read_text())
        for cell in nb.get("cells", []):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    errors.append(f"{output.get('ename')}: {output.get('evalue')}"[:200])
    size = html.stat().st_size if html.exists() else 0
    checks.add("report", result.returncode == 0 and size > 0 and not errors,
               f"exit {result.returncode}; {html} {size:,} bytes; cell errors {errors or 'none'}"
               + (f"; stderr {result.stderr[-300:]!r}" if result.returncode else ""))


# --------------------------------------------------------------------------- step 5


def step_fit(ctx: Context, checks: Checks) -> None:
    probe = run_workbench(ctx, ["tune", "fit", "--help"], "tune-fit-help.log", timeout=60)
    if probe.returncode != 0 or "tune fit" not in probe.stdout.split("\n", 1)[0]:
        checks.skip("fit", "skipped: not available (`workbench tune fit --help` shows no fit verb)")
        return
    sweep = ctx.out / "tune"
    if not (sweep / "results.csv").exists():
        checks.add("fit", False, f"no sweep in {sweep} (run step tune first)")
        return
    profile = ctx.out / "fit" / "profile.yaml"
    profile.parent.mkdir(parents=True, exist_ok=True)
    args = ["tune", "fit", str(sweep), "--out", str(profile), "--configs", ctx.args.fit_configs]
    code = stream_workbench(ctx, [*args, "--predict"], "tune-fit.log")
    checks.add("fit", code == 0 and profile.exists(),
               f"exit {code}; profile {profile} {'written' if profile.exists() else 'MISSING'} "
               f"(fitted on {ctx.args.fit_configs})")
    fit_csv = profile.parent / "fit.csv"
    if not fit_csv.exists():
        checks.add("held-out-prediction", False, f"{fit_csv} missing")
        return
    import csv

    rows = list(csv.DictReader(fit_csv.open()))
    held = [r for r in rows if r.get("role") == "held out"]
    errors = [abs(float(r["error_pct"])) for r in held if r.get("error_pct")]
    table = "; ".join(f"{r['config']}@{r['concurrency']}: measured {_cell(r['measured_tok_s'])} "
                      f"predicted {_cell(r['predicted_tok_s'])} ({_cell(r['error_pct'])}%)"
                      + (f" {r['reason']}" if r.get("reason") else "") for r in rows)
    worst = max(errors) if errors else None
    checks.add("held-out-prediction",
               bool(errors) and len(errors) == len(held) and worst <= ctx.args.fit_goal,
               f"{len(held)} held-out points, |error| mean "
               f"{(sum(errors) / len(errors)) if errors else float('nan'):.1f}% max "
               f"{worst if worst is not None else float('nan'):.1f}% (goal <= "
               f"{ctx.args.fit_goal:.0f}%); {table}", fit=rows)


def _cell(text: str | None) -> str:
    try:
        return f"{float(text):.1f}" if text not in (None, "") else "-"
    except ValueError:
        return str(text)


# --------------------------------------------------------------------------- step 6

EXAMPLE_PRETOK = Path(__file__).resolve().parents[1] / "examples" / "data" / "pretokenized.jsonl"
SCHEDULER_TITLE = "sglang::scheduler"  # the process title SGLang gives its scheduler
START_HEADER = "workbench: start "     # one line in OUT/server.log per server start


@dataclass
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, T (stopped), Z ...
    args: str   # the command line (SGLang's children: their process title)


@dataclass
class Frozen:
    pid: int
    pgid: int        # the launched server's process group
    title: str
    at: float        # time.time() of the SIGSTOP
    records: int     # lines written by then
    state: str       # the process's state just after the SIGSTOP
    running: float | None  # requests running on the server then (its gauge)


def processes() -> dict[int, Proc]:
    """Every process readable in /proc."""
    table: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp ...
        args = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        table[int(entry.name)] = Proc(int(entry.name), int(fields[1]), int(fields[2]), fields[0],
                                      args)
    return table


def descendants(root: int, table: dict[int, Proc]) -> list[Proc]:
    children: dict[int, list[Proc]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p)
    found: list[Proc] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def write_unattended_manifest(folder: Path, ctx: Context, *, prompts: int, max_new_tokens: int,
                              concurrency: int) -> Path:
    """Dataset `pretok`: the first `prompts` rows of examples/data/pretokenized.jsonl whose
    prompt and `max_new_tokens` fit the context (the run should fail none)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [line for line in EXAMPLE_PRETOK.read_text().splitlines()
            if len(json.loads(line)["input_ids"]) + max_new_tokens <= CONTEXT_LEN][:prompts]
    (folder / "pretok.jsonl").write_text("\n".join(rows) + "\n")
    manifest = folder / "datasets.yaml"
    manifest.write_text(
        "# written by scripts/real_sglang_check.py\n"
        "model_profile: kimi-k2.5\n"
        f"tokenizer: {ctx.model.resolve()}\n"
        f"sampling: {{temperature: {ctx.args.temperature}, top_p: 1.0, top_k: -1, "
        f"max_new_tokens: {max_new_tokens}}}\n"
        f"concurrency: {concurrency}\n"
        "order: random\n"
        "datasets:\n  - name: pretok\n    path: pretok.jsonl\n    input: input_ids\n")
    return manifest


def write_launch_params(folder: Path, ctx: Context) -> Path:
    """The `server` section `generate --launch` starts: SGLang as params/tuning.real-sglang.yaml
    starts it (on the CPU in --mode cpu), with absolute paths."""
    args, env = server_settings(ctx, 16384)
    server = {"launcher": "sglang", "model_path": str(ctx.model.resolve()),
              # absolute, not resolved: a venv's python is a symlink out of the venv
              "python": os.path.abspath(ctx.sglang_python), "host": "127.0.0.1", "port": 0,
              "startup_timeout": 420, "stop_grace": 10,
              "health_paths": list(HEALTH_PATHS), "args": args, "env": env}
    path = folder / "server.yaml"
    path.write_text("# written by scripts/real_sglang_check.py: the server `workbench generate "
                    "--launch` starts\n" + yaml.safe_dump({"server": server}, sort_keys=False))
    return path


def step_unattended(ctx: Context, checks: Checks) -> None:
    folder = ctx.out / "unattended"
    run = fresh_run(folder)
    concurrency = 8
    manifest = write_unattended_manifest(folder, ctx, prompts=ctx.args.unattended_prompts,
                                         max_new_tokens=128, concurrency=concurrency)
    total = sum(1 for _ in (folder / "pretok.jsonl").open())
    params = write_launch_params(folder, ctx)
    stall = ctx.args.unattended_stall_timeout
    cmd = ["generate", "--datasets", str(manifest), "--launch", str(params), "--out", str(run),
           "--stall-timeout", f"{stall:g}", "--restart-backoff", "2", "--max-restarts", "2",
           "--progress-interval", "5"]
    started = time.monotonic()
    proc = start_workbench(ctx, cmd, "generate-unattended.log")
    frozen: Frozen | None = None
    seen: list[str] = []
    try:
        frozen, seen = freeze_scheduler(proc, run, at_records=max(4, total // 5),
                                        in_flight=min(concurrency, total - total // 5))
        code = proc.wait(timeout=1800)
    finally:
        stop_workbench(proc)
    seconds = time.monotonic() - started
    events = run_events(run)
    groups = {int(e["pid"]) for e in events if e.get("kind") == "server_started" and e.get("pid")}
    if frozen is not None:
        groups.add(frozen.pgid)
    try:
        check_unattended(ctx, checks, run, total, code, seconds, frozen, seen, events, groups)
    finally:
        for pgid in groups:  # what is left of the run's servers, stopped ones too
            for sig in (signal.SIGKILL, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, sig)


def freeze_scheduler(proc: subprocess.Popen[bytes], run: Path, at_records: int,
                     in_flight: int) -> tuple[Frozen | None, list[str]]:
    """SIGSTOP to SGLang's scheduler among the processes under `workbench generate` once
    `at_records` lines are written and `in_flight` requests run on the server; None (and
    the processes seen) when it is not found."""
    seen: list[str] = []
    while proc.poll() is None:
        lines = finished_count(run, ["pretok"])
        if lines >= at_records:
            below = descendants(proc.pid, processes())
            seen = [f"{p.pid} {p.args[:80]}" for p in below]
            target = next((p for p in below if SCHEDULER_TITLE in p.args), None)
            if target is not None:
                running = wait_decoding(below, target.pgid, want=in_flight)
                os.kill(target.pid, signal.SIGSTOP)
                at = time.time()
                time.sleep(0.2)
                state = processes().get(target.pid)
                lines = finished_count(run, ["pretok"])
                say(f"{lines} records, {running} requests running on the server: SIGSTOP to "
                    f"SGLang's scheduler (pid {target.pid}, {target.args!r}, process group "
                    f"{target.pgid}); state now {state.state if state else 'gone'}")
                return Frozen(target.pid, target.pgid, target.args, at, lines,
                              state.state if state else "gone", running), seen
        time.sleep(0.2)
    say(f"run ended before a scheduler was found; processes seen under it: {seen}")
    return None, seen


def wait_decoding(below: list[Proc], pgid: int, want: int, timeout: float = 30.0) -> float | None:
    """Wait (at most `timeout` s) until the launched server's /metrics shows `want` requests
    running, so that the scheduler stops mid-decode; the running gauge last read (None:
    unread)."""
    leader = next((p for p in below if p.pid == pgid), None)
    port = re.search(r"--port (\d+)", leader.args) if leader else None
    if port is None:
        return None
    url = f"http://127.0.0.1:{port.group(1)}"
    running: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            running = read_metrics(url).snap.running
            if (running or 0) >= want:
                break
        time.sleep(0.2)
    return running


def run_events(run: Path) -> list[dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError):
        events = json.loads((run / "run.json").read_text()).get("events")
        if isinstance(events, list):
            return [e for e in events if isinstance(e, dict)]
    return []


def group_leftovers(groups: set[int], wait: float = 10.0) -> dict[int, list[str]]:
    """Live processes left in each process group after at most `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        table = processes()
        left = {g: [f"{p.pid} {p.state} {p.args[:60]}" for p in table.values()
                    if p.pgid == g and p.state != "Z"] for g in groups}
        left = {g: v for g, v in left.items() if v}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def pid_left(pid: int, pgid: int, wait: float = 10.0) -> Proc | None:
    """The process `pid` of group `pgid` (a zombie too) if still there after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        still = processes().get(pid)
        if still is None or still.pgid != pgid or time.monotonic() > deadline:
            return still if still is not None and still.pgid == pgid else None
        time.sleep(0.5)


def check_unattended(ctx: Context, checks: Checks, run: Path, total: int, code: int,
                     seconds: float, frozen: Frozen | None, seen: list[str],
                     events: list[dict[str, Any]], groups: set[int]) -> None:
    checks.add("exit", code == 0, f"workbench generate --launch exit {code} after {seconds:.0f} s")
    if not checks.add("scheduler-stopped", frozen is not None and frozen.state == "T",
                      f"SIGSTOP to {frozen.title!r} pid {frozen.pid} at {frozen.records} records "
                      f"with {frozen.running} requests running, state {frozen.state} "
                      f"(T: stopped)" if frozen else
                      f"no process titled {SCHEDULER_TITLE!r} under the run; seen {seen}"):
        return
    assert frozen is not None
    # --- events
    kinds = [str(e.get("kind")) for e in events]

    def at(kind: str) -> list[int]:
        return [i for i, k in enumerate(kinds) if k == kind]

    stalled, restarting, restarted = at("stalled"), at("server_restarting"), at("server_restarted")
    ordered = (len(stalled) == 1 and len(restarting) == 1 and len(restarted) == 1
               and stalled[0] < restarting[0] < restarted[0]
               and events[restarting[0]].get("reason") == "stalled"
               and float(events[stalled[0]].get("ts", 0)) >= frozen.at)

    def after_stop(index: list[int]) -> float | None:
        return round(float(events[index[0]]["ts"]) - frozen.at, 1) if index else None

    to_stalled, to_restarting, to_restarted = (after_stop(stalled), after_stop(restarting),
                                               after_stop(restarted))
    message = events[stalled[0]].get("message") if stalled else None
    reason = events[restarting[0]].get("reason") if restarting else None
    checks.add("events", ordered and "server_gave_up" not in kinds,
               f"events {kinds}; from the SIGSTOP: stalled after {to_stalled} s "
               f"(--stall-timeout {ctx.args.unattended_stall_timeout:g}), restarting after "
               f"{to_restarting} s (reason {reason}), restarted after {to_restarted} s; "
               f"stalled: {message!r}",
               kinds=kinds, to_stalled=to_stalled, to_restarting=to_restarting,
               to_restarted=to_restarted)
    # --- every sample once
    files = read_run(run, ["pretok"])["pretok"]
    ids = [r.sample_id for r in files.records]
    expected = {json.loads(line)["sample_id"]
                for line in (run.parent / "pretok.jsonl").read_text().splitlines()}
    failed = {e["sample_id"] for e in files.errors} - set(ids)
    covered = set(ids) | failed
    dupes, missing, extra = len(ids) - len(set(ids)), expected - covered, covered - expected
    checks.add("every-sample-once",
               not dupes and not missing and not extra and len(ids) + len(failed) == total,
               f"{len(ids)} records + {len(failed)} failed ids = {len(ids) + len(failed)} of "
               f"{total} prompts; {dupes} duplicate records, {len(missing)} missing, "
               f"{len(extra)} unknown ids; unfinished lines {files.unfinished}; error lines "
               f"{len(files.errors)}", records=len(ids), failed=len(failed), duplicates=dupes)
    # --- nothing left running or stopped
    left = group_leftovers(groups)
    still = pid_left(frozen.pid, frozen.pgid)
    checks.add("no-process-left", still is None and not left,
               f"stopped scheduler pid {frozen.pid} "
               + ("gone" if still is None else f"still there ({still.state} {still.args[:60]!r})")
               + f"; the run's server process groups {sorted(groups)}: "
               + (f"left {left}" if left else "none left"))
    # --- the server log
    log = run / SERVER_LOG
    text = log.read_text(errors="replace") if log.exists() else ""
    starts = text.count(START_HEADER)
    checks.add("server-log", starts == 2,
               f"{log}: {starts} start headers ({START_HEADER.strip()!r}; want 2: the first start "
               f"and the restart)")
    say(f"figures: SIGSTOP at {frozen.records} records, {frozen.running} running; stalled +{to_stalled} s, restarting "
        f"+{to_restarting} s, restarted +{to_restarted} s; {len(ids)} records of {total}; "
        f"{len(restarting)} restart(s); run {seconds:.0f} s")
    checks.note(run_dir=str(run), records=len(ids), prompts=total, restarts=len(restarting),
                to_stalled_s=to_stalled, to_restarting_s=to_restarting,
                to_restarted_s=to_restarted, run_seconds=round(seconds, 1), events=kinds)


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    p.add_argument("--model", default="outputs/real-sglang/model")
    p.add_argument("--out", default="outputs/real-sglang-check")
    p.add_argument("--mode", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: SGLang's CPU engine (--device cpu, torch_native attention, "
                        "SGLANG_USE_CPU_ENGINE=1, --mem-fraction-static 0.05); gpu: without them")
    p.add_argument("--workbench", default=None,
                   help="the workbench command (default: the `workbench` beside this python)")
    p.add_argument("--only", choices=STEPS, action="append", help="run only this step (repeatable)")
    for name in STEPS:
        p.add_argument(f"--skip-{name}", action="store_true")
    p.add_argument("--pool", type=int, default=3000, help="KV pool of steps 1-3 (retracts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="of steps 1-3 (0: greedy; CPU sampling over the 163,840-token vocabulary "
                        "halves the decode rate)")
    p.add_argument("--chat-prompts", type=int, default=80)
    p.add_argument("--pretok-prompts", type=int, default=30)
    p.add_argument("--long-prompts", type=int, default=4, help="over-long chat prompts (at most a tenth of them)")
    p.add_argument("--gen-concurrency", type=int, default=24)
    p.add_argument("--auto-prompts", type=int, default=100)
    p.add_argument("--fixed", default="8,16,32,64")
    p.add_argument("--auto-goal", type=float, default=0.9)
    p.add_argument("--auto-pool", type=int, default=None, help="KV pool of step 2 (default --pool)")
    p.add_argument("--tune-params", default="params/tuning.real-sglang.yaml")
    p.add_argument("--tune-set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to workbench tune as --set (repeatable)")
    p.add_argument("--tune-resume", action="store_true", help="resume the sweep in OUT/tune")
    p.add_argument("--fit-configs", default="default,pool8k,mrr16",
                   help="configurations `tune fit` fits on; the other ok ones are held out")
    p.add_argument("--unattended-prompts", type=int, default=60,
                   help="prompts of step 6 (128 new tokens each, 8 in flight)")
    p.add_argument("--unattended-stall-timeout", type=float, default=30.0,
                   help="--stall-timeout of step 6's run, seconds (well above the time a "
                        "prefill plus 50 tokens take here)")
    p.add_argument("--turn-rows", type=int, default=16,
                   help="function-calling conversations of step 7 (and half as many chats)")
    p.add_argument("--turn-kill-at", type=int, default=12,
                   help="turns step 7's run writes before it is killed")
    p.add_argument("--fit-goal", type=float, default=15.0,
                   help="largest |error| %% of a held-out point's predicted output tok/s")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for path, what in ((args.sglang_python, "--sglang-python"), (args.model, "--model")):
        if not Path(path).exists():
            print(f"real_sglang_check: error: {what} {path} does not exist", file=sys.stderr)
            return 2
    out = Path(args.out)
    workbench = ([args.workbench] if args.workbench
                 else [str(Path(sys.executable).parent / "workbench")])
    ctx = Context(sglang_python=args.sglang_python, model=Path(args.model), out=out,
                  workbench=workbench, pool=args.pool, max_new_tokens=args.max_new_tokens,
                  args=args)
    ctx.logs.mkdir(parents=True, exist_ok=True)
    steps = [s for s in (args.only or STEPS) if not getattr(args, f"skip_{s}")]
    checks = Checks()
    started = time.monotonic()
    say(f"steps {steps}; out {out}; sglang {args.sglang_python}; model {args.model}")
    functions = {"generate": step_generate, "auto": step_auto, "watch": step_watch,
                 "tune": step_tune, "fit": step_fit, "unattended": step_unattended,
                 "turns": lambda ctx, checks: step_turns(ctx, checks, sys.modules[__name__])}
    for name in steps:
        with step(name, checks):
            functions[name](ctx, checks)
    total = time.monotonic() - started
    write_summary(out, checks, steps, total)
    return 1 if checks.failed else 0


def write_summary(out: Path, checks: Checks, steps: Sequence[str], total: float) -> None:
    passed = sum(1 for c in checks.items if c.ok)
    skipped = sum(1 for c in checks.items if c.ok is None)
    failed = checks.failed
    print("\n=== summary ===", flush=True)
    for c in checks.items:
        mark = "ok  " if c.ok else ("skip" if c.ok is None else "FAIL")
        print(f"{mark} {c.step}/{c.name}", flush=True)
    print(f"{passed} ok, {len(failed)} FAIL, {skipped} skipped in {total / 60:.1f} min "
          f"(steps: {', '.join(f'{k} {v:.0f}s' for k, v in checks.seconds.items())}); "
          f"details in {out / 'summary.json'}", flush=True)
    summary = {
        "ok": not failed, "steps": list(steps), "seconds": round(total, 1),
        "step_seconds": checks.seconds,
        "checks": [{"step": c.step, "name": c.name,
                    "status": "ok" if c.ok else ("skipped" if c.ok is None else "FAIL"),
                    "detail": c.detail, **({"figures": c.figures} if c.figures else {})}
                   for c in checks.items],
        "figures": checks.figures,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
