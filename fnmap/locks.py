"""A mutex for short sections that many threads enter on every call.

``threading.Lock`` hands ownership straight to a blocked waiter when it is
released, and that waiter still has to get the GIL before it can run.  Two
threads that take the same lock on every call then end up trading the GIL on
every acquire (a lock convoy): the client's dispatch threads spent two to three
times the CPU per call on it (``benchmarks/client_scale.py``).
"""

from __future__ import annotations

import threading
import time

#: Times a thread that finds the lock held yields the GIL and tries again before it blocks.
_SPINS = 50


class YieldingLock:
    """A lock that, when held, first yields the GIL and retries instead of queueing.

    The holder gets to run and release, and a running thread can take a free lock
    again without a context switch.  After ``_SPINS`` tries it blocks like a plain
    lock, so a holder that waits on I/O does not make the others burn CPU.
    """

    __slots__ = ("_lock",)

    def __init__(self):
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        lock = self._lock
        if lock.acquire(False):
            return True
        for _ in range(_SPINS):
            time.sleep(0)  # releases the GIL: the holder runs
            if lock.acquire(False):
                return True
        return lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self._lock.release()
