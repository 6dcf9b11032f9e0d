"""An emulator reached through a port forward (``ssh -L 9000:localhost:8765``): a real TCP forwarder
on another local port relays to the emulator; the emulator admits its own names on any port, still
refuses foreign names, and the client says when the emulator refused it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

import fnmap
from fnmap.errors import ConfigError


class Forwarder:
    """Relay every connection to ``address`` (host, port) from a free port of ``listen_host``,
    a thread per direction, as ``ssh -L`` does; closed (with its connections) by :meth:`close`."""

    def __init__(self, address: tuple[str, int], listen_host: str = "127.0.0.1"):
        self.address = address
        self.listener = socket.create_server((listen_host, 0))
        self.host, self.port = self.listener.getsockname()[:2]
        self.accepted = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="test-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.address)
            with self._lock:
                self.accepted += 1
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


@pytest.fixture
def forward():
    """``forward(emu, listen_host)``: a forwarder to that emulator, closed after the test."""
    made: list[Forwarder] = []

    def make(emu, listen_host: str = "127.0.0.1") -> Forwarder:
        host, port = emu.url.removeprefix("http://").rsplit(":", 1)
        made.append(Forwarder((host, int(port)), listen_host))
        return made[-1]

    yield make
    for forwarder in made:
        forwarder.close()


def _status(host: str, port: int, host_header: str) -> tuple[int, bytes]:
    """One raw ``GET /health`` to ``host:port`` naming ``host_header``: its status and body."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[1]


def _flush_clients():
    """Forget this process's clients of an emulator named by URL (the next map makes a new one)."""
    from fnmap import client

    for c in list(client._clients.values()):
        if c.config.emulator_url:
            c.close()


def test_a_map_through_a_port_forward(use_emulator, forward, monkeypatch):
    emu = use_emulator(workers=2)
    tunnel = forward(emu)
    assert tunnel.port != int(emu.url.rsplit(":", 1)[1])
    for name in ("127.0.0.1", "localhost"):
        monkeypatch.setenv("FNMAP_EMULATOR_URL", f"http://{name}:{tunnel.port}")
        try:
            assert fnmap.map(abs, range(-20, 0)) == list(range(20, 0, -1))
        finally:
            _flush_clients()
    assert tunnel.accepted >= 2  # the calls went through the forward, not around it


def test_foreign_names_are_refused_on_any_port(use_emulator, forward):
    emu = use_emulator(workers=1)
    tunnel = forward(emu)
    emu_port = int(emu.url.rsplit(":", 1)[1])
    for port in (tunnel.port, emu_port):
        for foreign in (f"attacker.example:{port}", f"127.0.0.1.nip.io:{tunnel.port}", "attacker.example",
                        f"attacker.example:{emu_port}", "localhost:notaport"):
            status, body = _status("127.0.0.1", port, foreign)
            assert status == 403, (foreign, port, body)
        for own in (f"127.0.0.1:{tunnel.port}", f"localhost:{port}", "[::1]:1", "localhost"):
            assert _status("127.0.0.1", port, own)[0] == 200, (own, port)


def test_the_client_says_the_emulator_refused_its_host(use_emulator, forward, monkeypatch):
    """Forwarded from another address (127.0.0.2) that is none of the emulator's names: the client
    is told the front door refused that Host and how to admit it, not that nothing answered."""
    emu = use_emulator(workers=1)
    tunnel = forward(emu, listen_host="127.0.0.2")
    monkeypatch.setenv("FNMAP_EMULATOR_URL", f"http://127.0.0.2:{tunnel.port}")
    with pytest.raises(ConfigError) as refused:
        fnmap.map(abs, [-1])
    message = str(refused.value)
    assert f"refused by the front door: Host '127.0.0.2:{tunnel.port}' not among its names" in message
    assert "use --allow-host 127.0.0.2" in message
    assert "not reachable" not in message


def test_allow_host_with_another_port_admits_the_name_on_any_port(use_emulator, forward, monkeypatch):
    emu = use_emulator("--allow-host", "127.0.0.2:9", "--allow-host", "fnmap.internal", workers=1)
    tunnel = forward(emu, listen_host="127.0.0.2")
    monkeypatch.setenv("FNMAP_EMULATOR_URL", f"http://127.0.0.2:{tunnel.port}")
    try:
        assert fnmap.map(abs, [-3, 4]) == [3, 4]
    finally:
        _flush_clients()
    assert _status("127.0.0.2", tunnel.port, f"fnmap.internal:{tunnel.port}")[0] == 200
    assert _status("127.0.0.2", tunnel.port, "other.internal:9")[0] == 403


def test_a_malformed_allow_host_is_named_before_the_emulator_starts():
    done = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "--port", "0", "--workers", "1",
                           "--allow-host", "http://fnmap.internal/"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "--allow-host 'http://fnmap.internal/' is not a host name" in done.stderr
    assert "listening" not in done.stdout
