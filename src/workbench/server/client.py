"""SGLang HTTP client: one long-lived `httpx.AsyncClient` per run.

The default transport is `httpx-aiohttp` with an unlimited aiohttp connector: httpx's own
pool caps at 100 connections and its pool work grows with the number of connections (see
DESIGN.md for the measurement). Tests pass `httpx.MockTransport` or `httpx.ASGITransport`
through the same `transport=` seam.

Every failure is raised as an `errors.RequestFailed` subclass (or `ServerUnreachable` for
the probes), classified as retryable or not, so the runner can record it as data. A reply
body (or one streamed event) past `max_reply_bytes` is a ProtocolError: bodies are read in
pieces, so a server that never ends one costs that much memory, not the machine's.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from typing import Annotated, Any, NamedTuple, Self
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import httpx
import msgspec

from workbench.errors import (
    BadRequest,
    ConfigError,
    ConnectionLost,
    ProtocolError,
    RequestAborted,
    RequestFailed,
    RequestTimeout,
    ServerBusy,
    ServerUnreachable,
)

__all__ = [
    "API_KEY_ENV_VARS",
    "MAX_REPLY_BYTES",
    "GenerateResult",
    "SGLangClient",
    "ServerAddress",
    "StreamChunk",
    "api_key_from_env",
    "check_reply",
    "check_server_auth",
    "default_transport",
    "is_secret_name",
    "redact_url",
    "redact_urls_in",
    "request_timeout",
    "server_base_url",
    "split_server_url",
]

API_KEY_ENV_VARS = ("WORKBENCH_API_KEY", "SGLANG_API_KEY")
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# SGLang's JSON contract refusal of a key (sglang/api/v1/api_types.py `_unknown_field`).
_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")
DEFAULT_REQUEST_TIMEOUT = 3600.0
# A reply (or one streamed event) larger than this is refused: far above any real one, it
# bounds the memory a server that never ends its body can take.
MAX_REPLY_BYTES = 256 << 20
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=DEFAULT_REQUEST_TIMEOUT, write=60.0, pool=None)

# httpx logs one INFO line per request; a run sends hundreds of thousands.
logging.getLogger("httpx").setLevel(logging.WARNING)

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_JSON_HEADERS = {"Content-Type": "application/json"}


class _NoCookies(CookieJar):
    """SGLang sets no cookies; skipping httpx's per-response cookie parsing saves CPU."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


class FinishReason(msgspec.Struct):
    type: str
    matched: int | str | None = None
    message: str | None = None
    status_code: int | None = None
    err_type: str | None = None


Count = Annotated[int, msgspec.Meta(ge=0)]
FINISH_TYPES = ("stop", "length", "abort")  # meta_info.finish_reason.type in SGLang


class MetaInfo(msgspec.Struct):
    prompt_tokens: Count
    completion_tokens: Count
    finish_reason: FinishReason | None = None
    cached_tokens: Count = 0
    e2e_latency: float | None = None
    id: str | None = None
    num_retractions: int | None = None
    # `[logprob, token_id, text or null]` per output token, with return_logprob
    output_token_logprobs: list[list[Any]] | None = None


class Reply(msgspec.Struct):
    """The parts of a `/generate` reply the workbench keeps: `output_ids` and the counts are
    required (a reply without them is not a reply), other keys are skipped."""

    meta_info: MetaInfo
    output_ids: list[Annotated[int, msgspec.Meta(ge=0)]]
    text: str | None = None


_reply_decoder = msgspec.json.Decoder(Reply)


class _ChatChoice(msgspec.Struct):
    """The parts of a /v1/chat/completions choice a rendered-by-the-server prompt needs
    (``return_token_ids`` and ``return_meta_info``)."""

    prompt_token_ids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    response_token_ids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    meta_info: MetaInfo | None = None


class _ChatReply(msgspec.Struct):
    choices: list[_ChatChoice]


