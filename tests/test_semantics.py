"""Call semantics a caller relies on (issue 12, parts 3, 6 and 8).

* ``Executor.shutdown(cancel_futures=True)`` cancels pending futures only: a call already running
  ends with its own result, never with a "cancelled" platform error.
* Once a call's outcome is final, its other copies are stopped where the backend can: the emulator
  kills the worker process running a copy, Batch terminates the child.
* A remote ``sys.exit`` or ``KeyboardInterrupt`` is the item's failure (``fnmap.RemoteExit``), never
  the caller's exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

import fnmap
from fnmap.backends import batch as batch_backend
from fnmap.client import get_client
from fnmap.config import resolve
from fnmap.emulator import batch_api
from fnmap.runtime import signing

#: Generous bound for things that happen within a second on a quiet machine.
PATIENCE_SECONDS = 60


def _wait_for(predicate, what: str, seconds: float = PATIENCE_SECONDS):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {seconds} s")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- part 3: shutdown(cancel_futures=True) and running calls ------------------------------------------


def _marked(name, seconds, folder):
    """Mark that the call started (a file named ``name``), then take ``seconds``."""
    Path(folder, name).write_text(str(os.getpid()))
    time.sleep(seconds)
    return name


@pytest.fixture(params=["local", "emulator"])
def executor_backend(request, use_emulator):
    if request.param == "emulator":
        use_emulator(workers=2)
    return request.param


def _check_outcomes(futures_by_name: dict, folder: Path) -> None:
    """Every future ended; those whose call started have their own result; the others were
    cancelled; none failed."""
    started = {p.name for p in folder.iterdir()}
    cancelled = 0
    for name, future in futures_by_name.items():
        assert future.done(), name
        if future.cancelled():
            assert name not in started, f"{name} ran but its future was cancelled"
            cancelled += 1
            continue
        assert future.exception() is None, f"{name} failed: {future.exception()!r}"
        assert future.result() == name
    assert cancelled, "shutdown(cancel_futures=True) cancelled no pending future"


def test_shutdown_cancel_futures_lets_running_calls_end_with_their_own_results(executor_backend, tmp_path):
    """The issue's scenario: 60 two-second calls, shutdown after half a second."""
    ex = fnmap.Executor(backend=executor_backend, workers=2)
    fs = {f"c{i}": ex.submit(_marked, f"c{i}", 2, str(tmp_path)) for i in range(60)}
    _wait_for(lambda: any(tmp_path.iterdir()), "a call started")
    time.sleep(0.5)
    running = [name for name, f in fs.items() if f.running()]
    ex.shutdown(wait=True, cancel_futures=True)
    assert running, "no future was running at shutdown"
    assert all(fs[name].result() == name for name in running)
    _check_outcomes(fs, tmp_path)


def test_a_running_call_of_a_cancelled_job_is_not_failed_by_its_speculative_copy(executor_backend, tmp_path):
    """After ``shutdown(cancel_futures=True)`` the cancelled calls count as done, so a call still
    running looks like a straggler and gets a copy; that copy must not fail the call as
    "cancelled" (it did, through the dispatch path of a second attempt)."""
    ex = fnmap.Executor(backend=executor_backend, workers=2)
    folder = str(tmp_path)
    fs = {"slow": ex.submit(_marked, "slow", 8, folder)}
    _wait_for(lambda: (tmp_path / "slow").exists(), "the slow call started")
    fast = {f"fast{i}": ex.submit(_marked, f"fast{i}", 0, folder) for i in range(5)}
    for f in fast.values():
        f.result(timeout=PATIENCE_SECONDS)
    fs.update(fast)
    fs["medium"] = ex.submit(_marked, "medium", 2, folder)
    _wait_for(lambda: (tmp_path / "medium").exists(), "the medium call started")
    # Both dispatch threads are busy: these stay pending, and are cancelled at shutdown.
    fs.update({f"pending{i}": ex.submit(_marked, f"pending{i}", 0, folder) for i in range(30)})
    ex.shutdown(wait=True, cancel_futures=True)
    assert fs["slow"].result() == "slow"
    assert fs["medium"].result() == "medium"
    _check_outcomes(fs, tmp_path)


def test_a_future_cancelled_by_its_caller_before_it_started_stays_cancelled(tmp_path):
    ex = fnmap.Executor(backend="local", workers=1)
    try:
        blocker = ex.submit(_marked, "blocker", 1, str(tmp_path))
        waiting = [ex.submit(_marked, f"w{i}", 0, str(tmp_path)) for i in range(3)]
        assert waiting[1].cancel()
        assert blocker.result(timeout=PATIENCE_SECONDS) == "blocker"
        assert waiting[0].result(timeout=PATIENCE_SECONDS) == "w0"
        assert waiting[2].result(timeout=PATIENCE_SECONDS) == "w2"
        assert waiting[1].cancelled() and not (tmp_path / "w1").exists()
    finally:
        ex.shutdown(wait=True)


