"""HTTP/1.1 message parsing shared by the emulator's server and fnmap's client connection.

Parsing is left to a maintained parser, as uvicorn does: httptools (llhttp, the
parser of Node.js) where it can be imported, h11 (pure Python) where it cannot.
Both refuse what RFC 9112 forbids and hand-written parsers let through (issue 12):
chunk sizes such as ``+10``, ``0x10``, ``1_0`` or ``-1``, whitespace before a
header's colon, a ``Transfer-Encoding`` other than ``chunked``, ``Content-Length``
together with ``Transfer-Encoding``.  This module adds what neither does alone:
limits on the size of a message's head and body, a refusal of obs-fold lines (h11
would unfold them), and the choice of parser.

``FNMAP_HTTP_PARSER`` (``httptools`` or ``h11``) picks the parser of a process,
so that the fallback can be tested; the server and client take ``parser=`` too.
It lives outside ``backends/`` because the worker side (the emulator's server,
``http_app``) must not import the client side.
"""

from __future__ import annotations

import os
import re
import socket
from collections import deque
from http import HTTPStatus

PARSERS = ("httptools", "h11")
#: The most bytes a message's head (request or status line and headers) may have; more is 431.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 200
#: Bytes read from a socket at a time.
READ_SIZE = 256 * 1024

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_OBS_FOLD = re.compile(rb"\n[ \t]")
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")


def _default_parser() -> str:
    chosen = os.environ.get("FNMAP_HTTP_PARSER", "").strip().lower()
    if chosen:
        if chosen not in PARSERS:
            raise ValueError(f"FNMAP_HTTP_PARSER={chosen!r} is not a parser fnmap knows; "
                             f"set it to one of {', '.join(PARSERS)} or leave it unset")
        return chosen
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


#: The parser this process uses unless told otherwise.
PARSER = _default_parser()


def check_parser(parser: str) -> str:
    if parser not in PARSERS:
        raise ValueError(f"unknown HTTP parser {parser!r}: use one of {', '.join(PARSERS)}")
    return parser


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


def _add_header(headers: dict[str, str], name: str, value: str) -> None:
    headers[name] = f"{headers[name]}, {value}" if name in headers else value


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    connection = _tokens(headers.get("connection", ""))
    return "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)


def _too_many_headers(count: int) -> BadRequest:
    return BadRequest(431, f"more than {MAX_HEADERS} header fields ({count}); send fewer")


def _head_too_large(size: int) -> BadRequest:
    return BadRequest(431, f"the request's line and headers exceed {MAX_HEAD} bytes ({size} so far); "
                           "large values travel in the body")


def _body_too_large(size: int, max_body: int) -> BadRequest:
    return BadRequest(413, f"request body of {size} bytes exceeds {max_body}; large arguments travel "
                           "through storage")


# -- the server side: requests -------------------------------------------------------


def _head_complete(sock, length: int | None) -> None:
    mark = getattr(sock, "head_complete", None)
    if mark is not None:
        mark(length)


def request_reader(sock, max_body: int, parser: str | None = None):
    """A reader of the requests that arrive on ``sock`` (a socket, or a
    :class:`~fnmap.runtime.deadlines.TimedConnection`, told when each head is complete):
    ``read()`` returns the next :class:`Request`, None once the client has closed, or raises
    :class:`BadRequest` (``TimeoutError`` past a ``TimedConnection``'s deadline)."""
    if check_parser(parser or PARSER) == "httptools":
        return _HttptoolsRequestReader(sock, max_body)
    return _H11RequestReader(sock, max_body)