_chat_decoder = msgspec.json.Decoder(_ChatReply)
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """One finished generation, as read from SGLang's reply."""

    output_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    matched_stop: int | str | None
    e2e_latency: float
    text: str | None = None
    num_retractions: int | None = None  # when the server sends it (SGLang >= 0.5)
    output_logprobs: list[float] | None = None  # the chosen tokens' (with return_logprob)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed chunk: cumulative ids so far and the time it arrived (perf_counter)."""

    output_ids: list[int]
    at: float
    result: GenerateResult | None = None  # set on the last chunk, which carries finish_reason


@dataclass(slots=True)
class _Timer:
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def api_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The API key from WORKBENCH_API_KEY or SGLANG_API_KEY (first set wins)."""
    env = os.environ if environ is None else environ
    return next((env[name] for name in API_KEY_ENV_VARS if env.get(name)), None)


def request_timeout(seconds: float = DEFAULT_REQUEST_TIMEOUT) -> httpx.Timeout:
    """Timeouts for a run: a reply must start within `seconds` (connect and write capped lower)."""
    return httpx.Timeout(connect=min(10.0, seconds), read=seconds, write=min(60.0, seconds),
                         pool=None)


def redact_url(url: str) -> str:
    """`url` without user-info credentials, query string or fragment, fit for manifests and
    logs (the host keeps its port, and an IPv6 host its brackets)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: nothing of it can be shown safely
        return "(unparsable URL)"
    return urlunsplit((parts.scheme, _host_port(parts), parts.path, "", ""))


def _host_port(parts: SplitResult) -> str:
    """The netloc of parts without its user-info (``user:pw@``)."""
    return parts.netloc.rpartition("@")[2]


_URL_IN_TEXT = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def redact_urls_in(text: str) -> str:
    """text with every URL in it redacted (an error message may quote the URL it failed on)."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)


class ServerAddress(NamedTuple):
    """A server URL split the way the client uses it: `base_url` without credentials or
    query (safe to show), the URL's credentials (sent as HTTP basic auth) and its query
    string (sent with every request: a gateway may need it)."""

    base_url: str
    auth: tuple[str, str] | None
    query: str


def split_server_url(url: str) -> ServerAddress:
    """url as a ServerAddress (user-info percent-decoded; a trailing slash dropped)."""
    parts = urlsplit(url.strip())
    auth = None
    if "@" in parts.netloc:
        auth = (unquote(parts.username or ""), unquote(parts.password or ""))
    base = urlunsplit((parts.scheme, _host_port(parts), parts.path.rstrip("/"), "", ""))
    return ServerAddress(base, auth, parts.query)


def check_server_auth(url: str, api_key: str | None) -> None:
    """ConfigError on ``--server`` when url holds credentials and an API key is set too: both
    go in the one Authorization header, and neither may silently win."""
    if api_key and split_server_url(url).auth is not None:
        raise ConfigError("--server", "the URL holds credentials (sent as HTTP basic auth) and "
                                      f"an API key is set ({' or '.join(API_KEY_ENV_VARS)}): "
                                      "use one of them")


_ENDPOINT_SUFFIXES = ("/generate", "/v1")


def server_base_url(text: str) -> tuple[str, list[str]]:
    """The base URL the client needs from what a user typed, and one notice per change: a
    missing scheme gets ``http://``; a trailing ``/v1`` (the OpenAI-compatible API) or
    ``/generate`` (an endpoint) is dropped, since the client adds the paths itself. The
    URL's credentials and query are kept (the client uses them) and never shown in a notice;
    a URL that cannot be parsed is a ConfigError on ``--server``."""
    url, notices = text.strip(), []
    if "://" not in url:
        url = f"http://{url}"
        shown = redact_url(url)  # what was typed, as far as it is safe to show
        notices.append(f"no scheme in {shown.removeprefix('http://')!r}: using {shown}")
    parts = _parse_server_url(url)
    path = parts.path.rstrip("/")
    while path.endswith(_ENDPOINT_SUFFIXES):
        suffix = next(s for s in _ENDPOINT_SUFFIXES if path.endswith(s))
        path = path.removesuffix(suffix).rstrip("/")
        shown = urlunsplit((parts.scheme, _host_port(parts), path, "", ""))
        notices.append(f"dropped {suffix} from the server URL: using {shown} "
                       "(the workbench talks to SGLang's native API at the server's root)")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")), notices


def _parse_server_url(url: str) -> SplitResult:
    """url split, or a ConfigError on ``--server`` that quotes none of it (it may hold a
    password) when it is not a URL a client can use."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number in range)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise ConfigError("--server", f"not a usable URL ({redact_urls_in(str(exc))})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("--server", f"expected an http:// or https:// URL with a host, got "
                                      f"{redact_url(url)!r}")
    return parts


