"""A minimal HTTP/1.1 keep-alive client for plain ``http://`` POSTs on the per-call path.

``http.client`` parses every response's headers with the ``email`` package's
feed parser and builds the request header by header; on a noop job that was
about half of the client's CPU per call (issue 9).  This client sends one
request buffer and reads the status line, headers and body (``Content-Length``,
chunked, or up to the close) itself.  It speaks only what fnmap needs: POST with
a body, a response per request, no 1xx other than ``100 Continue``, no trailers.
"""

from __future__ import annotations

import socket
from http import HTTPStatus

_MAX_LINE = 65536
_MAX_HEADERS = 200
#: Bodies larger than this are sent with a second ``sendall`` instead of being copied onto the head.
_JOIN_LIMIT = 64 * 1024


class ProtocolError(OSError):
    """The server's answer was not HTTP/1.x as expected (or the connection closed mid-answer)."""


#: A call with no ``timeout`` may run for hours, so no read timeout applies to it; TCP keep-alive
#: probes instead find a host that vanished without closing the connection (about 2 minutes).
_KEEPALIVE = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))


def _keep_alive_probes(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        option = getattr(socket, name, None)  # Linux names; macOS has only some of them
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class Headers(dict):
    """Response headers by lower-case name; ``get`` accepts any case."""

    def get(self, name: str, default=None):
        return super().get(name.lower(), default)


class Response:
    __slots__ = ("status", "headers", "body", "will_close")

    def __init__(self, status: int, headers: Headers, body: bytes, will_close: bool):
        self.status = status
        self.headers = headers
        self.body = body
        self.will_close = will_close


class Connection:
    """One keep-alive connection to ``host:port`` (not thread-safe: one per thread)."""

    __slots__ = ("host", "port", "sock", "_rfile", "_host_header")

    def __init__(self, host: str, port: int, connect_timeout: float):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _keep_alive_probes(self.sock)
        self._rfile = self.sock.makefile("rb")
        self._host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"

    def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float | None) -> Response:
        """Send one POST and read its whole answer.  Raises ``TimeoutError`` when no answer
        comes within ``timeout`` seconds, ``OSError`` (``ProtocolError``) on a broken connection."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.settimeout(timeout)
        if len(body) <= _JOIN_LIMIT:
            self.sock.sendall(head + body)
        else:
            self.sock.sendall(head)
            self.sock.sendall(body)
        while True:
            response = self._read_response()
            if response.status != 100:
                return response

    def _read_response(self) -> Response:
        rfile = self._rfile
        line = rfile.readline(_MAX_LINE + 1)
        if not line:
            raise ProtocolError("the server closed the connection without answering")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {line[:100]!r}")
        http10 = parts[0] == b"HTTP/1.0"
        status = int(parts[1])
        headers = Headers(read_headers(rfile))
        connection = headers.get("connection", "").lower()
        will_close = "close" in connection or (http10 and "keep-alive" not in connection)
        if status in (100, 204, 304):
            return Response(status, headers, b"", will_close)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = read_chunked(rfile)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise ProtocolError(f"bad Content-Length {headers['content-length']!r}") from None
            body = rfile.read(length)
            if len(body) != length:
                raise ProtocolError(f"the connection closed after {len(body)} of {length} body bytes")
        else:  # the body runs to the end of the connection
            body = rfile.read()
            will_close = True
        return Response(status, headers, body, will_close)

    def close(self) -> None:
        try:
            self._rfile.close()
        finally:
            self.sock.close()


def read_headers(rfile) -> dict[str, str]:
    """Header lines up to the blank line, by lower-case name (repeats joined with ", "); the
    emulator's server reads request headers with it too.  Raises :class:`ProtocolError`."""
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = rfile.readline(_MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return headers
        if not line:
            raise ProtocolError("the connection closed inside the headers")
        name, sep, value = line.partition(b":")
        if not sep or not name.strip():
            raise ProtocolError(f"malformed header line: {line[:100]!r}")
        key = name.strip().lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    raise ProtocolError(f"more than {_MAX_HEADERS} headers")


def reason_phrase(status: int) -> str:
    """``OK`` for 200: the phrase of an HTTP status line."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def read_chunked(rfile, max_bytes: int | None = None) -> bytes:
    """Read a chunked message body from ``rfile`` (trailers skipped); the emulator's server
    reads request bodies with it too.  Raises :class:`ProtocolError` when it is malformed,
    cut short, or longer than ``max_bytes``."""
    pieces, total = [], 0
    while True:
        line = rfile.readline(_MAX_LINE + 1)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size line {line[:100]!r}") from None
        if size == 0:
            while rfile.readline(_MAX_LINE + 1) not in (b"\r\n", b"\n", b""):
                pass  # trailers: none expected, skipped
            return b"".join(pieces)
        total += size
        if max_bytes is not None and total > max_bytes:
            raise ProtocolError(f"the chunked body exceeds {max_bytes} bytes")
        piece = rfile.read(size)
        if len(piece) != size or rfile.readline(_MAX_LINE + 1) not in (b"\r\n", b"\n"):
            raise ProtocolError("the connection closed inside a chunk")
        pieces.append(piece)
