"""The interface every backend implements.

A backend only *delivers* invocations: the client owns chunking, retries,
stragglers and gathering.  ``invoke`` returns the response body when the
platform answers synchronously, or ``None`` when the call was accepted
asynchronously and its result will appear in storage.  Platform failures are
raised as :class:`fnmap.errors.PlatformFault`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import PlatformFault
from ..runtime.wire import CallRequest


@dataclass
class Invocation:
    """One signed request, ready to send."""

    request: CallRequest
    body: bytes
    signature: str
    #: The job's resolved options, for platforms that take resources per job (memory, GPUs).
    config: Any = None


@dataclass
class Failure:
    """An asynchronous call the platform reports as failed (see ``BaseBackend.poll_failures``)."""

    job_id: str
    call_id: int
    attempt: int
    fault: PlatformFault


@runtime_checkable
class Backend(Protocol):
    name: str
    #: How many calls the client keeps in flight at once.
    max_workers: int

    def invoke(self, invocation: Invocation) -> bytes | None: ...

    def close(self) -> None: ...


class BaseBackend:
    """Defaults for the optional parts of the interface."""

    name = "base"
    max_workers = 8
    #: Seconds after which an asynchronous call with no result counts as lost (None: never).
    lost_after: float | None = None
    #: The secret to sign with when the backend knows it (an auto-started emulator made it);
    #: otherwise the client uses the ``secret`` option / ``FNMAP_SECRET``.
    secret: bytes | None = None
    #: True when ``invoke_many`` delivers all of a job's calls in one platform request (an array job).
    batches_calls = False
    #: True when ``poll_failures`` reports every accepted call that fails on the platform; the client
    #: then never declares such calls lost on a timer (a container job may queue for a long time).
    watches_calls = False

    def invoke_many(self, invocations: list[Invocation]) -> list[bytes | None]:
        """Deliver several calls; one answer per invocation, as ``invoke`` gives.

        Raises :class:`PlatformFault` when the platform refused them all.
        """
        return [self.invoke(invocation) for invocation in invocations]

    def poll_failures(self) -> list[Failure]:
        """Accepted calls that failed on the platform since the last poll (the client's monitor asks)."""
        return []

    def cancel(self, job_id: str) -> None:
        """Stop what the platform still queues or runs for ``job_id``, where it can.

        Called when a map is abandoned (its first failure was raised, or it was
        interrupted).  By default nothing: a function call cannot be recalled, and
        its late result is discarded.
        """

    def stop_attempts(self, job_id: str, attempts: list[tuple[int, int]], secret: bytes) -> None:
        """Stop these ``(call id, attempt)`` of ``job_id`` where the platform can: their call's
        outcome is final already (another copy committed it, or it failed for good).

        ``secret`` is the job's signing secret, for platforms that take signed requests.  By
        default nothing: the copies run on and their late results are discarded as duplicates.
        """

    def close(self) -> None:
        pass
