"""The emulator as a real server: started through the CLI, used over HTTP, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import requests

import fnmap


def kill_self_on_two(x):
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 10


def exit_on_one(x):
    if x == 1:
        os._exit(3)
    return x


@pytest.mark.parametrize("server", ["fnmap", "waitress"])
def test_cli_emulator_serves_and_stops_on_sigterm(use_emulator, server):
    emu = use_emulator("--wsgi-server", server, workers=2)
    served_by = requests.get(emu.url + "/health", timeout=5).headers.get("Server", "")
    assert ("waitress" in served_by) == (server == "waitress")
    health = emu.health()
    assert health["status"] == "ok" and len(health["worker_pids"]) == 2
    assert fnmap.map(lambda x: x * 2, range(30), chunksize=4) == [x * 2 for x in range(30)]
    calls = requests.get(emu.url + "/calls", timeout=5).json()
    assert len(calls) == 8 and all(c["outcome"] == "ok" for c in calls)
    pids = health["worker_pids"]
    assert emu.stop() == 0
    for pid in pids:  # the worker processes are gone too
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_worker_killed_mid_call_fails_that_call_only(use_emulator):
    emu = use_emulator(workers=2)
    out = fnmap.map(kill_self_on_two, range(6), retries=0, return_exceptions=True)
    assert [o for i, o in enumerate(out) if i != 2] == [0, 10, 30, 40, 50]
    assert isinstance(out[2], fnmap.WorkerCrashed)
    assert "SIGKILL" in str(out[2])
    # The emulator replaced the worker and keeps serving.
    assert fnmap.map(lambda x: x, range(10)) == list(range(10))
    assert emu.health()["crashes"] == 1


def test_os_exit_is_retried_then_reported(use_emulator):
    use_emulator(workers=2)
    with pytest.raises(fnmap.WorkerCrashed) as info:
        fnmap.map(exit_on_one, [0, 1, 2], retries=1)
    assert "2 attempt" in str(info.value) and "exit code 3" in str(info.value)


def test_unsigned_request_refused(use_emulator):
    emu = use_emulator(workers=1)
    r = requests.post(emu.url + "/invoke", data=b"\x00\x00\x00\x02{}", timeout=10)
    assert r.status_code == 401
    r = requests.post(emu.url + "/invoke", data=b"x", headers={"X-Fnmap-Signature": "00"}, timeout=10)
    assert r.status_code == 403


def test_emulator_help():
    out = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--workers" in out and "--host" in out


def test_embedded_emulator_stops_when_parent_is_killed(tmp_path):
    """A parent killed with SIGKILL (a restarted notebook kernel) leaves no emulator behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import fnmap, sys\n"
        "from fnmap.client import get_client\nfrom fnmap.config import resolve\n"
        "fnmap.map(abs, [-1])\n"
        "print(get_client(resolve()).backend.url, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    env = dict(os.environ)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        url = parent.stdout.readline().decode().strip()
        health = requests.get(url + "/health", timeout=5).json()
        pids = health["worker_pids"]
        parent.kill()
        parent.wait()
        import time

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                requests.get(url + "/health", timeout=1)
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                break  # refused, or cut off mid-answer while shutting down
            time.sleep(0.2)
        else:
            pytest.fail("the emulator outlived its parent")
        time.sleep(1)
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            # A zombie already reaped by init is fine; a live worker is not.
            with open(f"/proc/{pid}/status") as f:
                assert "zombie" in f.read().lower(), f"worker {pid} outlived the emulator"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()
