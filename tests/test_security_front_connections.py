"""Bounded connections (issue 26): silent and slow connections cannot lock ordinary clients out of a
real ``fnmap emulator``, and many concurrent clients are all served."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import until

import fnmap

pytestmark = pytest.mark.timeout(120)


class Hogs:
    """``silent`` connections that send nothing and ``slow`` ones that send a request head a byte a
    second, each reopened as soon as the server closes it, held until :meth:`stop`."""

    def __init__(self, url: str, silent: int, slow: int):
        from fnmap.emulator.httpserver import raise_file_limit

        assert raise_file_limit(silent + slow) == silent + slow, "this process cannot open that many sockets"
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.address = (host, int(port))
        self.kinds = ["silent"] * silent + ["slow"] * slow
        self.socks: list[socket.socket | None] = [None] * len(self.kinds)
        self.reopened = 0
        self._stop = threading.Event()
        #: Set once every hog has been opened and the slow ones have sent their first byte.
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()

    def _open(self, i: int) -> None:
        try:
            self.socks[i] = socket.create_connection(self.address, timeout=5)
            self.socks[i].setblocking(False)
        except OSError:
            self.socks[i] = None

    def _hold(self) -> None:
        for i in range(len(self.kinds)):
            self._open(i)
        rounds = 0
        while not self._stop.wait(0 if rounds == 0 else 1.0):
            rounds += 1
            if rounds == 2:
                self.ready.set()
            for i, sock in enumerate(self.socks):
                try:
                    if sock is None:
                        raise OSError
                    if self.kinds[i] == "slow":
                        sock.send(b"G")  # GGGG...: a request line that never ends
                    if sock.recv(4096) == b"":
                        raise OSError
                except BlockingIOError:
                    continue
                except OSError:
                    if sock is not None:
                        sock.close()
                    self.reopened += 1
                    self._open(i)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for sock in self.socks:
            if sock is not None:
                sock.close()


@pytest.mark.parametrize("limits", ["short deadlines", "defaults"])
def test_silent_and_slow_connections_leave_a_map_served(use_emulator, limits):
    """1,100 hogs (reopened as soon as they are closed) against a limit of 1,000 connections, or
    2,100 against the default limit: the map's own connections are still taken (the connection
    idle longest is given up for each), and every call succeeds."""
    if limits == "defaults":
        emu, hogs = use_emulator(workers=2), 2100
    else:
        emu = use_emulator("--idle-timeout", "3", "--head-timeout", "3", "--max-connections", "1000", workers=2)
        hogs = 1100
    hogs = Hogs(emu.url, silent=hogs // 2, slow=hogs - hogs // 2)
    try:
        assert hogs.ready.wait(60)
        job = fnmap.map(abs, range(-200, 0), chunksize=1, workers=8, retries=0, return_job=True)
        assert job.results() == list(range(200, 0, -1))
        assert emu.health()["status"] == "ok"
        until(lambda: hogs.reopened > 0, 30)  # the server did close hogs (the map may end before they notice)
    finally:
        hogs.stop()


def _client(n: int) -> list[int]:
    return fnmap.map(abs, range(-200, 0), chunksize=1, workers=16, retries=0)


def test_64_concurrent_clients_of_16_connections_are_all_served(use_emulator):
    """64 clients at once, each 200 calls over 16 keep-alive connections: 1,024 connections, more
    than the emulator's old limit of 1,000 (some clients were answered 503 there)."""
    use_emulator(workers=2)
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(_client, range(64)))
    assert results == [list(range(200, 0, -1))] * 64


class ClosesIdleConnections:
    """A server that answers the first request on each connection, then closes that connection
    as soon as the next request's bytes arrive, without answering: what a client sees when the
    server gave the idle connection up just as the client reused it."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with sock:
                sock.recv(65536)
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                sock.recv(65536)  # the reused connection's request: closed unanswered

    def close(self) -> None:
        self.listener.close()


def test_client_sends_again_when_its_idle_connection_was_closed_before_any_answer():
    from fnmap.backends.base import Invocation
    from fnmap.backends.http import HttpBackend
    from fnmap.config import resolve

    server = ClosesIdleConnections()
    try:
        backend = HttpBackend(resolve(backend="http", http_url=f"http://127.0.0.1:{server.port}/invoke"))
        call = Invocation(request=None, body=b"body", signature="sig")
        for _ in range(3):
            assert backend._post_plain(backend._plain_target(), call, 10) == b"ok"
        assert server.connections == 3  # each reuse failed unanswered and was sent again on a new one
    finally:
        server.close()
