"""SGLang's own clients against the simulator: each run's counts must equal /metrics deltas.

Run by `make conformance` with the Python of a separate venv that holds SGLang (installed
with --no-deps, plus what its client modules import); the simulator runs from the workbench's
own environment (`--workbench`, a command). For every client the script scrapes /metrics
before and after, and compares the requests and generated tokens the client saw with the
deltas of `sglang:num_requests_total` and `sglang:generation_tokens_total`. Exit 1 on any
mismatch or client failure.

    python scripts/conformance.py --workbench ".venv/bin/workbench" [--speed 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

READY = re.compile(r"ready on (http://\S+)")


@dataclass
class Outcome:
    name: str
    requests: int
    tokens: int
    metric_requests: int = -1
    metric_tokens: int = -1
    note: str = ""

    @property
    def ok(self) -> bool:
        counted = (self.requests, self.tokens) == (self.metric_requests, self.metric_tokens)
        return counted and self.requests > 0


@contextlib.contextmanager
def simulator(workbench: str, speed: float) -> Iterator[str]:
    """`workbench sim` on a free port with metrics on; yields its URL."""
    command = [*shlex.split(workbench), "sim", "--port", "0", "--enable-metrics",
               "--speed", str(speed), "--reasoning-parser", "kimi_k2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = READY.search(line)
        if not match:
            raise SystemExit(f"conformance: the simulator did not start: {line.strip()!r}")
        yield match.group(1)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def totals(url: str) -> tuple[int, int]:
    """(requests, generated tokens) summed over every label set."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    found = {"sglang:num_requests_total": 0.0, "sglang:generation_tokens_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] += sample.value
    return int(found["sglang:num_requests_total"]), int(found["sglang:generation_tokens_total"])


def measured(url: str, name: str, run: Callable[[], tuple[int, int, str]]) -> Outcome:
    before = totals(url)
    try:
        requests_seen, tokens_seen, note = run()
    except Exception as exc:  # noqa: BLE001 - a failing client is a finding, reported
        return Outcome(name, -1, -1, note=f"FAILED: {type(exc).__name__}: {exc}"[:300])
    after = totals(url)
    return Outcome(name, requests_seen, tokens_seen, after[0] - before[0],
                   after[1] - before[1], note)


def bench_serving(url: str, tokenizer: str, *extra: str) -> Callable[[], tuple[int, int, str]]:
    """`python -m sglang.bench_serving` (no warmup request, so every request is counted)."""

    def run() -> tuple[int, int, str]:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "result.jsonl"
            command = [sys.executable, "-m", "sglang.bench_serving", "--base-url", url,
                       "--tokenizer", tokenizer, "--model", "sim/kimi-k2.5",
                       "--num-prompts", "24", "--random-input-len", "256",
                       "--random-output-len", "64", "--warmup-requests", "0",
                       "--output-file", str(out), *extra]
            subprocess.run(command, check=True, capture_output=True, timeout=900)
            result = json.loads(out.read_text().splitlines()[-1])
        note = f"{result['output_throughput']:.0f} output tok/s"
        return int(result["completed"]), int(result["total_output_tokens"]), note

    return run


def one_batch_server(url: str, tokenizer_path: str) -> Callable[[], tuple[int, int, str]]:
    """bench_one_batch_server's `run_one_case` with ignore_eos (exact output lengths)."""

    def run() -> tuple[int, int, str]:
        from sglang.bench_one_batch_server import run_one_case
        from sglang.benchmark.utils import get_tokenizer

        batch, output_len = 8, 48
        with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
            run_one_case(url, batch, 128, output_len, 0.0, True, False, 1, 0.0, "conformance",
                         str(Path(folder) / "result.jsonl"), get_tokenizer(tokenizer_path),
                         dataset_name="random-ids")
        return batch, batch * output_len, "ignore_eos, stream_interval 1"

    return run