class _HttptoolsRequestReader:
    """Requests through llhttp's callbacks; pipelined requests that arrive together are queued."""

    def __init__(self, sock: socket.socket, max_body: int):
        import httptools

        self.sock, self.max_body = sock, max_body
        self._errors = httptools.HttpParserError
        self._upgrade = httptools.HttpParserUpgrade
        self._parser = httptools.HttpRequestParser(self)
        self._ready: deque[Request] = deque()
        self._failure: BadRequest | None = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._in_head, self._head_done, self._head_size, self._url = False, False, 0, b""
        self._headers: dict[str, str] = {}
        self._count, self._body, self._body_size = 0, [], 0
        #: Bytes received while the head stays incomplete, from the read after the one where the
        #: head began: llhttp gathers a field until it ends, so this bounds the memory a huge field takes.
        self._head_backlog = None

    def read(self) -> Request | None:
        while not self._ready:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                return None
            data = self.sock.recv(READ_SIZE)
            if not data:
                return None  # closed between requests, or mid-request: nothing to answer
            self._feed(data)
        return self._ready.popleft()

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except self._upgrade:
            self._closed = True  # an upgrade fnmap does not speak: answer what came, then close
            if self._ready:
                self._ready[-1].keep_alive = False
            return
        except self._errors as e:
            if self._failure is None:
                self._failure = BadRequest(400, f"malformed HTTP request: {e}")
            return
        if self._in_head:
            if self._head_backlog is None:
                self._head_backlog = 0  # the head began in this read: only its fields count so far
            else:
                self._head_backlog += len(data)
                if self._head_backlog > MAX_HEAD:
                    self._failure = _head_too_large(self._head_backlog)

    # llhttp's callbacks; an exception raised in one stops the parser.

    def on_message_begin(self) -> None:
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._check_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:
            return  # a trailer field after a chunked body: not a header of the request
        self._count += 1
        if self._count > MAX_HEADERS:
            self._fail(_too_many_headers(self._count))
        self._check_head(len(name) + len(value) + 4)
        _add_header(self._headers, name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self._in_head, self._head_done = False, True
        version = "HTTP/" + self._parser.get_http_version()
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            self._fail(BadRequest(505, f"{version} is not supported; speak HTTP/1.1"))
        length = self._headers.get("content-length")
        if length is not None and int(length) > self.max_body:
            self._fail(_body_too_large(int(length), self.max_body))
        chunked = "transfer-encoding" in self._headers
        _head_complete(self.sock, None if chunked else int(length or 0))
        if self._headers.get("expect", "").lower() == "100-continue" and (chunked or (length and int(length))):
            self.sock.sendall(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.max_body:
            self._fail(_body_too_large(self._body_size, self.max_body))
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        version = "HTTP/" + parser.get_http_version()
        self._ready.append(Request(parser.get_method().decode("latin-1"), self._url.decode("latin-1"),
                                   version, self._headers, b"".join(self._body), parser.should_keep_alive()))
        self._start()

    def _check_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD:
            self._fail(_head_too_large(self._head_size))

    def _fail(self, failure: BadRequest):
        self._failure = failure
        raise failure


class _H11RequestReader:
    """Requests through h11, one ``h11.Connection`` per request (fnmap writes the answers itself)."""

    def __init__(self, sock: socket.socket, max_body: int):
        import h11

        self.h11, self.sock, self.max_body = h11, sock, max_body
        self._pending = b""  # bytes received after the previous request
        self._closed = False

    def read(self) -> Request | None:
        h11 = self.h11
        if self._closed:
            return None
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        head = _HeadWatch()
        if self._pending:
            head.add(self._pending)
            conn.receive_data(self._pending)
        request, pieces, size = None, [], 0
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = self.sock.recv(READ_SIZE)
                    if not data:
                        return None
                    if request is None:
                        head.add(data)
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                    headers = self._check(event, head)
                    chunked = "transfer-encoding" in headers
                    _head_complete(self.sock, None if chunked else int(headers.get("content-length", "0") or 0))
                    if headers.get("expect", "").lower() == "100-continue" and (
                            "transfer-encoding" in headers or int(headers.get("content-length", "0") or 0)):
                        self.sock.sendall(_CONTINUE)
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > self.max_body:
                        raise _body_too_large(size, self.max_body)
                    pieces.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    return None
        except h11.RemoteProtocolError as e:
            raise BadRequest(e.error_status_hint, f"malformed HTTP request: {e}") from None
        data, closed = conn.trailing_data
        self._pending = bytes(data)
        version = "HTTP/" + request.http_version.decode("latin-1")
        keep_alive = _keep_alive(version, headers)
        if conn.their_state is h11.MIGHT_SWITCH_PROTOCOL:
            keep_alive = False  # an upgrade fnmap does not speak: answer, then close
        self._closed = closed or not keep_alive
        return Request(request.method.decode("latin-1"), request.target.decode("latin-1"), version, headers,
                       b"".join(pieces), keep_alive)

    def _check(self, event, head: _HeadWatch) -> dict[str, str]:
        head.check()
        if len(event.headers) > MAX_HEADERS:
            raise _too_many_headers(len(event.headers))
        headers: dict[str, str] = {}
        for name, value in event.headers:
            _add_header(headers, name.decode("latin-1"), value.decode("latin-1"))
        if "transfer-encoding" in headers and "content-length" in headers:
            raise BadRequest(400, "a request with both Content-Length and Transfer-Encoding is refused "
                                  "(RFC 9112 section 6.1); send one of them")
        if event.http_version not in (b"1.0", b"1.1"):
            raise BadRequest(505, f"HTTP/{event.http_version.decode()} is not supported; speak HTTP/1.1")
        length = headers.get("content-length")
        if length is not None and int(length) > self.max_body:
            raise _body_too_large(int(length), self.max_body)
        return headers


class _HeadWatch:
    """The raw head of a message as h11 receives it, kept for the checks h11 does not make."""

    def __init__(self):
        self.data = b""

    def add(self, data: bytes) -> None:
        if len(self.data) <= MAX_HEAD:
            self.data += data[: MAX_HEAD + 4 - len(self.data)]

    def check(self) -> None:
        data = self.data.lstrip(b"\r\n")  # blank lines before a request line are allowed
        end = _END_OF_HEAD.search(data)
        if end is None:
            raise _head_too_large(len(self.data))
        head = data[: end.start()]
        if _OBS_FOLD.search(head):
            raise BadRequest(400, "malformed HTTP request: obs-fold (a header line that starts with "
                                  "whitespace) is refused; send each header on one line")


# -- the client side: responses ------------------------------------------------------


def response_reader(sock: socket.socket, parser: str | None = None):
    """The client's side of a connection: ``encode(...)`` gives the bytes to send for a request
    (its head, then its body), ``read()`` the answer.  Raises :class:`ProtocolError`."""
    if check_parser(parser or PARSER) == "httptools":
        return _HttptoolsResponseReader(sock)
    return _H11ResponseReader(sock)


def format_request(method: str, target: str, host: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _HttptoolsResponseReader:
    """Answers through llhttp's callbacks (a ``100 Continue`` is an answer of its own)."""

    def __init__(self, sock: socket.socket):
        import httptools

        self.sock = sock
        self._errors = httptools.HttpParserError
        self._parser = httptools.HttpResponseParser(self)
        self._ready: deque[Response] = deque()
        self._received = 0
        self._start()

    def _start(self) -> None:
        self._in_head, self._head_size, self._head_backlog = False, 0, None
        self._headers = Headers()
        self._count, self._body, self._complete_head = 0, [], False

    def encode(self, method: str, target: str, host: str, headers: dict[str, str],
               body: bytes) -> tuple[bytes, bytes]:
        self._received = 0
        return format_request(method, target, host, headers, len(body)), body

    def answer_started(self) -> bool:
        """Whether any byte of the answer to the last request arrived."""
        return self._received > 0

    def read(self) -> Response:
        while not self._ready:
            data = self.sock.recv(READ_SIZE)
            if not data:
                return self._at_close()
            self._received += len(data)
            try:
                self._parser.feed_data(data)
            except self._errors as e:
                cause = e.__context__ if isinstance(e.__context__, ProtocolError) else None
                raise cause or ProtocolError(f"malformed HTTP answer: {e}") from None
            if self._in_head:  # a bound on what llhttp gathers of a field that does not end
                self._head_backlog = 0 if self._head_backlog is None else self._head_backlog + len(data)
                if self._head_backlog > MAX_HEAD:
                    raise ProtocolError(f"the answer's status line and headers exceed {MAX_HEAD} bytes")
        return self._ready.popleft()

    def _at_close(self) -> Response:
        if not self._complete_head:
            if not self._received:
                raise ProtocolError("the server closed the connection without answering")
            raise ProtocolError("the connection closed inside the answer's status line or headers")
        if "content-length" in self._headers or "transfer-encoding" in self._headers:
            got = sum(map(len, self._body))
            raise ProtocolError(f"the connection closed after {got} of "
                                f"{self._headers.get('content-length', 'the chunked')} body bytes")
        # No length and not chunked: the body runs to the end of the connection.
        response = Response(self._parser.get_status_code(), self._headers, b"".join(self._body), True)
        self._start()
        return response

    def on_message_begin(self) -> None:
        self._in_head = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._complete_head:
            return  # a trailer field after a chunked body
        self._count += 1
        self._head_size += len(name) + len(value) + 4
        if self._count > MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} header fields in the answer")
        if self._head_size > MAX_HEAD:
            raise ProtocolError(f"the answer's headers exceed {MAX_HEAD} bytes")
        _add_header(self._headers, name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self._in_head, self._complete_head = False, True
        coding = self._headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":  # llhttp would read to the close
            raise ProtocolError(f"the answer's Transfer-Encoding is {coding!r}; fnmap reads only chunked")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        will_close = not parser.should_keep_alive()
        self._ready.append(Response(parser.get_status_code(), self._headers, b"".join(self._body), will_close))
        self._start()


class _H11ResponseReader:
    def __init__(self, sock: socket.socket):
        import h11

        self.h11, self.sock = h11, sock
        self._conn = None
        self._pending = b""
        self._received = False

    def answer_started(self) -> bool:
        """Whether any byte of the answer to the last request arrived."""
        return self._received

    def encode(self, method: str, target: str, host: str, headers: dict[str, str],
               body: bytes) -> tuple[bytes, bytes]:
        h11 = self.h11
        self._received = bool(self._pending)
        self._conn = conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        fields = [("Host", host), ("Content-Length", str(len(body))), *headers.items()]
        head = conn.send(h11.Request(method=method, target=target, headers=fields))
        data = conn.send(h11.Data(data=body)) if body else b""
        conn.send(h11.EndOfMessage())
        return head, data

    def read(self) -> Response:
        h11, conn = self.h11, self._conn
        head = _HeadWatch()
        if self._pending:
            head.add(self._pending)
            conn.receive_data(self._pending)
            self._pending = b""
        response, pieces, received = None, [], False
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = self.sock.recv(READ_SIZE)
                    if not data and not received:
                        raise ProtocolError("the server closed the connection without answering")
                    received = self._received = True
                    if response is None:
                        head.add(data)
                    conn.receive_data(data)
                elif isinstance(event, h11.InformationalResponse):
                    head = _HeadWatch()  # the final answer's head comes after this one's
                    head.add(bytes(conn.trailing_data[0]))
                elif isinstance(event, h11.Response):
                    response = event
                    try:
                        head.check()
                    except BadRequest as e:
                        raise ProtocolError(str(e).replace("request", "answer")) from None
                elif isinstance(event, h11.Data):
                    pieces.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    raise ProtocolError("the connection closed inside the answer")
        except h11.RemoteProtocolError as e:
            raise ProtocolError(f"malformed HTTP answer: {e}") from None
        except h11.LocalProtocolError as e:
            raise ProtocolError(f"the answer does not fit the request: {e}") from None
        headers = Headers()
        for name, value in response.headers:
            _add_header(headers, name.decode("latin-1"), value.decode("latin-1"))
        if "transfer-encoding" in headers and "content-length" in headers:
            raise ProtocolError("the answer has both Content-Length and Transfer-Encoding (RFC 9112 section 6.1)")
        will_close = conn.their_state is not h11.DONE or conn.our_state is not h11.DONE
        self._pending = bytes(conn.trailing_data[0])
        return Response(response.status_code, headers, b"".join(pieces), will_close)
