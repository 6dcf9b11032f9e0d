"""Who started a job, from where: the notebook or script, and the client process (host, pid, start
time), so that a reader on the same host can tell whether that client is still alive."""

from __future__ import annotations

import os
import socket
import sys

from ..runtime import processes

_CLIENT: dict | None = None
#: ``(pid, origin)`` of this process, found once: a record written late in the process's exit
#: (its interpreter tearing ``__main__`` down) still names the script.
_ORIGIN: tuple[int, str | None] | None = None


def origin() -> str | None:
    """The notebook or script this process runs: Jupyter's session name, else ``__main__``'s file."""
    global _ORIGIN
    if _ORIGIN is None or _ORIGIN[0] != os.getpid():
        _ORIGIN = (os.getpid(), _find_origin())
    return _ORIGIN[1]


def _find_origin() -> str | None:
    if os.environ.get("JPY_SESSION_NAME"):
        return os.environ["JPY_SESSION_NAME"]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file:
        return os.path.abspath(main_file)
    from .progress import in_kernel

    return "notebook" if in_kernel() else "interactive"


def client_process() -> dict:
    """This client's host, pid and process start time: a reader on the same host can tell whether
    the client that started a job is still alive (:func:`gone_reason`)."""
    global _CLIENT
    if _CLIENT is None or _CLIENT["pid"] != os.getpid():  # recomputed in a forked child
        found = processes.stat(os.getpid())
        _CLIENT = {"host": socket.gethostname(), "pid": os.getpid(), "start": found.start if found else None}
    return _CLIENT


def gone_reason(client: dict | None) -> str | None:
    """Why ``client`` (from a record or a lease) runs nothing any more, when it ran on this host
    and its process is gone (killed, crashed, a zombie, or its pid reused:
    :func:`fnmap.runtime.processes.alive`); None otherwise, and for another machine's client
    (nothing to check it against).  Readers ask :func:`fnmap.lease.judge`, which asks this."""
    if not client or client.get("host") != socket.gethostname() or not client.get("pid"):
        return None
    if processes.alive(client["pid"], client.get("start")):
        return None
    return f"its client ({client.get('host')}, pid {client.get('pid')}) is gone from this host (killed or crashed)"
