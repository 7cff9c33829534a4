"""Server commands and process groups: start, readiness, early exits, stopping, no leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_until

from workbench.errors import LaunchError
from workbench.server.launch import (
    ServerProcess,
    command_line,
    find_free_port,
    log_failure_reason,
    port_is_free,
    server_command,
    split_sim_args,
    to_flags,
)

PY = sys.executable


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [PY, str(path)]


# --- commands ----------------------------------------------------------------------------------


def test_flags_from_one_mapping() -> None:
    args = {"mem_fraction_static": 0.88, "enable_metrics": True, "enable_hierarchical_cache": False,
            "max_running_requests": None, "kv_cache_dtype": "bf16", "dp_size": 2}
    assert to_flags(args) == ["--mem-fraction-static", "0.88", "--enable-metrics",
                              "--kv-cache-dtype", "bf16", "--dp-size", "2"]


def test_sglang_and_sim_commands_share_the_flags() -> None:
    args = {"tp_size": 8, "mem_fraction_static": 0.8}
    real = server_command("sglang", port=30000, model_path="/models/Kimi-K2.5", args=args, python="python")
    sim = server_command("sim", port=30001, args=args, python="python")
    assert real == ["python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "30000",
                    "--model-path", "/models/Kimi-K2.5", "--tp-size", "8", "--mem-fraction-static", "0.8"]
    assert sim[:3] == ["python", "-m", "workbench.sim"]
    assert sim[-4:] == real[-4:]


def test_flags_the_simulator_does_not_know_are_set_aside() -> None:
    kept, ignored = split_sim_args({"tp_size": 8, "trust_remote_code": True, "speed": 200,
                                    "enable_hierarchical_cache": True, "attention_backend": "fa3"})
    assert kept == {"tp_size": 8, "speed": 200, "enable_hierarchical_cache": True}
    assert ignored == ["trust_remote_code", "attention_backend"]


def test_command_line_quotes_and_prefixes_the_environment() -> None:
    line = command_line(["python", "-m", "x", "--name", "a b"], {"SGLANG_FLAG": "1 2"})
    assert line == "SGLANG_FLAG='1 2' python -m x --name 'a b'"


# --- running -----------------------------------------------------------------------------------


def test_simulator_starts_answers_and_leaves_nothing_behind(tmp_path: Path) -> None:
    port = find_free_port()
    argv = server_command("sim", port=port, args={"profile": "fast"}, python=PY)
    server = ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log",
                           health_path=("/health_generate", "/health"))
    server.start()
    try:
        server.wait_ready(30)
        assert server.health_path == "/health_generate"
        assert not port_is_free(port)
    finally:
        code = server.stop()
    assert code is not None
    assert group_gone(server.pgid)  # type: ignore[arg-type]
    server.wait_port_free(port)  # a bounded wait: LaunchError if the port stays busy
    assert "ready on" in (tmp_path / "s.log").read_text()


@pytest.mark.anyio
async def test_async_readiness_of_the_simulator(tmp_path: Path) -> None:
    port = find_free_port()
    argv = server_command("sim", port=port, args={"profile": "fast"}, python=PY)
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log") as server:
        await server.wait_ready_async(30)
        assert server.returncode is None
    assert group_gone(server.pgid)  # type: ignore[arg-type]


def test_an_out_of_memory_start_is_a_launch_error_with_the_reason(tmp_path: Path) -> None:
    port = find_free_port()
    argv = server_command("sim", port=port, args={"profile": "dense-8b-1x24gb", "mem_fraction_static": 0.97},
                          python=PY)
    server = ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log")
    server.start()
    try:
        with pytest.raises(LaunchError, match=r"exited with code 1 before it was ready: workbench sim: "
                           r"mem_fraction_static: out of memory: activations need"):
            server.wait_ready(30)
        assert server.exit_reason() is not None and "out of memory" in server.exit_reason()  # type: ignore[operator]
    finally:
        server.stop()


def test_readiness_falls_back_to_health_when_health_generate_is_missing(tmp_path: Path) -> None:
    port = find_free_port()
    argv = script(tmp_path, "srv.py", f"""
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()
            def log_message(self, *args):
                pass
        HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "s.log",
                       health_path=("/health_generate", "/health")) as server:
        server.wait_ready(10)
        assert server.health_path == "/health"


