"""Headless Chromium driven over the DevTools protocol on a pipe (no websocket, no extra package).

`open_page(path)` loads a local HTML file in a fresh headless Chromium (Debian's `chromium`
package), waits for it to settle, evaluates JavaScript expressions, records uncaught
exceptions and console errors, and can take a full-page screenshot. Chromium reads commands
on fd 3 and writes replies and events on fd 4, one JSON message per NUL-terminated chunk.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.server.launch import group_members

INSTALL_HINT = "headless Chromium is missing: run scripts/ci_install_system.sh (Debian package chromium)"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
    "--remote-debugging-pipe",
)  # fmt: skip


def chromium_path() -> str:
    """The Chromium executable; AssertionError telling how to install it when absent."""
    for name in (os.environ.get("WORKBENCH_CHROMIUM"), "chromium", "chromium-browser"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise AssertionError(INSTALL_HINT)


@dataclass
class PageReport:
    """What a page did: uncaught exceptions, console errors, evaluated values."""

    exceptions: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None

    @property
    def errors(self) -> list[str]:
        return self.exceptions + self.console_errors


class _Pipe:
    """One Chromium process and its DevTools pipe."""

    def __init__(self, width: int, height: int) -> None:
        self.profile = tempfile.mkdtemp(prefix="wb-chromium-")
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        # Chromium reads fd 3 and writes fd 4: bash puts the pipe ends there, then execs it
        # (dash takes one-digit fds only; preexec_fn is unsafe with threads running)
        shell = f'exec "$0" "$@" 3<&{to_chrome} 4>&{from_chrome}'
        bash = shutil.which("bash") or "/bin/bash"
        argv = [bash, "-c", shell, chromium_path(), *FLAGS, f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, pass_fds=(to_chrome, from_chrome))
        os.close(to_chrome)
        os.close(from_chrome)
        self.ids = itertools.count(1)
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        buffer = b""
        while chunk := os.read(self._read, 1 << 16):
            buffer += chunk
            *whole, buffer = buffer.split(b"\0")
            for message in whole:
                self.messages.put(json.loads(message))
        self.messages.put(None)

    def send(self, method: str, params: Mapping[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        """Send a command and wait for its reply (events met meanwhile are kept)."""
        ident = next(self.ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": dict(params or {})}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline, method)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, name: str, timeout: float) -> bool:
        """Wait until an event called name arrived (True), or the timeout passed."""
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == name for e in self.events):
            try:
                self.events.append(self._next(deadline, name))
            except TimeoutError:
                return False
        return True

    def _next(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no reply from Chromium for {waiting_for}")
        try:
            message = self.messages.get(timeout=left)
        except queue.Empty:
            raise TimeoutError(f"no reply from Chromium for {waiting_for}") from None
        if message is None:
            raise RuntimeError(f"Chromium exited while waiting for {waiting_for}")
        return message

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def _evaluate(pipe: _Pipe, session: str, expression: str) -> Any:
    result = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                            "awaitPromise": True}, session=session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
    return result["result"].get("value")


# every plotly figure has drawn its traces (one without traces, its frame)
ALL_DRAWN = (
    "[...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('svg.main-svg')"
    " && (d.querySelector('g.trace') || !(d.data || []).length))"
)
# two animation frames: what the page changed before is laid out and painted
NEXT_PAINT = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"


def _settle(pipe: _Pipe, session: str, timeout: float) -> None:
    """Wait for the load event, then until every plot is drawn (at most `timeout` seconds:
    the caller's checks then say what is missing)."""
    pipe.wait_event("Page.loadEventFired", timeout)
    deadline = time.monotonic() + timeout
    while not _evaluate(pipe, session, ALL_DRAWN) and time.monotonic() < deadline:
        time.sleep(0.05)


def _collect(pipe: _Pipe, report: PageReport) -> None:
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            report.exceptions.append(str(text))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            report.console_errors.append(" ".join(map(str, args)))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            report.console_errors.append(str(params["entry"].get("text", "")))


def _screenshot(pipe: _Pipe, session: str, path: Path, width: int) -> Path:
    metrics = pipe.send("Page.getLayoutMetrics", session=session)
    height = int(metrics.get("cssContentSize", metrics.get("contentSize", {})).get("height", 3000))
    pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": min(height, 16000),
                                                     "deviceScaleFactor": 1, "mobile": False},
              session=session)
    _evaluate(pipe, session, NEXT_PAINT)
    shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                     session=session, timeout=60)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def open_page(
    path: str | os.PathLike[str],
    *,
    evaluate: Mapping[str, str] | None = None,
    screenshot: str | os.PathLike[str] | None = None,
    width: int = 1400,
    height: int = 3000,
    timeout: float = 30.0,
) -> PageReport:
    """Load a local file, let it settle, evaluate expressions (name -> JS), screenshot."""
    pipe = _Pipe(width, height)
    report = PageReport()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        _settle(pipe, session, timeout)
        report.values = {name: _evaluate(pipe, session, js) for name, js in (evaluate or {}).items()}
        if screenshot is not None:
            report.screenshot = _screenshot(pipe, session, Path(screenshot), width)
        _collect(pipe, report)
    finally:
        pipe.close()
    return report


def stop_like_ctrl_c(process: subprocess.Popen[str]) -> None:
    """Stop a verb started in its own process group as Ctrl-C would (SIGINT to the group,
    SIGKILL after 30 s), then kill whatever of the group is left."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for pid in group_members(process.pid):
        os.kill(pid, signal.SIGKILL)
