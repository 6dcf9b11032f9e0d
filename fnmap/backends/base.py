"""The interface every backend implements.

A backend only *delivers* invocations: the scheduler (:mod:`fnmap.scheduler`) owns
retries, stragglers and gathering.  ``invoke`` gives an :class:`Answer`: the worker's
response body when the platform answers synchronously, or :data:`ACCEPTED` when the
call was accepted asynchronously and its result will appear in storage.  Platform
failures are raised as :class:`fnmap.errors.PlatformFault` (a :class:`fnmap.errors.FaultKind`
says which).  :class:`Backend` lists every member the client and its scheduler use: what a
platform can do is a declared attribute (``fans_out``, ``group_limit``...), never probed for
or inferred from the backend's name; :class:`BaseBackend` gives the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import PlatformFault
from ..runtime.signing import window
from ..runtime.wire import CallRequest


@dataclass
class Invocation:
    """One signed request, ready to send."""

    request: CallRequest
    body: bytes
    signature: str
    #: The job's resolved options, for platforms that take resources per job (memory, GPUs).
    config: Any = None
    #: Memory (MB) this attempt runs with: the step of the job's ``memory`` the call has reached.
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the platform said to one invocation that it did not refuse."""

    #: The worker's response (:func:`fnmap.runtime.wire.decode_response`); None when the call was
    #: accepted to run asynchronously, its result to be found in storage.
    body: bytes | None

    @property
    def accepted(self) -> bool:
        return self.body is None


#: The answer of an asynchronous invocation (Lambda ``Event``, a Batch array child), and the event
#: the scheduler decides such an attempt on.
ACCEPTED = Answer(None)


@dataclass
class FailedCall:
    """An asynchronous call the platform reports as failed (see ``BaseBackend.poll_failures``)."""

    job_id: str
    call_id: int
    attempt: int
    fault: PlatformFault


@runtime_checkable
class Backend(Protocol):
    """Everything the client uses of a backend (:class:`BaseBackend` has the defaults)."""

    name: str
    #: How many calls the client keeps in flight at once.
    max_workers: int
    lost_after: float | None
    call_seconds: float
    secret: bytes | None
    fans_out: bool
    group_limit: int
    watches_calls: bool
    workers_on_this_terminal: bool
    platform_concurrency: int | None
    signature_lifetime: float
    stops_attempts: bool

    def invoke(self, invocation: Invocation) -> Answer: ...

    def invoke_all(self, invocations: list[Invocation]) -> list[Answer]: ...

    def invoke_group(self, invocations: list[Invocation]) -> list[Answer | PlatformFault] | None: ...

    def poll_failures(self) -> list[FailedCall]: ...

    def cancel(self, job_id: str) -> None: ...

    def stop_attempts(self, job_id: str, attempts: list[tuple[int, int]], secret: bytes) -> None: ...

    def usable(self) -> bool: ...

    def close(self) -> None: ...


class BaseBackend:
    """The defaults of every part of :class:`Backend` but ``invoke``."""

    name = "base"
    max_workers = 8
    #: True when :meth:`stop_attempts` stops a call while it runs (the emulator kills its worker,
    #: Batch terminates its container); False where a call, once started, runs to its end (Lambda).
    stops_attempts = False
    #: How long an automatically chunked call should take (``chunksize`` unset): long enough to
    #: amortize what one call costs here besides its items, short enough to spread the work.
    call_seconds = 0.5
    #: Seconds after which an asynchronous call with no result counts as lost (None: never).
    lost_after: float | None = None
    #: The secret to sign with when the backend knows it (an auto-started emulator made it);
    #: otherwise the client uses the ``secret`` option / ``FNMAP_SECRET``.
    secret: bytes | None = None
    #: True when ``invoke_all`` delivers all of a job's calls in one platform request (an array job).
    fans_out = False
    #: The most calls ``invoke_group`` takes in one platform request (0 or 1: one call a request).
    group_limit = 0
    #: True when ``poll_failures`` reports every accepted call that fails on the platform; the client
    #: then never declares such calls lost on a timer (a container job may queue for a long time).
    watches_calls = False
    #: True when the workers write to this process's terminal (the emulator's, in-process): their
    #: captured output is then not echoed there too unless ``output="live"``; cloud workers echo
    #: it into the platform's log.
    workers_on_this_terminal = False
    #: How many calls the platform runs at once, where it says (a Lambda function's reserved
    #: concurrency); None: as many as the client sends (see :func:`fnmap.feed.parallelism`).
    platform_concurrency: int | None = None

    @property
    def signature_lifetime(self) -> float:
        """Seconds a call's signature stays valid: the signature window, or as long as the
        platform may hold an accepted call before the client declares it lost."""
        return max(window(), self.lost_after or 0)

    def invoke_all(self, invocations: list[Invocation]) -> list[Answer]:
        """Deliver several calls; one answer per invocation, as ``invoke`` gives.

        Raises :class:`PlatformFault` when the platform refused them all.
        """
        return [self.invoke(invocation) for invocation in invocations]

    def invoke_group(self, invocations: list[Invocation]) -> list[Answer | PlatformFault] | None:
        """Deliver several short calls in one platform request (``group_limit`` at most): for each
        invocation its answer, or the fault that ended it alone; raises :class:`PlatformFault` for
        a fault that ended them all (the connection).  None: the platform takes no groups (by
        default; the client then sends each alone, under its throttle)."""
        return None

    def poll_failures(self) -> list[FailedCall]:
        """Accepted calls that failed on the platform since the last poll (the client's monitor asks)."""
        return []

    def cancel(self, job_id: str) -> None:
        """Stop what the platform still queues or runs for ``job_id``, where it can.

        Called when a map is abandoned (its first failure was raised, or it was
        interrupted).  By default nothing: a function call cannot be recalled, and
        its late result is discarded.
        """

    def stop_attempts(self, job_id: str, attempts: list[tuple[int, int]], secret: bytes) -> None:
        """Stop these ``(call id, attempt)`` of ``job_id`` where the platform can: their
        call is decided already (another copy committed it, or it failed for good).

        ``secret`` is the job's signing secret, for platforms that take signed requests.  By
        default nothing: the copies run on and their late results are discarded as duplicates.
        """

    def usable(self) -> bool:
        """False once the backend can no longer deliver (its embedded emulator died): the client is replaced."""
        return True

    def close(self) -> None:
        pass
