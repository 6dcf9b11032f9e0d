"""Client sessions of the shared emulator: each client process gets workers of its own.

The emulator a user's processes share (:mod:`.shared`) keeps its server and its fork server warm;
what a run computes must still be what it would compute with an emulator of its own.  So each
client process *attaches* over a Unix socket in the emulator's private folder (``sessions.sock``,
in a 0700 folder, or a private temporary folder where that path is too long for a socket; the
state file names it, and the peer's uid is checked too) and sends its working folder, its environment,
its ``PYTHONPATH`` and its stderr (the descriptor itself, ``SCM_RIGHTS``; in a notebook kernel a pipe
whose lines reach the running cell, :func:`fnmap.observe.output.workers_stderr`).  The emulator answers a
session token and forks that client's workers from the fork server, which has imported only fnmap
and the standard library: the client's code and packages are imported afresh, in its folder,
with its variables, and ``output="live"`` lines reach its own terminal or notebook cell.  Requests
carrying the token (:data:`fnmap.runtime.wire.SESSION_HEADER`) run on those workers; requests without one (a
``FNMAP_HTTP_URL`` client, the Lambda API) run on the emulator's own pool.

The socket stays open as long as the client lives: when it closes (the client exited, crashed
or was killed), the emulator ends the session's workers at once, so the memory its calls kept
is given back and no later client meets its imported state.  The same socket answers
``{"op": "status"}`` for ``fnmap emulator status`` and ``stop``: the clients served, their calls
in flight and jobs, the memory of the emulator's process tree.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import sys
import threading
import time

from ..runtime import processes

SOCKET_FILE = "sessions.sock"
#: The largest attach or status message (an environment of a few hundred variables is a few KB).
MAX_MESSAGE = 4 << 20
#: The most workers a client's session may ask for.
MAX_WORKERS = 4096


# -- messages: a line of JSON each; the attach message carries the client's stderr ------------------


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"  # JSON escapes every newline inside it
    sent = socket.send_fds(sock, [data], list(fds)) if fds else 0
    sock.sendall(data[sent:])


def _receive(sock: socket.socket) -> tuple[dict, list[int]]:
    """One message and the descriptors that came with it; EOFError when the peer closed.  Each side
    sends one message and waits for the other's, so what is read is that message only."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
    try:
        if not data:
            raise EOFError
        data = bytearray(data)
        while not data.endswith(b"\n"):
            if len(data) > MAX_MESSAGE:
                raise ValueError(f"a session message of more than {MAX_MESSAGE} bytes")
            more = sock.recv(1 << 20)
            if not more:
                raise EOFError
            data += more
        return json.loads(bytes(data)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# -- the client's side -----------------------------------------------------------------------------


class ClientSession:
    """This process's session on a shared emulator: its token, and the socket whose end ends it.

    ``settings``: what this client asks of its session: ``workers`` (its workers' count) and
    ``idle`` (seconds the emulator stays up after its last request, from now on)."""

    def __init__(self, path: str, settings: dict):
        from ..observe.output import workers_stderr

        stderr = workers_stderr()  # this process's stderr, or in a notebook the running cell's relay
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(30)
            sock.connect(path)
            fds = [stderr] if stderr is not None else []
            _send(sock, {"op": "attach", "pid": os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ),
                         "command": _command_line(), **settings}, fds)
            answer, _ = _receive(sock)
        except BaseException:
            sock.close()
            raise
        if "session" not in answer:
            sock.close()
            raise OSError(answer.get("error", "the emulator refused the session"))
        sock.settimeout(None)
        self.token: str = answer["session"]
        self._sock = sock  # kept open, unread: the emulator sees its end when this process ends

    def close(self) -> None:
        self._sock.close()


def _command_line() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    line = " ".join(argv)
    return line if len(line) <= 200 else line[:197] + "..."


