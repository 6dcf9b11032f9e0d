"""What user code prints during a call, captured per thread (the worker routine's ``capture_logs``)."""

from __future__ import annotations

import contextlib
import io
import sys
import threading

from . import forks

_capture = threading.local()
_router_lock = threading.Lock()


@forks.at_fork
def _new_router_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent starting a call held it at the fork)."""
    global _router_lock
    _router_lock = threading.Lock()


class _Router:
    """Stands in for ``sys.stdout``/``sys.stderr``: copies writes to the calling thread's capture buffer.

    Installed once and left in place; swapping ``sys.stdout`` per call would mix
    the output of calls running on several threads (the ``local`` backend).
    """

    def __init__(self, original):
        self.original = original

    def write(self, s: str) -> int:
        buffer = getattr(_capture, "buffer", None)
        if buffer is not None:
            buffer.write(s)
            if not _capture.echo:  # output="after"/"none": the client shows it, not this process's stderr
                return len(s)
        try:
            return self.original.write(s)
        except Exception:  # a closed or broken original stream must not fail the call
            return len(s)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.original.flush()

    def __getattr__(self, name):
        return getattr(self.original, name)


@contextlib.contextmanager
def captured(buffer: io.StringIO | None, echo: bool = True):
    """Copy the calling thread's writes to ``sys.stdout``/``sys.stderr`` into ``buffer``; with
    ``echo`` False they go only there (the emulator's workers would otherwise write them to the
    client's terminal as they happen, into its progress bar)."""
    if buffer is None:
        yield
        return
    with _router_lock:
        if not isinstance(sys.stdout, _Router):
            sys.stdout = _Router(sys.stdout)
        if not isinstance(sys.stderr, _Router):
            sys.stderr = _Router(sys.stderr)
    _capture.buffer = buffer
    _capture.echo = echo
    try:
        yield
    finally:
        _capture.buffer = None
