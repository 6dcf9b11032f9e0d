"""Processes of this host: whether one still runs, when it started, its parent.

The one reader of ``/proc/PID/stat`` and the one ``kill(pid, 0)`` in fnmap.  A client that started
a job, the writer of a temporary file, a shared emulator and its clients are all judged alive by
:func:`alive`: not gone, not a zombie (killed, not yet reaped by a parent that may never reap it:
a container's first process often does not), and, given the start time a record kept, not another
process that reused the pid.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Stat(NamedTuple):
    """What fnmap reads of ``/proc/PID/stat``: the state letter, the parent's pid, and the start
    time in clock ticks since boot (a decimal string, as records keep it)."""

    state: str
    ppid: int
    start: str


def stat(pid: int | str) -> Stat | None:
    """``/proc/PID/stat`` of ``pid`` (or ``"self"``), or None (no such process, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        # The command's name (field 2) is in parentheses and may hold spaces or ")": what follows
        # the last ")" is field 3 on.
        fields = text[text.rindex(b")") + 2:].split()
        return Stat(fields[0].decode(), int(fields[1]), fields[19].decode())
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` of this host runs: it exists (another user's counts), is not a
    zombie, and, when ``start`` (:attr:`Stat.start` read while it ran) is given, started then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    found = stat(pid)
    if found is None:
        return True  # no /proc (macOS): kill(0) said it is there
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
