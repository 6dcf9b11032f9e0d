"""One wording each, counted in the source: whether a process lives (one ``kill(pid, 0)``, one reader
of ``/proc/PID/stat``), whether a job's client is gone (asked of :func:`fnmap.lease.judge` alone),
the emulator handle the emulator backend uses (declared, never probed), a lost session (a typed
fault, not a message prefix), the session token (on every HTTP path) and the 4-byte framings."""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import until

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fnmap"


def _trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def _calls(tree: ast.AST):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def kill_zero_sites(trees: dict[str, ast.AST]) -> list[str]:
    """``os.kill(pid, 0)``: asking whether a process exists."""
    return [f"{module}:{call.lineno}" for module, tree in trees.items() for call in _calls(tree)
            if ast.unparse(call.func) == "os.kill" and len(call.args) == 2
            and isinstance(call.args[1], ast.Constant) and call.args[1].value == 0]


def proc_stat_readers(trees: dict[str, ast.AST]) -> list[str]:
    """Paths ``/proc/<pid or self>/stat`` opened (not ``/proc/stat``, the system's)."""
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.JoinedStr, ast.Constant)) and not isinstance(getattr(node, "value", None), bytes):
                text = ast.unparse(node)
                if "/proc/" in text and text.rstrip("'\"").endswith("/stat") and "/proc/stat" not in text:
                    found.append(f"{module}:{node.lineno}")
    return found


#: What tells whether a job's client (or any process) is gone, besides the judge and the one function.
LIVENESS = {"gone_reason", "client_gone", "_writer_alive", "_exists", "_process_start"}
#: Where they may be called: the judge of abandonment.
JUDGE = "fnmap/lease.py"


def liveness_calls_outside_the_judge(trees: dict[str, ast.AST]) -> list[str]:
    return [f"{module}:{call.lineno} {_name(call.func)}" for module, tree in trees.items() if module != JUDGE
            for call in _calls(tree) if _name(call.func) in LIVENESS]


def probes(tree: ast.AST) -> list[str]:
    """``getattr``/``hasattr`` calls: asking an object what it is instead of declaring it."""
    return [f"{call.lineno}: {ast.unparse(call)}" for call in _calls(tree)
            if isinstance(call.func, ast.Name) and call.func.id in ("getattr", "hasattr")]


def length_framings(trees: dict[str, ast.AST]) -> list[str]:
    return [f"{module}:{call.lineno}" for module, tree in trees.items() for call in _calls(tree)
            if ast.unparse(call) == "struct.Struct('>I')"]


def message_matches(trees: dict[str, ast.AST]) -> list[str]:
    """A fault recognised by its message's start: ``startswith(<a name>)`` on a fault's message."""
    return [f"{module}:{call.lineno}" for module, tree in trees.items() for call in _calls(tree)
            if _name(call.func) == "startswith" and "message" in ast.unparse(call.func)]


def test_one_kill_zero_and_one_proc_stat_reader():
    trees = _trees()
    line = _line("fnmap/runtime/processes.py", "os.kill(pid, 0)")
    assert kill_zero_sites(trees) == [f"fnmap/runtime/processes.py:{line}"]
    assert len(proc_stat_readers(trees)) == 1, proc_stat_readers(trees)
    assert proc_stat_readers(trees)[0].startswith("fnmap/runtime/processes.py:")


def _line(module: str, text: str) -> int:
    (line,) = [n for n, source in enumerate((ROOT / module).read_text().splitlines(), 1) if text in source]
    return line


def test_every_reader_asks_the_judge_whether_a_client_is_gone():
    assert liveness_calls_outside_the_judge(_trees()) == []


def test_the_emulator_backend_probes_no_handle_and_matches_no_message():
    trees = _trees()
    assert probes(trees["fnmap/backends/emulator.py"]) == []
    assert message_matches(trees) == []
    for module in ("backends/emulator.py", "emulator/app.py"):  # one name, one meaning: none left of two
        assert "_SESSION_GONE" not in (PACKAGE / module).read_text()


def test_at_most_two_length_framings():
    assert len(length_framings(_trees())) <= 2, length_framings(_trees())


