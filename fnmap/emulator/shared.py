"""One warm emulator shared by a user's processes: a fresh script's first call waits for no start-up.

Starting an emulator costs a new interpreter, its imports and its workers' (0.6 s or more here);
a script run again, or a notebook kernel restarted, would pay it every time.  So the emulator
``fnmap.map`` starts by itself stays up after its starter exits, and later processes of the same
user, interpreter and fnmap attach to it.  Each attached process gets workers of its own, forked
from the emulator's warm fork server and ended when the process ends (:mod:`.sessions`): they
import its current code, run in its folder with its environment, and print ``live`` output on its
stderr, so a run computes and shows what it would with an emulator of its own.

It stops by itself once it has served no request for ``emulator_idle`` seconds (300 by default),
or at ``fnmap emulator stop``, which refuses while another process has calls in flight on it
(``--force`` stops it anyway).  A client whose emulator is gone (stopped, killed, crashed) starts
or finds another and sends its unfinished calls again (:mod:`fnmap.backends.emulator`).  Whoever
starts one is told so on stderr when a person reads it (a terminal, a notebook); a program that
checks its own stderr gets a log record instead.

Where and how it is found: a folder per user (``$XDG_RUNTIME_DIR/fnmap``, else
``~/.cache/fnmap/run``; mode 0700, refused when others can write it), with a sub-folder per
*identity*: a hash of what the emulator itself is (the interpreter, whatever name started it:
:func:`interpreter`; fnmap's own code, the Linux namespaces it sees files and processes in, and
the secret's fingerprint) — not the folder, the environment or the settings of whoever started it.
Each client's workers take its folder and environment from their own client, their count from its
``workers``, and the emulator stays up as long after its last request as the client that attached
last asked (its ``emulator_idle``).  A client with ``emulator_options`` gets an emulator of its own
(:func:`fnmap.backends.emulator.embedded_emulator`).
In that folder ``emulator.json`` (the URL and pid, written once it listens), ``emulator.log``
(its output), ``sessions.sock`` (where clients attach); an exclusive ``flock`` on ``lock`` makes
concurrent starters start one emulator: the starter holds it from before the start, the emulator
it starts until it is ready (the open file is passed to it), so a starter killed meanwhile lets no
other start a second one.  An emulator removes only the state file and socket that are its own.

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
from ..runtime import forks, processes
from ..runtime.wire import SESSION_HEADER

#: Seconds a shared emulator waits for a request before it stops, unless ``emulator_idle`` says.
DEFAULT_IDLE = 300.0
STATE_FILE = "emulator.json"
LOG_FILE = "emulator.log"
STARTUP_TIMEOUT = 60.0
#: Tries to attach to an emulator that stops (idle) between being found and being attached to.
ATTACH_TRIES = 3
#: Starts of an emulator that a signal kills before it is ready (someone else's SIGKILL, the OOM killer).
START_TRIES = 3


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


def identity(secret: str) -> str:
    """The hash that names the emulator a process may share (see the module's docstring)."""
    facts = {"python": interpreter(), "version": sys.version, "code": _code_fingerprint(), "namespaces": _namespaces(),
             "secret": hashlib.sha256(secret.encode()).hexdigest()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def interpreter() -> list[str]:
    """This interpreter, whatever name started it: the program itself (``python``, ``python3`` and
    a console script's ``.../bin/python3`` are links to one file) and its prefix (a virtual
    environment's folder, whose packages another environment of the same program does not see)."""
    return [os.path.realpath(sys.executable), sys.prefix]


def _namespaces() -> list[str]:
    """The Linux namespaces this process sees files, processes and users in (``unshare``, a
    container sharing the runtime folder): an emulator in others would resolve the client's folder
    and storage paths to other files, and could not see its pid.  Empty elsewhere."""
    found = []
    for kind in ("mnt", "pid", "user"):
        try:
            found.append(os.readlink(f"/proc/self/ns/{kind}"))
        except OSError:
            pass
    return found


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
    """A handle on the shared emulator of one identity: attached to, or started and then attached to
    (an :class:`fnmap.emulator.EmulatorHandle`).

    ``url``, ``secret`` and ``pid`` as for :class:`.launcher.EmulatorLauncher`; ``workers``: this
    process's on it; ``session`` is this process's :class:`.sessions.ClientSession` on it (its
    calls name it: :meth:`headers`).  :meth:`alive` is False once it stopped (idle, ``fnmap
    emulator stop``, killed), and a new handle then starts another.
    """

    def __init__(self, workers: int, secret: str, idle: float):
        self.workers, self.secret, self._idle = workers, secret, idle
        self.folder = os.path.join(state_root(), identity(secret))
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.started = False
        for attempt in range(ATTACH_TRIES):
            with locked(self.folder) as lock:
                state = read_state(self.folder)
                if state is None or not listening(state["url"]):  # a pid reused after a SIGKILL
                    state = self._start(idle, lock)
                    self.started = True
            try:
                self.session = self._new_session(state)
                break
            except (OSError, EOFError, ValueError, KeyError) as e:
                if attempt == ATTACH_TRIES - 1:
                    raise FnmapError(f"cannot attach to the shared fnmap emulator ({e!r}; pid {state['pid']}, log "
                                     f"{os.path.join(self.folder, LOG_FILE)}); stop it with `fnmap emulator "
                                     "stop --force`, or set FNMAP_EMULATOR_IDLE=0 to give each process its "
                                     "own") from None
                time.sleep(0.1)  # it is stopping (idle): the next look starts another
        self.url, self.pid = state["url"], state["pid"]
        if self.started:
            notice(f"fnmap: started an emulator shared by your processes (pid {self.pid}, {workers} workers, "
                   f"log {os.path.join(self.folder, LOG_FILE)}); it stops after {idle:g} s without requests, "
                   "or now with `fnmap emulator stop`; `fnmap emulator status` shows what it serves "
                   "(FNMAP_EMULATOR_IDLE=0 gives each process its own)")

    def _new_session(self, state: dict):
        """This process's session on the emulator of ``state``: its workers, and the idle time it asks for."""
        from .sessions import ClientSession

        return ClientSession(state["socket"], {"workers": self.workers, "idle": self._idle})

    def _start(self, idle: float, lock: int) -> dict:
        """Start the emulator and wait until it listens; one killed (a signal) before it was ready is
        started again, up to :data:`START_TRIES` times: a map must not fail for an emulator it did
        not own the death of.  ``lock``: the start lock's file, which the emulator holds too until it
        is ready, so that a starter killed meanwhile lets no other process start a second one."""
        for _attempt in range(START_TRIES):
            proc = self._spawn(idle, lock)
            state = self._wait_until_listening(proc)
            if state is not None:
                return state
        raise FnmapError(f"the fnmap emulator was killed (code {proc.returncode}) before it was ready, "
                         f"{START_TRIES} times; its log: {os.path.join(self.folder, LOG_FILE)} (is something "
                         "killing it, or is memory short?); FNMAP_EMULATOR_IDLE=0 gives each process its own")

    def _spawn(self, idle: float, lock: int):
        import subprocess

        from ..runtime.signing import SECRET_ENV

        cmd = [sys.executable, "-m", "fnmap", "emulator", "--host", "127.0.0.1", "--port", "0",
               "--workers", str(self.workers), "--idle-exit", str(idle), "--stop-on-hangup",
               "--state-file", os.path.join(self.folder, STATE_FILE), "--start-lock-fd", str(lock)]
        log_fd = os.open(os.path.join(self.folder, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(log_fd, "wb") as log:  # 0600: it shows the AWS credentials the emulator made
            # Its own session and no pipe of ours: a Ctrl-C here does not reach it, and whoever
            # reads this process's output (a CI runner, subprocess.run) is not kept waiting by it.
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(lock,),
                                    env=dict(os.environ, **{SECRET_ENV: self.secret}), start_new_session=True)

    def _wait_until_listening(self, proc) -> dict | None:
        """The state ``proc`` wrote once it listens; None when a signal killed it before."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            state = read_state(self.folder)
            if state is not None and state["pid"] == proc.pid:
                _reap_in_background(proc)
                return state
            if proc.poll() is not None:
                if proc.returncode < 0:
                    return None
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

    def headers(self) -> dict[str, str]:
        """This process's session token, which every request names (its workers run the call)."""
        return {SESSION_HEADER: self.session.token}

    def close_in_child(self) -> None:
        """In a forked child: close the copy of the parent's session socket (its end ends the
        parent's session, whose workers end with the parent)."""
        self.session.close()

    def attach(self) -> None:
        """A new session of this process on the emulator (it ended the last one)."""
        self.session.close()
        self.session = self._new_session(read_state(self.folder))

    def request_stop(self) -> None:
        """Nothing: a shared emulator outlives the processes that use it."""

    def stop(self, timeout: float | None = None) -> int:
        """Leave the emulator: end this process's session (its workers end), the emulator runs on."""
        self.session.close()
        return 0


def notice(text: str) -> None:
    """Tell a person (stderr that is a terminal, or a notebook's), else log it: a program that checks
    its own stderr (CPython's tests of an executor's child processes) must not find it there."""
    import logging

    stream = sys.stderr
    to_person = "ipykernel" in sys.modules
    try:
        to_person = to_person or (stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        pass
    if to_person:
        print(text, file=stream, flush=True)
    else:
        logging.getLogger("fnmap").info(text)


def read_state(folder: str) -> dict | None:
    """The state a live emulator wrote in ``folder``, or None (none, unreadable, or its process gone)."""
    try:
        with open(os.path.join(folder, STATE_FILE)) as f:
            state = json.load(f)
        if not processes.alive(state["pid"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def listening(url: str) -> bool:
    """Whether something accepts connections at ``url``'s host and port (a state file can outlive its emulator)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
    except OSError:
        return False
    return True


#: The lock files this process has open in :func:`locked`, by any thread.
_lock_fds: set[int] = set()


@contextlib.contextmanager
def locked(folder: str):
    """The start lock of the shared emulator whose folder is ``folder``, held (the lock's descriptor):
    starting one, withdrawing its state, and removing its socket happen under it."""

    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    _lock_fds.add(fd)
    try:
        _take(fd, folder)
        yield fd
    finally:
        _lock_fds.discard(fd)
        os.close(fd)


def _take(fd: int, folder: str) -> None:
    """Take the start lock, waiting at most twice :data:`STARTUP_TIMEOUT` (its holder is a starter,
    or an emulator starting, which either is ready or is stopped in that time): an emulator whose
    starter was killed and that then hangs while starting would otherwise hold every client for ever."""
    import fcntl

    deadline = time.monotonic() + 2 * STARTUP_TIMEOUT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise FnmapError(
                    f"the shared fnmap emulator in {folder} has been starting for over {2 * STARTUP_TIMEOUT:.0f} s "
                    f"(another process holds its start lock; its log: {os.path.join(folder, LOG_FILE)}): kill the "
                    "`fnmap emulator` process that hangs (`pgrep -af 'fnmap emulator'`), then run again") from None
            time.sleep(0.05)


@forks.at_fork
def _close_inherited_locks() -> None:
    """In a forked child: close the copies of the lock files a thread of the parent had open.  An
    ``flock`` belongs to the open file, which the fork shares: a copy left open would hold the lock
    for as long as the child lives, and the child's own attach (or any other process's) would
    wait on it for ever."""
    for fd in list(_lock_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _lock_fds.clear()


def _reap_in_background(proc) -> None:
    """Wait for the child in a daemon thread, so it never lingers as a zombie of this process."""
    import threading

    threading.Thread(target=proc.wait, name="fnmap-shared-emulator-reaper", daemon=True).start()


# -- the emulator's side ------------------------------------------------------------------------


def write_state(path: str, url: str, workers: int, socket: str) -> None:
    """Say where this emulator listens, and where clients attach (``socket``), atomically: a reader
    sees all of it or nothing."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": os.getpid(), "workers": workers, "started": time.time(), "socket": socket}, f)
    os.replace(tmp, path)


def hold_start_lock(fd: int) -> None:
    """In the emulator: keep the start lock its starter passed (``--start-lock-fd``) until
    :func:`release_start_lock`.  The ``flock`` belongs to the open file both processes share, so
    it stays held if the starter is killed while the emulator starts: the next starter waits for
    this emulator to be ready and attaches to it, instead of starting a second one of the same
    identity, invisible to ``fnmap emulator status``.  Closed in forked children; never inherited."""
    os.set_inheritable(fd, False)
    _lock_fds.add(fd)


def release_start_lock(fd: int) -> None:
    """In the emulator, once its state is written (it can be found): let other starters look."""
    _lock_fds.discard(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def withdraw_state(path: str) -> None:
    """Stop being found: remove the state file if it still names this process, under the lock."""
    folder = os.path.dirname(path)
    with locked(folder):
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


def status(emu: dict) -> dict:
    """What a running emulator says of itself (:mod:`.sessions`): ``emu`` with its clients, calls in
    flight, memory and idle time left; just ``emu`` when it does not answer."""
    from .sessions import ask

    answer = ask(emu["socket"], {"op": "status"}) if "socket" in emu else None
    return dict(emu, **answer) if answer else emu


def busy_clients(emu: dict) -> list[dict]:
    """The sessions of ``status(emu)`` of live processes with calls in flight."""
    return [s for s in emu.get("sessions", ()) if s.get("in_flight") and (s.get("pid") or 0) > 0
            and processes.alive(s["pid"])]


def stop(force: bool = False, timeout: float = 10.0) -> tuple[list[dict], list[dict]]:
    """Stop this user's shared emulators (SIGTERM, then waits for each to go), except, unless
    ``force``, one serving another live process's calls: ``(stopped, refused)``, each with status."""
    stopped, refused = [], []
    for emu in running():
        emu = status(emu)
        (refused if busy_clients(emu) and not force else stopped).append(emu)
    for emu in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(emu["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for emu in stopped:
        while time.monotonic() < deadline and processes.alive(emu["pid"]):
            time.sleep(0.05)
    return stopped, refused

