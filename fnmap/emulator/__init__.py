"""The local emulator: plays the cloud on one machine.

``fnmap emulator`` serves the same WSGI app as ``handlers/http.py`` with a real
WSGI server (:mod:`.httpserver`, a thread per keep-alive connection), but runs
each invocation in a pool of warm worker processes so a crash, kill or hang
fails only its own call.
"""

import os
import typing


def default_workers() -> int:
    """Worker processes of an emulator when none is asked for: 2 x CPU cores, at least 4."""
    return max(4, 2 * (os.cpu_count() or 2))


@typing.runtime_checkable
class EmulatorHandle(typing.Protocol):
    """An emulator fnmap started or found for this process, as the emulator backend uses it: the
    one shared by the user's processes (:class:`.shared.SharedEmulator`) or this process's own
    (:class:`.launcher.EmbeddedEmulator`)."""

    url: str
    secret: str
    #: This process's workers on it.
    workers: int
    pid: int

    def alive(self) -> bool:
        """Whether it still serves (False once stopped, killed or crashed: start or find another)."""

    def headers(self) -> dict[str, str]:
        """The headers every request of this process to it carries (a shared one's session token)."""

    def attach(self) -> None:
        """Begin a new session of this process on it: it answered that it has none (a shared one)."""

    def request_stop(self) -> None:
        """Ask it to stop, without waiting (a shared one outlives this process: nothing)."""

    def stop(self, timeout: float | None = None) -> int:
        """Stop it, or this process's use of it (a shared one ends the session); an exit code."""

    def close_in_child(self) -> None:
        """In a forked child: close the copy of what ties it to the parent (the pipe whose end stops
        a per-process emulator, the socket whose end ends a session): it stays the parent's."""