def ask(path: str, message: dict, timeout: float = 10.0) -> dict | None:
    """Send one request (``status``) to the sessions socket at ``path``; the answer, or None if unreachable."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        _send(sock, message)
        answer, _ = _receive(sock)
        return answer
    except (OSError, EOFError, ValueError):
        return None
    finally:
        sock.close()


# -- the emulator's side ---------------------------------------------------------------------------


class Session:
    """One attached client: its workers and what it has in flight."""

    def __init__(self, token: str, pid: int, cwd: str, command: str, pool, stderr_fd: int | None):
        self.token, self.pid, self.cwd, self.command = token, pid, cwd, command
        self.pool = pool
        self.stderr_fd = stderr_fd
        self.started = time.time()
        #: job id -> calls of that job in flight here
        self.jobs: dict[str, int] = {}
        self.served = 0

    def call_started(self, job_id: str) -> None:
        """A call of ``job_id`` runs here (under the lock the :class:`Sessions` were given)."""
        self.jobs[job_id] = self.jobs.get(job_id, 0) + 1

    def call_ended(self, job_id: str) -> None:
        left = self.jobs.get(job_id, 0) - 1
        if left > 0:
            self.jobs[job_id] = left
        else:
            self.jobs.pop(job_id, None)
        self.served += 1

    def describe(self) -> dict:
        return {"pid": self.pid, "cwd": self.cwd, "command": self.command, "started": self.started,
                "in_flight": sum(self.jobs.values()), "jobs": sorted(self.jobs), "served": self.served,
                "workers": self.pool.pids()}

    def close(self) -> None:
        self.pool.close()
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None


class Sessions:
    """The sessions of one emulator, and the Unix socket clients attach on.

    ``make_pool(env, client, workers)`` builds a session's :class:`~.pool.WorkerPool` of ``workers``
    (None: the emulator's count); ``env_for(client_env, workers)`` what its workers' environment is
    (the client's, with the emulator's secret); ``describe()`` the emulator's own part of a status
    answer.  ``lock``: the emulator's, under which it counts each call in flight, the session's
    too (:meth:`Session.call_started`): one lock a call.  ``idle_exit``: seconds the emulator
    stays up after its last request, until a client attaches asking for another (:attr:`idle_exit`).
    """

    def __init__(self, folder: str, make_pool, env_for, describe, lock: threading.Lock,
                 idle_exit: float | None = None):
        self.folder = folder
        #: Seconds the emulator stays up after its last request: what the client that attached last
        #: asked for (its ``emulator_idle``), else what it was started with.
        self.idle_exit = idle_exit
        self._make_pool, self._env_for, self._describe = make_pool, env_for, describe
        self._lock = lock
        self._sessions: dict[str, Session] = {}
        path, self._short_folder = _socket_path(folder)
        if os.path.lexists(path):
            os.unlink(path)  # left by an emulator that was killed
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_mask = os.umask(0o177)
        try:
            self._listener.bind(path)
        finally:
            os.umask(old_mask)
        self._listener.listen(64)
        #: Where clients attach (the state file names it).
        self.path = path
        self._closed = False
        threading.Thread(target=self._accept_loop, name="fnmap-emulator-sessions", daemon=True).start()

    def get(self, token: str) -> Session | None:
        return self._sessions.get(token)

    def __len__(self) -> int:
        return len(self._sessions)

    def status(self) -> dict:
        with self._lock:
            sessions = [s.describe() for s in self._sessions.values()]
        return dict(self._describe(), sessions=sessions)

    def close(self) -> None:
        """Stop taking clients and end every session's workers."""
        self._closed = True
        try:
            self._listener.close()
        finally:
            try:
                os.unlink(self.path)
                if self._short_folder:
                    os.rmdir(self._short_folder)
            except OSError:
                pass
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="fnmap-emulator-session", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            same_user, peer_pid = _peer(conn)
            if not same_user:
                return
            message, fds = _receive(conn)
            if message.get("op") == "status":
                _send(conn, self.status())
            elif message.get("op") == "attach":
                session = self._attach(message, fds, peer_pid)
                fds = []  # the session owns them now
                try:
                    _send(conn, {"session": session.token})
                    session.pool.start()  # after the answer: the client's first call waits for one worker only
                    while conn.recv(1 << 16):  # the client sends nothing more; its end ends the session
                        pass
                finally:
                    self._end(session)
            else:
                _send(conn, {"error": f"unknown request {message.get('op')!r}"})
        except (OSError, EOFError, ValueError):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _attach(self, message: dict, fds: list[int], peer_pid: int | None) -> Session:
        from .pool import PassedFd

        stderr_fd, extra = (fds[0], fds[1:]) if fds else (None, [])
        for fd in extra:
            os.close(fd)
        client_env = message.get("env")
        if not isinstance(client_env, dict):
            client_env = {}
        workers = message.get("workers")
        workers = workers if isinstance(workers, int) and 0 < workers <= MAX_WORKERS else None
        idle = message.get("idle")
        if isinstance(idle, (int, float)) and 0 < idle < float("inf"):
            self.idle_exit = float(idle)
        env = self._env_for({str(k): str(v) for k, v in client_env.items()}, workers)
        own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        theirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        client = {"cwd": str(message.get("cwd", "")), "pythonpath": theirs,
                  "drop": [p for p in own if p not in theirs],
                  "stderr": PassedFd(stderr_fd) if stderr_fd is not None else None}
        pool = self._make_pool(env, client, workers)  # its workers start once the client has its answer
        pid = peer_pid if peer_pid else int(message.get("pid") or 0)
        session = Session(secrets.token_hex(16), pid, client["cwd"],
                          str(message.get("command", ""))[:200], pool, stderr_fd)
        with self._lock:
            self._sessions[session.token] = session
        return session

    def _end(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.token, None)
        session.close()


#: The longest path a Unix socket may have on Linux (108 bytes with the final NUL); macOS: 104.
_MAX_SOCKET_PATH = 100


def _socket_path(folder: str) -> tuple[str, str | None]:
    """``(path, folder made for it)``: in the emulator's folder, or where that path would be too long
    for a Unix socket (a deep home or runtime folder), in a private folder of the temporary folder."""
    import tempfile

    path = os.path.join(folder, SOCKET_FILE)
    if len(path.encode()) <= _MAX_SOCKET_PATH:
        return path, None
    short = tempfile.mkdtemp(prefix="fnmap-")  # 0700, this user's
    return os.path.join(short, SOCKET_FILE), short


def _peer(conn: socket.socket) -> tuple[bool, int | None]:
    """Whether the peer runs as this user, and its pid (Linux: ``SO_PEERCRED``; elsewhere the
    folder's 0700 decides, and the pid is the one the client sends)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True, None
    creds = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid(), pid


def tree_memory(pid: int) -> int | None:
    """Resident bytes of ``pid`` and every process below it (Linux ``/proc``), or None elsewhere."""
    if not os.path.isdir("/proc/self"):
        return None
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        found = processes.stat(name) if name.isdigit() else None
        if found is not None:
            children.setdefault(found.ppid, []).append(int(name))
    total, todo, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            continue
        todo.extend(children.get(current, ()))
    return total
