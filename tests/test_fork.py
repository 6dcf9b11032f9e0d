"""fnmap in a forked child of a process that used it: a real script forks a ``fork`` Pool and a child
of its own, each maps within a bounded time, and the parent's emulator stays the parent's.

The scripts run as real subprocesses in a session of their own: a child that hangs (the failure
these tests are about) is killed with its whole process group when the timeout expires.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc/self"),
                                reason="forks and reads /proc (Linux)")
#: Seconds a script may take; the scripts take a few (a start-up emulator per child included).
SCRIPT_TIMEOUT = 120

FORKING_SCRIPT = textwrap.dedent("""
    import json, multiprocessing, os, sys, time
    import fnmap, fnmap.lease

    def square(x):
        return x * x

    def child_that_calls_fnmap_map(n):
        return sum(fnmap.map(square, range(n)))

    if __name__ == "__main__":
        report = {"parent": sum(fnmap.map(square, range(200)))}
        executor = fnmap.Executor()
        executor.submit(square, 3).result()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            report["pool"] = pool.map(child_that_calls_fnmap_map, [100, 200, 300])
        pending = executor.submit(time.sleep, 2)  # still running as the child exits
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a child that maps, then exits through the interpreter's exit (atexit runs)
            os.close(read)
            try:
                executor.submit(square, 2)
                inherited = "submitted"
            except RuntimeError as e:
                inherited = str(e)
            answer = {"child": sum(fnmap.map(square, range(50))), "inherited": inherited}
            os.write(write, json.dumps(answer).encode())
            sys.exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            report.update(json.loads(f.read() or "{}"))
        report["child_exit"] = os.waitpid(pid, 0)[1]
        lease = fnmap.lease.read(executor.job.store, executor.job.id)
        report["lease_holder_is_parent"] = lease["holder"]["pid"] == os.getpid()
        report["parent_after"] = sum(fnmap.map(square, range(200)))
        pending.result()
        report["executor_after"] = executor.submit(square, 4).result()
        executor.shutdown()
        print(json.dumps(report))