def test_readiness_times_out(tmp_path: Path) -> None:
    argv = [PY, "-c", "import time; time.sleep(30)"]
    server = ServerProcess(argv, url=f"http://127.0.0.1:{find_free_port()}", log_path=tmp_path / "s.log")
    with server, pytest.raises(LaunchError, match="not healthy after"):
        server.wait_ready(0.5)


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    argv = script(tmp_path, "stubborn.py", """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
        print("child", child.pid, flush=True)
        time.sleep(3600)
    """)
    server = ServerProcess(argv, url="http://127.0.0.1:9", log_path=tmp_path / "s.log")
    server.start()
    try:
        wait_until(lambda: b"child" in server.read_log(), 60, "the script to start its child")
    finally:  # both ignore SIGTERM and outlive the test: only the group's SIGKILL ends them
        code = server.stop(grace=0.5)
    assert code == -signal.SIGKILL
    assert (server.exit_reason() or "").startswith("server killed by SIGKILL")
    assert group_gone(server.pgid), "the child ignoring SIGTERM outlived stop()"  # type: ignore[arg-type]


def test_failure_reason_prefers_the_out_of_memory_line(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("loading\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
                   "Traceback (most recent call last):\nsomething else\n")
    server = ServerProcess(["true"], url="http://127.0.0.1:9", log_path=log)
    assert server.failure_reason() == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    log.write_text("a\nlast line\n")
    assert server.failure_reason() == "last line"
    said = "workbench sim: out of memory: activations need 1.5 GB but 0.97 leaves 0.7 GB"
    assert log_failure_reason(f"starting\n{said}\n") == said  # said once, not twice
    assert log_failure_reason("x\nRuntimeError: not enough memory\n") == "out of memory: RuntimeError: not enough memory"


# The tail of a real SGLang 0.5.23 log on a CPU without Intel AMX, started with
# --kv-cache-dtype fp8_e4m3 (paths shortened): the error, then the launcher's clean-up lines.
SGLANG_FP8_LOG = """\
[2026-12-02 05:03:25] Load weight end. elapsed=0.80 s, type=LlamaForCausalLM, avail mem=21.05 GB
[2026-12-02 05:03:25] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/mem_cache/kv_cache_configurator.py", line 463, in configure
    raise ValueError("CPU FP8 KV cache requires Intel AMX support.")
ValueError: CPU FP8 KV cache requires Intel AMX support.

[2026-12-02 05:03:25] Received sigquit from a child process. It usually means the child failed.
[2026-12-02 05:03:25] kill_process_tree called: parent_pid=2155, include_parent=True, pid=2155
"""


def test_failure_reason_is_the_error_not_the_clean_up_after_it(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text(SGLANG_FP8_LOG)
    server = ServerProcess(["true"], url="http://127.0.0.1:9", log_path=log)
    assert server.failure_reason() == "ValueError: CPU FP8 KV cache requires Intel AMX support."
    assert log_failure_reason("x\nKeyboardInterrupt\n") == "KeyboardInterrupt"  # nothing better
    assert log_failure_reason("") == "empty log"


def test_a_killed_parent_takes_its_server_down(tmp_path: Path) -> None:
    parent = script(tmp_path, "parent.py", f"""
        import time
        from workbench.server.launch import ServerProcess
        server = ServerProcess([{PY!r}, "-c", "import time; time.sleep(3600)"],
                               url="http://127.0.0.1:9", log_path={str(tmp_path / 's.log')!r})
        server.start()
        print(server.pgid, flush=True)
        time.sleep(3600)
    """)
    proc = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pgid = int(proc.stdout.readline())
    assert not group_gone(pgid)
    proc.kill()
    proc.wait()
    try:  # the server outlives the wait unless its parent's death takes it down
        wait_until(lambda: group_gone(pgid), 60, "the server to go down with its parent")
    except AssertionError:
        os.killpg(pgid, signal.SIGKILL)
        raise
