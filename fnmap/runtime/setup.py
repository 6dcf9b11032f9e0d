"""Per-worker setup: ``initializer(*initargs)`` runs once per warm worker process (Pool's names).

The client stores the function as a :class:`WithInitializer`, in one pickle with the initializer
and its arguments: cloudpickle gives the functions of one pickle that come from the same
notebook, script or local module one shared globals dict, so ``global MODEL`` set by the
initializer is the ``MODEL`` the function reads.  The worker calls :func:`prepare` before a call's
items run.

"Already run" is kept in the namespace the initializer writes to (its ``__globals__``), keyed by
the digest of its pickle with the arguments: a different initializer, or other arguments, runs
too; a function of the same module loaded again from another pickle (another job) has a fresh
namespace, where the initializer runs again, because what it set is not there.  An initializer
of an installed module writes to that module, so it runs once per process across jobs.

An initializer that raises fails every call that worker process runs for it, each with an
:class:`fnmap.errors.InitializerError` naming it (no re-run on every call, and no endless
restarts as ``multiprocessing.Pool`` gives a failing initializer).

Shared by the client and the worker: it must not import client-only modules.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import threading
import traceback
from typing import Any

from ..errors import InitializerError
from . import forks

#: Name, in the initializer's namespace, of the ``{digest: None or (error message, traceback)}`` of its runs.
_DONE = "__fnmap_initialized__"
#: Namespace of initializers without ``__globals__`` (builtins, callable objects).
_process_namespace: dict = {}
_lock = threading.RLock()


@forks.at_fork
def _new_lock() -> None:
    """In a forked child: a fresh lock (a local-backend thread running an initializer at the fork
    held it, and that thread is gone)."""
    global _lock
    _lock = threading.RLock()


class WithInitializer:
    """A function and the initializer that must have run in its worker process first."""

    __slots__ = ("func", "initializer", "initargs", "digest")

    def __init__(self, func, initializer, initargs: tuple, digest: str):
        self.func, self.initializer, self.initargs, self.digest = func, initializer, tuple(initargs), digest

    def __reduce__(self):
        return WithInitializer, (self.func, self.initializer, self.initargs, self.digest)


def describe(initializer, initargs: tuple = ()) -> str:
    """``name(args)`` of an initializer call, for messages."""
    name = getattr(initializer, "__qualname__", None) or getattr(initializer, "__name__", None) or repr(initializer)
    args = ", ".join(repr(a)[:60] for a in initargs)
    return f"{name}({args})"


def prepare(func: Any) -> Any:
    """The function to run: ``func`` itself, after its initializer has run once in this process
    (for this namespace); raises :class:`InitializerError` if it failed, now or before."""
    if not isinstance(func, WithInitializer):
        return func
    namespace = _namespace(func.initializer)
    with _lock:  # calls on several threads (the local backend) run it once, the others wait
        runs = namespace.setdefault(_DONE, {})
        if func.digest not in runs:
            runs[func.digest] = _run(func.initializer, func.initargs)
        failure = runs[func.digest]
    if failure is not None:
        message, remote_traceback = failure
        error = InitializerError(message)
        error.add_note(f"fnmap: the initializer's traceback on the worker:\n{remote_traceback.rstrip()}")
        raise error
    return func.func


def _namespace(initializer) -> dict:
    target = initializer.func if isinstance(initializer, functools.partial) else initializer
    namespace = getattr(target, "__globals__", None)
    return namespace if isinstance(namespace, dict) else _process_namespace


def _run(initializer, initargs: tuple) -> tuple[str, str] | None:
    """Run the initializer; None, or the message and traceback every call of this worker process
    fails with (text, not the exception: its frames would keep the initializer's locals alive)."""
    try:
        initializer(*initargs)
        return None
    except Exception as e:
        message = (f"the initializer {describe(initializer, initargs)} raised {type(e).__name__}: {e} on "
                   f"worker {socket.gethostname()}:{os.getpid()}, so every call this worker process runs "
                   "with it fails (it is not run again there); fix the initializer or its initargs")
        return message, "".join(traceback.format_exception(type(e), e, e.__traceback__))


def with_initializer(func, config):
    """``func``, or with ``initializer=`` a :class:`WithInitializer` holding both, in one pickle (so
    they share the globals of their module); the initializer is named if it does not pickle."""
    if config.initializer is None:
        return func
    initargs = tuple(config.initargs)
    from .serialization import dumps_checked

    data = dumps_checked((config.initializer, initargs), "the initializer or its initargs")
    return WithInitializer(func, config.initializer, initargs, hashlib.sha256(data).hexdigest()[:32])
