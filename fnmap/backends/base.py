"""The interface every backend implements.

A backend only *delivers* invocations: the client owns chunking, retries,
stragglers and gathering.  ``invoke`` returns the response body when the
platform answers synchronously, or ``None`` when the call was accepted
asynchronously and its result will appear in storage.  Platform failures are
raised as :class:`fnmap.errors.PlatformFault`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..wire import CallRequest


@dataclass
class Invocation:
    """One signed request, ready to send."""

    request: CallRequest
    body: bytes
    signature: str


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

    def close(self) -> None:
        pass
