"""HTTP/1.1 messages as fnmap's server and client hold them, and the limits both sides apply.

The parsing itself is in :mod:`.http_requests` (the server side) and :mod:`.http_responses` (the
client side); :mod:`.httpwire` picks the parser and is the module the rest of fnmap imports.
"""

from __future__ import annotations

import re
from http import HTTPStatus

#: The most bytes a message's head (request or status line and headers) may have; more is 431.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 200
#: Bytes read from a socket at a time.
READ_SIZE = 256 * 1024

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
OBS_FOLD = re.compile(rb"\n[ \t]")
END_OF_HEAD = re.compile(rb"\r?\n\r?\n")


def reason_phrase(status: int) -> str:
    """``OK`` for 200: the phrase of an HTTP status line."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class ProtocolError(OSError):
    """The server's answer was not HTTP/1.x as expected (or the connection closed mid-answer)."""


class BadRequest(Exception):
    """A request the server refuses: answer ``status`` with ``message`` and close the connection."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Request:
    """One parsed request: header names in lower case, repeats joined with ", "."""

    __slots__ = ("method", "target", "version", "headers", "body", "keep_alive")

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str], body: bytes,
                 keep_alive: bool):
        self.method, self.target, self.version = method, target, version
        self.headers, self.body, self.keep_alive = headers, body, keep_alive


class Headers(dict):
    """Answer headers by lower-case name; ``get`` accepts any case."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


class Response:
    """One answer to fnmap's client; ``headers`` by lower-case name."""

    __slots__ = ("status", "headers", "body", "will_close")

    def __init__(self, status: int, headers: Headers, body: bytes, will_close: bool):
        self.status = status
        self.headers = headers
        self.body = body
        self.will_close = will_close


def add_header(headers: dict[str, str], name: str, value: str) -> None:
    headers[name] = f"{headers[name]}, {value}" if name in headers else value


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def wants_keep_alive(version: str, headers: dict[str, str]) -> bool:
    connection = _tokens(headers.get("connection", ""))
    return "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)


def too_many_headers(count: int) -> BadRequest:
    return BadRequest(431, f"more than {MAX_HEADERS} header fields ({count}); send fewer")


def head_too_large(size: int) -> BadRequest:
    return BadRequest(431, f"the request's line and headers exceed {MAX_HEAD} bytes ({size} so far); "
                           "large values travel in the body")


def body_too_large(size: int, max_body: int) -> BadRequest:
    return BadRequest(413, f"request body of {size} bytes exceeds {max_body}; large arguments travel "
                           "through storage")


class HeadWatch:
    """The raw head of a message as h11 receives it, kept for the checks h11 does not make."""

    def __init__(self):
        self.data = b""

    def add(self, data: bytes) -> None:
        if len(self.data) <= MAX_HEAD:
            self.data += data[: MAX_HEAD + 4 - len(self.data)]

    def check(self) -> None:
        data = self.data.lstrip(b"\r\n")  # blank lines before a request line are allowed
        end = END_OF_HEAD.search(data)
        if end is None:
            raise head_too_large(len(self.data))
        head = data[: end.start()]
        if OBS_FOLD.search(head):
            raise BadRequest(400, "malformed HTTP request: obs-fold (a header line that starts with "
                                  "whitespace) is refused; send each header on one line")


def format_request(method: str, target: str, host: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
