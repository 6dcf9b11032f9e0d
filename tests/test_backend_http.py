"""The ``http`` backend against real HTTP function hosts on loopback, started as subprocesses.

Google's ``functions-framework`` serving ``handlers/gcf.py``, and the plain
WSGI entry ``python -m handlers.web`` (Cloud Run, Knative, SCF/FC web
functions).  Storage is the shared local folder both sides can reach.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import requests

import fnmap
from fnmap.runtime.signing import new_secret

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def square(x):
    return x * x


class TwoArgError(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")
        self.a, self.b = a, b


def fail_on_two(x):
    if x == 2:
        raise TwoArgError("bad", x)
    return x


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _host(cmd: list[str], secret: str, port: int, env: dict | None = None, cwd: str = ROOT):
    """Run a function host on 127.0.0.1:port until the block ends; stop its whole process group."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    full_env.update(FNMAP_SECRET=secret, HOST="127.0.0.1", PORT=str(port), **(env or {}))
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                requests.get(url, timeout=1)  # any answer (405 for GET) means it is serving
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd[0]} did not start within 60 s") from None
                time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()


@pytest.fixture(scope="module")
def gcf():
    """functions-framework serving handlers/gcf.py, one gunicorn worker with a few threads."""
    exe = shutil.which("functions-framework")
    if exe is None:
        pytest.skip("functions-framework is not installed (pip install -e '.[test]')")
    secret = new_secret()
    port = _free_port()
    cmd = [exe, "--target=invoke", "--source=handlers/gcf.py", "--host=127.0.0.1", f"--port={port}"]
    with _host(cmd, secret, port, env={"THREADS": "4"}) as url:
        yield url, secret


def test_functions_framework_runs_a_job(gcf):
    url, secret = gcf
    job = fnmap.map(square, range(24), chunksize=3, backend="http", http_url=url, secret=secret,
                    return_job=True)
    assert job.results() == [x * x for x in range(24)]
    assert job.summary()["calls"] == 8


def test_functions_framework_remote_exception_keeps_its_type(gcf):
    url, secret = gcf
    with pytest.raises(TwoArgError) as info:
        fnmap.map(fail_on_two, range(4), backend="http", http_url=url, secret=secret)
    assert info.value.b == 2
    assert any("item 2" in note for note in info.value.__notes__)


def test_wrong_secret_is_refused_before_anything_runs(gcf):
    url, _ = gcf
    with pytest.raises(fnmap.SignatureError, match="403"):
        fnmap.map(square, [1], backend="http", http_url=url, secret=new_secret())


def test_local_module_travels_by_value(gcf, tmp_path, monkeypatch):
    """A module of the user's that the function host does not have is shipped with the function."""
    name = f"fnmap_local_helpers_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        OFFSET = 7

        def shifted(x):
            return x + OFFSET
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = __import__(name)
        url, secret = gcf
        assert fnmap.map(module.shifted, range(3), backend="http", http_url=url, secret=secret) == [7, 8, 9]
    finally:
        sys.modules.pop(name, None)


def test_plain_wsgi_entry_on_port():
    """``python -m handlers.web`` as Cloud Run / Knative / SCF web functions start it, with $PORT."""
    secret = new_secret()
    port = _free_port()
    with _host([sys.executable, "-m", "handlers.web"], secret, port) as url:
        assert fnmap.map(square, range(6), backend="http", http_url=url, secret=secret) == [
            x * x for x in range(6)
        ]
        r = requests.post(url + "/invoke", data=b"\0\0\0\2{}", timeout=5)
        assert r.status_code == 401 and "signature invalid" in r.text


def fnmap_location(_):
    import fnmap as worker_fnmap

    return worker_fnmap.__file__


def test_staged_cloud_functions_source_serves_a_job(tmp_path):
    """The folder `gcloud functions deploy --source` uploads (infra/http/gcf_source.py) runs as is."""
    exe = shutil.which("functions-framework")
    if exe is None:
        pytest.skip("functions-framework is not installed (pip install -e '.[test]')")
    from fnmap.deploy.package import stage_gcf_source

    dest = stage_gcf_source(str(tmp_path / "gcf"))
    assert {"main.py", "requirements.txt", "fnmap", "handlers", "cloudpickle"} <= set(os.listdir(dest))
    secret = new_secret()
    port = _free_port()
    cmd = [exe, "--target=invoke", f"--source={dest}/main.py", "--host=127.0.0.1", f"--port={port}"]
    with _host(cmd, secret, port, env={"PYTHONPATH": ""}, cwd=dest) as url:
        where = fnmap.map(fnmap_location, [0], backend="http", http_url=url, secret=secret)
    assert where[0].startswith(dest)  # the staged fnmap, not this checkout's