def runtime_endpoint(url: str) -> Callable[[], tuple[int, int, str]]:
    """sglang.lang's RuntimeEndpoint: gen, select (logprobs) and run_batch."""

    def run() -> tuple[int, int, str]:
        import sglang as sgl

        sgl.set_default_backend(sgl.RuntimeEndpoint(url))

        @sgl.function
        def answer(s, question):  # type: ignore[no-untyped-def]
            s += question
            s += sgl.gen("answer", max_tokens=24)

        @sgl.function
        def pick(s):  # type: ignore[no-untyped-def]
            s += "the best colour is"
            s += sgl.select("colour", choices=[" red", " green", " blue"])

        one = answer.run(question="why is the sky blue?")
        batch = answer.run_batch([{"question": f"question {index}"} for index in range(4)])
        chosen = pick.run()["colour"]
        tokens = sum(state.get_meta_info("answer")["completion_tokens"] for state in [one, *batch])
        # select: one request for the shared prefix, one batch of three choices (0 new tokens)
        return 5 + 1 + 3, tokens, f"select chose {chosen!r}"

    return run


def send_one(url: str, *extra: str) -> Callable[[], tuple[int, int, str]]:
    """`python -m sglang.test.send_one` (prints latency, tokens, speed)."""

    def run() -> tuple[int, int, str]:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        command = [sys.executable, "-m", "sglang.test.send_one", "--host", host, "--port", port,
                   "--max-new-tokens", "40", *extra]
        printed = subprocess.run(command, check=True, capture_output=True, text=True,
                                 timeout=300).stdout
        row = [line for line in printed.splitlines() if re.match(r"^\|\s*[\d.]+\s*\|", line)][-1]
        tokens = int(row.strip("|").split("|")[1])
        return 1, tokens, "stream" if extra else "non-streaming"

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workbench", default="workbench", help="command that runs workbench")
    parser.add_argument("--speed", type=float, default=20.0, help="simulator speed")
    args = parser.parse_args()
    with simulator(args.workbench, args.speed) as url:
        tokenizer = requests.get(f"{url}/model_info", timeout=30).json()["tokenizer_path"]
        checks: list[tuple[str, Callable[[], tuple[int, int, str]]]] = [
            ("bench_serving sglang random-ids stream",
             bench_serving(url, tokenizer, "--backend", "sglang", "--dataset-name", "random-ids")),
            ("bench_serving sglang random-ids no stream",
             bench_serving(url, tokenizer, "--backend", "sglang", "--dataset-name", "random-ids",
                           "--disable-stream")),
            ("bench_serving sglang random-ids --tokenize-prompt",
             bench_serving(url, tokenizer, "--backend", "sglang", "--dataset-name", "random-ids",
                           "--tokenize-prompt")),
            ("bench_serving sglang --request-rate 40",
             bench_serving(url, tokenizer, "--backend", "sglang", "--dataset-name", "random-ids",
                           "--request-rate", "40")),
            ("bench_serving sglang-oai /v1/completions",
             bench_serving(url, tokenizer, "--backend", "sglang-oai", "--dataset-name",
                           "random-ids")),
            ("bench_one_batch_server run_one_case", one_batch_server(url, tokenizer)),
            ("RuntimeEndpoint gen/select/run_batch", runtime_endpoint(url)),
            ("send_one", send_one(url)),
            ("send_one --stream", send_one(url, "--stream")),
        ]
        outcomes = []
        for name, run in checks:
            started = time.perf_counter()
            outcome = measured(url, name, run)
            outcomes.append(outcome)
            status = "ok" if outcome.ok else "MISMATCH"
            print(f"{status:8} {name:46} client {outcome.requests:4} req {outcome.tokens:6} tok | "
                  f"/metrics {outcome.metric_requests:4} req {outcome.metric_tokens:6} tok | "
                  f"{time.perf_counter() - started:5.1f}s {outcome.note}", flush=True)
    failed = [one for one in outcomes if not one.ok]
    print(f"{len(outcomes) - len(failed)}/{len(outcomes)} clients agree with /metrics")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
