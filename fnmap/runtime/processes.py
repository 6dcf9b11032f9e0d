"""Processes of this host: whether one runs, when it started, its parent.  The one reader of
``/proc/PID/stat`` and the one ``kill(pid, 0)`` of fnmap: a job's client, a temporary file's
writer, a shared emulator and its clients are all judged by :func:`alive`."""

from __future__ import annotations

import os
from typing import NamedTuple


class Stat(NamedTuple):
    """Of ``/proc/PID/stat``: the state letter, the parent's pid, the start in clock ticks since boot
    (a decimal string, as records keep it)."""

    state: str
    ppid: int
    start: str


def stat(pid: int | str) -> Stat | None:
    """``/proc/PID/stat`` of ``pid`` (or ``"self"``), or None (no such process, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        fields = text[text.rindex(b")") + 2:].split()  # after the command's name, which may hold ")"
        return Stat(fields[0].decode(), int(fields[1]), fields[19].decode())
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` runs: it exists (another user's counts), is not a zombie (killed, not
    reaped by a parent that may never reap it), and started at ``start`` when given (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    found = stat(pid)
    if found is None:  # reaped since kill(0), or no /proc (macOS): kill(0) said it is there
        return not os.path.isdir("/proc/self")
    return found.state != "Z" and (start is None or found.start == start)


def started_at(pid: int | str = "self") -> float | None:
    """When process ``pid`` started (Unix time), or None where ``/proc`` does not say."""
    found = stat(pid)
    if found is None:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + int(found.start) / os.sysconf("SC_CLK_TCK")