def test_every_request_to_a_host_carries_the_backends_headers():
    """The shared emulator's session token goes on the plain-HTTP path, the ``requests`` path (a proxy
    applies) and the stop route alike: each request built with a signature carries ``self.headers``."""
    tree = _trees()["fnmap/backends/http.py"]
    signed = [node for node in ast.walk(tree) if isinstance(node, ast.Dict)
              and any(key is not None and ast.unparse(key) == "SIGNATURE_HEADER" for key in node.keys)]
    assert len(signed) == 3, [ast.unparse(d) for d in signed]
    for node in signed:
        unpacked = [ast.unparse(value) for key, value in zip(node.keys, node.values, strict=True) if key is None]
        assert unpacked == ["self.headers"], ast.unparse(node)


def test_both_emulators_implement_the_declared_handle():
    from fnmap.emulator import EmulatorHandle
    from fnmap.emulator.launcher import EmbeddedEmulator
    from fnmap.emulator.shared import SharedEmulator

    methods = [name for name, value in vars(EmulatorHandle).items() if inspect.isfunction(value) and name[0] != "_"]
    assert set(methods) >= {"alive", "headers", "attach", "request_stop", "stop", "close_in_child"}
    for cls in (SharedEmulator, EmbeddedEmulator):
        for name in methods:
            own = getattr(cls, name)
            assert callable(own) and own is not getattr(EmulatorHandle, name), f"{cls.__name__}.{name}"
            declared = list(inspect.signature(getattr(EmulatorHandle, name)).parameters)
            assert list(inspect.signature(own).parameters) == declared, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("probe, counter, expected", [
    ("import os\nos.kill(pid, 0)\nos.kill(pid, 9)\n", kill_zero_sites, 1),
    ("open(f'/proc/{pid}/stat')\nopen('/proc/self/stat')\nopen('/proc/stat')\nopen(f'/proc/{p}/statm')\n",
     proc_stat_readers, 2),
    ("from .identity import gone_reason\nx = gone_reason(c)\nclient_gone(c)\n", liveness_calls_outside_the_judge, 2),
    ("import struct\nA = struct.Struct('>I')\nB = struct.Struct('>III')\n", length_framings, 1),
    ("if fault.message.startswith(GONE):\n    pass\n", message_matches, 1),
])
def test_the_counters_see_what_they_count(probe, counter, expected):
    assert len(counter({"fnmap/probe.py": ast.parse(probe)})) == expected
    assert len(probes(ast.parse("getattr(e, 'session', None)\nhasattr(self, 'url')\n"))) == 2


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")


@needs_proc
def test_a_zombie_or_a_reused_pid_is_not_alive():
    from fnmap.runtime import processes

    me = processes.stat(os.getpid())
    assert processes.alive(os.getpid()) and processes.alive(os.getpid(), me.start)
    assert not processes.alive(os.getpid(), str(int(me.start) + 1))  # another process that got this pid
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        until(lambda: processes.stat(child.pid).state == "Z")  # it exited; nobody reaped it yet
        assert not processes.alive(child.pid)
    finally:
        child.wait()
    assert not processes.alive(child.pid) and processes.stat(child.pid) is None


@needs_proc
def test_the_judge_calls_a_running_job_whose_client_is_a_zombie_abandoned(tmp_path):
    """No lease (the client was killed before it wrote one): the judge asks after the client its
    start entry names, and a killed client not yet reaped is gone."""
    import socket

    from fnmap import lease
    from fnmap.runtime import processes
    from fnmap.storage import open_store

    store = open_store(tmp_path.as_uri())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        client = {"host": socket.gethostname(), "pid": child.pid, "start": processes.stat(child.pid).start}
        entry = {"job_id": "j" * 32, "status": "running", "client": client}
        assert lease.judge(store, dict(entry))["status"] == "running"
        child.kill()
        until(lambda: processes.stat(child.pid).state == "Z")
        judged = lease.judge(store, dict(entry))
        assert judged["status"] == lease.ABANDONED and f"pid {child.pid}" in judged["abandoned"], judged
    finally:
        child.kill()
        child.wait()
