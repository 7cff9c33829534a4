"""The workbench's one exception tree.

    WorkbenchError                  anything the workbench raises on purpose
    ├── InputError                  bad input from the user: the CLI prints one line, exits 2
    │   ├── ConfigError             a parameter file or option: names the key path
    │   ├── DataError               a data file: names the file and the line
    │   └── ResumeMismatch          resuming a run whose model or sampling parameters changed
    ├── ServerError                 talking to a server
    │   ├── ServerUnreachable       cannot connect at all (names the URL); exits 2 in the CLI
    │   └── RequestFailed           one request failed; carries `retryable`, `error_type`,
    │       │                       `http_status`; the runner records it, never crashes on it
    │       ├── BadRequest          HTTP 400 / 413 / 422: never retried
    │       ├── ServerBusy          408, 429, 500, 502, 503, 504: retried
    │       ├── RequestAborted      an abort (SGLang's 5xx error body, or finish_reason.type ==
    │       │                       "abort"): retried; an abort with status 400 is a BadRequest
    │       ├── RequestTimeout      no reply within the timeout: retried
    │       ├── ConnectionLost      connection refused, reset or dropped: retried
    │       └── ProtocolError       a reply that is not SGLang's shape (HTML page, bad JSON)
    ├── StorageError                a file could not be written (disk full, I/O error,
    │                                   read-only): names the file and the free space
    ├── LaunchError                 a server process failed to start or died early
    └── ReportError                 a report notebook failed to execute (names the cell)
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "ConfigError",
    "ConnectionLost",
    "DataError",
    "InputError",
    "LaunchError",
    "ProtocolError",
    "ReportError",
    "RequestAborted",
    "RequestFailed",
    "RequestTimeout",
    "ResumeMismatch",
    "ServerBusy",
    "ServerError",
    "ServerUnreachable",
    "StorageError",
    "WorkbenchError",
]


class WorkbenchError(Exception):
    """Base of every error the workbench raises on purpose."""


class InputError(WorkbenchError):
    """Bad input from the user (files, parameters, options)."""


class ConfigError(InputError):
    """A bad parameter: the message starts with the source (and its line) and the key path."""

    def __init__(self, key: str, message: str, source: str | None = None,
                 line: int | None = None) -> None:
        self.key = key
        self.message = message
        self.source = source
        self.line = line
        where = f"{source}:{line}: " if source and line else f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


class DataError(InputError):
    """A bad data file: the message names the file and (when known) the line."""

    def __init__(self, path: object, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ResumeMismatch(InputError):
    """The output directory holds a run with another model or other sampling parameters."""


class ServerError(WorkbenchError):
    """Talking to a server failed."""

    def __init__(self, message: str, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class ServerUnreachable(ServerError):
    """No connection could be made to the server at all."""


class RequestFailed(ServerError):
    """One request failed. A failed request is data: the runner writes it to errors.jsonl."""

    retryable: bool = True
    error_type: str = "request_failed"

    def __init__(self, message: str, url: str | None = None, http_status: int | None = None) -> None:
        self.http_status = http_status
        super().__init__(message, url)


class BadRequest(RequestFailed):
    retryable = False
    error_type = "bad_request"


class ServerBusy(RequestFailed):
    error_type = "server_error"


class RequestAborted(RequestFailed):
    error_type = "aborted"


class RequestTimeout(RequestFailed):
    error_type = "timeout"


class ConnectionLost(RequestFailed):
    error_type = "connection"


class ProtocolError(RequestFailed):
    error_type = "protocol"


class StorageError(WorkbenchError):
    """A file could not be written: the message names it, the reason and the free space."""

    def __init__(self, path: object, reason: str, free: int | None = None,
                 errno: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.free = free
        self.errno = errno
        super().__init__(f"{self.path}: cannot write: {reason}")


class LaunchError(WorkbenchError):
    """A server process could not be started, or exited before it was healthy."""


class ReportError(WorkbenchError):
    """A report notebook failed to execute: names the cell and the exception."""