# A name whose word part (split at `_`, `-`, `.`, ...) ends in one of these holds a credential:
# HF_TOKEN, --api-key, AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, DB_PASSWD, apiKey.
# `tokens` and `tokenizer` do not (--max-total-tokens, --tokenizer-path).
_SECRET_ENDINGS = ("token", "key", "secret", "secrets", "password", "passwords", "passwd",
                   "credential", "credentials")


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key name says it holds a credential (its value is hidden).

    The one rule for launch environments, server arguments and server-info keys."""
    return any(part.endswith(_SECRET_ENDINGS) for part in re.split(r"[^a-z0-9]+", name.lower()))


_FLAG_VALUE = re.compile(r"(--([\w-]+))(=|\s+)((?!--)\S+)")


def _redact_command(command: Any) -> Any:
    """A server's `launch_command` with the values of credential flags (`--api-key K`) hidden."""
    if not isinstance(command, str):
        return command
    return _FLAG_VALUE.sub(
        lambda m: f"{m[1]}{m[3]}***" if is_secret_name(m[2]) else m[0], command)


# An idle connection is not reused after this long: under SGLang's (and the simulator's)
# uvicorn keep-alive of 5 s (SGLANG_TIMEOUT_KEEP_ALIVE), so the client never sends a request
# on a connection the server is closing ("Server disconnected" on a request's first attempt).
KEEPALIVE_SECONDS = 4.0


def default_transport() -> httpx.AsyncBaseTransport:
    """httpx over aiohttp with no connection cap (the runner bounds concurrency itself)."""
    import aiohttp
    from httpx_aiohttp import AiohttpTransport

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
        return aiohttp.ClientSession(connector=connector)

    return AiohttpTransport(client=session)


def parse_generate_reply(data: Any, url: str, *, elapsed: float) -> GenerateResult:
    """A GenerateResult from one decoded `/generate` reply object; aborts raise."""
    try:
        reply = msgspec.convert(data, Reply)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"reply is not SGLang's /generate shape: {exc}", url) from None
    return _result_from_reply(reply, url, elapsed)


def _result_from_reply(reply: Reply, url: str, elapsed: float) -> GenerateResult:
    meta = reply.meta_info
    finish = meta.finish_reason
    if finish is None or finish.type not in FINISH_TYPES:
        got = "none" if finish is None else repr(finish.type)
        raise ProtocolError(f"reply has no known finish_reason.type (got {got})", url)
    if finish.type == "abort":
        raise _abort_error(finish, url)
    if meta.completion_tokens > 0 and not reply.output_ids:
        raise ProtocolError(f"reply has no output_ids for {meta.completion_tokens} completion "
                            "tokens", url)
    return GenerateResult(
        output_ids=reply.output_ids,
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=meta.completion_tokens,
        cached_tokens=meta.cached_tokens,
        finish_reason=finish.type,
        matched_stop=finish.matched,
        e2e_latency=meta.e2e_latency if meta.e2e_latency is not None else elapsed,
        text=reply.text,
        num_retractions=meta.num_retractions,
        output_logprobs=_chosen_logprobs(meta.output_token_logprobs, url),
    )


