"""The emulator shared by a user's processes (fnmap/emulator/shared.py), met as a user meets it:
scripts run one after another (and at once) in fresh interpreters, the `fnmap emulator status|stop`
commands, an idle timeout, a killed emulator, a folder others can write."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import until

from fnmap.errors import FnmapError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and a per-user runtime folder")

SCRIPT = """
import os, fnmap
print(sum(fnmap.map(abs, [-1, -2, 3], chunksize=1)), os.environ.get("FNMAP_EMULATOR_IDLE"))
"""


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A runtime folder of its own; every shared emulator started in it is stopped after the test."""
    folder = tmp_path / "xdg-runtime"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.setenv("FNMAP_EMULATOR_IDLE", "120")
    yield folder
    for state in folder.glob("fnmap/*/emulator.json"):
        try:
            os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError):
            pass


def run_script(env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "6"
    return result


def emulators(runtime) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runtime.glob("fnmap/*/emulator.json"))]


def fnmap_cli(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "fnmap", "emulator", *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child of this test process (never here: the scripts started it) would show as a zombie.
    return True


def test_two_scripts_share_one_emulator_which_outlives_them(runtime):
    run_script()  # capture_output: returns although the emulator it started still runs
    (state,) = emulators(runtime)
    assert alive(state["pid"])
    run_script()
    assert emulators(runtime) == [state]
    assert f"pid {state['pid']}" in fnmap_cli("status")


def test_the_start_notice_goes_to_a_terminal_not_to_a_program_reading_stderr(runtime):
    """CPython's own executor tests check that a child writes nothing on stderr: the notice is for
    a person (a terminal, a notebook: see the kernel test below), logged otherwise."""
    import pty

    piped = run_script()
    assert piped.stderr == ""
    (state,) = emulators(runtime)
    os.kill(state["pid"], signal.SIGKILL)
    until(lambda: not alive(state["pid"]))
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=follower, text=True,
                              timeout=120)
        assert done.returncode == 0
        os.close(follower)
        follower = -1
        said = b""
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the terminal's other end is closed and all was read
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert b"started an emulator shared by your processes" in said and b"fnmap emulator stop" in said


def test_status_and_stop_make_no_folder(runtime):
    assert "no shared fnmap emulator is running" in fnmap_cli("status")
    assert "no shared fnmap emulator is running" in fnmap_cli("stop")
    assert not (runtime / "fnmap").exists()


def test_the_folder_is_private(runtime):
    run_script()
    (folder,) = (runtime / "fnmap").iterdir()
    assert (runtime / "fnmap").stat().st_mode & 0o777 == 0o700
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "emulator.json").stat().st_mode & 0o077 == 0
    from fnmap.runtime.signing import local_secret

    assert local_secret() not in (folder / "emulator.json").read_text()


def test_stop_command_stops_it(runtime):
    run_script()
    (state,) = emulators(runtime)
    out = fnmap_cli("stop")
    assert f"stopped: pid {state['pid']}" in out
    until(lambda: not alive(state["pid"]))
    assert emulators(runtime) == []
    assert "no shared fnmap emulator is running" in fnmap_cli("status")


def test_it_stops_by_itself_when_idle(runtime):
    run_script({"FNMAP_EMULATOR_IDLE": "1"})
    (state,) = emulators(runtime)
    until(lambda: not alive(state["pid"]))  # it stopped by itself after 1 s without requests
    assert emulators(runtime) == []


WHERE = """
import os, fnmap

def where(x):
    return os.getcwd(), os.environ.get("MY_SETTING"), os.environ.get("FNMAP_OUTPUT")

print(repr(fnmap.map(where, range(2), chunksize=1)))
"""


