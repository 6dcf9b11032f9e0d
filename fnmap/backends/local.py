"""``local``: run calls in the client process through the worker routine, no HTTP.

Useful for debugging (breakpoints work) and as the cheapest baseline.  Calls
run on the client's dispatch threads.  A thread cannot be interrupted, so a call
with a ``timeout`` runs on a thread of its own: when it overruns, the call fails
with ``fnmap.TimeoutError`` at its deadline, as on every other backend, and the
thread runs on in the background with its result ignored.
"""

from __future__ import annotations

import os
import threading

from ..errors import PlatformFault
from ..runtime import worker
from ..runtime.signing import local_secret
from .base import Answer, BaseBackend, Invocation

#: Seconds past a call's timeout before the dispatch thread stops waiting for it.
TIMEOUT_GRACE_SECONDS = 0.5


class LocalBackend(BaseBackend):
    name = "local"
    #: A call is a function call on a thread here: 0.05 s amortizes the bookkeeping.
    call_seconds = 0.05
    workers_on_this_terminal = True

    def __init__(self, config):
        self.max_workers = config.workers or (os.cpu_count() or 2)
        # In-process calls need no shared deployment secret; sign with this user's own all the same,
        # so the local path verifies exactly as a remote handler does and another process of the
        # user can check the job's stored results (``fnmap.job(ID).results()``).
        self.secret = (config.secret or local_secret()).encode()

    def invoke(self, invocation: Invocation) -> Answer:
        timeout = invocation.request.timeout
        if not timeout:
            return Answer(self._run(invocation))
        answer: list = []
        runner = threading.Thread(target=self._run_into, args=(invocation, answer), daemon=True,
                                  name="fnmap-local-call")
        runner.start()
        # The worker checks the deadline between items; the grace lets it answer that itself.
        runner.join(timeout + TIMEOUT_GRACE_SECONDS)
        if not answer:
            raise PlatformFault(
                "timeout",
                f"it ran past its timeout of {timeout} s; the local backend cannot stop a thread, so the "
                "call runs on in the background and its result is ignored",
            )
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return Answer(answer[0])

    def _run(self, invocation: Invocation) -> bytes:
        status, body = worker.handle(invocation.body, invocation.signature, self.secret)
        if status != 200:
            raise PlatformFault("rejected", body.decode(errors="replace"))
        return body

    def _run_into(self, invocation: Invocation, answer: list) -> None:
        try:
            answer.append(self._run(invocation))
        except BaseException as e:  # noqa: B036 - handed to the dispatch thread waiting for it
            answer.append(e)