def _chosen_logprobs(entries: list[list[Any]] | None, url: str) -> list[float] | None:
    """The logprob of each `[logprob, token_id, text]` entry; ProtocolError for another shape."""
    if entries is None:
        return None
    try:
        return [float(entry[0]) for entry in entries]
    except (TypeError, ValueError, IndexError):
        raise ProtocolError("reply's output_token_logprobs are not [logprob, token_id, text] "
                            "entries", url) from None


def check_reply(result: GenerateResult, vocab_size: int | None, url: str) -> None:
    """ProtocolError when an output id is outside the model's vocabulary [0, vocab_size) (the
    rest of the reply contract is checked as the reply is read)."""
    ids = result.output_ids
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        bad = next(i for i in ids if i >= vocab_size)
        raise ProtocolError(f"reply has output id {bad}, outside the vocabulary "
                            f"[0, {vocab_size})", redact_url(url))


def _abort_error(finish: FinishReason, url: str) -> RequestFailed:
    """An abort finish_reason (SGLang's FINISH_ABORT: message, status_code, err_type) as an
    error: a 400 / BadRequestError is the request's fault and never retried, others are."""
    kind = f" ({finish.err_type})" if finish.err_type else ""
    message = f"aborted by server{kind}: {finish.message or 'no message'}"
    if finish.status_code == 400 or finish.err_type == "BadRequestError":
        return BadRequest(message, url, http_status=finish.status_code)
    return RequestAborted(message, url, http_status=finish.status_code)


def _error_message(response: httpx.Response) -> str:
    """The server's error as one clear line, from SGLang's bodies: `{"error": {"message"}}`,
    `{"error": "<contract text>"}`, `{"object": "error", "message", "code"}`, or text."""
    body = response.content[:4000]
    try:
        data = _decoder.decode(body)
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return _clear(str(err))
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return f"HTTP {response.status_code}: {text[:200]}" if text else f"HTTP {response.status_code}"


def _clear(message: str) -> str:
    """A server message made short; SGLang's refusal of an unknown key names the key."""
    unknown = _UNKNOWN_FIELD.match(message)
    if unknown:
        return (f"the server refuses the unknown parameter `{unknown.group(1)}` "
                "(check the sampling parameters)")
    return message[:500]


def _is_abort_body(response: httpx.Response) -> bool:
    """SGLang's non-streaming abort: HTTP 5xx with an ErrorResponse (`"object": "error"`)."""
    try:
        data = _decoder.decode(response.content[:4000])
    except msgspec.DecodeError:
        return False
    return isinstance(data, dict) and data.get("object") == "error"


def raise_for_status(response: httpx.Response, url: str) -> None:
    """Map a non-2xx reply onto the error tree (retryable or not)."""
    status = response.status_code
    if status < 300:
        return
    message = _error_message(response)
    if status >= 500 and _is_abort_body(response):
        raise RequestAborted(f"aborted by server: {message}", url, http_status=status)
    if status in RETRY_STATUSES:
        raise ServerBusy(message, url, http_status=status)
    if status == 401 or status == 403:
        raise BadRequest(f"not authorised ({status}): set WORKBENCH_API_KEY", url, http_status=status)
    if 400 <= status < 500:
        raise BadRequest(message, url, http_status=status)
    raise ServerBusy(message, url, http_status=status)


def _stream_error(error: Any, url: str) -> RequestFailed:
    """A streamed error chunk (http_server `stream_results`: message, type, code)."""
    detail = error if isinstance(error, dict) else {"message": error}
    status = detail.get("code") if isinstance(detail.get("code"), int) else 400
    message = _clear(str(detail.get("message", error)))
    if status in RETRY_STATUSES:
        return ServerBusy(message, url, http_status=status)
    return BadRequest(message, url, http_status=status)