def test_folders_and_environments_share_one_emulator_and_each_call_sees_its_own(runtime, tmp_path):
    """Five scripts in five folders, with variables of their own (a setting of theirs, a client-only
    fnmap setting, a typo, a plotting backend): one emulator, each call in its client's folder with
    its client's variables."""
    import ast

    extras = [{"MY_SETTING": "a"}, {"MY_SETTING": "b", "FNMAP_OUTPUT": "after"}, {"FNMAP_RETRYS": "1"},
              {"MPLBACKEND": "agg"}, {"JPY_PARENT_PID": "1", "MY_SETTING": "e"}]
    for n, extra in enumerate(extras):
        folder = tmp_path / f"project{n}"
        folder.mkdir()
        result = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, timeout=120,
                                cwd=folder, env=dict(os.environ, **extra))
        assert result.returncode == 0, result.stderr
        answers = ast.literal_eval(result.stdout.strip().splitlines()[-1])
        assert answers == [(str(folder), extra.get("MY_SETTING"), extra.get("FNMAP_OUTPUT"))] * 2
    assert len(emulators(runtime)) == 1


@contextlib.contextmanager
def _forwarding_proxy():
    """An HTTP proxy on loopback that forwards each request as it came, headers and all: its URL and
    the paths it forwarded."""
    import http.client
    import http.server
    import threading
    from urllib.parse import urlsplit

    seen: list[str] = []

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self):
            target = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if not k.lower().startswith(("proxy-", "connection"))}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, target.path or "/", body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            finally:
                conn.close()
            seen.append(target.path)
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _forward

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_calls_sent_through_a_proxy_run_on_the_clients_own_workers(runtime, tmp_path):
    """A client whose HTTP goes through a proxy sends its calls with ``requests``, not its plain-HTTP
    path: they carry its session token all the same, so they run on its workers, in its folder with
    its variables (without the token they would run on the emulator's own)."""
    import ast

    run_script()  # the emulator is up, started from another folder without MY_SETTING
    folder = tmp_path / "behind-a-proxy"
    folder.mkdir()
    with _forwarding_proxy() as (proxy, seen):
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.update(http_proxy=proxy, HTTP_PROXY=proxy, MY_SETTING="mine")
        done = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, timeout=120,
                              cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == [(str(folder), "mine", None)] * 2
    assert seen.count("/invoke") == 2, seen  # both calls went through the proxy
    assert len(emulators(runtime)) == 1


def test_a_killed_emulator_is_replaced(runtime):
    run_script()
    (state,) = emulators(runtime)
    os.kill(state["pid"], signal.SIGKILL)
    until(lambda: not alive(state["pid"]))
    run_script()
    (new,) = emulators(runtime)
    assert new["pid"] != state["pid"]


def test_scripts_started_at_once_start_one_emulator(runtime):
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len(emulators(runtime)) == 1


def test_a_folder_others_can_write_is_refused(runtime):
    (runtime / "fnmap").mkdir(mode=0o700)
    os.chmod(runtime / "fnmap", 0o777)
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "writable by others" in result.stderr and "chmod 700" in result.stderr
    assert emulators(runtime) == []


def test_idle_zero_keeps_one_emulator_per_process(runtime):
    run_script({"FNMAP_EMULATOR_IDLE": "0"})
    assert emulators(runtime) == []


@pytest.mark.parametrize("value", [-1, "300", True, float("nan")])
def test_a_bad_idle_time_is_refused_with_the_fix(value):
    import fnmap

    with pytest.raises(fnmap.ConfigError, match=r"emulator_idle=.* must be a number of seconds >= 0.*=300"):
        fnmap.map(abs, [1], emulator_idle=value)


def test_a_command_is_not_an_emulator_option():
    import fnmap

    with pytest.raises(fnmap.ConfigError, match="unrecognized arguments: stop"):
        fnmap.map(abs, [1], emulator_options="stop")


