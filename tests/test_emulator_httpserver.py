"""The emulator's own HTTP server (issue 9): HTTP/1.1 as clients send it, over real sockets, with
each parser (httptools, and h11, the fallback; issue 12)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from conftest import until

from fnmap.emulator.httpserver import WSGIServer
from fnmap.runtime.deadlines import TimeLimits

pytestmark = pytest.mark.timeout(60)


def echo_app(environ, start_response):
    """Answers with what it was given; ``/fail`` raises, ``/nolength`` gives no Content-Length."""
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    path = environ["PATH_INFO"]
    if path == "/fail":
        raise RuntimeError("app bug")
    text = (f"{environ['REQUEST_METHOD']} {path} q={environ['QUERY_STRING']} "
            f"x={environ.get('HTTP_X_THING', '-')} type={environ.get('CONTENT_TYPE', '-')} "
            f"len={len(body)}|").encode() + body
    headers = [("Content-Type", "text/plain")]
    if path != "/nolength":
        headers.append(("Content-Length", str(len(text))))
    start_response("200 OK", headers)
    return [text[:5], text[5:]] if path == "/nolength" else [text]


@pytest.fixture(params=["httptools", "h11"])
def server(request):
    srv = WSGIServer(echo_app, "127.0.0.1", 0, max_body=1000, parser=request.param)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.close()
    thread.join(5)
    assert not thread.is_alive()


def _raw(server, data: bytes) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_keep_alive_requests_with_query_headers_and_bodies(server):
    url = f"http://{server.host}:{server.port}"
    with requests.Session() as session:
        r1 = session.post(url + "/a%20b?x=1", data=b"hello", headers={"X-Thing": "t",
                                                                      "Content-Type": "app/x"})
        r2 = session.post(url + "/nolength", data=iter([b"chunk", b"ed"]))  # a chunked request body
        r3 = session.get(url + "/")
    assert r1.content == b"POST /a b q=x=1 x=t type=app/x len=5|hello"
    assert r2.content == b"POST /nolength q= x=- type=- len=7|chunked"
    assert r2.headers["Content-Length"] == str(len(r2.content))  # gathered and sent with a length
    assert r3.status_code == 200 and r3.content.endswith(b"len=0|")


def test_http10_head_expect_continue_and_pipelining(server):
    out = _raw(server, b"HEAD /h HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in out
    assert out.endswith(b"\r\n\r\n")  # headers only
    out = _raw(server, b"POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
                       b"Connection: close\r\n\r\nhi")
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert out.endswith(b"len=2|hi")
    out = _raw(server, b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.endswith(b"GET /2 q= x=- type=- len=0|")


@pytest.mark.parametrize("request_bytes, status", [
    (b"NONSENSE\r\n\r\n", b"400"),
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: x\r\n\r\n", b"400"),
    ("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"), b"400"),
    (b"POST / HTTP/1.1\r\nHost: h\r\nbad header\r\n\r\n", b"400"),
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5000\r\n\r\n", b"413"),
    (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000
     + b"\r\n1\r\nx\r\n0\r\n\r\n", b"413"),  # a chunked body over max_body
    (b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X-Many: 1\r\n" * 201 + b"\r\n", b"431"),
    (b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
    (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", b"505"),
    (b"GET /fail HTTP/1.1\r\nHost: h\r\n\r\n", b"500"),
])
def test_bad_requests_and_app_errors_get_an_answer_and_the_server_keeps_serving(
        server, request_bytes, status, capsys):
    out = _raw(server, request_bytes)
    assert out.split(b" ")[1] == status and b"Connection: close" in out
    r = requests.get(f"http://{server.host}:{server.port}/still", timeout=10)
    assert r.status_code == 200


def test_a_malformed_request_after_a_pipelined_one_is_answered_after_it(server):
    out = _raw(server, b"GET /first HTTP/1.1\r\nHost: h\r\n\r\nGET /second HTTP/1.1\r\nHost: h\r\n"
                       b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n")
    first, second = out.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK") and first.endswith(b"GET /first q= x=- type=- len=0|")
    assert second.startswith(b"400 Bad Request") and b"Connection: close" in second


def test_header_names_with_underscores_are_dropped(server):
    # WSGI spells X-Thing and X_Thing alike (HTTP_X_THING): only the dashed name may reach the app.
    out = _raw(server, b"GET / HTTP/1.1\r\nHost: h\r\nX_Thing: forged\r\nConnection: close\r\n\r\n")
    assert out.endswith(b"x=- type=- len=0|")


def test_trailer_fields_are_not_request_headers(server):
    out = _raw(server, b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                       b"2\r\nhi\r\n0\r\nX-Thing: trailer\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"x=- type=- len=2|hi")


def test_an_unknown_parser_name_is_a_clear_error():
    env = dict(os.environ, FNMAP_HTTP_PARSER="llhttp")
    proc = subprocess.run([sys.executable, "-c", "import fnmap.runtime.httpwire"], env=env,
                          capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "FNMAP_HTTP_PARSER='llhttp' is not a parser fnmap knows; set it to one of httptools, h11" in proc.stderr
    with pytest.raises(ValueError, match="unknown HTTP parser 'picohttp'"):
        WSGIServer(echo_app, "127.0.0.1", 0, parser="picohttp")


def test_close_hangs_up_idle_keep_alive_connections():
    srv = WSGIServer(echo_app, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    sock = socket.create_connection((srv.host, srv.port), timeout=10)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        srv.close()
        thread.join(5)
        assert not thread.is_alive()
        assert sock.recv(65536) == b""  # the idle connection was closed by the server
    finally:
        with contextlib.suppress(OSError):
            sock.close()


# -- bounded connections (issue 26) ---------------------------------------------------------


@contextlib.contextmanager
def _serving(**options):
    srv = WSGIServer(echo_app, "127.0.0.1", 0, **options)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.close()
        thread.join(5)


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (read end of file or a reset); False when
    nothing came within the socket's timeout."""
    try:
        while data := sock.recv(65536):
            assert not data.startswith(b"HTTP/1.1 200"), data
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_default_limits_are_bounded():
    limits = WSGIServer(echo_app, "127.0.0.1", 0).limits
    assert limits == TimeLimits()
    assert 0 < limits.idle <= 15 and 0 < limits.head <= 10
    assert limits.transfer_seconds(64 << 20) <= 120  # the largest body the emulator takes
    with pytest.raises(ValueError, match="idle=0 must be a positive"):
        TimeLimits(idle=0)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_silent_and_byte_a_second_connections_are_closed(parser):
    with _serving(limits=TimeLimits(idle=1.0, head=1.0), parser=parser) as srv:
        with socket.create_connection((srv.host, srv.port), timeout=10) as silent:
            assert _closed_by_server(silent)
        with socket.create_connection((srv.host, srv.port), timeout=10) as slow:
            slow.settimeout(0.2)
            request, sent = b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Thing: " + b"y" * 100, 0
            while sent < len(request):  # a byte every 0.2 s: each read is quick, the head never ends
                try:
                    slow.sendall(request[sent:sent + 1])
                except OSError:
                    break
                sent += 1
                with contextlib.suppress(TimeoutError):
                    if slow.recv(65536) == b"":
                        break
            assert 3 < sent < len(request), f"the server closed after {sent} bytes of a head sent a byte at a time"
        with requests.get(f"http://{srv.host}:{srv.port}/still", timeout=10) as r:
            assert r.status_code == 200


