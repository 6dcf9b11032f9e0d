"""``local``: run calls in the client process through the worker routine, no HTTP.

Useful for debugging (breakpoints work) and as the cheapest baseline.  Calls
run on the client's dispatch threads, so a per-call ``timeout`` is checked
between items only (threads cannot be interrupted).
"""

from __future__ import annotations

import os

from .. import worker
from ..errors import PlatformFault
from ..signing import new_secret
from .base import BaseBackend, Invocation


class LocalBackend(BaseBackend):
    name = "local"

    def __init__(self, config):
        self.max_workers = config.workers or (os.cpu_count() or 2)
        # In-process calls need no shared deployment secret; sign with a fresh one all the same,
        # so the local path verifies exactly as a remote handler does.
        self.secret = (config.secret or new_secret()).encode()

    def invoke(self, invocation: Invocation) -> bytes:
        status, body = worker.handle(invocation.body, invocation.signature, self.secret)
        if status != 200:
            raise PlatformFault("rejected", body.decode(errors="replace"))
        return body