def test_a_restarted_kernel_attaches_to_the_emulator_the_first_kernel_started(runtime, tmp_path):
    """A notebook's kernel shut down and started again: the second kernel's first map waits for no
    emulator start (it attaches), and the first kernel's shutdown left the emulator serving."""
    import importlib.util

    if importlib.util.find_spec("ipykernel") is None:
        pytest.skip("ipykernel is not installed")
    from jupyter_client import KernelManager

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    said = []
    for _ in range(2):
        km = KernelManager(kernel_name="python3")
        km.start_kernel(env=env, cwd=str(tmp_path))
        kc = km.client()
        try:
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            out: list[str] = []
            reply = kc.execute_interactive("import fnmap; print(fnmap.map(abs, [-1, -2], chunksize=1))", timeout=180,
                                           output_hook=lambda m, out=out: out.append(m["content"].get("text", "")))
            assert reply["content"]["status"] == "ok", reply["content"]
            assert "[1, 2]" in "".join(out)
            said.append("".join(out))
            km.request_shutdown()
            until(lambda km=km: km.provisioner.process.poll() is not None, 20)  # it exits on the request
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    assert "started an emulator shared" in said[0]
    assert "started an emulator" not in said[1]
    (state,) = emulators(runtime)
    assert alive(state["pid"])


def test_a_runtime_folder_that_cannot_be_made_is_named_with_the_fix(runtime, tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    os.chmod(tmp_path, 0o700)
    (tmp_path / "fnmap").write_text("not a folder")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert f"cannot make {tmp_path / 'fnmap'}" in result.stderr and "FNMAP_EMULATOR_IDLE=0" in result.stderr
    assert "Traceback" in result.stderr and "OSError" not in result.stderr.splitlines()[-1]


SLOW_CLIENT = """
import time, fnmap

def slow(x):
    time.sleep(600)
    return x

print("go", flush=True)
fnmap.map(slow, range(3), chunksize=1)
"""


def _health(state: dict) -> dict:
    import requests

    return requests.get(state["url"] + "/health", timeout=10).json()


def test_the_calls_of_a_killed_client_are_stopped_and_free_the_workers(runtime):
    """An emulator of its own dies with a SIGKILLed client, and its calls with it; the shared one
    outlives the client, so it stops that client's calls itself: the next script finds free
    workers instead of waiting ten minutes behind them."""
    run_script()
    (state,) = emulators(runtime)
    client = subprocess.Popen([sys.executable, "-c", SLOW_CLIENT], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        assert client.stdout.readline().strip() == "go"
        until(lambda: _health(state)["in_flight"] == 3)
        os.kill(client.pid, signal.SIGKILL)
    finally:
        client.kill()
        client.wait()
    health = until(lambda: (h := _health(state))["in_flight"] == 0 and h)  # stopped, not left to run 600 s
    assert health["stopped"] >= 3, health
    run_script()


def test_python_python3_and_the_fnmap_command_share_one_emulator_whatever_their_settings(runtime, tmp_path):
    """One interpreter, one emulator: started as ``python``, as ``python3``, and by a command whose
    shebang is ``.../bin/python3`` (as pip writes the ``fnmap`` console script), each with another
    idle time and worker count: a client's settings start no other emulator."""
    python, _site = _venv(tmp_path)
    command = pathlib.Path(python).parent / "fnmap"
    command.write_text(f"#!{pathlib.Path(python).parent / 'python3'}\n{SCRIPT}")
    command.chmod(0o755)
    runs = [([python, "-c", SCRIPT], {"FNMAP_EMULATOR_IDLE": "120"}),
            ([str(pathlib.Path(python).parent / "python3"), "-c", SCRIPT], {"FNMAP_EMULATOR_IDLE": "90"}),
            ([str(command)], {"FNMAP_EMULATOR_IDLE": "60", "FNMAP_WORKERS": "3"})]
    # Every client imports this checkout's fnmap, whichever folder its interpreter puts first on the
    # path (a script's own, or the working folder): another fnmap would rightly get its own emulator.
    checkout = str(pathlib.Path(__file__).resolve().parents[1])
    here = os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))
    for argv, extra in runs:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=here, **extra))
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[0] == "6"
    assert len(emulators(runtime)) == 1