# -- part 6: a decided call's other copies are stopped ----------------------------------------------


def _slow_first_run(x, folder):
    """Item 0's first run writes its pid and takes 100 s; any later run of it returns at once."""
    if x != 0:
        return x
    try:
        fd = os.open(os.path.join(folder, "slow.pid"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return "copy"
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(100)
    Path(folder, "slow.end").write_text("the first run was not stopped")
    return "first"


@pytest.mark.parametrize("backend", ["emulator", "http"])
def test_the_emulator_stops_a_copy_once_its_call_is_decided(backend, use_emulator, tmp_path):
    emu = use_emulator(workers=2)
    options = {"http_url": emu.url} if backend == "http" else {}
    out = fnmap.map(lambda x: _slow_first_run(x, str(tmp_path)), range(30), timeout=150, backend=backend,
                    **options)
    assert out == ["copy", *range(1, 30)]  # the speculative copy decided item 0
    pid = int((tmp_path / "slow.pid").read_text())
    _wait_for(lambda: not _alive(pid), f"the first run's worker process {pid} ended")
    assert not (tmp_path / "slow.end").exists()
    # The emulator replaced that worker and keeps serving.
    _wait_for(lambda: len(emu.health()["worker_pids"]) == 2, "the pool is back to 2 workers")
    health = emu.health()
    assert pid not in health["worker_pids"]
    assert health["stopped"] >= 1
    assert fnmap.map(abs, [-1, -2, -3], backend=backend, **options) == [1, 2, 3]
    stopped = [c for c in requests.get(emu.url + "/calls", timeout=10).json() if c["outcome"] == "stopped"]
    assert stopped and stopped[0]["attempt"] == 1


def test_a_straggler_held_back_by_the_emulator_is_stopped_once_its_copy_decided(use_emulator):
    """The emulator's straggler injection holds call 0's first attempt back for 200 s (seed 33:
    no other call of the 30 straggles, nor call 0's copy); once the copy has decided the call,
    the held attempt is let go without running."""
    emu = use_emulator("--straggler-rate", "0.05", "--straggler-factor", "10000", "--latency-ms", "20",
                       "--seed", "33", workers=2)
    assert fnmap.map(abs, range(0, -30, -1), chunksize=1) == list(range(30))

    def first_attempt():
        calls = requests.get(emu.url + "/calls", timeout=10).json()
        return next((c for c in calls if c["call_id"] == 0 and c["attempt"] == 1), None)

    _wait_for(lambda: first_attempt() is not None, "call 0's first attempt was answered")
    assert first_attempt()["faults"] == ["straggle"]
    assert first_attempt()["outcome"] == "stopped"
    assert emu.health()["stopped"] == 1


def _always_slow(x, folder):
    if x == 0:
        Path(folder, f"start-{os.getpid()}-{time.time()}").write_text("")
        time.sleep(60)
    return x


def test_a_copy_is_stopped_when_its_call_times_out_for_good(use_emulator, tmp_path):
    """The issue's case: ``retries=0``; item 0 is slow every time, gets a speculative copy, then
    its first attempt ends with TimeoutError; the copy, still running, is stopped at once instead
    of running to its own timeout."""
    emu = use_emulator(workers=2)
    out = fnmap.map(lambda x: _always_slow(x, str(tmp_path)), range(30), timeout=8, retries=0,
                    return_exceptions=True)
    assert isinstance(out[0], fnmap.TimeoutError) and out[1:] == list(range(1, 30))
    pids = [int(p.name.split("-")[1]) for p in tmp_path.iterdir()]
    assert len(pids) == 2, "item 0 got no speculative copy"
    # The first attempt's worker ended its call itself and keeps serving; the copy's was killed.
    _wait_for(lambda: any(not _alive(pid) for pid in pids), "the copy's worker process ended")
    _wait_for(lambda: len(emu.health()["worker_pids"]) == 2, "the pool is back to 2 workers")


def test_a_function_host_without_a_stop_route_is_asked_once():
    """A deployed HTTP function (here ``python -m handlers.web``) cannot stop a call: the http
    backend's stop request gets a 404, which it takes as "cannot stop" and does not send again."""
    from test_backend_http import _free_port, _host

    secret = signing.new_secret()
    port = _free_port()
    with _host([sys.executable, "-m", "handlers.web"], secret, port) as url:
        backend = get_client(resolve(backend="http", http_url=url, secret=secret)).backend
        backend.stop_attempts("j", [(0, 1)], secret.encode())
        assert backend._cannot_stop
        backend.stop_attempts("j", [(0, 1)], secret.encode())  # not sent: nothing to fail on
        assert fnmap.map(abs, [-4], backend="http", http_url=url, secret=secret) == [4]


def _signed_post(emu, payload: dict, secret: str | None, raw: bytes | None = None):
    body = raw if raw is not None else json.dumps(payload).encode()
    job_id = str(json.loads(body).get("job_id", ""))  # /cancel's signature binds its route and job (issue 26)
    signature = signing.sign_request(secret.encode(), signing.ROUTE_CANCEL, job_id, "", "", body) if secret else None
    headers = {} if secret is None else {signing.SIGNATURE_HEADER: signature}
    return requests.post(emu.url + "/cancel", data=body, headers=headers, timeout=10)


def test_the_stop_route_refuses_unsigned_and_malformed_requests(emulator_process):
    emu = emulator_process(workers=1)
    payload = {"job_id": "j", "attempts": [[0, 1]]}
    assert _signed_post(emu, payload, None).status_code == 401
    r = _signed_post(emu, payload, "not-the-secret")
    assert r.status_code == 403 and "signature invalid" in r.json()["error"]
    r = _signed_post(emu, {}, emu.secret, raw=b'{"job_id": "j", "attempts": 5}')
    assert r.status_code == 400 and "attempts" in r.json()["error"]
    r = _signed_post(emu, payload, emu.secret)
    assert r.status_code == 200 and r.json() == {"stopped": 0, "stopped_on_arrival": 1}
    assert emu.health()["status"] == "ok"


@pytest.fixture
def batch_emulator(emulator_process, monkeypatch):
    """An emulator speaking the Batch API; boto3 pointed at it by ``AWS_ENDPOINT_URL_BATCH``."""
    emu = emulator_process(workers=1, env={batch_api.CONCURRENCY_ENV: "2"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", emu.url)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    for key, value in emu.aws_environment.items():  # fnmap's own Batch client signs with them
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(batch_backend.BatchBackend, "status_interval", 0.2)
    import boto3

    emu.batch = boto3.client("batch", endpoint_url=emu.url, region_name="us-east-1",
                             aws_access_key_id=emu.aws_environment["AWS_ACCESS_KEY_ID"],
                             aws_secret_access_key=emu.aws_environment["AWS_SECRET_ACCESS_KEY"])
    yield emu
    emu.batch.close()
    get_client(resolve(backend="batch")).close()


def _slow_child(x, folder):
    Path(folder, f"start-{x}").write_text(str(os.getpid()))
    if x == 1:
        time.sleep(120)
        Path(folder, "end-1").write_text("not stopped")
    return x


def test_batch_terminates_the_child_running_an_attempt_to_stop(batch_emulator, tmp_path):
    job = fnmap.map(lambda x: _slow_child(x, str(tmp_path)), range(2), backend="batch", retries=0,
                    return_job=True)
    _wait_for(lambda: (tmp_path / "start-1").exists() and (tmp_path / "start-1").read_text(), "child 1 started")
    pid = int((tmp_path / "start-1").read_text())
    client = get_client(job.config)
    client.backend.stop_attempts(job.id, [(1, 1)], client.secret)
    _wait_for(lambda: not _alive(pid), f"child 1's process {pid} ended")
    out = job.results(return_exceptions=True)
    assert out[0] == 0
    assert isinstance(out[1], fnmap.PlatformError) and "stopped by the fnmap client" in str(out[1])
    assert not (tmp_path / "end-1").exists()
    b = batch_emulator.batch
    # Child 0 wrote its result before its container exited: the array turns FAILED only after that.
    _wait_for(lambda: b.list_jobs(jobQueue="fnmap", jobStatus="FAILED")["jobSummaryList"], "the array job FAILED")
    array = b.list_jobs(jobQueue="fnmap", jobStatus="FAILED")["jobSummaryList"][0]["jobId"]
    child = b.describe_jobs(jobs=[f"{array}:1"])["jobs"][0]
    assert child["status"] == "FAILED" and child["statusReason"].startswith("stopped by the fnmap client")


# -- part 8: a remote sys.exit / KeyboardInterrupt is the item's failure -----------------------------

_SCRIPT = textwrap.dedent('''
    import sys
    import fnmap

    BACKEND = sys.argv[1]

    def failing(kind):
        def f(x):
            if x == 1:
                if kind == "exit":
                    sys.exit(3)
                if kind == "interrupt":
                    raise KeyboardInterrupt
                raise GeneratorExit("closed")
            return x * 10
        return f

    for KIND in sys.argv[2:]:  # one process (and emulator) for every kind: the setup is paid once
        f = failing(KIND)
        try:
            fnmap.map(f, range(3), backend=BACKEND)
            print(KIND, "RAISED nothing")
        except fnmap.RemoteExit as e:
            print(KIND, "RAISED", type(e).__name__, e.item, e.exit_code, type(e.__cause__).__name__, "|", e)
        out = fnmap.map(f, range(3), backend=BACKEND, return_exceptions=True)
        print(KIND, "IN PLACE", out[0], type(out[1]).__name__, out[2])
        job = fnmap.map(f, range(3), backend=BACKEND, return_exceptions=True, return_job=True)
        job.results(return_exceptions=True)
        print(KIND, "ATTEMPTS", len(job.attempts_summary()[1]))
        with fnmap.Executor(backend=BACKEND) as ex:
            print(KIND, "FUTURE", type(ex.submit(f, 1).exception()).__name__)
        job = fnmap.map(f, range(3), backend=BACKEND, return_job=True, retries=1,
                        retry_on=(SystemExit, KeyboardInterrupt, GeneratorExit))
        job.results(return_exceptions=True)
        print(KIND, "RETRY_ON ATTEMPTS", len(job.attempts_summary()[1]))
        print(KIND, "DONE")
''')

_EXPECTED_CAUSE = {"exit": "SystemExit", "interrupt": "KeyboardInterrupt", "generator_exit": "GeneratorExit"}


@pytest.fixture(scope="module")
def remote_exit_runs(tmp_path_factory):
    """``runs(backend)``: the script's lines for every kind, by kind; one script run per backend."""
    done = {}

    def runs(backend: str) -> dict[str, dict[str, str]]:
        if backend not in done:
            folder = tmp_path_factory.mktemp(f"remote-exit-{backend}")
            script = folder / "remote_exit.py"
            script.write_text(_SCRIPT)
            done[backend] = subprocess.run([sys.executable, str(script), backend, *_EXPECTED_CAUSE],
                                           capture_output=True, text=True, timeout=300, env=dict(os.environ),
                                           cwd=folder)
        proc = done[backend]
        assert proc.returncode == 0, proc.stdout + proc.stderr
        by_kind: dict[str, dict[str, str]] = {}
        for line in proc.stdout.splitlines():
            kind, rest = line.split(" ", 1)
            by_kind.setdefault(kind, {})[rest.split(" ", 1)[0]] = rest
        return by_kind

    return runs


@pytest.mark.parametrize("kind", ["exit", "interrupt", "generator_exit"])
@pytest.mark.parametrize("backend", ["local", "emulator"])
def test_a_remote_exit_is_the_items_failure_not_the_callers(backend, kind, remote_exit_runs):
    lines = remote_exit_runs(backend)[kind]
    raised = lines["RAISED"].split(" | ")[0].split()
    assert raised[1:3] == ["RemoteExit", "1"]
    assert raised[3] == ("3" if kind == "exit" else "None")
    assert raised[4] == _EXPECTED_CAUSE[kind]
    message = lines["RAISED"].split(" | ", 1)[1]
    assert "item 1" in message
    if kind == "exit":
        assert "sys.exit(3)" in message and "exit code 3" in message
    else:
        assert _EXPECTED_CAUSE[kind] in message
    assert lines["IN"] == "IN PLACE 0 RemoteExit 20"
    assert lines["ATTEMPTS"] == "ATTEMPTS 1"  # the user's code: not retried
    assert lines["FUTURE"] == "FUTURE RemoteExit"
    assert lines["RETRY_ON"] == "RETRY_ON ATTEMPTS 2"  # unless retry_on says so
    assert "DONE" in lines


class _ExitsWhenLoaded:
    """A callable whose unpickling, in the worker, calls ``sys.exit(4)``."""

    def __call__(self, x):
        return x

    def __reduce__(self):
        return (sys.exit, (4,))


@pytest.mark.parametrize("backend", ["local", "emulator"])
def test_a_sys_exit_while_the_function_loads_is_the_items_failure(backend):
    out = fnmap.map(_ExitsWhenLoaded(), [7], backend=backend, return_exceptions=True)
    assert isinstance(out[0], fnmap.RemoteExit) and out[0].exit_code == 4, repr(out[0])


def test_remote_exit_messages_and_pickling():
    import pickle

    exc = fnmap.RemoteExit.of(SystemExit("bye"), 4)
    assert exc.exit_code == 1 and "item 4" in str(exc) and "sys.exit('bye')" in str(exc)
    assert fnmap.RemoteExit.of(SystemExit(), 0).exit_code == 0
    again = pickle.loads(pickle.dumps(fnmap.RemoteExit.of(SystemExit(3), 2)))
    assert (again.item, again.exit_code, str(again)) == (2, 3, str(fnmap.RemoteExit.of(SystemExit(3), 2)))
    assert isinstance(exc, fnmap.FnmapError) and isinstance(exc, Exception)
