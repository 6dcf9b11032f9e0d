"""One warm emulator shared by a user's processes: a fresh script's first call waits for no start-up.

Starting an emulator costs a new interpreter, its imports and its workers' (0.6 s or more here);
a script run again, or a notebook kernel restarted, would pay it every time.  So the emulator
``fnmap.map`` starts by itself stays up after its starter exits, and later processes of the same
user with the same settings attach to it.  It stops by itself once it has served no request for
``emulator_idle`` seconds (300 by default), or at ``fnmap emulator stop``; whoever starts one is
told so on stderr, with its pid and log.

Where and how it is found: a folder per user (``$XDG_RUNTIME_DIR/fnmap``, else
``~/.cache/fnmap/run``; mode 0700, refused when others can write it), with a sub-folder per
*identity*: a hash of what the emulator's workers inherit or need (the interpreter, fnmap's own
code, the working folder, the environment but for variables that differ between shells, the
worker count, the extra options and the secret's fingerprint).  A process whose identity
differs gets an emulator of its own, so no worker ever runs with another process's settings.
In that folder ``emulator.json`` (the URL and pid, written once it listens) and ``emulator.log``
(its output); an exclusive ``flock`` on ``lock`` makes concurrent starters start one emulator.

Trust: the emulator listens on loopback TCP as the per-process one does, and every route that
runs code checks a signature made with the user's secret (:func:`fnmap.runtime.signing.local_secret`,
mode 0600), so another user or a web page can reach the port but not run anything; the folder's
files say where it is, never the secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time

from ..errors import FnmapError

#: Seconds a shared emulator waits for a request before it stops, unless ``emulator_idle`` says.
DEFAULT_IDLE = 300.0
STATE_FILE = "emulator.json"
LOG_FILE = "emulator.log"
#: Variables that differ between two shells or kernels of one user without changing what a
#: worker does; every other variable is part of the identity.
VOLATILE_VARIABLES = frozenset({
    "_", "OLDPWD", "PWD", "SHLVL", "PS1", "PS2", "COLUMNS", "LINES", "TERM_SESSION_ID", "WINDOWID",
    "JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTEST_CURRENT_TEST", "SSH_TTY", "SSH_CLIENT", "SSH_CONNECTION",
    "XDG_SESSION_ID", "INVOCATION_ID", "SECURITYSESSIONID",
})
STARTUP_TIMEOUT = 60.0


def supported() -> bool:
    """A shared emulator needs ``fcntl.flock`` (POSIX) to start one among concurrent starters."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return True


