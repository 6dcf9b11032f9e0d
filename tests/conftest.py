"""Shared fixtures: a clean environment, real servers on loopback (emulator, moto S3), stopped after."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time

import pytest
import requests

from fnmap.emulator.launcher import EmulatorLauncher
from fnmap.errors import FnmapError

_SCRUB = re.compile(r"^(FNMAP_|AWS_ENDPOINT_URL)")


@pytest.fixture(scope="session", autouse=True)
def _bytecode():
    """Byte-compile fnmap once, as ``pip install`` does for an installed package.  Under
    ``PYTHONDONTWRITEBYTECODE`` (set on some CI machines) an editable checkout is otherwise compiled
    from source again in every process a test starts (emulators, their fork servers, scripts):
    about 0.2 s each."""
    import compileall

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in ("fnmap", "handlers"):
        compileall.compile_dir(os.path.join(repo, folder), quiet=1)


@pytest.fixture(scope="session")
def storage_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fnmap-storage")


@pytest.fixture(autouse=True)
def _reset_environ(monkeypatch, storage_root):
    """Every test starts with no FNMAP_* settings and storage in a temporary folder."""
    for name in list(os.environ):
        if _SCRUB.match(name):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FNMAP_STORAGE", storage_root.as_uri())
    monkeypatch.setenv("FNMAP_PROGRESS", "false")
    # One emulator per test process, stopped with it (tests/test_shared_emulator.py covers the
    # emulator shared by a user's processes, which outlives them).
    monkeypatch.setenv("FNMAP_EMULATOR_IDLE", "0")
    # No config file from the developer's home or working folder leaks in.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(storage_root / "no-config"))
    yield


@pytest.fixture(scope="session", autouse=True)
def _stop_embedded_emulators(tmp_path_factory):
    """Stop this process's emulators at the end, and any shared one a subprocess started anyway
    (a test that builds its own environment without FNMAP_EMULATOR_IDLE=0): they live in a
    runtime folder of the session's, never the developer's."""
    runtime = tmp_path_factory.mktemp("xdg-runtime")
    os.chmod(runtime, 0o700)
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    yield
    from fnmap.backends.emulator import stop_embedded

    stop_embedded()
    for state in runtime.glob("fnmap/*/emulator.json"):
        try:
            os.kill(json.loads(state.read_text())["pid"], signal.SIGTERM)
        except (OSError, ValueError):
            pass
    if saved is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = saved


class EmulatorProcess(EmulatorLauncher):
    """``fnmap emulator`` run as a subprocess on a free loopback port, with a fresh secret."""

    def __init__(self, *args: str, workers: int = 2, env: dict | None = None,
                 aws_credentials: tuple[str, str] | None = None):
        # stderr (the emulator's and its workers' output) goes to a file: an unread pipe would fill
        # up and block a worker that prints a lot.
        self.log = tempfile.TemporaryFile()
        try:
            super().__init__(workers, options=list(args), env=env, stderr=self.log, aws_credentials=aws_credentials)
        except FnmapError as e:
            raise RuntimeError(f"{e}\n{self.output()}") from None

    def output(self) -> str:
        """What the emulator and its workers wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=5).json()

    def stop(self) -> int:
        code = super().stop(timeout=20)
        self.log.close()
        return code


@pytest.fixture
def emulator_process():
    """Factory: start emulators with given options; every one is stopped after the test."""
    started: list[EmulatorProcess] = []

    def start(*args: str, **kwargs) -> EmulatorProcess:
        emu = EmulatorProcess(*args, **kwargs)
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()


@pytest.fixture(scope="module")
def _module_emulator():
    emu = EmulatorProcess(workers=2)
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def module_emulator(_module_emulator, monkeypatch):
    """One plain emulator per test module (starting one costs seconds), pointed at by each test that
    asks for it; tests read its counters as differences."""
    monkeypatch.setenv("FNMAP_EMULATOR_URL", _module_emulator.url)
    monkeypatch.setenv("FNMAP_SECRET", _module_emulator.secret)
    return _module_emulator


