"""The emulator's Flask app: the shared invocation app plus the emulator's own routes.

Routes: ``POST /invoke`` (and ``/``), the same as a deployed HTTP handler;
``GET /health``; ``GET /calls`` (recent calls, newest last).  Invocations run in
the :class:`~fnmap.emulator.pool.WorkerPool`.
"""

from __future__ import annotations

import collections
import importlib
import threading
import time

from flask import jsonify

from ..http_app import create_app
from ..wire import ERROR_KIND_HEADER, decode_header
from .faults import FaultPlan, RequestKeys
from .pool import WorkerPool

RECENT_CALLS = 1000
#: Seconds past a call's timeout that a dropped call (``--drop-rate``) is held without an answer:
#: longer than an HTTP client waits (timeout + 5 s), so the client declares the call lost.
DROP_HOLD_SECONDS = 8.0
#: Modules adding routes that emulate other platform APIs; each has ``register(app, emulator)``.
EXTENSIONS: list[str] = ["fnmap.emulator.lambda_api", "fnmap.emulator.batch_api"]


class Emulator:
    """State shared by the routes: the pool and the log of recent calls."""

    def __init__(self, pool: WorkerPool, faults: FaultPlan | None = None):
        self.pool = pool
        self.faults = faults or FaultPlan()
        self.started = time.time()
        self.recent: collections.deque = collections.deque(maxlen=RECENT_CALLS)
        self.served = 0
        self.in_flight = 0
        #: Requests answered by each injected fault (fail, kill, drop, straggle, throttled).
        self.injected: collections.Counter = collections.Counter()
        self._keys = RequestKeys()
        self._lock = threading.Lock()
        #: Set when the server stops, so requests held back by a fault let go.
        self.stopping = threading.Event()

    def execute(self, body: bytes, signature: str | None) -> tuple[int, bytes, dict]:
        try:  # only the JSON header is read here; nothing is unpickled in the emulator itself
            header, _ = decode_header(body)
            timeout = header.get("timeout")
            timeout = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None
        except (ValueError, TypeError):
            header, timeout = {}, None
        record = {
            "job_id": str(header.get("job_id", "?")),
            "call_id": header.get("call_id"),
            "attempt": header.get("attempt"),
            "received": time.time(),
        }
        plan = self.faults
        fate = plan.fate(*self._keys.key(header)) if plan.active else None
        with self._lock:
            if plan.max_concurrency is not None and self.in_flight >= plan.max_concurrency:
                self.injected["throttled"] += 1
                record.update(outcome="throttled", status=429, duration=0.0)
                self.recent.append(record)
                return 429, (
                    f"too many calls at once: the emulator runs at most {plan.max_concurrency} "
                    "(--max-concurrency); slow down and retry"
                ).encode(), {}
            self.in_flight += 1
        try:
            if fate is not None and fate.labels:
                self.injected.update(fate.labels)
                record["faults"] = fate.labels
            outcome, status, out, info = self._run(body, signature, timeout, fate)
        finally:
            with self._lock:
                self.in_flight -= 1
                self.served += 1
        record.update(info, outcome=outcome, status=status, duration=time.time() - record["received"])
        self.recent.append(record)
        if outcome == "crashed":
            return 502, (
                f"worker process {info['pid']} died while running the call ({info.get('exit')})"
            ).encode(), {ERROR_KIND_HEADER: "crashed"}
        if outcome == "timeout":
            return 504, (
                f"the call ran past its timeout of {timeout} s plus a grace period; its worker "
                f"process {info['pid']} was killed"
            ).encode(), {ERROR_KIND_HEADER: "timeout"}
        if outcome == "failed":
            return 500, b"injected platform fault (--fail-rate): the call was not run", {}
        if outcome == "dropped":
            return 504, b"injected lost call (--drop-rate): the call was not run", {}
        return status, out, {}

    def _run(self, body: bytes, signature: str | None, timeout: float | None, fate):
        """Apply the planned faults around the pool's execution of one request."""
        plan = self.faults
        if plan.latency_ms:
            self.stopping.wait(plan.latency_ms / 1000.0)
        if fate is None:
            return self.pool.execute(signature, body, timeout)
        if fate.fail:
            return "failed", 500, b"", {}
        if fate.drop:
            # Hold the request past any client's patience; the client declares the call lost.
            self.stopping.wait((timeout or 0.0) + DROP_HOLD_SECONDS)
            return "dropped", 504, b"", {}
        if fate.straggle:
            self.stopping.wait(plan.straggler_delay(self.pool.typical_seconds))
        return self.pool.execute(signature, body, timeout, kill_at=fate.kill_at,
                                 cold_start=plan.cold_start_ms / 1000.0)

    def health(self) -> dict:
        return {
            "status": "ok",
            "workers": self.pool.size,
            "worker_pids": self.pool.pids(),
            "in_flight": self.in_flight,
            "served": self.served,
            "crashes": self.pool.crashes,
            "timeouts": self.pool.timeouts,
            "kills": self.pool.kills,
            "faults": self.faults.options(),
            "injected": dict(self.injected),
            "uptime": time.time() - self.started,
        }


def create_emulator_app(emulator: Emulator):
    app = create_app(emulator.execute, name="fnmap-emulator")
    app.add_url_rule("/health", "health", lambda: jsonify(emulator.health()))
    app.add_url_rule("/calls", "calls", lambda: jsonify(list(emulator.recent)))
    for name in EXTENSIONS:
        importlib.import_module(name).register(app, emulator)
    return app
