"""Hardening of `generate --launch` and of the client: credentials in a launch file are shown
as `***` wherever they are printed or written, a reply body is read up to `max_reply_bytes`,
and a refused connection says the URL and the reason."""

from __future__ import annotations

import asyncio
import gzip
import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from conftest import EXAMPLES, workbench, write_manifest

from workbench.errors import ConnectionLost, ProtocolError
from workbench.server.client import SGLangClient, _redact_command, is_secret_name
from workbench.server.launch import find_free_port
from workbench.server.spec import redact, redact_argv

ENV_SECRET = "env-value-never-shown-1"
ARG_SECRET = "arg-value-never-shown-2"
EQ_SECRET = "eq-value-never-shown-3"


@pytest.mark.parametrize("name", [
    "ACME_DEPLOY_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SESSION_TOKEN", "GITHUB_TOKEN",
    "MY_PRIVATE_KEY", "DB_PASSWD", "hf_token", "--api-key", "--hf-token", "--vault-credential",
    "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "apiKey", "admin_api_key",
])
def test_names_that_say_they_hold_a_credential_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "--tokenizer-path", "--max-total-tokens", "max_new_tokens", "PATH", "CUDA_VISIBLE_DEVICES",
    "--kv-cache-dtype", "skip_tokenizer_init",
])
def test_ordinary_names_are_shown(name: str) -> None:
    assert not is_secret_name(name)


def test_every_form_of_a_secret_flag_is_hidden() -> None:
    argv = ["py", "-m", "sglang", "--vault-credential", ARG_SECRET, "--hf-token=" + EQ_SECRET,
            "--acme-keys-list", "x", "--port", "1", "--enable-metrics"]
    shown = redact_argv(argv)
    assert ARG_SECRET not in shown and not any(EQ_SECRET in part for part in shown)
    assert shown[-3:] == ["--port", "1", "--enable-metrics"]
    assert redact({"ACME_DEPLOY_TOKEN": ENV_SECRET, "HOME": "/h"}) == {
        "ACME_DEPLOY_TOKEN": "***", "HOME": "/h"}
    line = _redact_command(f"python -m sglang --enable-metrics --vault-credential {ARG_SECRET} "
                           f"--hf-token={EQ_SECRET} --port 3")
    assert ARG_SECRET not in line and EQ_SECRET not in line and "--port 3" in line


def test_a_launch_file_s_credentials_are_printed_and_logged_as_stars(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"  # a "server" that exits at once, saying nothing
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = tmp_path / "server.yaml"
    server.write_text(json.dumps({"server": {
        "launcher": "sglang", "model_path": "org/model", "python": str(fake),
        "startup_timeout": 30, "stop_grace": 2,
        "env": {"ACME_DEPLOY_TOKEN": ENV_SECRET, "HOME_ZONE": "visible-env"},
        "args": {"vault-credential": ARG_SECRET, "context-length": 4096}}}))
    manifest = write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 2}])
    out = tmp_path / "out"
    done = workbench("generate", "--datasets", str(manifest), "--launch", str(server),
                     "--out", str(out), "--max-restarts", "0")
    log = (out / "server.log").read_text()
    printed = done.stdout + done.stderr
    assert done.returncode != 0 and "--vault-credential '***'" in log, printed + log
    assert "ACME_DEPLOY_TOKEN='***'" in log and "HOME_ZONE=visible-env" in log
    for text in (printed, log, *(p.read_text() for p in out.rglob("*.json"))):
        assert ENV_SECRET not in text and ARG_SECRET not in text


def _serve(body: bytes) -> httpx.MockTransport:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks())  # streamed, no length
    return httpx.MockTransport(reply)


def test_a_reply_body_past_max_reply_bytes_is_a_protocol_error() -> None:
    async def go(size: int) -> object:
        body = json.dumps({"text": "x" * size, "meta_info": {}}).encode()
        async with SGLangClient("http://gpu:1", transport=_serve(body),
                                max_reply_bytes=5000) as client:
            return await client.generate_json({"text": "hi"})

    assert asyncio.run(go(100))["text"] == "x" * 100  # type: ignore[index]
    with pytest.raises(ProtocolError, match=r"larger than 5000 bytes \(max_reply_bytes\)"):
        asyncio.run(go(20_000))


def test_a_compressed_reply_is_read_once_decoded() -> None:
    body = json.dumps({"text": "x" * 100, "meta_info": {}}).encode()

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=gzip.compress(body),
                              headers={"content-encoding": "gzip"})

    async def go() -> object:
        async with SGLangClient("http://gpu:1", transport=httpx.MockTransport(reply)) as client:
            return await client.generate_json({"text": "hi"})

    assert asyncio.run(go()) == json.loads(body)


def test_a_stream_line_past_max_reply_bytes_is_a_protocol_error() -> None:
    async def go() -> None:
        body = b"data: " + b"x" * 20_000  # a line that never ends
        async with SGLangClient("http://gpu:1", transport=_serve(body),
                                max_reply_bytes=5000) as client:
            async for _ in client.generate_stream({"text": "hi"}):
                pass

    with pytest.raises(ProtocolError, match="stream event larger than 5000 bytes"):
        asyncio.run(go())


def test_a_refused_connection_says_the_url_and_the_reason() -> None:
    port = find_free_port()

    async def go() -> None:
        async with SGLangClient(f"http://127.0.0.1:{port}") as client:
            await client.generate({"text": "hi"})

    with pytest.raises(ConnectionLost) as caught:
        asyncio.run(go())
    message = str(caught.value)
    assert "ssl:" not in message
    assert message == (f"connection failed: cannot connect to http://127.0.0.1:{port}/generate: "
                       "Connection refused")
