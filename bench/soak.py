"""Crash, fault and full-disk soak of `workbench generate`: every sample exactly once, always.

    python bench/soak.py [--cycles 20] [--samples 3000] [--disk-cycles 10] [--seed 0] [--work DIR]

Kill cycles. Against one simulator answering a share of /generate with HTTP 500/503, dropped
connections, hangs longer than the client's --request-timeout and abort replies, the soak
starts `workbench generate` and SIGKILLs it at a random moment, again and again, resuming each
time; the simulator is restarted on the same port in the middle of some cycles, and after some
kills a torn last line (a record cut mid-line, as a crash mid-write leaves it) is appended to
a raw file. A final run then goes to completion. Two datasets: token ids with int sample ids,
text with str sample ids.

Disk cycles (``--disk-cycles``, 0 skips them): a second phase after the kill cycles' final run,
with a run directory of its own (``--disk-samples`` prompts) on a small tmpfs the script mounts
(``--disk-mib``) and always unmounts; where mounting is refused (not root) the phase is skipped,
the reason printed, and the verdict does not count it. A phase of its own rather than a kind of
kill cycle: a cycle's checks are only sharp when no SIGKILL, torn line or server restart stirs
the same directory. The same faulty simulator answers. A filler file (os.write until ENOSPC,
then cut back to leave 0 to a few dozen KiB, so the failure falls mid-record) takes the space.
Each cycle is one of, in a seeded mix:

    start   the disk full before the run starts: one line, exit 74, no temp file left;
    pause   filled at a random moment of the run; once it says "sending paused", the filler
            is deleted: it must say "writing again" and go on; then the disk is filled again,
            and it pauses again and stops by itself;
    stop    filled at a random moment and left full: it stops by itself after --disk-wait
            (exit 74, its stop line naming the file and the free space).

The filler fills once the run has started, not before it: a resume rewrites prompts.jsonl whole
(through a temp file as big as it), so a disk with a few KiB free refuses the start itself.
After each cycle, the disk still full: no duplicate sample id, no unreadable line, no partial
line, no temp file, no sample gone that was on disk before; `workbench stats --json`,
`workbench validate --json` and the printed summary's done count agree with the records
read_rows reads. Then the filler is deleted, and the next cycle resumes; a final run completes.

Figures printed: cycles survived (the directory held no duplicate and no unreadable line
after the kill), samples expected, samples written, duplicates, lost, torn lines repaired,
retries (failed attempts, each an errors.jsonl line, by kind), server restarts, the verdict of
`workbench validate --strict` and the wall time; for the disk cycles, the cycles of each kind,
the stops with exit 74, the pauses and those resumed, lost, duplicated, unreadable, failed
checks and the same validate verdict. The target: zero lost, zero duplicated, every record
valid, in both phases. Exit status 0 when it is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from workbench.rundir.layout import ERRORS_FILE, RAW_FILE, TORN_SUFFIX
from workbench.rundir.line_index import read_sample_ids
from workbench.rundir.reader import read_rows
from workbench.rundir.records import SampleId
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
    disk_cycles: int = 10  # disk-full cycles after the kill cycles (0: none)
    disk_samples: int = 1800  # token-id prompts of the disk run (text prompts: a sixth)
    disk_mib: int = 8  # the tmpfs: the whole disk run (3 MB, 4.5 MB while a resume rewrites
    # prompts.jsonl) fits; with the filler it does not
    disk_wait: float = 4.0  # generate --disk-wait: a stop 7 s after a write failed (1+2+4 s)
    fill_after: tuple[float, float] = (0.2, 2.5)  # seconds after the run starts sending
    leave_kib: tuple[int, int] = (0, 24)  # space the filler leaves free


@dataclass
class DiskResult:
    """The disk cycles' figures; `skipped` says why there were none."""

    skipped: str | None = None
    kinds: Counter[str] = field(default_factory=Counter)  # cycles by kind: start, pause, stop
    stops: int = 0  # runs that ended with exit 74
    pauses: int = 0  # "sending paused" lines
    resumed: int = 0  # "writing again" lines
    freed_resumed: int = 0  # pause cycles that wrote again once the soak freed space
    unwritten: int = 0  # lines the stops could not write (sent again on resume)
    expected: int = 0
    written: int = 0
    duplicates: int = 0  # the most repeated ids any check saw
    lost: int = 0  # missing at the end, or gone from the file between two cycles
    unexpected: int = 0
    unreadable: int = 0  # the most unreadable or partial lines any check saw
    failures: list[str] = field(default_factory=list)  # failed checks, one line each
    final_returncode: int | None = None
    validate_returncode: int | None = None
    integrity_findings: Counter[str] = field(default_factory=Counter)
    other_findings: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return True
        return (self.lost == 0 and self.duplicates == 0 and self.unexpected == 0
                and self.unreadable == 0 and not self.failures and self.final_returncode == 0
                and self.validate_returncode == 0 and not self.integrity_findings)


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
    disk: DiskResult = field(default_factory=DiskResult)

    @property
    def kills_ok(self) -> bool:
        return (self.lost == 0 and self.duplicates == 0 and self.unexpected == 0
                and self.final_returncode == 0 and self.validate_returncode == 0
                and not self.integrity_findings and self.survived == self.cycles)

    @property
    def ok(self) -> bool:
        return self.kills_ok and self.disk.ok


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


