"""The jobs one awaited call starts, so that cancelling the task that awaits it stops them.

An ``.aio`` front end (:mod:`fnmap.aio`) runs the blocking front end on a thread of fnmap's own
(:mod:`fnmap.loop`) inside a :class:`Scope`; :meth:`fnmap.client.Client.new_job` hands every job
made on that thread to the scope.  Cancelling the scope stops each job as an interrupt of the
blocking form does (:meth:`fnmap.jobs.Job.stop`), and refuses the jobs not made yet (the next
level of a ``map_reduce``).  A leaf: it imports nothing of fnmap.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

_current = threading.local()


class Scope:
    """The jobs made on one thread while it runs one awaited call; cancelled at most once."""

    def __init__(self, reason: str):
        #: What the record of each stopped job says stopped it.
        self.reason = reason
        self.jobs: list = []
        self.cancelled = False
        self._lock = threading.Lock()

    def adopt(self, job) -> None:
        """``job`` was just made for this scope's call; refused (CancelledError) once it is cancelled."""
        with self._lock:
            if self.cancelled:
                raise CancelledError(f"{self.reason} before job {job.id} started")
            self.jobs.append(job)

    def cancel(self) -> None:
        """Stop every job the call made (blocking: the backend is told); refuse those to come."""
        with self._lock:
            self.cancelled = True
            jobs = list(self.jobs)
        for job in jobs:
            if not job.done:  # one that ended stays as it ended
                job.stop(CancelledError(self.reason))

    def run(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)`` on this thread with this scope current."""
        before = getattr(_current, "scope", None)
        _current.scope = self
        try:
            return fn(*args, **kwargs)
        finally:
            _current.scope = before


def adopt(job) -> None:
    """Hand ``job`` (just made) to the scope current on this thread, if any."""
    scope = getattr(_current, "scope", None)
    if scope is not None:
        scope.adopt(job)
