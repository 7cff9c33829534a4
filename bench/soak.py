"""Crash and fault soak of `workbench generate`: every sample exactly once, whatever happens.

    python bench/soak.py [--cycles 20] [--samples 3000] [--seed 0] [--work DIR]

Against one simulator answering a share of /generate with HTTP 500/503, dropped connections,
hangs longer than the client's --request-timeout and abort replies, the soak starts
`workbench generate` and SIGKILLs it at a random moment, again and again, resuming each time;
the simulator is restarted on the same port in the middle of some cycles, and after some
kills a torn last line (a record cut mid-line, as a crash mid-write leaves it) is appended to
a raw file. A final run then goes to completion. Two datasets: token ids with int sample ids,
text with str sample ids.

Figures printed: cycles survived (the directory held no duplicate and no unreadable line
after the kill), samples expected, samples written, duplicates, lost, torn lines repaired,
retries (failed attempts, each an errors.jsonl line, by kind), server restarts, the verdict of
`workbench validate --strict` and the wall time. The target: zero lost, zero duplicated,
every record valid. Exit status 0 when it is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from workbench.rundir.layout import ERRORS_FILE, RAW_FILE, TORN_SUFFIX
from workbench.rundir.records import SampleId, read_rows, read_sample_ids
from workbench.server.launch import ServerProcess, find_free_port, server_command

INTEGRITY_RULES = (
    "parse_error", "torn_line", "bad_type", "missing_field", "duplicate_sample_id",
    "missing_response", "orphan_response", "aborted", "id_out_of_vocab",
)  # fmt: skip


@dataclass(frozen=True)
class SoakConfig:
    """What the soak does; the defaults are the full soak (a few minutes)."""

    cycles: int = 20
    samples: int = 3000  # token-id prompts; text prompts are a sixth of that
    seed: int = 0
    speed: float = 0.25  # the fast profile slowed down: a reply takes about a second
    concurrency: int = 64
    kill_after: tuple[float, float] = (0.3, 3.0)  # seconds after the start of a cycle
    request_timeout: float = 8.0  # above the longest reply (512 tokens), below a hang
    max_new_tokens: int = 512
    error_rate: float = 0.04
    drop_rate: float = 0.03
    hang_rate: float = 0.02
    abort_rate: float = 0.03
    restarts: int = 2  # server restarts, spread over the cycles
    torn_rate: float = 0.25  # share of kills followed by an appended torn line
    final_timeout: float = 900.0
    work: Path | None = None


@dataclass
class SoakResult:
    cycles: int = 0
    kills: int = 0
    survived: int = 0
    expected: int = 0
    written: int = 0
    duplicates: int = 0
    lost: int = 0
    unexpected: int = 0
    torn_injected: int = 0
    torn_repaired: int = 0
    restarts: int = 0
    failed_attempts: Counter[str] = field(default_factory=Counter)
    final_returncode: int | None = None
    validate_returncode: int | None = None
    integrity_findings: Counter[str] = field(default_factory=Counter)
    other_findings: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicates == 0 and self.unexpected == 0
                and self.final_returncode == 0 and self.validate_returncode == 0
                and not self.integrity_findings and self.survived == self.cycles)


# --- the job ---------------------------------------------------------------------------------


def _write_job(work: Path, config: SoakConfig) -> tuple[Path, dict[str, set[SampleId]]]:
    """Two prompt files and their manifest; returns it with the expected ids per dataset."""
    rng = random.Random(config.seed)
    ids = [{"sample_id": i, "input_ids": [rng.randrange(1000, 150_000) for _ in range(rng.randint(8, 200))]}
           for i in range(config.samples)]
    words = ("alpha", "beta", "gamma", "delta", "kv", "cache", "router", "token", "batch", "draft")
    texts = [{"sample_id": f"t{i:05d}", "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 80)))}
             for i in range(max(1, config.samples // 6))]
    for name, rows in (("ids", ids), ("texts", texts)):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = {
        "model_profile": "kimi-k2.5",
        "sampling": {"temperature": 0.0, "max_new_tokens": config.max_new_tokens},
        "datasets": [{"name": "ids", "path": "ids.jsonl", "input": "input_ids"},
                     {"name": "texts", "path": "texts.jsonl", "input": "text"}],
    }
    path = work / "datasets.yaml"
    path.write_text(json.dumps(manifest, indent=1))
    expected = {"ids": {r["sample_id"] for r in ids}, "texts": {r["sample_id"] for r in texts}}
    return path, expected


class _Simulator:
    """The faulty simulator on a fixed port, restartable in place."""

    def __init__(self, work: Path, config: SoakConfig) -> None:
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = server_command("sim", port=self.port, python=sys.executable, args={
            "profile": "fast", "speed": config.speed, "random_seed": config.seed,
            "fault_error_rate": config.error_rate, "fault_drop_rate": config.drop_rate,
            "fault_hang_rate": config.hang_rate, "fault_abort_rate": config.abort_rate,
            "fault_seed": config.seed,
        })
        self.log = work / "logs" / "sim.log"
        self.process: ServerProcess | None = None

    def start(self) -> None:
        self.process = ServerProcess(self.argv, url=self.url, log_path=self.log)
        self.process.start()
        self.process.wait_ready(60)

    def restart(self) -> None:
        """Stop the server, wait for its port, start a new one on the same port."""
        self.stop()
        assert self.process is not None
        self.process.wait_port_free(self.port)
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@contextmanager
def _workdir(config: SoakConfig) -> Iterator[Path]:
    if config.work is not None:
        config.work.mkdir(parents=True, exist_ok=True)
        yield config.work
        return
    with tempfile.TemporaryDirectory(prefix="workbench-soak-") as tmp:
        yield Path(tmp)


# --- cycles ----------------------------------------------------------------------------------


def _generate_argv(manifest: Path, server: str, out: Path, config: SoakConfig) -> list[str]:
    return [sys.executable, "-m", "workbench", "generate", "--datasets", str(manifest), "--server", server,
            "--out", str(out), "--concurrency", str(config.concurrency), "--max-attempts", "10",
            "--request-timeout", str(config.request_timeout), "--progress-interval", "30"]


def _cycle(index: int, argv: list[str], work: Path, sim: _Simulator, restart: bool,
           rng: random.Random, kill_after: tuple[float, float]) -> bool:
    """One generate run, SIGKILLed at a random moment (after a server restart when asked).

    Returns whether it was still running when killed."""
    with (work / "logs" / f"cycle-{index:02d}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            if restart:
                time.sleep(rng.uniform(0.8, 1.5))
                sim.restart()
            time.sleep(rng.uniform(*kill_after))
            running = proc.poll() is None
            if running:
                proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
    return running


def _inject_torn_line(out: Path, rng: random.Random) -> bool:
    """Append the first part of an existing record, without its newline, to a raw file."""
    raws = [p for p in sorted(out.glob(f"*/{RAW_FILE}")) if p.read_bytes().endswith(b"\n")]
    if not raws:
        return False
    raw = rng.choice(raws)
    lines = raw.read_bytes().splitlines()
    if not lines:
        return False
    line = rng.choice(lines)
    with raw.open("ab") as fh:
        fh.write(line[: rng.randint(1, max(1, len(line) - 1))])
    return True


def _consistent(out: Path) -> bool:
    """No repeated sample id and no unreadable line (a torn tail is allowed: it is repaired)."""
    for raw in out.glob(f"*/{RAW_FILE}"):
        _ids, repeats = read_sample_ids(raw)
        _rows, problems = read_rows(raw)
        if repeats or any(p.kind != "torn" for p in problems):
            return False
    return True


def _restart_cycles(config: SoakConfig) -> set[int]:
    if config.restarts <= 0 or config.cycles <= 1:
        return set()
    step = config.cycles / (config.restarts + 1)
    return {max(1, round(step * (k + 1))) for k in range(config.restarts)}


# --- figures ---------------------------------------------------------------------------------


def _count_records(out: Path, expected: dict[str, set[SampleId]], result: SoakResult) -> None:
    for name, wanted in expected.items():
        ids, repeats = read_sample_ids(out / name / RAW_FILE)
        result.expected += len(wanted)
        result.written += len(ids & wanted)
        result.lost += len(wanted - ids)
        result.unexpected += len(ids - wanted)
        result.duplicates += len(repeats)
        torn = out / name / f"{RAW_FILE}{TORN_SUFFIX}"
        result.torn_repaired += torn.read_bytes().count(b"\n") if torn.exists() else 0
        errors = out / name / ERRORS_FILE
        if errors.exists():
            result.failed_attempts.update(json.loads(line)["error_type"]
                                          for line in errors.read_text().splitlines() if line.strip())


def _validate(out: Path, result: SoakResult) -> None:
    done = subprocess.run([sys.executable, "-m", "workbench", "validate", str(out), "--json", "--strict"],
                          capture_output=True, text=True, timeout=600, check=False)
    result.validate_returncode = done.returncode
    if done.returncode not in (0, 1):
        result.integrity_findings["validate failed: " + done.stderr.strip()[:200]] += 1
        return
    for report in json.loads(done.stdout)["datasets"].values():
        for finding in report["findings"]:
            bucket = result.integrity_findings if finding["rule"] in INTEGRITY_RULES else result.other_findings
            bucket[f"{finding['rule']} ({finding['severity']})"] += finding["count"]


def run_soak(config: SoakConfig = SoakConfig(), say: Callable[[str], None] = print) -> SoakResult:
    """Run the soak and return its figures."""
    started = time.perf_counter()
    result = SoakResult()
    rng = random.Random(config.seed)
    with _workdir(config) as work:
        (work / "logs").mkdir(exist_ok=True)
        manifest, expected = _write_job(work, config)
        out = work / "out"
        sim = _Simulator(work, config)
        sim.start()
        try:
            argv = _generate_argv(manifest, sim.url, out, config)
            restarts = _restart_cycles(config)
            for index in range(config.cycles):
                killed = _cycle(index, argv, work, sim, index in restarts, rng, config.kill_after)
                result.cycles += 1
                result.kills += killed
                result.restarts += index in restarts
                if killed and rng.random() < config.torn_rate and _inject_torn_line(out, rng):
                    result.torn_injected += 1
                result.survived += _consistent(out)
                done = sum(raw.read_bytes().count(b"\n") for raw in out.glob(f"*/{RAW_FILE}"))
                say(f"cycle {index + 1}/{config.cycles}: {'killed' if killed else 'ended'}"
                    f"{', server restarted' if index in restarts else ''}; {done} records so far")
            final = subprocess.run(argv, capture_output=True, text=True, timeout=config.final_timeout,
                                   check=False)
            result.final_returncode = final.returncode
            (work / "logs" / "final.log").write_text(final.stdout + final.stderr)
            say(f"final run: exit {final.returncode}; {_last_line(final.stdout, final.stderr)}")
        finally:
            sim.stop()
        _count_records(out, expected, result)
        _validate(out, result)
    result.wall_seconds = time.perf_counter() - started
    return result


def _last_line(*texts: str) -> str:
    lines = [line for text in texts for line in text.strip().splitlines()]
    return next((line for line in lines if line.startswith(("run ", "workbench: error"))), lines[-1] if lines else "")


def format_figures(result: SoakResult) -> str:
    kinds = ", ".join(f"{kind} {count}" for kind, count in result.failed_attempts.most_common()) or "none"
    integrity = ", ".join(f"{k} {v}" for k, v in sorted(result.integrity_findings.items())) or "none"
    other = ", ".join(f"{k} {v}" for k, v in sorted(result.other_findings.items())) or "none"
    lines = [
        (f"cycles survived      {result.survived}/{result.cycles} ({result.kills} SIGKILLs, "
         f"{result.restarts} server restarts)"),
        f"samples expected     {result.expected}",
        f"samples written      {result.written}",
        f"duplicates           {result.duplicates}",
        f"lost                 {result.lost}" + (f" (+{result.unexpected} unexpected ids)" if result.unexpected else ""),
        f"torn lines repaired  {result.torn_repaired} ({result.torn_injected} injected)",
        f"retries              {sum(result.failed_attempts.values())} failed attempts retried ({kinds})",
        f"final run            exit {result.final_returncode}",
        f"validate --strict    exit {result.validate_returncode}; integrity findings: {integrity}",
        f"other findings       {other}",
        f"wall time            {result.wall_seconds:.1f}s",
        f"verdict              {'PASS' if result.ok else 'FAIL'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=SoakConfig.cycles, help="SIGKILL cycles (20)")
    parser.add_argument("--samples", type=int, default=SoakConfig.samples, help="token-id prompts (3000)")
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--speed", type=float, default=SoakConfig.speed, help="simulator speed (0.25)")
    parser.add_argument("--work", type=Path, help="keep the run here (default: a temporary directory)")
    args = parser.parse_args(argv)
    config = SoakConfig(cycles=args.cycles, samples=args.samples, seed=args.seed, speed=args.speed,
                        work=args.work)
    result = run_soak(config)
    print(format_figures(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
