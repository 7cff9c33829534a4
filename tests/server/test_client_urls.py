"""What a server URL may carry besides the host: credentials (sent as HTTP basic auth) and a
query string (sent with every request), and neither shown in any message or file."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES, write_manifest

from workbench.errors import ConfigError, ConnectionLost, ServerUnreachable
from workbench.server.client import SGLangClient, redact_url, server_base_url
from workbench.server.launch import find_free_port

SECRET = "tok-9d1e-SECRET"
PASSWORD = "pw-4c7a-SECRET"
REPLY = {"output_ids": [5, 163586], "meta_info": {
    "prompt_tokens": 2, "completion_tokens": 2,
    "finish_reason": {"type": "stop", "matched": 163586}}}
INFO = {"model_path": "m", "is_generation": True, "version": "0.5"}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Recorder:
    """A MockTransport handler that answers like SGLang and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json=INFO)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="# no metrics\n")
        if json.loads(request.content or b"{}").get("stream"):
            body = f"data: {json.dumps(REPLY)}\n\ndata: [DONE]\n\n"
            return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=REPLY)


def test_url_credentials_are_basic_auth_and_the_query_goes_with_every_request() -> None:
    recorder = Recorder()

    async def go() -> None:
        url = f"http://us%40er:{PASSWORD}@gpu:30000/?token={SECRET}&x=1"
        async with SGLangClient(url, transport=httpx.MockTransport(recorder)) as client:
            assert client.base_url == "http://gpu:30000"
            await client.server_info()
            await client.generate({"input_ids": [1, 2]})
            assert [c async for c in client.generate_stream({"input_ids": [1, 2]})]
            await client.metrics()

    asyncio.run(go())
    paths = [r.url.path for r in recorder.requests]
    assert paths == ["/server_info", "/generate", "/generate", "/metrics"]
    for request in recorder.requests:
        assert request.url.params["token"] == SECRET and request.url.params["x"] == "1"
        assert request.url.userinfo == b""
        assert request.headers["authorization"] == basic("us@er", PASSWORD)


def test_credentials_and_an_api_key_together_are_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        SGLangClient(f"http://user:{PASSWORD}@gpu:30000", api_key="k",
                     transport=httpx.MockTransport(Recorder()))
    assert caught.value.key == "--server" and PASSWORD not in str(caught.value)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers /server_info and keeps each request's path and Authorization header."""

    seen: list[tuple[str, str | None]]

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        data = json.dumps({"model_path": "m", "version": "0.5"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def recording_server() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_Handler,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_credentials_and_query_over_the_default_aiohttp_transport(
        recording_server: tuple[str, list[tuple[str, str | None]]]) -> None:
    """aiohttp refuses a URL with credentials next to an Authorization header (the traceback
    of `--server http://user:pw@host:port`)."""
    address, seen = recording_server

    async def go() -> dict[str, Any]:
        async with SGLangClient(f"http://user:{PASSWORD}@{address}?token={SECRET}") as client:
            return await client.server_info()

    assert asyncio.run(go())["model_path"] == "m"
    assert seen == [(f"/server_info?token={SECRET}", basic("user", PASSWORD))]


def test_no_message_shows_the_url_credentials_or_query() -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:{find_free_port()}?token={SECRET}"

    async def go() -> list[Exception]:
        caught: list[Exception] = []
        async with SGLangClient(url, timeout=10.0) as client:
            for call in (client.server_info(), client.generate({"input_ids": [1]})):
                try:
                    await call
                except (ServerUnreachable, ConnectionLost) as exc:
                    caught.append(exc)
        return caught

    caught = asyncio.run(go())
    assert [type(exc) for exc in caught] == [ServerUnreachable, ConnectionLost]
    for exc in caught:
        shown = f"{exc} {exc.url}"  # type: ignore[attr-defined]
        assert SECRET not in shown and PASSWORD not in shown and "127.0.0.1" in shown


def test_server_base_url_keeps_credentials_and_query_and_notes_show_neither() -> None:
    url, notices = server_base_url(f"user:{PASSWORD}@gpu:30000/v1/generate/?token={SECRET}")
    assert url == f"http://user:{PASSWORD}@gpu:30000?token={SECRET}"
    assert len(notices) == 3 and all(SECRET not in n and PASSWORD not in n for n in notices)
    assert notices[-1].startswith("dropped /v1 from the server URL: using http://gpu:30000 ")
    assert redact_url("http://u:p@[::1]:30000/x?token=1#f") == "http://[::1]:30000/x"


@pytest.mark.parametrize("text",
                         ["http://[::1", "http://gpu:99999", "http://gpu:port", "ftp://gpu"])
def test_an_unusable_server_url_is_one_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        server_base_url(text.replace("://", f"://user:{PASSWORD}@"))
    assert caught.value.key == "--server" and PASSWORD not in str(caught.value)


def test_run_files_hold_neither_credentials_nor_query(tmp_path: Path) -> None:
    from workbench.config import load_manifest
    from workbench.generate.plan import GenerateOptions
    from workbench.generate.session import run_generation

    manifest = load_manifest(write_manifest(tmp_path, [
        {"name": "ids", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids",
         "max_samples": 4}]))
    recorder = Recorder()

    async def go() -> None:
        url = f"http://user:{PASSWORD}@gpu:30000?token={SECRET}"
        async with SGLangClient(url, transport=httpx.MockTransport(recorder)) as client:
            summary = await run_generation(manifest, client, tmp_path / "out",
                                           GenerateOptions(preflight=True))
            assert summary.datasets["ids"].done == 4

    asyncio.run(go())
    assert recorder.requests and all(r.url.params["token"] == SECRET for r in recorder.requests)
    assert {r.url.path for r in recorder.requests} >= {"/server_info", "/generate"}
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    secrets = (SECRET.encode(), PASSWORD.encode())
    assert [p for p in written if any(s in p.read_bytes() for s in secrets)] == []
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["server_url"] == "http://gpu:30000"
