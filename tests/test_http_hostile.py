"""Malformed and smuggling HTTP/1.1 requests sent as raw bytes to a real ``fnmap emulator`` (issue 12).

Each request carries a validly signed call whose function writes a marker file, so a request that
got through would run it.  Every one must be refused (400, 413, 431 or 501), the connection
closed, nothing run, and the emulator must go on serving.  The suite runs once per parser
(``FNMAP_HTTP_PARSER``): httptools (llhttp), and h11, the fallback where httptools is missing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid

import pytest
import requests
from conftest import EmulatorProcess

from fnmap.runtime import keys, signing
from fnmap.runtime.serialization import dumps, pickle_function, runtime_info
from fnmap.runtime.wire import CallRequest, encode
from fnmap.storage import open_store

pytestmark = pytest.mark.timeout(300)

REFUSALS = (400, 413, 431, 501)


def touch(path):
    with open(path, "w") as f:
        f.write("ran")
    return path


@pytest.fixture(scope="module", params=["httptools", "h11"])
def emulator(request, tmp_path_factory):
    """One emulator per parser for the module (each case gets its own connection and markers)."""
    storage = tmp_path_factory.mktemp("hostile-storage")
    emu = EmulatorProcess(workers=1, env={"FNMAP_HTTP_PARSER": request.param, "FNMAP_STORAGE": storage.as_uri()})
    try:
        emu.store_url = storage.as_uri()
        emu.markers = tmp_path_factory.mktemp("hostile-markers")
        yield emu
    finally:
        emu.stop()


class SignedCall:
    """A correctly signed invocation of ``touch(marker)``: the emulator runs it if the request gets through."""

    def __init__(self, emu: EmulatorProcess):
        self.marker = str(emu.markers / uuid.uuid4().hex)
        digest, data = pickle_function(touch)
        func_key = keys.function_key(digest)
        open_store(emu.store_url).put(func_key, data)
        job_id = keys.new_job_id()
        open_store(emu.store_url).put(keys.job_record_key(job_id), b"{}")  # a job with a record
        req = CallRequest(job_id=job_id, call_id=0, func_key=func_key, store_url=emu.store_url,
                          runtime=runtime_info())
        self.body = encode(req, dumps(("one", [self.marker])))
        self.signature = signing.sign(emu.secret.encode(), self.body)

    def ran(self) -> bool:
        return os.path.exists(self.marker)


def _head(call: SignedCall, *lines: str) -> bytes:
    fields = ["POST /invoke HTTP/1.1", "Host: 127.0.0.1", f"{signing.SIGNATURE_HEADER}: {call.signature}", *lines]
    return ("\r\n".join(fields) + "\r\n\r\n").encode("latin-1")


def _chunked(body: bytes, size: str | None = None) -> bytes:
    return f"{size or format(len(body), 'x')}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def _hex_with_underscore(n: int) -> str:
    digits = format(n, "x")
    return digits[0] + "_" + digits[1:]


def _with_chunk_size(size_of):
    """A chunked request whose one chunk's size is written as ``size_of(length)``."""
    return lambda c, h: _head(c, "Transfer-Encoding: chunked") + _chunked(c.body, size_of(len(c.body)))


def _long_line_smuggling_te(call: SignedCall) -> bytes:
    # A header line of exactly 65537 bytes: a reader that cuts lines at 64 KiB reads the rest of
    # the line as a header of its own: here a Transfer-Encoding the request does not really have.
    pad = "X-Pad: " + "a" * (65537 - len("X-Pad: "))
    return _head(call, pad + "Transfer-Encoding: chunked") + _chunked(call.body)


def _smuggled_after_chunked(call: SignedCall, hidden: SignedCall, te_first: bool) -> bytes:
    inner = _head(hidden, f"Content-Length: {len(hidden.body)}") + hidden.body
    framing = ["Transfer-Encoding: chunked", f"Content-Length: {len(b'0' + inner)}"]
    return _head(call, *(framing if te_first else framing[::-1])) + b"0\r\n\r\n" + inner


