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
    """An emulator fnmap started or found, as the emulator backend uses it: the one the user's
    processes share (:class:`.shared.SharedEmulator`) or this process's own (:class:`.launcher.EmbeddedEmulator`)."""

    url: str
    secret: str
    workers: int  # this process's workers on it
    pid: int

    def alive(self) -> bool:
        """False once it stopped, was killed or crashed: start or find another."""

    def headers(self) -> dict[str, str]:
        """What every request to it carries (a shared one's session token)."""

    def attach(self) -> None:
        """Begin a new session of this process on it: it answered that it has none."""

    def request_stop(self) -> None:
        """Ask it to stop, not waiting (a shared one outlives this process: nothing)."""

    def stop(self, timeout: float | None = None) -> int:
        """Stop it, or (a shared one) this process's session on it; an exit code."""

    def close_in_child(self) -> None:
        """In a forked child: close the copy of what ties it to the parent, whose it stays."""
