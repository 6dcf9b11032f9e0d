"""fnmap.Executor at the program's end, as the standard library's executors (issue 23).

A real interpreter exits with work pending (each case a fresh script; the function appends to a
file, so what ran is what the file holds); ``submit`` after the interpreter began to exit raises;
the executor keeps no result the caller dropped (bpo-14406, CPython's ``test_free_reference``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
import weakref
from concurrent import futures

import pytest

import fnmap

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_script(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``body`` as a script in a fresh interpreter (this checkout's fnmap, the test's storage)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k != "FNMAP_EMULATOR_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=180, cwd=str(tmp_path))


def _lines(path) -> list[str]:
    return sorted(path.read_text().split()) if path.exists() else []


_PENDING = """
    import sys, time
    import fnmap

    backend, out = sys.argv[1], sys.argv[2]

    def work(i):
        time.sleep(0.3)
        with open(out, "a") as f:
            f.write(f"{i}\\n")
        if i == 0:
            print("apple")
        return i

    def noted(future):
        with open(out, "a") as f:
            f.write(f"callback-{future.result()}\\n")

    ex = fnmap.Executor(backend=backend, workers=2)
    for i in range(4):
        ex.submit(work, i)
    ex.submit(work, 4).add_done_callback(noted)      # the future itself is dropped at once
    fnmap.Executor(backend=backend, workers=2).submit(work, 5)   # so is this executor
    later = fnmap.Executor(backend=backend, workers=2)
    later.submit(work, 6)
    later.shutdown(wait=False)                     # shut down without waiting: still finished
    print("leaving")
"""


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_pending_work_finishes_before_the_interpreter_exits(tmp_path, backend):
    out = tmp_path / "ran.txt"
    proc = _run_script(tmp_path, _PENDING, backend, str(out))
    assert proc.returncode == 0, proc.stderr
    assert _lines(out) == ["0", "1", "2", "3", "4", "5", "6", "callback-4"], proc.stderr
    assert "apple" in proc.stdout  # the call's print() output is shown, as shutdown() shows it
    assert "Traceback" not in proc.stderr, proc.stderr


_CANCEL = """
    import json, os, sys, time
    import fnmap

    out, gate = sys.argv[1], sys.argv[2]

    def work(i):
        if i == 0:
            open(gate + ".started", "w").close()
        while i == 0 and not os.path.exists(gate):  # the first call holds the only worker until told
            time.sleep(0.01)
        time.sleep(0.3)  # still running when the script's last line ends
        with open(out, "a") as f:
            f.write(f"{i}\\n")
        return i

    ex = fnmap.Executor(backend="local", workers=1)
    fs = [ex.submit(work, i) for i in range(6)]
    while not os.path.exists(gate + ".started"):  # the first call runs: only the others can be cancelled
        time.sleep(0.01)
    ex.shutdown(wait=False, cancel_futures=True)
    open(gate, "w").close()
    print(json.dumps([i for i, f in enumerate(fs) if f.cancelled()]))
"""


def test_cancel_futures_then_exit_finishes_only_what_was_not_cancelled(tmp_path):
    out = tmp_path / "ran.txt"
    proc = _run_script(tmp_path, _CANCEL, str(out), str(tmp_path / "gate"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [1, 2, 3, 4, 5]
    assert _lines(out) == ["0"], proc.stderr  # the started call finished; the cancelled never ran


_LATE = """
    import atexit, sys
    import fnmap
    from fnmap import Executor  # imported before the exit, as a script's top does

    backend, which = sys.argv[1], sys.argv[2]
    if which == "existing":
        ex = fnmap.Executor(backend=backend)
        assert ex.submit(pow, 2, 3).result() == 8

    def late():
        try:
            executor = ex if which == "existing" else Executor(backend=backend)
        except RuntimeError as e:  # refused before a backend starts
            print("refused at start:", e)
            return
        try:
            future = executor.submit(pow, 2, 5)
        except RuntimeError as e:
            print("refused:", e)
        else:
            print("accepted:", future)

    atexit.register(late)
"""


@pytest.mark.parametrize(("backend", "which"), [("emulator", "existing"), ("local", "existing"), ("local", "new")])
def test_submit_after_interpreter_shutdown_raises(tmp_path, backend, which):
    """An executor made before the exit refuses at ``submit``; one made after, at its creation
    (before any backend starts; the stdlib's refuses at ``submit``, with the same message)."""
    proc = _run_script(tmp_path, _LATE, backend, which)
    assert proc.returncode == 0, proc.stderr
    refused = "refused at start:" if which == "new" else "refused:"
    assert proc.stdout.strip() == f"{refused} cannot schedule new futures after interpreter shutdown", \
        proc.stdout + proc.stderr


class Payload:
    pass


def _collect_unless_freed(*refs) -> None:
    """A full ``gc.collect()`` only where reference counting did not free the objects already:
    late in the suite the heap is large and a collection takes a second or more."""
    if any(r() is not None for r in refs):
        gc.collect()


def make_payload(_):
    return Payload()


@pytest.fixture(params=["emulator", "local"])
def executor(request):
    ex = fnmap.Executor(backend=request.param)
    yield ex
    ex.shutdown(wait=True)


@pytest.mark.parametrize("options", [{}, {"chunksize": 3}, {"buffersize": 2}])
def test_map_keeps_no_result_the_caller_has_had(executor, options):
    """CPython's ``test_free_reference`` (bpo-14406)."""
    seen = 0
    for obj in executor.map(make_payload, range(10), **options):
        ref = weakref.ref(obj)
        del obj
        _collect_unless_freed(ref)
        assert ref() is None
        seen += 1
    assert seen == 10


def test_submit_result_is_freed_with_its_future(executor):
    futures_ = [executor.submit(make_payload, i) for i in range(3)]
    refs = [weakref.ref(f.result()) for f in futures_]
    del futures_
    _collect_unless_freed(*refs)
    assert [r() for r in refs] == [None, None, None]


class Failure(Exception):
    pass


def fail(_):
    raise Failure("no")


def test_a_failed_result_is_freed_with_its_future(executor):
    future = executor.submit(fail, 1)
    ref = weakref.ref(future.exception())
    del future
    gc.collect()
    assert ref() is None


def wait_for_file(path, value):
    while not os.path.exists(path):
        time.sleep(0.01)
    return value


def append_line(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
    return line


def test_map_timeout_cancels_the_chunk_it_waited_on(tmp_path):
    """CPython's ``test_executor_map_current_future_cancel``: the chunk whose wait timed out is
    cancelled too, not only those after it (``_base._result_or_cancel``)."""
    gate, log = tmp_path / "gate", tmp_path / "ran.txt"
    ex = fnmap.Executor(backend="local", workers=1)
    try:
        first = ex.submit(wait_for_file, str(gate), "first")  # holds the only worker
        results = ex.map(append_line, [str(log)] * 2, ["second", "third"], timeout=0)
        with pytest.raises(futures.TimeoutError):
            next(results)
        results.close()
        gate.touch()
        assert first.result() == "first"
    finally:
        gate.touch()
        ex.shutdown(wait=True)
    assert _lines(log) == []
