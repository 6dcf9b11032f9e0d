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

from ..wire import ERROR_KIND_HEADER
from ..http_app import create_app
from ..wire import decode_header
from .pool import WorkerPool

RECENT_CALLS = 1000
#: Modules adding routes that emulate other platform APIs; each has ``register(app, emulator)``.
EXTENSIONS: list[str] = ["fnmap.emulator.lambda_api", "fnmap.emulator.batch_api"]


class Emulator:
    """State shared by the routes: the pool and the log of recent calls."""

    def __init__(self, pool: WorkerPool):
        self.pool = pool
        self.started = time.time()
        self.recent: collections.deque = collections.deque(maxlen=RECENT_CALLS)
        self.served = 0
        self.in_flight = 0
        self._lock = threading.Lock()

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
        with self._lock:
            self.in_flight += 1
        try:
            outcome, status, out, info = self.pool.execute(signature, body, timeout)
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
        return status, out, {}

    def health(self) -> dict:
        return {
            "status": "ok",
            "workers": self.pool.size,
            "worker_pids": self.pool.pids(),
            "in_flight": self.in_flight,
            "served": self.served,
            "crashes": self.pool.crashes,
            "timeouts": self.pool.timeouts,
            "uptime": time.time() - self.started,
        }


def create_emulator_app(emulator: Emulator):
    app = create_app(emulator.execute, name="fnmap-emulator")
    app.add_url_rule("/health", "health", lambda: jsonify(emulator.health()))
    app.add_url_rule("/calls", "calls", lambda: jsonify(list(emulator.recent)))
    for name in EXTENSIONS:
        importlib.import_module(name).register(app, emulator)
    return app