def _idle_since(srv, sock: socket.socket) -> float:
    """When the server last marked the connection of this client socket idle (0: it is not idle)."""
    with srv._lock:
        for conn in srv._connections.values():
            if conn.sock.getpeername() == sock.getsockname():
                return conn.since if conn.phase == conn.IDLE else 0.0
    return 0.0


def test_the_connection_idle_longest_is_given_up_for_a_new_one():
    with _serving(limits=TimeLimits(idle=60, head=60), max_connections=3) as srv:
        socks = [socket.create_connection((srv.host, srv.port), timeout=10) for _ in range(3)]
        try:
            for sock in socks:  # each served once, then idle (keep-alive), oldest first
                sent = time.monotonic()
                sock.sendall(b"GET /once HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                # the server marks it idle just after the answer, on its own thread: under load that
                # came after the next request, and another socket was the one idle longest
                until(lambda sock=sock, sent=sent: _idle_since(srv, sock) > sent, 10)
            with requests.get(f"http://{srv.host}:{srv.port}/new", timeout=10) as r:
                assert r.status_code == 200  # not 503: room was made
            assert _closed_by_server(socks[0])
            socks[2].settimeout(0.5)
            assert not _closed_by_server(socks[2])  # the newest idle one is kept
            assert srv.evicted >= 1
        finally:
            for sock in socks:
                sock.close()