# --- disk-full cycles ------------------------------------------------------------------------

PAUSED, RESUMED = "sending paused", "writing again"
NO_SPACE = "cannot write: No space left on device ("
_STOP_LINE = re.compile(r"^stopped: (?P<file>.+?): cannot write: .*\(.+ free\); "
                        r"(?P<unwritten>\d+) lines could not be written")
_DONE_LINE = re.compile(r"^  (?P<name>\S+): (?P<done>\d+)/\d+ done")


@contextmanager
def _tmpfs(path: Path, mib: int) -> Iterator[str | None]:
    """A tmpfs of `mib` MiB mounted on path for the block, unmounted after it whatever happens;
    yields None, or why it could not be mounted (then nothing is mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        yield f"mount -t tmpfs: {exc}"
        return
    if done.returncode != 0:
        reason = ((done.stderr or done.stdout).strip().splitlines() or [""])[0][:200]
        yield f"mount -t tmpfs refused (exit {done.returncode}): {reason}"
        return
    try:
        yield None
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=False)  # busy: detach it


class _Disk:
    """The tmpfs the disk run lives on, and the filler file that takes its space."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def free(self) -> int:
        """Bytes free on the tmpfs."""
        return shutil.disk_usage(self.root).free

    def fill(self, leave: int) -> int:
        """Write the filler until ENOSPC, then cut `leave` bytes off it; the bytes free then."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = bytes(1 << 16)
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        finally:
            os.close(fd)
        return self.free()

    def release(self, amount: int | None = None) -> None:
        """Cut `amount` bytes off the filler, or delete it (None)."""
        if amount is None:
            self.filler.unlink(missing_ok=True)
            return
        size = self.filler.stat().st_size
        os.truncate(self.filler, max(0, size - amount))


class _Watched:
    """A `workbench generate` process whose output lines (stdout and stderr) are read as they
    come, kept, and copied to a log."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(log,), daemon=True)
        self._reader.start()

    def _read(self, log: Path) -> None:
        assert self.process.stdout is not None
        with log.open("w") as copy:
            for line in self.process.stdout:
                copy.write(line)
                copy.flush()
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, holds: Callable[[list[str]], bool], timeout: float) -> bool:
        """Whether `holds(lines)` came true within timeout, before the output ended."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not holds(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    return holds(self.lines)
                self._changed.wait(min(left, 0.5))
        return True

    def count(self, text: str) -> int:
        """Lines so far that hold text."""
        with self._changed:
            return sum(text in line for line in self.lines)

    def finish(self, timeout: float) -> int | None:
        """Its exit code, once it ended and its output is read; None (killed) after timeout."""
        try:
            code: int | None = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        self._reader.join(10)
        return code

    def kill(self) -> None:
        """SIGKILL it if it still runs (a cycle that went wrong), and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _paused(lines: list[str]) -> bool:
    """Whether the run's last word on writing was that it paused."""
    return sum(PAUSED in line for line in lines) > sum(RESUMED in line for line in lines)


