"""The minimal HTTP/1.1 client of the http backend's per-call path (issue 9), against a real
socket server on loopback that answers each request with canned bytes; each test runs with both
parsers (httptools, and h11, the fallback), and malformed answers are refused (issue 12)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading

import pytest

from fnmap.backends import rawhttp

pytestmark = pytest.mark.timeout(60)


class CannedServer:
    """Accepts connections; answers the n-th request with ``answers[n]`` (then closes if told)."""

    def __init__(self, answers: list[tuple[bytes, bool]]):
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.closing = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while self.answers:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            break
                        buf += data
                    if b"\r\n\r\n" not in buf:
                        break
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + buf[:length])
                    buf = buf[length:]
                    answer, close = self.answers.pop(0)
                    if answer is None:  # never answer: hold the connection until close()
                        self.closing.wait(30)
                        break
                    conn.sendall(answer)
                    if close:
                        break

    def close(self):
        self.closing.set()
        self.answers.clear()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        self.sock.close()
        self.thread.join(5)


@pytest.fixture(params=["httptools", "h11"])
def parser(request):
    return request.param


@pytest.fixture
def serve():
    servers = []

    def start(*answers):
        server = CannedServer(answers)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _post(server, parser, body=b"payload", timeout=10):
    conn = rawhttp.Connection("127.0.0.1", server.port, 5, parser)
    try:
        return conn, conn.post("/invoke?x=1", body, {"X-Test": "yes"}, timeout)
    except BaseException:
        conn.close()
        raise


def test_keep_alive_content_length_and_request_format(serve, parser):
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: canned\r\n\r\nhello"
    server = serve((ok, False), (ok, False))
    conn, r = _post(server, parser)
    assert (r.status, r.body, r.will_close) == (200, b"hello", False)
    assert r.headers.get("SERVER") == "canned"
    # No read timeout without a call timeout: keep-alive probes find a vanished host instead.
    assert conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    r2 = conn.post("/invoke?x=1", b"x" * 100_000, {}, 10)  # a large body: sent in two writes
    conn.close()
    assert r2.body == b"hello" and server.connections == 1  # the same connection, kept alive
    head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /invoke?x=1 HTTP/1.1"
    assert b"Content-Length: 7" in head and b"X-Test: yes" in head
    assert server.requests[0].endswith(b"\r\n\r\npayload")
    assert server.requests[1].endswith(b"x" * 100_000)


def test_an_idle_connection_reads_as_ready_once_the_server_closed_it(serve, parser):
    """What the http backend checks before it reuses a connection (a poll object per connection)."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = serve((ok, False), (ok, True))
    conn, _r = _post(server, parser)
    try:
        assert not conn.readable()  # kept alive: nothing more to read
        assert conn.post("/invoke", b"x", {}, 10).body == b"ok"
        server.thread.join(5)  # the server answered the last request and closed the connection
        select.select([conn.sock], [], [], 5)  # its end of the connection has reached this side
        assert conn.readable()
    finally:
        conn.close()


def test_chunked_body_continue_and_repeated_headers(serve, parser):
    answer = (b"HTTP/1.1 100 Continue\r\n\r\n"
              b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\nRetry-After: 2\r\n"
              b"X-A: 1\r\nX-A: 2\r\n\r\n4;ext=1\r\nslow\r\n5\r\n down\r\n0\r\n\r\n")
    server = serve((answer, False))
    conn, r = _post(server, parser)
    conn.close()
    assert (r.status, r.body) == (429, b"slow down")
    assert r.headers.get("retry-after") == "2" and r.headers.get("x-a") == "1, 2"


def test_close_and_body_to_the_end_of_the_connection(serve, parser):
    server = serve((b"HTTP/1.0 500 Oops\r\nContent-Type: text/plain\r\n\r\nbroken worker", True))
    conn, r = _post(server, parser)
    conn.close()
    assert (r.status, r.body, r.will_close) == (500, b"broken worker", True)
    server2 = serve((b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", True))
    conn, r = _post(server2, parser)
    conn.close()
    assert r.will_close and r.body == b"ok"


@pytest.mark.parametrize("answer, match", [
    (b"", "closed the connection without answering"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "after 5 of 10 body bytes|received 5 bytes, expected 10"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed HTTP answer"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed HTTP answer"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed HTTP answer"),
])
def test_broken_answers_raise_protocol_errors(serve, parser, answer, match):
    server = serve((answer, True))
    with pytest.raises(rawhttp.ProtocolError, match=match):
        _post(server, parser)


def test_no_answer_times_out(serve, parser):
    server = serve((None, False))  # reads the request, answers nothing
    conn = rawhttp.Connection("127.0.0.1", server.port, 5)
    try:
        with pytest.raises(TimeoutError):
            conn.post("/", b"x", {}, 0.3)
    finally:
        conn.close()


def _chunked_answer(*lines: str, size: str = "5") -> bytes:
    head = "\r\n".join(["HTTP/1.1 200 OK", *lines]) + "\r\n\r\n"
    return head.encode("latin-1") + size.encode() + b"\r\nhello\r\n0\r\n\r\n"


#: Answers RFC 9112 forbids; the connection stays open after each, so a reader that waits for
#: more (a chunk size of -1 read "to the end") fails with a timeout instead of a ProtocolError.
HOSTILE_ANSWERS = {
    "chunk size +5": _chunked_answer("Transfer-Encoding: chunked", size="+5"),
    "chunk size 0x5": _chunked_answer("Transfer-Encoding: chunked", size="0x5"),
    "chunk size 0_5": _chunked_answer("Transfer-Encoding: chunked", size="0_5"),
    "chunk size with a leading space": _chunked_answer("Transfer-Encoding: chunked", size=" 5"),
    "chunk size -1": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nhello",
    "space before the colon": _chunked_answer("Transfer-Encoding : chunked"),
    "space before the colon of Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
    "Transfer-Encoding xchunked": _chunked_answer("Transfer-Encoding: xchunked"),
    "Content-Length and Transfer-Encoding": _chunked_answer("Content-Length: 3", "Transfer-Encoding: chunked"),
    "obs-fold continuation line": _chunked_answer("X-Note: 1", " Transfer-Encoding: chunked"),
    "header line over 64 KiB": _chunked_answer("X-Pad: " + "a" * (65537 - 7) + "Transfer-Encoding: chunked"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ANSWERS))
def test_hostile_answers_raise_protocol_errors(serve, parser, case):
    server = serve((HOSTILE_ANSWERS[case], False), (None, False))
    with pytest.raises(rawhttp.ProtocolError):
        _post(server, parser, timeout=30)


def test_h11_fallback_is_selected_by_name(serve):
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = serve((ok, False))
    conn = rawhttp.Connection("127.0.0.1", server.port, 5, "h11")
    try:
        assert type(conn._wire).__name__ == "H11ResponseReader"
        assert conn.post("/", b"x", {}, 10).body == b"ok"
    finally:
        conn.close()
    with pytest.raises(ValueError, match="unknown HTTP parser 'llhttp'.*httptools, h11"):
        rawhttp.Connection("127.0.0.1", server.port, 5, "llhttp")