def test_emulator_options_get_an_emulator_of_their_own_not_another_shared_one(runtime):
    """Faults on purpose are one process's wish: that process gets an emulator of its own, stopped
    with it; the shared one serves everyone else (docs/operations.md)."""
    run_script({"FNMAP_EMULATOR_OPTIONS": "--latency-ms 1"})
    assert emulators(runtime) == []
    run_script()
    run_script({"FNMAP_EMULATOR_OPTIONS": "--latency-ms 1 --seed 2"})
    assert len(emulators(runtime)) == 1


MANY_SHORT_CALLS = """
import sys, time, fnmap

def short(x):
    time.sleep(0.02)
    return x

print("started", flush=True)
fnmap.map(short, range(1000), chunksize=1, job_name=sys.argv[1])
"""


def _status_or_none() -> dict | None:
    from fnmap.emulator import shared

    found = shared.running()
    return shared.status(found[0]) if found else None


def _waiting_for_workers(pid: int) -> bool:
    """Whether client ``pid`` has more calls in flight than its workers: some wait for one."""
    status = _status_or_none() or {}
    return any(s["pid"] == pid and s["in_flight"] > len(s["workers"]) > 0 for s in status.get("sessions", []))


def test_clients_killed_mid_map_leave_no_call_in_flight_and_it_stops_when_idle(runtime):
    """A client SIGKILLed while its calls wait for its workers: its session ends, and so does every
    call of it, waiting or running, so the emulator counts none in flight and stops after the idle
    time its last client asked for (an emulator forever busy with the calls of dead clients never did)."""
    run_script()
    (state,) = emulators(runtime)
    for n in range(3):
        client = subprocess.Popen([sys.executable, "-c", MANY_SHORT_CALLS, f"killed-mid-map-{n}-{os.getpid()}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  env=dict(os.environ, FNMAP_EMULATOR_IDLE="3"))
        try:
            assert client.stdout.readline().strip() == "started"
            until(lambda client=client: _waiting_for_workers(client.pid))
            os.kill(client.pid, signal.SIGKILL)
        finally:
            client.kill()
            client.wait()
    status = until(lambda: (s := _status_or_none()) is None or (s["in_flight"] == 0 and s), 30)
    if status is not None:  # (it may have stopped already)
        assert status["sessions"] == [] and status["idle_exit"] == 3, status
    until(lambda: not alive(state["pid"]), 30)  # it stopped by itself, 3 s after its last request
    assert emulators(runtime) == []


def test_a_session_the_emulator_ended_is_attached_again(runtime):
    """The emulator ended this process's session (its socket closed under it): the next request is
    answered 410, a lost session (``SessionGone``), and the process attaches again and runs the
    calls, on the same emulator."""
    import fnmap
    from fnmap.backends import emulator as backend
    from fnmap.emulator import EmulatorHandle
    from fnmap.emulator.shared import SharedEmulator

    assert fnmap.map(abs, [-1, -2], chunksize=1) == [1, 2]
    # (this process's emulators of earlier tests are there too, stopped or its own)
    (handle,) = [h for h in backend._embedded.values() if isinstance(h, SharedEmulator) and h.alive()]
    assert isinstance(handle, EmulatorHandle)
    token = handle.headers()
    handle.session.close()  # as the emulator sees a client whose socket closed
    until(lambda: not any(s["pid"] == os.getpid() for s in _status()["sessions"]))
    assert fnmap.map(abs, [-3, -4, -5], chunksize=1) == [3, 4, 5]
    assert handle.headers() != token
    assert [s["pid"] for s in _status()["sessions"]] == [os.getpid()]
    assert len(emulators(runtime)) == 1


def test_a_handle_found_not_answering_is_replaced_though_it_reads_as_alive(runtime):
    """A killed emulator closes its sockets some milliseconds before its process reads as ended: a
    client that found it not answering asks for another (``gone=``) and must not get the same
    handle back, or its replacements are spent in that window and the map fails (seen under load)."""
    import fnmap
    from fnmap.backends.emulator import embedded_emulator
    from fnmap.config import resolve

    assert fnmap.map(abs, [-1], chunksize=1) == [1]
    config = resolve()
    settings = dict(secret=config.secret, idle=config.emulator_idle)
    first = embedded_emulator(config.workers, "", (), **settings)
    assert first.alive() and embedded_emulator(config.workers, "", (), **settings) is first
    second = embedded_emulator(config.workers, "", (), gone=first, **settings)
    assert second is not first and second.alive()
    assert embedded_emulator(config.workers, "", (), **settings) is second
    second.stop()


# -- fresh code, live output, memory given back, an emulator that outlives what it serves ----------


def _venv(tmp_path) -> tuple[str, str]:
    """A virtual environment that sees this one's packages (fnmap among them): its python and its
    site-packages, where a test installs modules as pip would."""
    folder = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(folder)],
                   check=True, timeout=120)
    python = str(folder / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return python, site


VERSION_SCRIPT = """
import fnmap, verlib

def version(x):
    return verlib.VERSION

print("client", verlib.VERSION, "workers", sorted(set(fnmap.map(version, range(4), chunksize=1))))
"""

NEW_PACKAGES_SCRIPT = """
import fnmap

def probe(x):
    import newpkg, edpkg
    return newpkg.NAME, edpkg.NAME

print(fnmap.map(probe, [0]))
"""


def test_an_installed_module_edited_between_runs_and_packages_installed_since_are_seen(runtime, tmp_path):
    python, site = _venv(tmp_path)
    module = pathlib.Path(site) / "verlib.py"
    module.write_text("VERSION = 'v1'\n")

    def run(script: str) -> str:
        done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(VERSION_SCRIPT) == "client v1 workers ['v1']"
    module.write_text("VERSION = 'v2 edited'\n")
    assert run(VERSION_SCRIPT) == "client v2 edited workers ['v2 edited']"
    # Installed while the emulator runs: a plain package, and an editable one (a .pth naming its folder).
    (pathlib.Path(site) / "newpkg").mkdir()
    (pathlib.Path(site) / "newpkg" / "__init__.py").write_text("NAME = 'new'\n")
    source = tmp_path / "editable-src"
    (source / "edpkg").mkdir(parents=True)
    (source / "edpkg" / "__init__.py").write_text("NAME = 'editable'\n")
    (pathlib.Path(site) / "__editable__.edpkg.pth").write_text(f"{source}\n")
    assert run(NEW_PACKAGES_SCRIPT) == "[('new', 'editable')]"
    assert len(emulators(runtime)) == 1


LIVE_SCRIPT = """
import sys, fnmap

def shout(x):
    print(f"live line {x}", file=sys.stderr, flush=True)
    return x

print(fnmap.map(shout, range(3), chunksize=1, output="live"))
"""


def test_live_output_reaches_the_callers_stderr(runtime):
    done = subprocess.run([sys.executable, "-c", LIVE_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 2]"
    # Workers print at once: their lines may interleave (a print writes its text and its end apart).
    assert sorted(re.findall(r"live line \d", done.stderr)) == ["live line 0", "live line 1", "live line 2"]
    assert all("live line" not in p.read_text() for p in runtime.glob("fnmap/*/emulator.log"))


HOLDER_SCRIPT = """
import fnmap

KEPT = []

def hold(x):
    KEPT.append(bytearray(100 << 20))  # kept by the worker after the call
    return len(KEPT)

print(fnmap.map(hold, range(4), chunksize=1))
"""


def _status() -> dict:
    from fnmap.emulator import shared

    (emu,) = shared.running()
    return shared.status(emu)


def test_an_ended_clients_memory_is_given_back(runtime):
    run_script()
    fresh = _status()["memory"]
    done = subprocess.run([sys.executable, "-c", HOLDER_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The client's workers ended with it: what they held (400 MB) is not the emulator's any more.
    status = until(lambda: (s := _status())["memory"] < fresh + (100 << 20) and s, 20)
    assert status["sessions"] == []


#: A map of ``argv[2]`` calls of ``argv[1]`` seconds each; with ``argv[4]``, a file, each call then
#: waits while that file exists (the test releases them once it has seen them in flight).
SLOW_MAP = """
import os, sys, time, fnmap

def slow(pause_x_hold):
    pause, x, hold = pause_x_hold
    time.sleep(pause)
    while hold and os.path.exists(hold):
        time.sleep(0.01)
    return x * 10

hold = sys.argv[4] if len(sys.argv) > 4 else ""
items = [(float(sys.argv[1]), x, hold) for x in range(int(sys.argv[2]))]
print("started", flush=True)
print("results", fnmap.map(slow, items, chunksize=1, job_name=sys.argv[3]), flush=True)
"""


def _slow_client(seconds: float, items: int, name: str, hold: pathlib.Path) -> subprocess.Popen:
    """A client running SLOW_MAP whose calls wait while ``hold`` exists: in flight until the test
    removes it, however long the client (or another) took to start on a loaded machine."""
    return subprocess.Popen([sys.executable, "-c", SLOW_MAP, str(seconds), str(items), name, str(hold)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(client: subprocess.Popen, items: int) -> None:
    out, err = client.communicate(timeout=180)
    assert client.returncode == 0, err
    assert out.splitlines()[-1] == f"results {[x * 10 for x in range(items)]}", (out, err)


def _in_flight(pid: int) -> bool:
    return any(s["pid"] == pid and s["in_flight"] for s in _status().get("sessions", []))


def test_stop_refuses_while_another_process_has_calls_on_it_and_force_does_not_lose_them(runtime):
    run_script()
    (state,) = emulators(runtime)
    hold = runtime / "hold"
    hold.touch()
    client = _slow_client(0, 4, "stop-me", hold)
    try:
        until(lambda: _in_flight(client.pid))
        status = fnmap_cli("status")
        assert f"client pid {client.pid} in {os.getcwd()}: " in status and "calls in flight (job " in status
        assert f"python {sys.executable}" in status and "MB (its processes and workers)" in status
        assert "stops after" in status and "s more without requests" in status
        refused = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "stop"], capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 1
        assert f"process {client.pid} has" in refused.stdout and "stop --force" in refused.stdout
        assert alive(state["pid"])
        hold.unlink()
        _finished(client, 4)
        hold.touch()
        client = _slow_client(0, 4, "forced", hold)
        until(lambda: _in_flight(client.pid))
        forced = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "stop", "--force"], capture_output=True,
                                text=True, timeout=60)
        assert forced.returncode == 0 and f"stopped: pid {state['pid']}" in forced.stdout
        hold.unlink()
        _finished(client, 4)  # it started another emulator and sent its unfinished calls again
    finally:
        hold.unlink(missing_ok=True)  # no worker left waiting on it if the test failed
        client.kill()
        client.wait()
    (new,) = emulators(runtime)
    assert new["pid"] != state["pid"]


def _jobs_of(pid: int) -> list[dict]:
    from fnmap.config import resolve
    from fnmap.observe.history import list_jobs
    from fnmap.storage import open_store

    config = resolve()
    store = open_store(config.storage_url, config.storage_origin, create=False)
    # The suite's storage is shared: other tests plant index entries of their own (some hostile).
    return [j for j in list_jobs(store, None) if isinstance(j.get("client"), dict) and j["client"].get("pid") == pid]


def test_a_killed_shared_emulator_loses_no_map_it_served(runtime):
    run_script()
    (state,) = emulators(runtime)
    hold = runtime / "hold"
    hold.touch()
    clients = [_slow_client(0, 6, f"killed-{n}", hold) for n in range(2)]
    try:
        until(lambda: all(_in_flight(c.pid) for c in clients))  # both, however long each took to start
        os.kill(state["pid"], signal.SIGKILL)
        hold.unlink()
        for client in clients:
            _finished(client, 6)
    finally:
        hold.unlink(missing_ok=True)  # no worker left waiting on it if the test failed
        for client in clients:
            client.kill()
            client.wait()
    for client in clients:
        (job,) = _jobs_of(client.pid)
        assert job["status"] == "succeeded" and job["calls_done"] == 6, job


def test_losing_an_emulator_named_by_url_fails_the_map_saying_how_to_finish_it(emulator_process, runtime):
    """An emulator the user started and named is theirs: fnmap does not replace it; the map fails
    naming it and the command that finishes the job, and the job reads failed, not abandoned."""
    emu = emulator_process()
    env = dict(os.environ, FNMAP_EMULATOR_URL=emu.url, FNMAP_SECRET=emu.secret)
    client = subprocess.Popen([sys.executable, "-c", SLOW_MAP, "3", "4", "named-url"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert client.stdout.readline().strip() == "started"
        until(lambda: emu.health()["in_flight"] > 0)
        os.kill(emu.pid, signal.SIGKILL)
        out, err = client.communicate(timeout=120)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 1
    assert f"the emulator at {emu.url} (FNMAP_EMULATOR_URL=" in err and "is not answering" in err, err
    assert "`fnmap redrive " in err
    (job,) = _jobs_of(client.pid)
    assert job["status"] == "failed", job
    assert emulators(runtime) == []  # none started in its place


def test_live_output_reaches_the_notebook_cell(runtime, tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("ipykernel") is None:
        pytest.skip("ipykernel is not installed")
    from test_notebook import run_cells, text_of

    # ipykernel forwards what is written on its stderr's descriptor to the cell, as a user's kernel
    # does, except under pytest: its kernel here must not know it runs in a test.
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)

    cell = ("import sys, fnmap\n"
            "def shout(x):\n    print(f'live line {x}', file=sys.stderr, flush=True)\n    return x * 2\n"
            "print(fnmap.map(shout, range(3), chunksize=1, output='live'))")
    shown = text_of(run_cells([cell], tmp_path)[0])
    assert "[0, 2, 4]" in shown, shown
    assert sorted(re.findall(r"live line \d", shown)) == ["live line 0", "live line 1", "live line 2"], shown
    assert len(emulators(runtime)) == 1  # the shared one served it


LIGHT_CLIENT = """
import sys, fnmap
fnmap.map(abs, [-1], chunksize=1)
print(sorted(m for m in ("flask", "werkzeug", "boto3", "botocore", "requests") if m in sys.modules))
"""


def test_a_clients_first_map_imports_no_server_or_cloud_library(runtime):
    """The emulator's HTTP stack (Flask, 0.1 s to import) and boto3 are the emulator's and the cloud
    backends': a client's first map on the shared emulator loads none of them."""
    run_script()
    done = subprocess.run([sys.executable, "-c", LIGHT_CLIENT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_client_in_another_mount_namespace_gets_an_emulator_that_sees_its_files(runtime, tmp_path):
    """A client under ``unshare`` (or in a container sharing the runtime folder) sees other files at
    the same paths: the emulator it shares must see them too, or its workers miss the job's storage."""
    import shutil

    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("user namespaces are not available here (unshare -rm)")
    run_script()  # an emulator of this namespace is up
    store = tmp_path / "store"
    store.mkdir()
    env = dict(os.environ, FNMAP_STORAGE=store.as_uri())
    shell = f"mount -t tmpfs tmpfs {store} && exec {sys.executable} -c '{SCRIPT.strip()}'"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", shell], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "6"


# -- starts that someone's SIGKILL interrupts ------------------------------------------------------


def _emulator_processes(marker: str, parent: int | None = None) -> list[int]:
    """The live ``fnmap emulator`` processes whose command line names ``marker`` (the runtime
    folder, in their ``--state-file``), or every one that ``parent`` started."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if " -m fnmap emulator " in command and fields[0] != "Z" and (
                int(fields[1]) == parent if parent is not None else marker in command):
            found.append(int(entry))
    return sorted(found)


def _frozen_before_ready(client: subprocess.Popen, runtime) -> int:
    """The emulator ``client`` starts, stopped (SIGSTOP) as soon as it is seen, before it is ready."""
    deadline = time.monotonic() + 120
    while not (started := _emulator_processes(str(runtime), parent=client.pid)):
        assert client.poll() is None and time.monotonic() < deadline, "the client started no emulator"
        time.sleep(0.002)
    (pid,) = started
    os.kill(pid, signal.SIGSTOP)
    assert not emulators(runtime), "the emulator was ready before it could be stopped: nothing tested"
    return pid


@pytest.fixture
def short_runtime(monkeypatch):
    """A runtime folder with a path short enough for the sessions socket to lie in the emulator's
    folder (pytest's folders are too deep: the socket would go to a private folder of its own)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="fx")
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    monkeypatch.setenv("FNMAP_EMULATOR_IDLE", "120")
    yield pathlib.Path(folder)
    for pid in _emulator_processes(folder):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_client_killed_while_it_starts_the_emulator_leaves_one_emulator(short_runtime):
    """The emulator a SIGKILLed client was starting goes on starting; the next client waits for it
    and attaches to it (the start lock, passed to the emulator, stays held until it is ready), not
    start a second one of the same identity that no ``fnmap emulator status`` would show."""
    first = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphan = _frozen_before_ready(first, short_runtime)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    second = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        # The second client waits on the start lock meanwhile (polling it: a bounded wait); without
        # the lock passed on, it would start an emulator of its own within these seconds.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not _emulator_processes(str(short_runtime), second.pid):
            time.sleep(0.1)
    finally:
        os.kill(orphan, signal.SIGCONT)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0 and out.split()[0] == "6", err
    assert _emulator_processes(str(short_runtime)) == [orphan]
    assert [state["pid"] for state in emulators(short_runtime)] == [orphan]


def test_an_emulator_killed_before_it_is_ready_is_started_again(short_runtime):
    """A map does not fail because the shared emulator its process was starting died (another
    process's SIGKILL, the OOM killer): its client starts another."""
    client = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    killed = _frozen_before_ready(client, short_runtime)
    os.kill(killed, signal.SIGKILL)
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0 and out.split()[0] == "6", err
    (state,) = emulators(short_runtime)
    assert state["pid"] != killed


def test_an_emulator_that_stops_when_idle_leaves_its_successors_socket(short_runtime):
    """An idle emulator withdraws its state and serves on a moment; one started meanwhile binds its
    own sessions socket at the same path.  The first one's exit must not remove it: every later
    client would fail to attach until the second one stopped."""
    import fcntl

    run_script({"FNMAP_EMULATOR_IDLE": "1"})
    (old,) = emulators(short_runtime)
    until(lambda: not emulators(short_runtime))  # withdrawn (idle); it serves its grace seconds
    lock = os.open(os.path.join(os.path.dirname(old["socket"]), "lock"), os.O_RDWR)
    try:
        while True:  # stopped where it holds no lock (withdrawing takes it a moment)
            os.kill(old["pid"], signal.SIGSTOP)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_UN)
                break
            except BlockingIOError:
                os.kill(old["pid"], signal.SIGCONT)
                time.sleep(0.01)
    finally:
        os.close(lock)
    try:
        run_script()
        (new,) = emulators(short_runtime)
        assert new["socket"] == old["socket"] and new["pid"] != old["pid"]
    finally:
        os.kill(old["pid"], signal.SIGCONT)
    until(lambda: old["pid"] not in _emulator_processes(str(short_runtime)))
    assert os.path.exists(new["socket"])
    run_script()
    assert emulators(short_runtime) == [new]


def test_a_start_lock_held_for_ever_is_waited_on_for_a_bounded_time(tmp_path, monkeypatch):
    """An emulator whose starter was killed holds the start lock until it is ready; one that hangs
    while starting must not hold every later client for ever: they wait a bounded time, then say
    what to do."""
    from fnmap.emulator import shared

    hold = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(shared, "STARTUP_TIMEOUT", 0.2)
        with pytest.raises(FnmapError, match="has been starting for over .* kill the `fnmap emulator` process"):
            with shared.locked(str(tmp_path)):
                pass
    finally:
        holder.kill()
        holder.wait()
