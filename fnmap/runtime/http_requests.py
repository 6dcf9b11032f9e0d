"""The server side of :mod:`.httpwire`: requests read from a socket with httptools or h11."""

from __future__ import annotations

import socket
from collections import deque

from .http_messages import (
    CONTINUE,
    MAX_HEAD,
    MAX_HEADERS,
    READ_SIZE,
    BadRequest,
    HeadWatch,
    Request,
    add_header,
    body_too_large,
    head_too_large,
    too_many_headers,
    wants_keep_alive,
)


def _head_complete(sock, length: int | None) -> None:
    mark = getattr(sock, "head_complete", None)
    if mark is not None:
        mark(length)


class HttptoolsRequestReader:
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
                    self._failure = head_too_large(self._head_backlog)

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
            self._fail(too_many_headers(self._count))
        self._check_head(len(name) + len(value) + 4)
        add_header(self._headers, name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self._in_head, self._head_done = False, True
        version = "HTTP/" + self._parser.get_http_version()
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            self._fail(BadRequest(505, f"{version} is not supported; speak HTTP/1.1"))
        length = self._headers.get("content-length")
        if length is not None and int(length) > self.max_body:
            self._fail(body_too_large(int(length), self.max_body))
        chunked = "transfer-encoding" in self._headers
        _head_complete(self.sock, None if chunked else int(length or 0))
        if self._headers.get("expect", "").lower() == "100-continue" and (chunked or (length and int(length))):
            self.sock.sendall(CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.max_body:
            self._fail(body_too_large(self._body_size, self.max_body))
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
            self._fail(head_too_large(self._head_size))

    def _fail(self, failure: BadRequest):
        self._failure = failure
        raise failure


class H11RequestReader:
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
        head = HeadWatch()
        if self._pending:
            head.add(self._pending)
            conn.receive_data(self._pending)
        try:
            received = self._receive(conn, head)
        except h11.RemoteProtocolError as e:
            raise BadRequest(e.error_status_hint, f"malformed HTTP request: {e}") from None
        if received is None:
            return None
        request, headers, body = received
        data, closed = conn.trailing_data
        self._pending = bytes(data)
        version = "HTTP/" + request.http_version.decode("latin-1")
        keep_alive = wants_keep_alive(version, headers)
        if conn.their_state is h11.MIGHT_SWITCH_PROTOCOL:
            keep_alive = False  # an upgrade fnmap does not speak: answer, then close
        self._closed = closed or not keep_alive
        return Request(request.method.decode("latin-1"), request.target.decode("latin-1"), version, headers,
                       body, keep_alive)

    def _receive(self, conn, head: HeadWatch):
        """h11's events up to the end of one request: (its event, its headers, its body), or None
        where the connection closed first."""
        h11 = self.h11
        request, headers, pieces, size = None, None, [], 0
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
                request, headers = event, self._begin(event, head)
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_body:
                    raise body_too_large(size, self.max_body)
                pieces.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, headers, b"".join(pieces)
            elif event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                return None

    def _begin(self, event, head: HeadWatch) -> dict[str, str]:
        """A request's head has arrived: check it, tell the connection, answer ``Expect: 100-continue``."""
        headers = self._check(event, head)
        chunked = "transfer-encoding" in headers
        _head_complete(self.sock, None if chunked else int(headers.get("content-length", "0") or 0))
        if headers.get("expect", "").lower() == "100-continue" and (
                "transfer-encoding" in headers or int(headers.get("content-length", "0") or 0)):
            self.sock.sendall(CONTINUE)
        return headers

    def _check(self, event, head: HeadWatch) -> dict[str, str]:
        head.check()
        if len(event.headers) > MAX_HEADERS:
            raise too_many_headers(len(event.headers))
        headers: dict[str, str] = {}
        for name, value in event.headers:
            add_header(headers, name.decode("latin-1"), value.decode("latin-1"))
        if "transfer-encoding" in headers and "content-length" in headers:
            raise BadRequest(400, "a request with both Content-Length and Transfer-Encoding is refused "
                                  "(RFC 9112 section 6.1); send one of them")
        if event.http_version not in (b"1.0", b"1.1"):
            raise BadRequest(505, f"HTTP/{event.http_version.decode()} is not supported; speak HTTP/1.1")
        length = headers.get("content-length")
        if length is not None and int(length) > self.max_body:
            raise body_too_large(int(length), self.max_body)
        return headers
