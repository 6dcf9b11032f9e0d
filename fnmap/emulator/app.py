"""The emulator's Flask app: the shared invocation app plus the emulator's own routes.

Routes: ``POST /invoke`` (and ``/``), the same as a deployed HTTP handler;
``POST /invoke-many`` (several short calls in one request, each signed and answered as alone);
``POST /cancel`` (stop attempts whose call the client decided by another
attempt; signed with the secret as an invocation is); ``GET /health``;
``GET /calls`` (recent calls, newest last, without their job ids: anyone who reaches
the port may ask).  Every request passes :mod:`fnmap.runtime.frontdoor` first.
Invocations run in the
:class:`~fnmap.emulator.pool.WorkerPool`.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import threading
import time
from dataclasses import dataclass

from flask import Response, jsonify, request

from ..runtime.batch_frames import pack_answers, unpack_calls
from ..runtime.http_app import create_app
from ..runtime.signing import REFUSED, ROUTE_CALL, ROUTE_CANCEL, SECRET_ENV, SIGNATURE_HEADER, verify_request
from ..runtime.wire import ERROR_KIND_HEADER, SESSION_GONE_STATUS, decode_header
from .faults import FaultPlan, RequestKeys
from .hangup import on_hangup
from .pool import Stopper, WorkerPool
from .routes import add_routes

RECENT_CALLS = 1000
#: Seconds past a call's timeout that a dropped call (``--drop-rate``) is held without an answer:
#: longer than an HTTP client waits (timeout + 5 s), so the client declares the call lost.
DROP_HOLD_SECONDS = 8.0
#: Modules adding routes that emulate other platform APIs; each has ``register(app, emulator)``.
EXTENSIONS: list[str] = ["fnmap.emulator.lambda_api", "fnmap.emulator.batch_api"]
#: Attempts stopped before their request arrived, remembered so that they do not run when it does.
STOPPED_EARLY_KEPT = 1000


def _read_header(body: bytes) -> tuple[dict, float | None, int | None]:
    """The request's JSON header, its timeout and memory; only the header is read here (nothing is
    unpickled in the emulator itself)."""
    try:
        header, _ = decode_header(body)
        timeout = header.get("timeout")
        timeout = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None
        memory = header.get("memory")
        memory = memory if isinstance(memory, int) and memory > 0 else None
    except (ValueError, TypeError):
        return {}, None, None
    return header, timeout, memory


#: What the client gets for each way a call ends other than answered: status, message, error kind.
_ENDINGS = {
    "crashed": (502, lambda info, timeout: f"worker process {info['pid']} died while running the call "
                f"({info.get('exit')})", "crashed"),
    "out_of_memory": (502, lambda info, timeout: f"{info['memory']} (worker process {info['pid']})",
                      "out_of_memory"),
    "timeout": (504, lambda info, timeout: f"the call ran past its timeout of {timeout} s plus a grace period; "
                f"its worker process {info['pid']} was killed", "timeout"),
    "stopped": (409, lambda info, timeout: "the call was stopped on the client's request (POST /cancel): another "
                "attempt of it decided the call" + (f"; its worker process {info['pid']} was killed"
                                                       if info.get("pid") else ""), "cancelled"),
    "failed": (500, lambda info, timeout: "injected platform fault (--fail-rate): the call was not run", None),
    "dropped": (504, lambda info, timeout: "injected lost call (--drop-rate): the call was not run", None),
    "closed": (503, lambda info, timeout: "the call's workers were stopped before one was free (its client "
               "session ended, or the emulator is stopping): the call was not run", None),
}


#: The answer to a request naming a session this emulator does not have (its client's socket closed,
#: or another emulator made it): the client attaches again.
_NO_SESSION = (SESSION_GONE_STATUS, b"no such client session on this emulator: attach again", {})


def _answer(ending: str, status: int, out: bytes, info: dict, timeout: float | None) -> tuple[int, bytes, dict]:
    refusal = _ENDINGS.get(ending)
    if refusal is None:
        return status, out, {}
    status, message, kind = refusal
    return status, message(info, timeout).encode(), ({ERROR_KIND_HEADER: kind} if kind else {})


@dataclass(slots=True)
class _Accepted:
    """An invocation that passed the checks and was admitted (:meth:`Emulator._accept`)."""

    timeout: float | None
    memory: int | None
    fate: object
    record: dict
    key: tuple | None
    stopper: Stopper
    unwatch: object
    pool: WorkerPool
    session: object  # the client's sessions.Session, or None (the emulator's own workers)


class Emulator:
    """State shared by the routes: the pool and the log of recent calls."""

    def __init__(self, pool: WorkerPool, faults: FaultPlan | None = None, secret: bytes | None = None):
        self.pool = pool
        if secret is None:
            value = (pool.env or os.environ).get(SECRET_ENV)
            secret = value.encode() if value else None
        #: The secret requests are signed with (``/cancel`` checks it, and every invocation).
        self.secret = secret
        workers_env = pool.env if pool.env is not None else os.environ  # what process.serve reads
        #: Whether the workers' secret is this one: then a request verified here is not verified again.
        self.workers_trust_front = bool(secret) and workers_env.get(SECRET_ENV, "").encode() == secret
        self.faults = faults or FaultPlan()
        self.started = time.time()
        self.recent: collections.deque = collections.deque(maxlen=RECENT_CALLS)
        self.served = 0
        self.in_flight = 0
        #: Requests stopped on the client's request (``POST /cancel``).
        self.stopped = 0
        #: Requests answered by each injected fault (fail, kill, drop, straggle, throttled).
        self.injected: collections.Counter = collections.Counter()
        self._keys = RequestKeys()
        #: Guards the counts of calls in flight (the emulator's, and its client sessions').
        self.lock = threading.Lock()
        #: ``(job id, call id, attempt)`` -> the stopper of that request while it is served.
        self._running: dict[tuple, Stopper] = {}
        #: Attempts asked to stop that had not arrived yet (oldest first).
        self._stopped_early: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        #: Set when the server stops, so requests held back by a fault let go.
        self.stopping = threading.Event()
        #: Stop a call whose client hung up before its answer (``--stop-on-hangup``).
        self.stop_on_hangup = False
        #: The client sessions of a shared emulator (:class:`.sessions.Sessions`), or None.
        self.sessions = None

    def _pool_for(self, token: str | None):
        """``(pool, session)`` for a request's session token; ``(None, None)`` when it names none here."""
        if not token:
            return self.pool, None
        session = self.sessions.get(token) if self.sessions is not None else None
        if session is None:
            return None, None
        return session.pool, session

    def execute(self, body: bytes, signature: str | None, session: str | None = None) -> tuple[int, bytes, dict]:
        pool, owner = self._pool_for(session)
        if pool is None:
            return _NO_SESSION
        call = self._accept(body, signature, pool, owner)
        if not isinstance(call, _Accepted):
            return call  # refused
        return self._run_accepted(call, body, signature)

    def _run_accepted(self, call: _Accepted, body: bytes, signature: str | None) -> tuple[int, bytes, dict]:
        try:
            result = self._run(call.pool, body, signature, call.timeout, call.fate, call.stopper, call.memory)
        except BaseException:
            self._release(call, "error")
            raise
        return self._answered(call, *result)

    def execute_many(self, data: bytes, session: str | None = None) -> tuple[int, bytes, dict]:
        """``POST /invoke-many``: several invocations (:mod:`fnmap.runtime.batch_frames`), each
        verified and answered exactly as ``POST /invoke`` would; their answers in one body.

        The calls run one after another: the client sends short calls together, several requests
        at once.  Calls with no timeout or memory limit go to one worker in one message
        (``WorkerPool.execute_many``).  An emulator that injects faults (planned per request, and
        counted per request by its tests) or whose workers check signatures themselves answers 404:
        its clients send one call a request.
        """
        if self.faults.active or not self.workers_trust_front:  # active: --max-concurrency too
            return 404, (b"this emulator takes one call a request (it injects faults, or its workers "
                         b"verify every call): POST /invoke"), {}
        pool, owner = self._pool_for(session)
        if pool is None:
            return _NO_SESSION
        try:
            calls = unpack_calls(data)
        except ValueError as e:
            return 400, f"malformed batch of invocations: {e}".encode(), {}
        return 200, pack_answers(self._execute_plain(calls, pool, owner)), {}

    def _execute_plain(self, calls: list, pool: WorkerPool, owner) -> list[tuple[int, bytes, dict]]:
        answers: list = [None] * len(calls)
        together: list[tuple[int, _Accepted, str | None, bytes]] = []
        for index, (signature, body) in enumerate(calls):
            call = self._accept(body, signature, pool, owner)
            if not isinstance(call, _Accepted):
                answers[index] = call
            elif call.timeout is None and call.memory is None:
                together.append((index, call, signature, body))
            else:
                answers[index] = self._run_accepted(call, body, signature)
        if together:
            try:
                results = pool.execute_many(
                    [(signature, body, call.stopper) for _, call, signature, body in together], verified=True)
            except BaseException:
                for _, call, _, _ in together:
                    self._release(call, "error")
                raise
            for (index, call, _, _), result in zip(together, results, strict=True):
                answers[index] = self._answered(call, *result)
        return answers

    def _accept(self, body: bytes, signature: str | None, pool: WorkerPool,
                session) -> _Accepted | tuple[int, bytes, dict]:
        """Check and admit one invocation: what it needs to run, or the answer that refuses it."""
        header, timeout, memory = _read_header(body)
        # Authenticated before any fault is injected or any worker touched.  This check
        # is the one a call gets on the emulator (workers_trust_front): the worker runs what its
        # pipe brings, and only this process writes that pipe (an anonymous pipe made for the
        # forked child; no other process, user or socket reaches it), always after this line, with
        # the same secret the worker holds (else the worker checks again).  The replay defences
        # are all kept: a signature's time window is checked here, and the worker still refuses a
        # call whose result is committed or whose job record is gone.  The worker's own check stays
        # the boundary of every other route (HTTP handler, Lambda, container, local backend).
        if self.secret and not verify_request(self.secret, ROUTE_CALL, header.get("job_id", ""),
                                              header.get("call_id", ""), header.get("attempt", ""), body, signature):
            with self.lock:
                self.served += 1
            return (401 if not signature else 403), REFUSED, {}
        record = {
            "job_id": str(header.get("job_id", "?")),
            "call_id": header.get("call_id"),
            "attempt": header.get("attempt"),
            "received": time.time(),
        }
        fate = self.faults.fate(*self._keys.key(header)) if self.faults.active else None
        key = (record["job_id"], record["call_id"], record["attempt"])
        if not all(isinstance(part, int) for part in key[1:]):  # unreadable: nothing can stop it
            key = None
        stopper = Stopper()
        if not self._admit(key, stopper, session, record["job_id"]):
            record.update(outcome="throttled", status=429, duration=0.0)
            self.recent.append(record)
            return 429, (
                f"too many calls at once: the emulator runs at most {self.faults.max_concurrency} "
                "(--max-concurrency); slow down and retry"
            ).encode(), {}
        # The shared emulator stops the calls of a client that went away (SIGKILL), as an
        # emulator of its own would have died with it (.hangup).
        unwatch = on_hangup(stopper.stop) if self.stop_on_hangup else None
        if fate is not None and fate.labels:
            self.injected.update(fate.labels)
            record["faults"] = fate.labels
        return _Accepted(timeout, memory, fate, record, key, stopper, unwatch, pool, session)

    def _release(self, call: _Accepted, ending: str) -> None:
        if call.unwatch is not None:
            call.unwatch()
        self._done(call.key, call.stopper, ending, call.session, call.record["job_id"])

    def _answered(self, call: _Accepted, ending: str, status: int, out: bytes, info: dict) -> tuple[int, bytes, dict]:
        """Release an admitted call, log it and turn how it ended into the answer."""
        self._release(call, ending)
        call.record.update(info, outcome=ending, status=status, duration=time.time() - call.record["received"])
        self.recent.append(call.record)
        return _answer(ending, status, out, info, call.timeout)

    def _admit(self, key, stopper: Stopper, session, job_id: str) -> bool:
        """Count the request in flight, the emulator's and its client session's (False:
        --max-concurrency throttles it)."""
        with self.lock:
            if self.faults.max_concurrency is not None and self.in_flight >= self.faults.max_concurrency:
                self.injected["throttled"] += 1
                return False
            self.in_flight += 1
            if session is not None:
                session.call_started(job_id)
            if key is not None:
                self._running[key] = stopper
                if key in self._stopped_early:
                    stopper.stop()
        return True

    def _done(self, key, stopper: Stopper, ending: str, session, job_id: str) -> None:
        with self.lock:
            self.in_flight -= 1
            if session is not None:
                session.call_ended(job_id)
            self.served += 1
            self.stopped += ending == "stopped"
            if key is not None and self._running.get(key) is stopper:
                del self._running[key]

    def _run(self, pool: WorkerPool, body: bytes, signature: str | None, timeout: float | None, fate,
             stopper: Stopper, memory: int | None = None):
        """Apply the planned faults around the pool's execution of one request."""
        plan = self.faults
        if plan.latency_ms:
            self.stopping.wait(plan.latency_ms / 1000.0)
        verified = self.workers_trust_front  # execute() verified the signature with the workers' secret
        if fate is None:
            return pool.execute(signature, body, timeout, stopper=stopper, memory=memory, verified=verified)
        if fate.fail:
            return "failed", 500, b"", {}
        if fate.drop:
            # Hold the request past any client's patience; the client declares the call lost.
            self._hold((timeout or 0.0) + DROP_HOLD_SECONDS, stopper)
            return "dropped", 504, b"", {}
        if fate.straggle and self._hold(plan.straggler_delay(pool.typical_seconds), stopper):
            return "stopped", 0, b"", {}
        return pool.execute(signature, body, timeout, kill_at=fate.kill_at, cold_start=plan.cold_start_ms / 1000.0,
                                 stopper=stopper, memory=memory, verified=verified)

    def _hold(self, seconds: float, stopper: Stopper) -> bool:
        """Hold a request back for ``seconds``, less if the server stops or the request is
        stopped; True when it was stopped."""
        end = time.monotonic() + seconds
        while not self.stopping.is_set():
            left = end - time.monotonic()
            if left <= 0 or stopper.stopped.wait(min(left, 0.25)):
                break
        return stopper.stopped.is_set()

    def stop_attempts(self, body: bytes, signature: str | None) -> tuple[int, dict]:
        """``POST /cancel``: stop the attempts ``{"job_id": ..., "attempts": [[call, attempt], ...]}``
        names, signed with the secret exactly as an invocation is; unsigned requests are refused.
        An attempt being served is stopped (its worker process killed and replaced); one not
        arrived yet is stopped when it arrives."""
        if not self.secret:
            return 500, {"error": f"the emulator has no secret to check requests with: set {SECRET_ENV}"}
        try:
            spec = json.loads(body)
            job_id = spec.get("job_id") if isinstance(spec, dict) else None
        except ValueError:
            job_id = None
        if not isinstance(job_id, str) or not verify_request(self.secret, ROUTE_CANCEL, job_id, "", "", body,
                                                             signature):
            return (401 if not signature else 403), {"error": REFUSED.decode()}
        try:
            job_id, attempts = spec["job_id"], spec["attempts"]
            keys = [(job_id, int(call), int(attempt)) for call, attempt in attempts]
            if not isinstance(job_id, str):
                raise TypeError(f"job_id is a {type(job_id).__name__}")
        except (ValueError, TypeError, KeyError) as e:
            return 400, {"error": f"malformed stop request ({e!r}): send JSON "
                                  '{"job_id": "...", "attempts": [[call_id, attempt], ...]}'}
        stopping = []
        with self.lock:
            for key in keys:
                stopper = self._running.get(key)
                if stopper is not None:
                    stopping.append(stopper)
                else:
                    self._stopped_early[key] = None
                    while len(self._stopped_early) > STOPPED_EARLY_KEPT:
                        self._stopped_early.popitem(last=False)
        for stopper in stopping:  # all marked before any kill: a replaced worker takes none of them
            stopper.stop(kill=False)
        for stopper in stopping:
            stopper.stop()
        return 200, {"stopped": len(stopping), "stopped_on_arrival": len(keys) - len(stopping)}

    def calls(self) -> list[dict]:
        """``GET /calls``: how the recent calls ended, without the job ids (not asked for a signature)."""
        return [{k: v for k, v in record.items() if k != "job_id"} for record in list(self.recent)]

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
            "stopped": self.stopped,
            "faults": self.faults.options(),
            "injected": dict(self.injected),
            "uptime": time.time() - self.started,
            "sessions": len(self.sessions) if self.sessions is not None else 0,
        }


def health(emulator: Emulator):
    return jsonify(emulator.health())


def calls(emulator: Emulator):
    return jsonify(emulator.calls())


def cancel(emulator: Emulator):
    status, answer = emulator.stop_attempts(request.get_data(cache=False), request.headers.get(SIGNATURE_HEADER))
    return Response(json.dumps(answer), status=status, mimetype="application/json")


#: The emulator's own routes, besides ``POST /invoke`` (and ``/``) of the shared invocation app.
ROUTES = [("GET", "/health", health), ("GET", "/calls", calls), ("POST", "/cancel", cancel)]


def create_emulator_app(emulator: Emulator):
    app = create_app(emulator.execute, name="fnmap-emulator", execute_many=emulator.execute_many)
    add_routes(app, ROUTES, emulator)
    for name in EXTENSIONS:
        importlib.import_module(name).register(app, emulator)
    return app