""")


def _run(script: str, env: dict, timeout: float = SCRIPT_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``script`` in a session of its own; on a hang kill that whole session and fail."""
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        hung = True
    else:
        hung = False
    if hung:
        pytest.fail(f"the forking script hung (killed after {timeout} s); its stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _environment(**settings) -> dict:
    return dict(os.environ, **settings)


def _stop_shared(env: dict) -> None:
    subprocess.run([sys.executable, "-m", "fnmap", "emulator", "stop"], env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize("setup", ["own-emulator", "shared-emulator", "local"])
def test_forked_children_map_within_a_bounded_time(tmp_path, setup):
    settings = {"own-emulator": {"FNMAP_EMULATOR_IDLE": "0"},
                "shared-emulator": {"FNMAP_EMULATOR_IDLE": "30", "XDG_RUNTIME_DIR": str(tmp_path)},
                "local": {"FNMAP_BACKEND": "local"}}[setup]
    env = _environment(**settings)
    try:
        done = _run(FORKING_SCRIPT, env)
    finally:
        if setup == "shared-emulator":
            _stop_shared(env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    squares = sum(x * x for x in range(200))
    assert report["parent"] == report["parent_after"] == squares
    assert report["pool"] == [sum(x * x for x in range(n)) for n in (100, 200, 300)]
    assert report["child"] == sum(x * x for x in range(50))
    assert report["child_exit"] == 0
    # The parent's open job is still the parent's: the child did not renew its lease as its own.
    assert report["lease_holder_is_parent"]
    # The parent's executor is the parent's: refused in the child with the fix, still working here.
    assert "make a new fnmap.Executor() in this process" in report["inherited"]
    assert report["executor_after"] == 16


LOCK_HELD_SCRIPT = textwrap.dedent("""
    import multiprocessing
    import fnmap
    from fnmap.backends import emulator
    from fnmap.emulator import shared

    def child_that_calls_fnmap_map(n):
        return sum(fnmap.map(abs, range(-n, 0)))

    if __name__ == "__main__":
        fnmap.map(abs, [-1])
        (emu,) = emulator._embedded.values()
        # As a thread of this process attaching to (or starting) the shared emulator at the fork.
        with shared._locked(emu.folder):
            pool = multiprocessing.get_context("fork").Pool(2)
        print(pool.map(child_that_calls_fnmap_map, [3, 4]))
        pool.close()
        pool.join()
""")


def test_a_child_forked_while_the_shared_emulators_lock_is_held(tmp_path):
    """The lock that makes concurrent starters start one shared emulator is an ``flock``, held by the
    open file that the fork shares: the child must close its copy, or the lock outlives the parent's
    release and the child's own attach waits on it for ever."""
    env = _environment(FNMAP_EMULATOR_IDLE="30", XDG_RUNTIME_DIR=str(tmp_path))
    try:
        done = _run(LOCK_HELD_SCRIPT, env)
    finally:
        _stop_shared(env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[6,", "10]"]


WORKER_LOCK_SCRIPT = textwrap.dedent("""
    import multiprocessing, threading
    import fnmap
    from fnmap.cost import prices
    from fnmap.runtime import capture, setup, worker

    def ready():
        pass

    def child_that_calls_fnmap_map(n):
        return sum(fnmap.map(abs, range(-n, 0), backend="local", initializer=ready))

    if __name__ == "__main__":
        held = {"functions": worker._functions_lock, "initializer": setup._lock,
                "peak memory": worker._peak_memory._lock, "output": capture._router_lock,
                "prices": prices._lock}[HELD_LOCK]
        taken, release = threading.Event(), threading.Event()

        def hold():  # as a local-backend call loading its function or running its initializer
            with held:
                taken.set()
                release.wait()

        threading.Thread(target=hold).start()
        taken.wait()
        pool = multiprocessing.get_context("fork").Pool(2)
        release.set()
        print(pool.map(child_that_calls_fnmap_map, [3, 4]))
        pool.close()
        pool.join()
""")


@pytest.mark.parametrize("lock", ["functions", "initializer", "peak memory", "output", "prices"])
def test_a_child_forked_while_a_local_call_holds_a_worker_lock(lock):
    """The local backend runs the worker routine on the client's threads: a lock one of them held at
    the fork (loading a function, running an initializer, starting a call: its peak memory reset
    writes to /proc under a lock, its output capture; pricing a job record) is fresh in the child."""
    done = _run(WORKER_LOCK_SCRIPT.replace("HELD_LOCK", repr(lock)), _environment())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[6,", "10]"]


KILLED_PARENT_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import fnmap
    from fnmap.backends import emulator

    print(sum(fnmap.map(abs, range(-5, 5))), flush=True)
    (emu,) = emulator._embedded.values()
    if os.fork() == 0:  # a child that outlives its parent
        time.sleep(600)
        os._exit(0)
    print(emu.pid, flush=True)
    time.sleep(600)
""")


def _exists(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_parents_emulator_stops_while_its_forked_child_lives(tmp_path):
    """A per-process emulator stops when its process dies (the end of its stdin): a forked child
    that lives on must not hold that pipe open, and must not stop the emulator either."""
    env = _environment(FNMAP_EMULATOR_IDLE="0")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_PARENT_SCRIPT], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    emulator_pid = None
    try:
        assert proc.stdout.readline().strip() == "25"
        emulator_pid = int(proc.stdout.readline())
        assert _exists(emulator_pid)
        proc.kill()  # the parent only: its forked child sleeps on
        proc.wait()
        deadline = time.monotonic() + 30
        while _exists(emulator_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _exists(emulator_pid), "the emulator of a killed process lived on with its forked child"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child, still in the script's session
        proc.wait()
        proc.stdout.close()
        if emulator_pid is not None and _exists(emulator_pid):
            os.kill(emulator_pid, signal.SIGKILL)