def _disk_kinds(cycles: int, rng: random.Random) -> list[str]:
    """The cycles' kinds, shuffled: a fifth (at least one) start with the disk full, the
    others pause or stop, half and half."""
    if cycles <= 0:
        return []
    starts = max(1, cycles // 5)
    rest = cycles - starts
    kinds = ["start"] * starts + ["pause"] * ((rest + 1) // 2) + ["stop"] * (rest // 2)
    rng.shuffle(kinds)
    return kinds


@dataclass
class _DiskCycle:
    """What one disk cycle did and what its run said."""

    kind: str
    left: int = 0  # bytes free after the fill
    freed: int = 0  # bytes of filler deleted while paused (pause cycles)
    returncode: int | None = None
    lines: list[str] = field(default_factory=list)
    resumed_after_free: bool = False
    problems: list[str] = field(default_factory=list)  # expectations of the kind not met


def _run_full_at_start(cycle: _DiskCycle, argv: list[str], disk: _Disk, log: Path) -> None:
    """The disk full before the run starts: one line naming the reason, exit 74."""
    cycle.left = disk.fill(0)
    run = _Watched(argv, log)
    try:
        cycle.returncode = run.finish(120)
    finally:
        run.kill()
    cycle.lines = run.lines
    said = [line for line in run.lines if line.strip()]
    if cycle.returncode != 74:
        cycle.problems.append(f"exit {cycle.returncode}, expected 74")
    if len(said) != 1 or f"{NO_SPACE}0 B free)" not in said[0]:
        cycle.problems.append(f"expected one line '...{NO_SPACE}0 B free)', got {len(said)}: "
                              f"{' | '.join(said)[:300]}")


def _run_filled(cycle: _DiskCycle, argv: list[str], disk: _Disk, log: Path, rng: random.Random,
                config: SoakConfig) -> None:
    """A run whose disk fills at a random moment; a pause cycle frees it while paused."""
    run = _Watched(argv, log)
    try:
        if not run.wait_until(lambda lines: any(x.startswith("generating") for x in lines), 120):
            cycle.problems.append("never started sending")
        time.sleep(rng.uniform(*config.fill_after))
        cycle.left = disk.fill(1024 * rng.randint(*config.leave_kib))
        if cycle.kind == "pause":
            _free_while_paused(cycle, run, disk, rng, config)
        cycle.returncode = run.finish(config.disk_wait + 180)
    finally:
        run.kill()
    cycle.lines = run.lines
    if cycle.returncode != 74:
        cycle.problems.append(f"exit {cycle.returncode}, expected 74 (a stop on the full disk)")


def _free_while_paused(cycle: _DiskCycle, run: _Watched, disk: _Disk, rng: random.Random,
                       config: SoakConfig) -> None:
    """Once the run says it paused, delete the filler: it must say it writes again. Then fill
    the disk again at once, so that it pauses again and stops by itself.

    The whole filler goes: the pause ends only once every held line is written, up to one
    reply per request in flight (64 of up to 3.6 KB), and less space than that lets the run
    write some of them and stay paused."""
    if not run.wait_until(_paused, config.disk_wait + 120):
        cycle.problems.append("never said 'sending paused'")
        return
    time.sleep(rng.uniform(0, config.disk_wait / 2))
    resumed = run.count(RESUMED)
    cycle.freed = disk.filler.stat().st_size
    disk.release()
    cycle.resumed_after_free = run.wait_until(
        lambda lines: sum(RESUMED in line for line in lines) > resumed, config.disk_wait + 30)
    if not cycle.resumed_after_free:
        cycle.problems.append(f"the filler deleted while paused, but no '{RESUMED}'")
        return
    time.sleep(rng.uniform(*config.fill_after))
    disk.fill(1024 * rng.randint(*config.leave_kib))


def _stop_line(cycle: _DiskCycle, out: Path) -> tuple[str, int] | None:
    """(the stop line, its unwritten lines) of a run stopped by the disk; None without one.
    The line must name a file of the run and the free space."""
    for line in cycle.lines:
        match = _STOP_LINE.match(line)
        if match is not None and Path(match["file"]).is_relative_to(out):
            return line, int(match["unwritten"])
    return None


# --- disk-full checks ------------------------------------------------------------------------


@dataclass
class _Look:
    """One look at the disk run: its records per dataset as read_rows reads them, and its ids."""

    records: dict[str, int] = field(default_factory=dict)
    ids: dict[str, set[SampleId]] = field(default_factory=dict)
    duplicates: int = 0
    unreadable: int = 0  # unreadable lines, a partial last line included
    gone: int = 0  # samples on disk at the previous look and not now
    temps: set[str] = field(default_factory=set)  # temp files in the run directory
    failures: list[str] = field(default_factory=list)


def _look(out: Path, names: list[str]) -> _Look:
    """What is on disk now: per dataset the records, ids, repeats and bad or partial lines."""
    look = _Look()
    for name in names:
        raw = out / name / RAW_FILE
        if not raw.exists():
            look.records[name], look.ids[name] = 0, set()
            continue
        rows, problems = read_rows(raw)
        ids, repeats = read_sample_ids(raw)
        data = raw.read_bytes()
        partial = bool(data) and not data.endswith(b"\n")
        look.records[name], look.ids[name] = len(rows), ids
        look.duplicates += len(repeats)
        look.unreadable += len(problems) + (partial and not any(p.kind == "torn" for p in problems))
        if repeats or problems or partial:
            look.failures.append(f"{name}: {len(repeats)} repeated ids, {len(problems)} unreadable "
                                 f"lines{', a partial last line' if partial else ''}")
    return look


def _verb_counts(verb: str, out: Path) -> dict[str, int] | str:
    """Records per dataset as `workbench stats|validate --json` count them, or what went wrong."""
    done = subprocess.run([sys.executable, "-m", "workbench", verb, str(out), "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode not in (0, 1):
        return f"workbench {verb} exit {done.returncode}: {done.stderr.strip()[-300:]}"
    try:
        datasets = json.loads(done.stdout)["datasets"]
        return {name: report["records"] for name, report in datasets.items()}
    except (ValueError, KeyError, TypeError) as exc:
        return f"workbench {verb} --json unreadable: {exc!r}"


def _summary_done(lines: list[str]) -> dict[str, int]:
    """The done count per dataset of a printed summary (`  ids: 312/1200 done ...`)."""
    return {m["name"]: int(m["done"]) for m in map(_DONE_LINE.match, lines) if m is not None}


def _temp_files(out: Path) -> list[str]:
    """Temp files left in the run directory (``.<name>.<pid>.tmp``, the caches' ``.tmp-*``)."""
    if not out.exists():
        return []
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.name.endswith(".tmp") or p.name.startswith(".tmp-"))


def _check(out: Path, names: list[str], previous: _Look, lines: list[str]) -> _Look:
    """The checks after a cycle (module docstring), against the look after the previous one;
    the failures are in the returned look. Temp files are told apart by who left them: the
    generate run, or `workbench stats`/`validate` reading the run on the full disk."""
    look = _look(out, names)
    for name in names:
        gone = previous.ids.get(name, set()) - look.ids[name]
        look.gone += len(gone)
        if gone:
            look.failures.append(f"{name}: {len(gone)} samples on disk before the cycle are gone")
    _new_temps(look, out, previous.temps, "workbench generate")
    if any(look.records.values()):
        for verb in ("stats", "validate"):
            counted = _verb_counts(verb, out)
            if isinstance(counted, str):
                look.failures.append(counted)
            elif {n: counted.get(n, 0) for n in names} != look.records:
                look.failures.append(f"workbench {verb} counts {counted}, read_rows {look.records}")
        _new_temps(look, out, set(look.temps), "workbench stats/validate --json")
    done = _summary_done(lines)
    if done and done != {n: look.records[n] for n in done}:
        look.failures.append(f"the summary says done {done}, the files hold {look.records}")
    return look


def _new_temps(look: _Look, out: Path, known: set[str], by: str) -> None:
    """A failure for the temp files of out that `known` does not hold, as left by `by`; the
    look keeps them all."""
    look.temps = set(_temp_files(out))
    new = look.temps - known
    if new:
        look.failures.append(f"{len(new)} temp files left by {by}: {', '.join(sorted(new)[:3])}")


# --- the disk phase --------------------------------------------------------------------------


def _disk_cycle(index: int, kind: str, argv: list[str], disk: _Disk, work: Path,
                rng: random.Random, config: SoakConfig) -> _DiskCycle:
    """One disk cycle of `kind` (module docstring); the disk is left as the cycle left it."""
    cycle = _DiskCycle(kind)
    log = work / "logs" / f"disk-cycle-{index:02d}.log"
    if kind == "start":
        _run_full_at_start(cycle, argv, disk, log)
    else:
        _run_filled(cycle, argv, disk, log, rng, config)
    return cycle


def _tally(cycle: _DiskCycle, look: _Look, out: Path, result: DiskResult, index: int) -> None:
    """Add a cycle and the look after it to the figures (a stop without its line is a failure)."""
    stop = _stop_line(cycle, out)
    if cycle.kind != "start" and cycle.returncode == 74 and stop is None:
        cycle.problems.append("exit 74 without a stop line naming the file and the free space")
    result.kinds[cycle.kind] += 1
    result.stops += cycle.returncode == 74
    result.pauses += sum(PAUSED in line for line in cycle.lines)
    result.resumed += sum(RESUMED in line for line in cycle.lines)
    result.freed_resumed += cycle.resumed_after_free
    result.unwritten += stop[1] if stop else 0
    result.duplicates = max(result.duplicates, look.duplicates)
    result.unreadable = max(result.unreadable, look.unreadable)
    result.lost += look.gone
    result.failures += [f"disk cycle {index + 1} ({cycle.kind}): {failure}"
                        for failure in cycle.problems + look.failures]


def _account(cycle: _DiskCycle, look: _Look, out: Path) -> str:
    """One line on a disk cycle: how full, what the run did and said, the records after it."""
    if cycle.kind == "start":
        said = next((line for line in cycle.lines if line.strip()), "(nothing)")
        story = f"disk full; exit {cycle.returncode}: {said.replace(str(out), 'OUT')}"
    else:
        story = f"{cycle.left // 1024} KiB left free"
        if cycle.freed:
            story += f", paused, filler deleted ({cycle.freed // 1024} KiB)"
        if cycle.resumed_after_free:
            story += f", '{RESUMED}', filled again"
        stop = _stop_line(cycle, out)
        story += f"; exit {cycle.returncode}"
        story += f", {stop[1]} lines held at the stop" if stop else ""
    failed = cycle.problems + look.failures
    return (f"{story}; {sum(look.records.values())} records"
            + (f"; FAILED: {'; '.join(failed)[:300]}" if failed else ""))


def _disk_final(argv: list[str], out: Path, names: list[str], previous: _Look,
                expected: dict[str, set[SampleId]], result: DiskResult, work: Path,
                config: SoakConfig) -> str:
    """The run that completes the disk run, its checks and the final figures; its last line."""
    final = subprocess.run(argv, capture_output=True, text=True, timeout=config.final_timeout,
                           check=False)
    result.final_returncode = final.returncode
    (work / "logs" / "disk-final.log").write_text(final.stdout + final.stderr)
    look = _check(out, names, previous, (final.stdout + final.stderr).splitlines())
    result.failures += [f"disk final run: {failure}" for failure in look.failures]
    result.duplicates = max(result.duplicates, look.duplicates)
    result.unreadable = max(result.unreadable, look.unreadable)
    for name, wanted in expected.items():
        ids = look.ids[name]
        result.expected += len(wanted)
        result.written += len(ids & wanted)
        result.lost += len(wanted - ids)
        result.unexpected += len(ids - wanted)
    _validate(out, result)
    return _last_line(final.stdout, final.stderr)


def run_disk_cycles(work: Path, sim: _Simulator, config: SoakConfig,
                    say: Callable[[str], None] = print) -> DiskResult:
    """The disk phase (module docstring) on a tmpfs under work, against sim."""
    result = DiskResult()
    if config.disk_cycles <= 0:
        result.skipped = "--disk-cycles 0"
        return result
    job = work / "disk-job"
    job.mkdir(exist_ok=True)
    manifest, expected = _write_job(job, replace(config, samples=config.disk_samples))
    names = sorted(expected)
    rng = random.Random(config.seed + 1)
    with _tmpfs(work / "disk", config.disk_mib) as refused:
        if refused is not None:
            result.skipped = refused
            say(f"disk cycles skipped: {refused}")
            return result
        disk = _Disk(work / "disk")
        out = disk.root / "out"
        argv = [*_generate_argv(manifest, sim.url, out, config), "--disk-wait",
                str(config.disk_wait)]
        previous = _Look()
        kinds = _disk_kinds(config.disk_cycles, rng)
        for index, kind in enumerate(kinds):
            cycle = _disk_cycle(index, kind, argv, disk, work, rng, config)
            look = _check(out, names, previous, cycle.lines)
            _tally(cycle, look, out, result, index)
            say(f"disk cycle {index + 1}/{len(kinds)} ({kind}): {_account(cycle, look, out)}")
            previous = look
            disk.release()
        last = _disk_final(argv, out, names, previous, expected, result, work, config)
        say(f"disk final run: exit {result.final_returncode}; {last}")
    return result


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


def _validate(out: Path, result: SoakResult | DiskResult) -> None:
    """`workbench validate --strict` of out: its exit code and its findings, integrity or other."""
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
            result.disk = run_disk_cycles(work, sim, config, say)
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
        *_disk_figures(result.disk),
        f"wall time            {result.wall_seconds:.1f}s",
        (f"verdict              {'PASS' if result.ok else 'FAIL'} (kill cycles "
         f"{'PASS' if result.kills_ok else 'FAIL'}, disk cycles "
         f"{'skipped' if result.disk.skipped else 'PASS' if result.disk.ok else 'FAIL'})"),
    ]
    return "\n".join(lines)


def _disk_figures(disk: DiskResult) -> list[str]:
    """The disk cycles' lines of the figures."""
    if disk.skipped is not None:
        return [f"disk cycles          skipped ({disk.skipped}); not counted in the verdict"]
    kinds = ", ".join(f"{kind} {disk.kinds[kind]}" for kind in ("start", "pause", "stop"))
    integrity = ", ".join(f"{k} {v}" for k, v in sorted(disk.integrity_findings.items())) or "none"
    failures = "".join(f"\n  {failure}" for failure in disk.failures[:20])
    return [
        f"disk cycles          {sum(disk.kinds.values())} ({kinds}); {disk.stops} stops with exit 74",
        (f"disk pauses          {disk.pauses} 'sending paused', {disk.resumed} 'writing again'; "
         f"{disk.freed_resumed}/{disk.kinds['pause']} pause cycles resumed once space was freed"),
        (f"disk samples         {disk.written}/{disk.expected} written; lost {disk.lost}, duplicated "
         f"{disk.duplicates}, unreadable {disk.unreadable}"
         + (f" (+{disk.unexpected} unexpected ids)" if disk.unexpected else "")
         + f"; {disk.unwritten} held lines not written at stops (sent again on resume)"),
        f"disk checks          {len(disk.failures)} failed{failures}",
        f"disk final run       exit {disk.final_returncode}",
        f"disk validate        exit {disk.validate_returncode}; integrity findings: {integrity}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=SoakConfig.cycles, help="SIGKILL cycles (20)")
    parser.add_argument("--samples", type=int, default=SoakConfig.samples, help="token-id prompts (3000)")
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--speed", type=float, default=SoakConfig.speed, help="simulator speed (0.25)")
    parser.add_argument("--work", type=Path, help="keep the run here (default: a temporary directory)")
    parser.add_argument("--disk-cycles", type=int, default=SoakConfig.disk_cycles,
                        help="disk-full cycles after the kill cycles (10; 0 skips them; needs root)")
    parser.add_argument("--disk-samples", type=int, default=SoakConfig.disk_samples,
                        help="token-id prompts of the disk run (1800)")
    parser.add_argument("--disk-mib", type=int, default=SoakConfig.disk_mib,
                        help="tmpfs size in MiB (8)")
    parser.add_argument("--disk-wait", type=float, default=SoakConfig.disk_wait,
                        help="generate --disk-wait in the disk cycles (4)")
    args = parser.parse_args(argv)
    config = SoakConfig(cycles=args.cycles, samples=args.samples, seed=args.seed, speed=args.speed,
                        work=args.work, disk_cycles=args.disk_cycles, disk_samples=args.disk_samples,
                        disk_mib=args.disk_mib, disk_wait=args.disk_wait)
    result = run_soak(config)
    print(format_figures(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
