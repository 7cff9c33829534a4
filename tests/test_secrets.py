"""Secrets and exposure: the API key is written nowhere, the simulator listens on loopback,
report blocks escape model text."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import EXAMPLES, workbench, write_manifest

from workbench.cli import build_parser
from workbench.server.launch import ServerProcess, find_free_port
from workbench.sim.config import SimConfig

KEY = "wbk-7f3a9c-DO-NOT-LEAK-e41d"


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.integration
@pytest.mark.parametrize("variable", ["WORKBENCH_API_KEY", "SGLANG_API_KEY"])
def test_the_api_key_is_in_no_file_and_no_output(
        tmp_path: Path, start_sim: Callable[..., ServerProcess], variable: str) -> None:
    server = start_sim(api_key=KEY)
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids", "max_samples": 30},
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages", "max_samples": 10,
         "chat_template_kwargs": {"thinking": True}},
    ])
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_API_KEY", "SGLANG_API_KEY")}
    env[variable] = KEY
    runs = [
        workbench("generate", "--datasets", str(manifest), "--server", server.url, "--out", str(out), env=env),
        # a refused request is recorded as data: its message must not echo the key either
        workbench("generate", "--datasets", str(manifest), "--server", server.url, "--out", str(tmp_path / "no-key"),
                  env={k: v for k, v in env.items() if k != variable}),
        workbench("stats", str(out), env=env),
        workbench("stats", str(out), "--json", env=env),
        workbench("validate", str(out), "--json", env=env),
        workbench("monitor", str(out), "--once", "--server", server.url, env=env),
        workbench("export", str(out), "--to", str(tmp_path / "export.jsonl"), env=env),
        workbench("export", str(out), "--to", str(tmp_path / "conversations.jsonl"), "--format", "conversations",
                  "--only", "chat", env=env),
    ]
    if variable == "WORKBENCH_API_KEY":  # one report is enough: it reads the run, never a server
        params = tmp_path / "report.yaml"
        params.write_text(f"run_dir: {out}\n")
        runs.append(workbench("report", "explore", "--params", str(params), "--out", str(tmp_path / "reports"),
                              env=env))
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[1].returncode == 2 and "not authorised" in runs[1].stderr
    assert all(done.returncode == 0 for done in runs[2:]), [d.stderr for d in runs[2:] if d.returncode]
    assert f"server {server.url}:" in runs[5].stdout and "running" in runs[5].stdout
    leaks = [" ".join(map(str, d.args[3:5])) for d in runs if KEY in d.stdout or KEY in d.stderr]
    assert leaks == [], f"the key was printed by: {leaks}"
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 10 and (out / "run.json").exists()
    leaked = [p.relative_to(tmp_path) for p in files_holding(tmp_path, KEY.encode())]
    assert leaked == [], f"the key was written to {leaked}"


def test_the_run_manifest_drops_a_key_the_server_reports_and_url_credentials(tmp_path: Path) -> None:
    """SGLang's /server_info lists every server argument, --api-key included."""
    import asyncio
    import json

    from workbench.config import load_manifest
    from workbench.generate.plan import GenerateOptions
    from workbench.generate.session import run_generation
    from workbench.server.client import SGLangClient

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"model_path": "m", "api_key": KEY, "admin_api_key": KEY,
                                             "tokenizer_path": "m", "version": "0.5"})
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "m", "is_generation": True})
        body = json.loads(request.content)
        return httpx.Response(200, json={"output_ids": [1, 2], "meta_info": {
            "prompt_tokens": len(body["input_ids"]), "completion_tokens": 2,
            "finish_reason": {"type": "stop", "matched": 163586}}})

    manifest = load_manifest(write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids", "max_samples": 5}]))

    async def go() -> None:
        # URL credentials and an API key together are refused (test_client_urls.py)
        async with SGLangClient("http://user:pw@gpu:30000",
                                transport=httpx.MockTransport(server)) as client:
            summary = await run_generation(manifest, client, tmp_path / "out", GenerateOptions(preflight=True))
            assert summary.datasets["ids"].done == 5

    asyncio.run(go())
    assert files_holding(tmp_path, KEY.encode()) == [] and files_holding(tmp_path, b"user:pw") == []
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["server_url"] == "http://gpu:30000" and "api_key" not in run["server_info"]


def test_the_simulator_binds_loopback_by_default() -> None:
    assert SimConfig().host == "127.0.0.1"
    args = build_parser().parse_args(["sim"])
    assert args.host == "127.0.0.1"


def _listening_addresses(port: int) -> list[str]:
    """Local addresses listening on port, from /proc/net/tcp (IPv4, Linux)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")
def test_a_simulator_started_without_host_listens_on_loopback_only(tmp_path: Path) -> None:
    port = find_free_port()
    argv = [sys.executable, "-m", "workbench", "sim", "--port", str(port), "--profile", "fast"]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "sim.log") as server:
        server.wait_ready(60)
        assert _listening_addresses(port) == ["127.0.0.1"]


def test_report_blocks_escape_model_text() -> None:
    from workbench.analyze.explore import Sample
    from workbench.report import plots

    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    sample = Sample(dataset="d<b>", line=3, sample_id="<i>7</i>", finish_reason="stop", prompt_tokens=4,
                    completion_tokens=9, reasoning=evil, answer=evil + "&", decoded=True, cut=False)
    markup = plots.samples_view([sample]).html
    assert "<script>" not in markup and "<img" not in markup and "<i>7</i>" not in markup
    assert "&lt;script&gt;" in markup and "&amp;" in markup


@pytest.mark.integration
def test_the_simulator_neither_logs_nor_reports_its_key(tmp_path: Path) -> None:
    port = find_free_port()
    argv = [sys.executable, "-m", "workbench", "sim", "--port", str(port), "--api-key", KEY]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=tmp_path / "sim.log") as server:
        server.wait_ready(60)
        assert httpx.get(f"{server.url}/server_info", timeout=10).status_code == 401
        info = httpx.get(f"{server.url}/server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert info.status_code == 200 and KEY not in info.text
    assert KEY not in (tmp_path / "sim.log").read_text()
