"""The client side of :mod:`.httpwire`: answers read from a socket with httptools or h11."""

from __future__ import annotations

import socket
from collections import deque

from .http_messages import (
    MAX_HEAD,
    MAX_HEADERS,
    READ_SIZE,
    BadRequest,
    Headers,
    HeadWatch,
    ProtocolError,
    Response,
    add_header,
    format_request,
)


class HttptoolsResponseReader:
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
        add_header(self._headers, name.decode("latin-1").lower(), value.decode("latin-1"))

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


class H11ResponseReader:
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
        head = HeadWatch()
        if self._pending:
            head.add(self._pending)
            conn.receive_data(self._pending)
            self._pending = b""
        try:
            response, body = self._receive(conn, head)
        except h11.RemoteProtocolError as e:
            raise ProtocolError(f"malformed HTTP answer: {e}") from None
        except h11.LocalProtocolError as e:
            raise ProtocolError(f"the answer does not fit the request: {e}") from None
        headers = Headers()
        for name, value in response.headers:
            add_header(headers, name.decode("latin-1"), value.decode("latin-1"))
        if "transfer-encoding" in headers and "content-length" in headers:
            raise ProtocolError("the answer has both Content-Length and Transfer-Encoding (RFC 9112 section 6.1)")
        will_close = conn.their_state is not h11.DONE or conn.our_state is not h11.DONE
        self._pending = bytes(conn.trailing_data[0])
        return Response(response.status_code, headers, body, will_close)

    def _receive(self, conn, head: HeadWatch):
        """h11's events up to the end of one answer (a ``100 Continue`` skipped): (its event, its body)."""
        h11 = self.h11
        response, pieces, received = None, [], False
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
                head = HeadWatch()  # the final answer's head comes after this one's
                head.add(bytes(conn.trailing_data[0]))
            elif isinstance(event, h11.Response):
                response = event
                _check_head(head)
            elif isinstance(event, h11.Data):
                pieces.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return response, b"".join(pieces)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                raise ProtocolError("the connection closed inside the answer")


def _check_head(head: HeadWatch) -> None:
    try:
        head.check()
    except BadRequest as e:
        raise ProtocolError(str(e).replace("request", "answer")) from None