def state_path() -> str:
    """Where this user's shared emulators are found: ``$XDG_RUNTIME_DIR/fnmap``, else ``~/.cache/fnmap/run``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "fnmap")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fnmap", "run")


def state_root() -> str:
    """:func:`state_path`, made 0700; FnmapError when it cannot be made or others could write it."""
    root = state_path()
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        info = os.stat(root)
    except OSError as e:
        raise FnmapError(f"cannot make {root}, where fnmap keeps this user's shared emulators ({e.strerror}); "
                         "set XDG_RUNTIME_DIR to a folder of yours, or FNMAP_EMULATOR_IDLE=0 to give each "
                         "process an emulator of its own") from None
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise FnmapError(
            f"{root} (where fnmap keeps this user's shared emulators) is not owned by you or is writable "
            f"by others (mode {oct(info.st_mode & 0o777)}); fix it with `chmod 700 {root}`, or set "
            "FNMAP_EMULATOR_IDLE=0 to give each process an emulator of its own"
        )
    return root


def identity(workers: int, options: str, secret: str, idle: float) -> str:
    """The hash that names the emulator these settings may share (see the module's docstring)."""
    environment = sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE_VARIABLES)
    facts = {
        "python": sys.executable, "version": sys.version, "code": _code_fingerprint(), "cwd": os.getcwd(),
        "env": environment, "workers": workers, "options": options, "idle": idle,
        "secret": hashlib.sha256(secret.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


_fingerprint: list[str] = []


def _code_fingerprint() -> str:
    """fnmap's own source files (names, sizes, times): an edited checkout gets a new emulator."""
    if not _fingerprint:
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        digest = hashlib.sha256()
        for folder, dirs, files in os.walk(package):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    info = os.stat(os.path.join(folder, name))
                    digest.update(f"{folder}/{name}:{info.st_size}:{info.st_mtime_ns}\n".encode())
        _fingerprint.append(digest.hexdigest())
    return _fingerprint[0]


class SharedEmulator:
    """A handle on the shared emulator of one identity: attached to, or started and then attached to.

    ``url``, ``secret``, ``workers`` and ``pid`` as for :class:`.launcher.EmulatorLauncher`;
    :meth:`alive` is False once it stopped (idle, ``fnmap emulator stop``, killed), and a new
    handle then starts another.
    """

    def __init__(self, workers: int, options: str, secret: str, idle: float):
        self.workers, self.secret = workers, secret
        self.folder = os.path.join(state_root(), identity(workers, options, secret, idle))
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.started = False
        with _locked(self.folder):
            state = read_state(self.folder)
            if state is None or not _listening(state["url"]):  # a pid reused after a SIGKILL
                state = self._start(options, idle)
                self.started = True
        self.url, self.pid = state["url"], state["pid"]
        if self.started:
            print(f"fnmap: started an emulator shared by your processes (pid {self.pid}, {workers} workers, "
                  f"log {os.path.join(self.folder, LOG_FILE)}); it stops after {idle:g} s without requests, "
                  "or now with `fnmap emulator stop` (FNMAP_EMULATOR_IDLE=0 gives each process its own)",
                  file=sys.stderr, flush=True)

    def _start(self, options: str, idle: float) -> dict:
        import shlex
        import subprocess

        from ..runtime.signing import SECRET_ENV

        cmd = [sys.executable, "-m", "fnmap", "emulator", "--host", "127.0.0.1", "--port", "0",
               "--workers", str(self.workers), "--idle-exit", str(idle), "--stop-on-hangup",
               "--state-file", os.path.join(self.folder, STATE_FILE), *shlex.split(options)]
        log_fd = os.open(os.path.join(self.folder, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(log_fd, "wb") as log:  # 0600: it shows the AWS credentials the emulator made
            # Its own session and no pipe of ours: a Ctrl-C here does not reach it, and whoever
            # reads this process's output (a CI runner, subprocess.run) is not kept waiting by it.
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env=dict(os.environ, **{SECRET_ENV: self.secret}), start_new_session=True)
        return self._wait_until_listening(proc)

    def _wait_until_listening(self, proc) -> dict:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            state = read_state(self.folder)
            if state is not None and state["pid"] == proc.pid:
                _reap_in_background(proc)
                return state
            if proc.poll() is not None:
                with open(os.path.join(self.folder, LOG_FILE), errors="replace") as f:
                    output = f.read()
                raise FnmapError(f"the fnmap emulator exited with code {proc.returncode} before it was ready; "
                                 f"its output:\n{output}")
            time.sleep(0.005)
        proc.kill()
        raise FnmapError(f"the fnmap emulator was not ready after {STARTUP_TIMEOUT} s")

    def alive(self) -> bool:
        """Still the emulator its folder names (it removes its state before it stops)."""
        state = read_state(self.folder)
        return state is not None and state["pid"] == self.pid

    def request_stop(self) -> None:
        """Nothing: a shared emulator outlives the processes that use it."""

    def stop(self, timeout: float | None = None) -> int:
        return 0


def read_state(folder: str) -> dict | None:
    """The state a live emulator wrote in ``folder``, or None (none, unreadable, or its process gone)."""
    try:
        with open(os.path.join(folder, STATE_FILE)) as f:
            state = json.load(f)
        os.kill(state["pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def _listening(url: str) -> bool:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _locked(folder: str):
    import fcntl

    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _reap_in_background(proc) -> None:
    """Wait for the child in a daemon thread, so it never lingers as a zombie of this process."""
    import threading

    threading.Thread(target=proc.wait, name="fnmap-shared-emulator-reaper", daemon=True).start()


# -- the emulator's side ------------------------------------------------------------------------


def write_state(path: str, url: str, workers: int) -> None:
    """Say where this emulator listens (atomically: a reader sees all of it or nothing)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": os.getpid(), "workers": workers, "started": time.time()}, f)
    os.replace(tmp, path)


def withdraw_state(path: str) -> None:
    """Stop being found: remove the state file if it still names this process, under the lock."""
    folder = os.path.dirname(path)
    with _locked(folder):
        state = read_state(folder)
        if state is not None and state["pid"] == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


# -- fnmap emulator stop / status ----------------------------------------------------------------


def running() -> list[dict]:
    """Every shared emulator of this user that is up: its state plus ``folder``."""
    root = state_path()
    if not os.path.isdir(root):
        return []  # a command that only looks makes nothing
    found = []
    for name in sorted(os.listdir(root)):
        state = read_state(os.path.join(root, name))
        if state is not None:
            found.append(dict(state, folder=os.path.join(root, name)))
    return found


def stop_all(timeout: float = 10.0) -> list[dict]:
    """Stop every shared emulator of this user (SIGTERM, then waits for each to go); those stopped."""
    emulators = running()
    for emu in emulators:
        with contextlib.suppress(ProcessLookupError):
            os.kill(emu["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for emu in emulators:
        while time.monotonic() < deadline and _exists(emu["pid"]):
            time.sleep(0.05)
    return emulators


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
