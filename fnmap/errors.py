"""Exceptions raised by fnmap.

Every error fnmap raises derives from :class:`FnmapError`; leaf classes also
derive from the builtin a caller would naturally catch (``ValueError`` for bad
configuration, ``TimeoutError`` for timeouts, ...).  This module is imported by
the worker side too, so it must stay free of client-only dependencies.
"""

from __future__ import annotations

import builtins
import enum
import os
import sys

#: The folder of fnmap's own modules: frames under it are fnmap's, not the user's.
_FNMAP_ROOT = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the function calling this one name the
    user's line: the first frame outside fnmap, whichever of fnmap's own functions led there."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_FNMAP_ROOT):
        frame, level = frame.f_back, level + 1
    return level


class FnmapError(Exception):
    """Root of every exception fnmap itself raises."""


class ConfigError(FnmapError, ValueError):
    """A configuration value is wrong: the message names the value, where it came from and the fix."""


class UnknownBackend(ConfigError):
    """The backend name is not in the registry."""


class UnknownStorage(ConfigError):
    """The storage URL has a scheme fnmap does not know, or is malformed."""


class StorageError(FnmapError, OSError):
    """The job's storage failed in a way retrying will not fix: read-only or full, a folder or bucket
    that does not exist, no credentials, no access, an endpoint that cannot be reached.  The message
    names the storage URL, the setting it came from and the fix; ``reason`` says which case it is
    (one of :data:`STORAGE_REASONS`)."""

    reason = "refused"


#: Values of :attr:`StorageError.reason`.
STORAGE_REASONS = ("refused", "missing", "credentials", "access", "unreachable", "bucket", "failed")


class MissingBucket(StorageError, UnknownStorage):
    """The storage URL's bucket does not exist (an :class:`UnknownStorage` as well, as it was)."""

    reason = "bucket"


#: errno values of a storage that is full or refuses writes: no retry will help.
STORAGE_REFUSED_ERRNOS = frozenset({28, 122, 30, 13, 1})  # ENOSPC, EDQUOT, EROFS, EACCES, EPERM


def storage_fix(e: OSError, url: str | None = None) -> str:
    """What to do about a refused storage write, by its errno; ``url``: the storage's, for the command.

    For a full storage the command is one that frees space now: jobs of minutes ago are what a
    day of work leaves, so an age cutoff such as ``--older-than 1d`` would delete none of them."""
    if e.errno in (28, 122):
        gc = f"fnmap gc --older-than 0s --storage {url or 'URL'}"
        return (f"the storage is full: free space with `{gc}` (it deletes every job that has ended, "
                "results included, and keeps running ones; --dry-run first shows what each takes), or "
                "point storage= / FNMAP_STORAGE at a folder or bucket with room")
    return ("the storage is not writable: point storage= / FNMAP_STORAGE at a writable folder or bucket, "
            "e.g. storage='file:///tmp/fnmap'")