@pytest.fixture
def use_emulator(emulator_process, monkeypatch):
    """A dedicated emulator subprocess, with FNMAP_EMULATOR_URL and FNMAP_SECRET pointing at it."""

    def start(*args: str, **kwargs) -> EmulatorProcess:
        emu = emulator_process(*args, **kwargs)
        monkeypatch.setenv("FNMAP_EMULATOR_URL", emu.url)
        monkeypatch.setenv("FNMAP_SECRET", emu.secret)
        return emu

    return start


#: The five backends the behaviour suites (test_map, test_executor) run on; see ``use_backend``.
ALL_BACKENDS = ("emulator", "local", "http", "aws", "batch")


def aws_credentials_of(emu) -> dict:
    """The settings boto3 signs with for an emulator's Lambda and Batch APIs (its credentials, a region)."""
    return {**emu.aws_environment, "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def platform_emulator():
    """One ``fnmap emulator`` for the behaviour suites: its invoke route serves the ``http`` backend,
    its Lambda API the ``aws`` backend, its Batch API the ``batch`` backend (stopped after the session)."""
    from fnmap.emulator.batch_api import CONCURRENCY_ENV

    emu = EmulatorProcess(workers=2, env={CONCURRENCY_ENV: "2"})
    yield emu
    from fnmap import client

    for c in list(client._clients.values()):  # their keep-alive connections would hold the emulator up
        if c.config.backend in ("http", "aws", "batch"):
            c.close()
    emu.stop()


@pytest.fixture
def use_backend(platform_emulator, monkeypatch):
    """``use_backend(name)`` points backend ``name`` at the suites' emulator through the settings a
    user sets (``FNMAP_HTTP_URL``, ``AWS_ENDPOINT_URL_LAMBDA``/``_BATCH``, ``FNMAP_SECRET``) and returns
    the name; ``emulator`` and ``local`` need nothing."""

    def use(name: str) -> str:
        assert name in ALL_BACKENDS, name
        if name in ("http", "aws", "batch"):
            monkeypatch.setenv("FNMAP_SECRET", platform_emulator.secret)
            for key, value in aws_credentials_of(platform_emulator).items():
                monkeypatch.setenv(key, value)
        if name == "http":
            monkeypatch.setenv("FNMAP_HTTP_URL", platform_emulator.url + "/invoke")
        elif name == "aws":
            monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", platform_emulator.url)
        elif name == "batch":
            from fnmap.backends.batch import BatchBackend

            monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", platform_emulator.url)
            # Each call is a container (here a process): jobs of a few calls keep the suite quick
            # (1,000 items are 4 calls); a test that passes chunksize= still gets what it asks.
            monkeypatch.setenv("FNMAP_CHUNKSIZE", "250")
            monkeypatch.setattr(BatchBackend, "status_interval", 0.2)
        return name

    return use


@pytest.fixture
def aws_backend_on(monkeypatch):
    """``aws_backend_on(emu)`` points the aws backend and boto3 at an emulator's Lambda API through the
    settings a user sets; returns ``emu``.  The aws clients' connections are closed after the test."""

    def point(emu):
        for key, value in {**aws_credentials_of(emu), "AWS_ENDPOINT_URL_LAMBDA": emu.url, "FNMAP_BACKEND": "aws",
                           "FNMAP_SECRET": emu.secret}.items():
            monkeypatch.setenv(key, value)
        return emu

    yield point
    from fnmap import client

    for c in list(client._clients.values()):  # their keep-alive connections would hold the emulator up
        if c.config.backend == "aws":
            c.close()


def lambda_stats(emu) -> dict:
    """The emulator's Lambda API counters (invocations by type, spawners, throttles...)."""
    return requests.get(emu.url + "/lambda/stats", timeout=5).json()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3-compatible server on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """boto3 pointed at the moto server through its standard settings; returns a bucket maker."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=s3_server)

    def make_bucket(name: str) -> str:
        s3.create_bucket(Bucket=name)
        return name

    make_bucket.client = s3
    return make_bucket


def until(predicate, seconds: float = 60.0):
    """``predicate()``'s first true value, polled every 0.1 s; fails the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value
