"""``Event`` calls sent through spawners by default: the aws client's CPU per call near the emulator's.

Every call the ``aws`` backend sends as ``Event`` (the default ``lambda_invocation="auto"`` sends
a job's calls beyond a quarter of the dispatch threads that way) is not sent at once: it joins a
buffer, and a flusher thread sends the buffer every :data:`FLUSH_SECONDS` (at once when it holds
``fanout_slice`` calls or nears the synchronous payload limit) as one *spawner* invocation
(``RequestResponse``), which the function answers by invoking each call as an ``Event`` of itself
(``handlers/aws_lambda.py``).  The client then signs and sends one request per flush, not one per
call: its cost per call is encoding the call's event (4.5x the emulator backend's
client CPU per call without this, about 0.4x with it).  A flush of fewer than
:data:`MIN_SPAWN` calls sends them directly (a spawner would cost an invocation more than it saves).

Where the deployment does not allow it (the function's role may not invoke the function: ``fnmap
deploy aws`` grants ``lambda:InvokeFunction`` on itself; or it cannot reach the Lambda API), the
first spawner invokes none of its calls (AccessDenied, a connection error); they are sent
directly, spawners are switched off for this client and one warning says why and how to fix it.
Any other call a spawner could not invoke, or the calls of a spawner that failed, are reported
through ``poll_failures`` and retried by the scheduler, as with the opt-in ``lambda_fanout``.
``lambda_fanout=0`` (``FNMAP_LAMBDA_FANOUT=0``) turns spawners off.
"""

from __future__ import annotations

import threading
import time
import warnings

#: Seconds a buffered Event call waits for company before its spawner is sent.
FLUSH_SECONDS = 0.02
#: Fewer calls than this in a flush go out directly, one Invoke each.
MIN_SPAWN = 4


class EventSpawner:
    """The buffer of ``Event`` calls of one :class:`~fnmap.backends.aws.AwsBackend` and its flusher."""

    def __init__(self, backend):
        self.backend = backend
        self.enabled = True
        self._calls: list = []  # (invocation, payload)
        self._size = 0
        self._first = 0.0
        self._cond = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._closed = False

    def add(self, invocation, payload: bytes) -> None:
        """Buffer one call's Event payload; a flush sends it (it counts as accepted now)."""
        backend = self.backend
        with self._cond:
            if not self._calls:
                self._first = time.monotonic()
            self._calls.append((invocation, payload))
            self._size += len(payload) + 2
            full = len(self._calls) >= backend.fanout_slice or self._size + 4096 > backend.sync_limit // 2
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._run, name="fnmap-aws-spawner", daemon=True)
                self._flusher.start()
            if full or len(self._calls) == 1:
                self._cond.notify()

    def _take(self) -> list:
        calls, self._calls, self._size = self._calls, [], 0
        return calls

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._closed:
                    self._cond.wait()
                if self._closed and not self._calls:
                    return
                wait = self._first + FLUSH_SECONDS - time.monotonic()
                full = len(self._calls) >= self.backend.fanout_slice
                if wait > 0 and not full and not self._closed:
                    self._cond.wait(wait)
                calls = self._take()
            if calls:
                try:
                    self.backend.senders().submit(self.send, calls)
                except RuntimeError:  # the backend was closed: its jobs are over
                    return

    def send(self, calls: list) -> None:
        """Send buffered calls: through a spawner, or directly when few or spawners are off."""
        if len(calls) < MIN_SPAWN or not self.enabled:
            for invocation, payload in calls:
                self.backend.send_event(invocation, payload)
            return
        refused = self.backend.spawn(calls, give_back=True)
        if refused:
            self._switch_off(refused[0][2])
            for invocation, payload, _message in refused:
                self.backend.send_event(invocation, payload)

    def _switch_off(self, message: str) -> None:
        with self._cond:
            if not self.enabled:
                return
            self.enabled = False
        warnings.warn(
            f"fnmap: the Lambda function {self.backend.function_name!r} may not invoke itself (or cannot reach "
            f"the Lambda API), so its calls are sent one by one from this client (more client CPU per call): "
            f"{message[:300]}. Redeploy with `fnmap deploy aws update`, which grants its role "
            "lambda:InvokeFunction on the function, or set lambda_fanout=0 to silence this",
            RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