def _map_transport_error(exc: httpx.TransportError, url: str) -> RequestFailed:
    # httpx-aiohttp maps every aiohttp connection error (refused, reset, server disconnected)
    # onto ConnectTimeout, so a connect-phase failure is a lost connection, not a slow reply.
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return RequestTimeout(f"timed out: {type(exc).__name__}", url)
    reason = _os_reason(exc)
    if reason is not None:
        return ConnectionLost(f"connection failed: cannot connect to {url}: {reason}", url)
    detail = _SSL_WORDING.sub("", redact_urls_in(str(exc))) or type(exc).__name__
    return ConnectionLost(f"connection failed: {detail}", url)


# aiohttp's "Cannot connect to host h:p ssl:default [...]" names its TLS setting, not the cause
_SSL_WORDING = re.compile(r" ssl:\S+")


def _os_reason(exc: BaseException) -> str | None:
    """The operating system's reason under a connect error (`Connection refused`), read from
    aiohttp's `os_error` below httpx-aiohttp's exception; None when there is none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        error = getattr(seen, "os_error", None)
        if isinstance(error, OSError):
            if error.errno is not None and error.errno > 0:
                return os.strerror(error.errno)
            return error.strerror or str(error) or type(error).__name__
        seen = seen.__cause__ or seen.__context__
    return None


class SGLangClient:
    """Async client for one SGLang server (or a router in front of many).

    Use as `async with SGLangClient(url) as client:`. `transport` defaults to
    `default_transport()`; pass `httpx.MockTransport` or `httpx.ASGITransport` in tests.
    Credentials in the URL are sent as HTTP basic auth (a ConfigError when `api_key` is
    given too) and its query with every request; `base_url` holds neither.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        check_server_auth(base_url, api_key)
        self.max_reply_bytes = max_reply_bytes
        address = split_server_url(base_url)
        self.base_url = address.base_url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            auth=httpx.BasicAuth(*address.auth) if address.auth else None,
            params=address.query or None,
            timeout=timeout,
            transport=transport if transport is not None else default_transport(),
            cookies=_NoCookies(),
        )
        self._absolute: dict[str, httpx.URL] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _url(self, path: str) -> str:
        return redact_url(f"{self.base_url}{path}")

    def _absolute_url(self, path: str) -> httpx.URL:
        """The parsed absolute URL of path, built once (httpx re-parses relative ones per request)."""
        url = self._absolute.get(path)
        if url is None:
            url = self._absolute[path] = httpx.URL(self.base_url + path)
        return url

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The reply with its body read, at most `max_reply_bytes` of it (a ProtocolError past)."""
        try:
            async with self._http.stream(method, self._absolute_url(path), **kwargs) as streamed:
                response = await self._read_bounded(streamed, path)
        except httpx.TransportError as exc:
            raise _map_transport_error(exc, self._url(path)) from None
        if response.status_code >= 300:
            raise_for_status(response, self._url(path))
        return response

    async def _read_bounded(self, response: httpx.Response, path: str) -> httpx.Response:
        """The streamed reply as a read one: its body read in pieces, so that a body that
        never ends costs `max_reply_bytes` (a ProtocolError past it)."""
        body = await self._bounded_body(response, path)  # decoded (gzip, br, ...) already
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length")]
        return httpx.Response(response.status_code, headers=headers, content=body,
                              request=response.request, extensions=response.extensions)

    async def _bounded_body(self, response: httpx.Response, path: str) -> bytes:
        """The body, read in pieces so that one that never ends costs `max_reply_bytes`."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_reply_bytes:
                raise ProtocolError(f"reply body larger than {self.max_reply_bytes} bytes "
                                    "(max_reply_bytes)", self._url(path))
            chunks.append(chunk)
        return b"".join(chunks)

    def _json(self, response: httpx.Response, path: str) -> Any:
        try:
            return _decoder.decode(response.content)
        except msgspec.DecodeError:
            snippet = response.text[:80].replace("\n", " ")
            raise ProtocolError(f"reply is not JSON: {snippet!r}", self._url(path)) from None

    async def generate(self, payload: Mapping[str, Any]) -> GenerateResult:
        """POST /generate for one prompt (non-streaming); aborts and HTTP errors raise."""
        timer = _Timer()
        response = await self._request("POST", "/generate", content=_encoder.encode(payload),
                                       headers=_JSON_HEADERS)
        try:
            reply = _reply_decoder.decode(response.content)
        except msgspec.DecodeError:
            return parse_generate_reply(self._json(response, "/generate"), self._url("/generate"),
                                        elapsed=timer.elapsed())
        return _result_from_reply(reply, self._url("/generate"), timer.elapsed())

    async def chat_generate(self, payload: Mapping[str, Any]) -> tuple[GenerateResult, list[int]]:
        """POST /v1/chat/completions for one conversation, non-streaming, with
        ``return_token_ids`` and ``return_meta_info`` set: the generation as /generate gives it
        and the prompt ids the server rendered. A reply without them (an older server, another
        engine) is a ProtocolError; aborts and HTTP errors raise."""
        timer = _Timer()
        url = self._url(CHAT_PATH)
        response = await self._request("POST", CHAT_PATH, content=_encoder.encode(payload),
                                       headers=_JSON_HEADERS)
        try:
            reply = _chat_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"reply is not a chat completion: {exc}", url) from None
        choice = reply.choices[0] if reply.choices else _ChatChoice()
        if (choice.prompt_token_ids is None or choice.response_token_ids is None
                or choice.meta_info is None):
            raise ProtocolError("the chat completion has no prompt_token_ids, "
                                "response_token_ids and meta_info (the server must take "
                                "return_token_ids and return_meta_info: SGLang 0.5.23 does)", url)
        generated = _result_from_reply(Reply(choice.meta_info, choice.response_token_ids), url,
                                       timer.elapsed())
        return generated, choice.prompt_token_ids

    async def generate_json(self, payload: Mapping[str, Any]) -> Any:
        """POST /generate, its reply as decoded JSON: for the fields a GenerateResult leaves
        out (a prefill-only request's input logprobs); HTTP errors raise."""
        response = await self._request("POST", "/generate", content=_encoder.encode(payload),
                                       headers=_JSON_HEADERS)
        return self._json(response, "/generate")

    async def generate_stream(self, payload: Mapping[str, Any]) -> AsyncIterator[StreamChunk]:
        """POST /generate with stream=true; yields cumulative chunks with arrival times."""
        timer = _Timer()
        body = {**payload, "stream": True}
        url = self._url("/generate")
        try:
            async with self._http.stream("POST", "/generate", json=body) as response:
                if response.status_code >= 300:
                    raise_for_status(await self._read_bounded(response, "/generate"), url)
                async for chunk in self._iter_sse(response, url, timer):
                    yield chunk
        except httpx.TransportError as exc:
            raise _map_transport_error(exc, url) from None

    async def _iter_sse(
        self, response: httpx.Response, url: str, timer: _Timer
    ) -> AsyncIterator[StreamChunk]:
        last: Any = None
        async for line in self._bounded_lines(response, url):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                last = _decoder.decode(data)
            except msgspec.DecodeError:
                raise ProtocolError(f"bad stream chunk: {data[:80]!r}", url) from None
            if isinstance(last, dict) and "error" in last:
                raise _stream_error(last["error"], url)
            ids = last.get("output_ids", []) if isinstance(last, dict) else []
            yield StreamChunk(output_ids=ids, at=time.perf_counter())
        if last is None:
            raise ProtocolError("stream ended without a chunk", url)
        result = parse_generate_reply(last, url, elapsed=timer.elapsed())
        yield StreamChunk(output_ids=result.output_ids, at=time.perf_counter(), result=result)

    async def _bounded_lines(self, response: httpx.Response, url: str) -> AsyncIterator[str]:
        """The stream's lines; a line past `max_reply_bytes` is a ProtocolError."""
        pending: list[str] = []
        size = 0
        async for text in response.aiter_text():
            start = 0
            while (end := text.find("\n", start)) >= 0:
                pending.append(text[start:end])
                yield "".join(pending).rstrip("\r")
                pending, size, start = [], 0, end + 1
            pending.append(text[start:])
            size += len(text) - start
            if size > self.max_reply_bytes:
                raise ProtocolError(f"stream event larger than {self.max_reply_bytes} bytes "
                                    "(max_reply_bytes)", url)
        if any(pending):
            yield "".join(pending).rstrip("\r")

    async def _probe(self, *paths: str) -> Any:
        """GET the first of `paths` that exists (404 falls through to the next)."""
        last_error: RequestFailed | None = None
        for path in paths:
            try:
                return self._json(await self._request("GET", path), path)
            except BadRequest as exc:
                if exc.http_status != 404:
                    raise
                last_error = exc
            except ConnectionLost as exc:
                url = redact_url(self.base_url)
                raise ServerUnreachable(f"cannot reach the server at {url}: {exc}", url) from None
        assert last_error is not None
        raise last_error

    async def server_info(self) -> dict[str, Any]:
        """`/server_info` (newer servers) or `/get_server_info` (older), without the API key."""
        info = await self._probe("/server_info", "/get_server_info")
        if not isinstance(info, dict):
            raise ProtocolError("server_info is not a JSON object", self._url("/server_info"))
        return {k: _redact_command(v) if k == "launch_command" else v
                for k, v in info.items() if not is_secret_name(k)}

    async def model_info(self) -> dict[str, Any]:
        """`/model_info` (newer) or `/get_model_info` (older)."""
        info = await self._probe("/model_info", "/get_model_info")
        if not isinstance(info, dict):
            raise ProtocolError("model_info is not a JSON object", self._url("/model_info"))
        return info

    async def abort_request(self, rid: str) -> bool:
        """POST /abort_request: ask the server to stop generating request `rid` (a client
        that gives up on a request does not stop it in every SGLang version); False when
        the server cannot be asked or does not know the endpoint."""
        try:
            await self._request("POST", "/abort_request", content=_encoder.encode({"rid": rid}),
                                headers=_JSON_HEADERS, timeout=10.0)
        except RequestFailed:
            return False
        return True

    async def health(self, *, generate: bool = False) -> bool:
        """True when `/health` (or `/health_generate`) answers 200."""
        path = "/health_generate" if generate else "/health"
        try:
            await self._request("GET", path)
        except RequestFailed:
            return False
        return True

    async def metrics(self) -> str | None:
        """Prometheus text from `/metrics`, or None when the server runs without metrics."""
        try:
            response = await self._request("GET", "/metrics")
        except BadRequest as exc:
            if exc.http_status == 404:
                return None
            raise
        return response.text

    async def flush_cache(self) -> bool:
        """POST /flush_cache; False when the server refuses (requests still running)."""
        try:
            await self._request("POST", "/flush_cache")
        except BadRequest:
            return False
        return True

    async def workers(self) -> list[dict[str, Any]] | None:
        """The workers behind an sglang-router (`/workers`, older `/list_workers`), each as
        `{"url", "healthy", "load"}` (None where the router does not say); None for a server."""
        try:
            data = await self._probe("/workers", "/list_workers")
        except BadRequest as exc:
            if exc.http_status in (404, 405):
                return None
            raise
        return _worker_list(data, self._url("/workers"))


def _worker_list(data: Any, url: str) -> list[dict[str, Any]]:
    """`{"workers": [{"url", "is_healthy", "load"}, ...]}` or `{"urls": [...]}` as one shape."""
    if isinstance(data, dict) and isinstance(data.get("workers"), list):
        return [
            {"url": str(w.get("url")), "healthy": w.get("is_healthy"), "load": w.get("load")}
            for w in data["workers"] if isinstance(w, dict) and w.get("url")
        ]
    if isinstance(data, dict) and isinstance(data.get("urls"), list):
        return [{"url": str(u), "healthy": None, "load": None} for u in data["urls"]]
    raise ProtocolError("the worker list is not sglang-router's shape", url)
