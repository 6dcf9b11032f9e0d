"""Fresh process-wide state in a forked child: the one place fnmap's fork hooks are kept.

A process that used fnmap and then forks (a ``multiprocessing`` Pool with the ``fork`` start
method, gunicorn's pre-fork workers, joblib's ``multiprocessing`` backend) gives its child a copy
of its memory but only the thread that forked.  The client's dispatch, monitor and lease threads
do not exist there, a lock one of them held at that moment stays held for ever, and its keep-alive
connections are sockets the parent still reads: a child that went on with the parent's client
would wait for ever on calls that no thread sends.  So each module that keeps process-wide state
registers a reset here with :func:`at_fork`; right after a fork, in the child, every reset runs
once, and the child builds its own client, store and emulator handle on first use.

What is the parent's stays the parent's: its emulator, its jobs and their leases are forgotten in
the child, never stopped, cancelled or closed (the parent still uses them).  A reset hands what it
forgets to :func:`keep`, so that nothing of it is finalized in the child either: a finalizer could
wait on a lock that a thread of the parent held at the fork, or close what the parent reads.

It lives beside the worker side, which imports nothing of the client side, because storage (shared
by both sides) and the worker routine (which the ``local`` backend runs on the client's threads)
register resets too.  Registered at import: ``fnmap.client`` (the clients), ``fnmap.executor``
(what exit waits for), ``fnmap.lease``, ``fnmap.joblib``, ``fnmap.backends.emulator`` (the
emulator handles), ``fnmap.emulator.shared`` (the start lock's files), ``fnmap.storage``,
``fnmap.runtime.worker``, ``fnmap.runtime.setup``, ``fnmap.runtime.capture``,
``fnmap.runtime.dask_tasks``, ``fnmap.backends.lambda_deployment`` and ``fnmap.cost.prices``
(their locks).
"""

from __future__ import annotations

import os
from collections.abc import Callable

_resets: list[Callable[[], None]] = []
#: What the resets forgot in this process (a forked child): kept, never used and never finalized.
_kept: list = []


def at_fork(reset: Callable[[], None]) -> Callable[[], None]:
    """Run ``reset()`` in every child this process forks from now on (usable as a decorator).

    ``reset`` replaces the module's locks and forgets its clients, threads and connections; it
    must not wait on anything the parent held, and it runs before the child's own code."""
    _resets.append(reset)
    return reset


def keep(*objects) -> None:
    """Keep ``objects`` (the parent's, forgotten in this child) alive until this process ends."""
    _kept.extend(objects)


def _after_fork_in_child() -> None:
    """Every reset, each whatever the others did; the first error is raised after them all (the
    interpreter reports an error of an at-fork hook and goes on with the child)."""
    failed = None
    for reset in _resets:
        try:
            reset()
        except Exception as e:  # the next module's reset still runs
            failed = failed or e
    if failed is not None:
        raise failed


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