class KeyNotFound(FnmapError, KeyError):
    """A storage key does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain words
        return str(self.args[0]) if self.args else "key not found"


class SerializationError(FnmapError, TypeError):
    """A function, argument or result cannot be pickled; the message names the object and its path."""


class InitializerError(FnmapError, RuntimeError):
    """The ``initializer`` raised on the worker process that was to run the call: every call that
    process runs with it fails with this error (the message names the initializer and its error)."""


class VersionMismatch(FnmapError, RuntimeError):
    """The client and the function runtime run different Python or cloudpickle versions."""


class SignatureError(FnmapError, PermissionError):
    """The platform refused a request because its signature was missing or wrong."""


class PlatformError(FnmapError, RuntimeError):
    """The platform failed a call (crash, kill, throttling, 5xx, lost call) more often than ``retries`` allows."""


class WorkerCrashed(PlatformError):
    """The worker process running the call died (segfault, ``os._exit``, SIGKILL, out of memory)."""


class OutOfMemory(WorkerCrashed):
    """The call was killed for using more memory than its ``memory`` allowed, at every step of it."""


class RemoteExit(FnmapError):
    """The remote function ended its item with ``sys.exit``, ``KeyboardInterrupt`` or another
    ``BaseException`` that is not an ``Exception`` (``GeneratorExit``, ...).

    That is the item's failure, not the caller's: re-raised as itself it would end the
    caller's script (``SystemExit``) or look like the user pressed Ctrl-C.  The remote
    exception is the ``__cause__`` (and ``remote``); ``exit_code`` is the status a
    ``sys.exit`` asked for (``None`` for other exceptions).
    """

    def __init__(self, message: str, item: int | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.item = item
        self.exit_code = exit_code
        self.remote: BaseException | None = None

    @classmethod
    def of(cls, remote: BaseException, item: int) -> RemoteExit:
        """The error standing for ``remote``, raised by ``item``, with ``remote`` as its cause."""
        name = type(remote).__name__
        if isinstance(remote, SystemExit):
            code = remote.code
            exit_code = 0 if code is None else code if isinstance(code, int) else 1
            shown = f"sys.exit({code!r})" if code is not None else "sys.exit()"
            message = (f"item {item} called {shown} in the remote function: exit code {exit_code}; "
                       "that ends the item's call, not this process")
        else:
            exit_code = None
            shown = f"{name}: {remote}" if str(remote) else name
            message = (f"item {item} raised {shown} in the remote function; a {name} there ends "
                       "the item's call, not this process")
        exc = cls(message, item, exit_code)
        exc.remote = remote
        exc.__cause__ = remote
        return exc

    def __reduce__(self):
        return (RemoteExit, (str(self), self.item, self.exit_code))


class CallLost(PlatformError):
    """A call never reported a result within its timeout plus a grace period."""


class TimeoutError(FnmapError, builtins.TimeoutError):  # noqa: A001 - deliberately shadows the builtin
    """A call ran longer than its ``timeout`` and was stopped."""


class CostCapReached(FnmapError):
    """A job with ``max_cost`` stopped at its cap: what it spent, the calls done, the calls not run.

    Raised by ``map`` (and every front-end) when the cost of the calls so far plus what the calls
    still out will cost reaches ``max_cost``, and before anything runs when even the least the job
    must cost is above it (then ``calls_done`` is 0 and ``estimate`` says what the least was made
    from).  ``spent`` is the list-price estimate of what ran, in USD; calls in flight when the cap
    was reached still bill until they end (the emulator and Batch stop them, Lambda cannot).
    Finish the job later with ``fnmap redrive JOB_ID --max-cost USD``."""

    def __init__(self, message: str, *, id: str | None = None, cap: float = 0.0, spent: float = 0.0,
                 calls_done: int = 0, calls_not_run: int = 0, estimate: dict | None = None):
        super().__init__(message)
        #: The job's id, as every job object spells it (``fnmap.job(e.id)`` reads the job back).
        self.id = id
        self.cap = cap
        self.spent = spent
        self.calls_done = calls_done
        self.calls_not_run = calls_not_run
        self.estimate = estimate

    def __reduce__(self):
        return (_cost_cap_reached, (str(self), self.id, self.cap, self.spent, self.calls_done,
                                    self.calls_not_run, self.estimate))


def _cost_cap_reached(message, job_id, cap, spent, calls_done, calls_not_run, estimate):
    return CostCapReached(message, id=job_id, cap=cap, spent=spent, calls_done=calls_done,
                          calls_not_run=calls_not_run, estimate=estimate)


class RedriveError(FnmapError, RuntimeError):
    """A job cannot be redriven: it still runs elsewhere, or it stored no inputs."""


class RemoteError(FnmapError):
    """Stand-in for a remote exception that could not be pickled back: carries its type name and message."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message

    def __reduce__(self):
        return (RemoteError, (self.type_name, self.message))


class RemoteTraceback(Exception):
    """Carries the formatted remote traceback; set as ``__cause__`` of a re-raised remote exception."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class FaultKind(str, enum.Enum):
    """Why one attempt of a call failed at platform level (not the user's exception).

    The scheduler decides by kind: the retryable kinds run the call again (``throttled`` without
    using up a retry while the throttle can still slow down), the others fail it for good with
    the error class :data:`fnmap.jobs.FAULT_ERRORS` names.
    """

    THROTTLED = "throttled"  # 429: the platform refused to start the call; nothing ran
    SERVER = "server"  # 5xx, a malformed or unreadable answer
    CONNECTION = "connection"  # the request or its answer was lost on the way
    CRASHED = "crashed"  # the worker process died (segfault, os._exit, out of memory)
    OUT_OF_MEMORY = "out_of_memory"  # killed for going over its memory: retried with the next ``memory`` step
    LOST = "lost"  # accepted asynchronously, no result in time
    REJECTED = "rejected"  # the platform or worker refused the request (4xx other than below)
    SIGNATURE = "signature"  # 401/403: the request was not signed with the deployment's secret
    TIMEOUT = "timeout"  # the call ran past its timeout
    VERSION = "version"  # the worker's Python/cloudpickle cannot load the client's pickles
    STORAGE = "storage"  # the worker cannot read or write the job's storage
    CANCELLED = "cancelled"  # the job was cancelled or abandoned, or the platform stopped the attempt (POST /cancel)
    CLIENT = "client"  # a bug in fnmap's own client code, reported on the call instead of lost
    RETRY_ON = "retry_on"  # the user's exception, in ``retry_on``: the call runs again

    def __str__(self) -> str:  # records and messages show the plain name
        return self.value

    __format__ = str.__format__


class PlatformFault(FnmapError):
    """Internal: one attempt of a call failed for a platform reason; the scheduler decides whether to retry.

    ``kind`` is a :class:`FaultKind` (a plain string of one is accepted and checked).
    ``retry_after`` is the platform's hint in seconds, if any.
    """

    RETRYABLE = frozenset({FaultKind.THROTTLED, FaultKind.SERVER, FaultKind.CONNECTION, FaultKind.CRASHED,
                           FaultKind.LOST})

    def __init__(self, kind: FaultKind | str, message: str, *, retry_after: float | None = None):
        try:
            kind = FaultKind(kind)
        except ValueError:
            raise ValueError(f"unknown fault kind {kind!r}; one of {[k.value for k in FaultKind]}") from None
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in self.RETRYABLE
