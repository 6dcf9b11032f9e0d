"""How long a server waits on a client: deadlines for each request's head and body, and idle time.

A thread per connection (the emulator's server) is held for as long as its client keeps it, so
silent or byte-a-second connections could lock every other client out.  A
:class:`TimedConnection` reads a request under :class:`TimeLimits` and says where its request
stands, so that the server can give the connections idle longest up first when it is crowded.
The request readers of :mod:`.httpwire` tell it when a head is complete.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeLimits:
    """How long a server waits on a client, so that silent or slow connections cannot hold it.

    ``idle``: seconds a connection may wait for its next request (keep-alive).  ``head``: seconds
    from a request's first byte to the end of its head.  ``body_rate``: the slowest upload, in
    bytes per second, a body is given time for (after ``head`` seconds of grace); a chunked body
    of unknown length gets the time of the largest allowed.  Answers are written under the same rate.
    """

    idle: float = 10.0
    head: float = 10.0
    body_rate: float = 1 << 20

    def __post_init__(self):
        for name in ("idle", "head", "body_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}={value!r} must be a positive number of seconds (bytes/s for body_rate)")

    def transfer_seconds(self, size: int) -> float:
        """Seconds a body (or an answer) of ``size`` bytes is given."""
        return self.head + size / self.body_rate


class TimedConnection:
    """A server's connection, read under :class:`TimeLimits` and telling where its request stands.

    ``phase`` is ``IDLE`` (waiting for a request), ``HEAD`` (its first byte came), ``BODY`` (the
    head is complete), or ``BUSY`` (the request is being answered: no limit applies, a call may
    run for hours).  ``since`` is when that phase began.  The server gives up idle connections
    first when it is crowded.  A read past its deadline raises ``TimeoutError``.
    """

    IDLE, HEAD, BODY, BUSY = 0, 1, 2, 3
    __slots__ = ("sock", "limits", "max_body", "phase", "since", "given_up", "_until", "_timeout")

    def __init__(self, sock: socket.socket, limits: TimeLimits, max_body: int):
        self.sock, self.limits, self.max_body = sock, limits, max_body
        self.phase, self.since, self._until = self.IDLE, time.monotonic(), 0.0
        self._timeout: float | None = None
        #: Set (under the server's lock) when the server gave this connection up for a new one.
        self.given_up = False

    def recv(self, size: int) -> bytes:
        if self.phase == self.IDLE:
            self._set_timeout(self.limits.idle)
        else:
            left = self._until - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client sent its request too slowly")
            self._set_timeout(left)
        data = self.sock.recv(size)
        if data and self.phase == self.IDLE:
            self._enter(self.HEAD, self.limits.head)
        return data

    def sendall(self, data: bytes) -> None:
        self.allow_writing(len(data))
        self.sock.sendall(data)

    def allow_writing(self, size: int) -> None:
        """Give the client time to take ``size`` bytes: the idle time for what one second at the
        slowest rate carries, more for more (a client that never reads is given up)."""
        limits = self.limits
        self._set_timeout(limits.idle if size <= limits.body_rate else limits.transfer_seconds(size))

    def _set_timeout(self, seconds: float) -> None:
        if seconds != self._timeout:  # each change costs system calls; most requests need none
            self.sock.settimeout(seconds)
            self._timeout = seconds

    def head_complete(self, length: int | None) -> None:
        """The head is in: the body (``length`` bytes, None when chunked) must follow in time."""
        self._enter(self.BODY, self.limits.transfer_seconds(self.max_body if length is None else length))

    def answering(self) -> None:
        self.phase, self.since = self.BUSY, time.monotonic()

    def waiting(self) -> None:
        self.phase, self.since = self.IDLE, time.monotonic()

    def _enter(self, phase: int, seconds: float) -> None:
        now = time.monotonic()
        self.phase, self.since, self._until = phase, now, now + seconds