HOSTILE = {
    "chunk size +N": _with_chunk_size(lambda n: f"+{n:x}"),
    "chunk size 0xN": _with_chunk_size(lambda n: f"0x{n:x}"),
    "chunk size 1_0": _with_chunk_size(_hex_with_underscore),
    "chunk size with a leading space": _with_chunk_size(lambda n: f" {n:x}"),
    "chunk size -1": lambda c, h: _head(c, "Transfer-Encoding: chunked") + b"-1\r\n" + c.body,
    "space before the colon of Transfer-Encoding": lambda c, h: (
        _head(c, "Transfer-Encoding : chunked") + _chunked(c.body)),
    "space before the colon of Content-Length": lambda c, h: (
        _head(c, f"Content-Length : {len(c.body)}") + c.body),
    "Transfer-Encoding xchunked": lambda c, h: _head(c, "Transfer-Encoding: xchunked") + _chunked(c.body),
    "header line over 64 KiB": lambda c, h: _long_line_smuggling_te(c),
    "obs-fold continuation line": lambda c, h: _head(c, "X-Note: 1", " Transfer-Encoding: chunked") + _chunked(c.body),
    "Content-Length then Transfer-Encoding": lambda c, h: _smuggled_after_chunked(c, h, te_first=False),
    "Transfer-Encoding then Content-Length": lambda c, h: _smuggled_after_chunked(c, h, te_first=True),
}


def _exchange(emu: EmulatorProcess, data: bytes) -> bytes:
    """Send ``data`` (never half-closing) and read until the server closes; what it answered."""
    host, port = emu.url.rsplit("/", 1)[-1].rsplit(":", 1)
    out = b""
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(data)
        try:
            while chunk := sock.recv(65536):  # a server that keeps the connection open times out here
                out += chunk
        except ConnectionResetError:
            pass  # closed with our bytes unread: closed all the same
    return out


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), f"not an HTTP answer: {answer[:200]!r}"
    return int(answer.split(b" ", 2)[1])


def _rss(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except OSError:
        return None


def _still_serves(emu: EmulatorProcess) -> None:
    control = SignedCall(emu)
    r = requests.post(emu.url + "/invoke", data=control.body, timeout=60,
                      headers={signing.SIGNATURE_HEADER: control.signature})
    assert r.status_code == 200 and control.ran(), "the emulator stopped serving signed calls"


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_request_is_refused_closed_and_runs_nothing(emulator, case):
    call, hidden = SignedCall(emulator), SignedCall(emulator)
    answer = _exchange(emulator, HOSTILE[case](call, hidden))
    assert _status(answer) in REFUSALS, answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1, f"more than one answer on the connection: {answer[:300]!r}"
    assert b"Connection: close" in answer
    assert not call.ran() and not hidden.ran()
    _still_serves(emulator)
    assert not call.ran() and not hidden.ran()


def test_negative_chunk_size_does_not_buffer_the_stream(emulator):
    """``-1`` once meant "read to the end": the emulator must answer at once, without reading the
    megabytes that follow into memory and without waiting for the client to stop sending."""
    call = SignedCall(emulator)
    rss_before = _rss(emulator.proc.pid)
    host, port = emulator.url.rsplit("/", 1)[-1].rsplit(":", 1)
    flood = 64 << 20
    sent = []
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(_head(call, "Transfer-Encoding: chunked") + b"-1\r\n")

        def keep_sending():
            block = b"x" * (1 << 20)
            try:
                for _ in range(flood // len(block)):
                    sock.sendall(block)
                    sent.append(len(block))
            except OSError:
                pass  # the server closed the connection: what this test wants

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        answer = b""
        try:
            while chunk := sock.recv(65536):  # no answer before the flood ends would time out here
                answer += chunk
        except ConnectionResetError:
            pass
        sender.join(60)
        assert not sender.is_alive()
    assert _status(answer) == 400 and b"Connection: close" in answer
    assert sum(sent) < flood, "the server read the whole stream instead of closing the connection"
    if rss_before is not None:
        assert _rss(emulator.proc.pid) - rss_before < 32 << 20
    assert not call.ran()
    _still_serves(emulator)


def test_the_emulator_parses_with_the_parser_it_was_given(emulator, request):
    """The two parsers differ on one lawful point: h11 refuses an HTTP/1.1 request without Host."""
    answer = _exchange(emulator, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    parser = request.node.callspec.params["emulator"]
    assert _status(answer) == {"httptools": 200, "h11": 400}[parser]
