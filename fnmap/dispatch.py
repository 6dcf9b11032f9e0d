"""Sending calls: the dispatch threads, the batching of calls sent one by one, the signed request
of an attempt, and the throttle.

:class:`Dispatch` is built by the :class:`fnmap.scheduler.Scheduler` and handed what it needs:
``begin`` (claim a call's next attempt), ``decide`` (apply an attempt's answer) and ``after``
(run an action on the monitor's timer heap).  A dispatch thread takes a call from the queue,
asks ``begin`` for the number of its next attempt, signs the request, waits for room under the
throttle and hands the invocation to the backend; the answer goes to ``decide``.  It never
decides anything itself.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass

from . import policy
from .backends.base import ACCEPTED, Answer, Invocation
from .errors import FaultKind, PlatformFault
from .runtime import keys, signing
from .runtime.outcome import open_committed
from .runtime.serialization import runtime_info
from .runtime.wire import CallRequest, decode_response, encode

#: What every request says of this client: its fnmap protocol and the versions its pickles need.
_RUNTIME = runtime_info()
#: How long calls submitted one by one wait for the next before being sent together where the
#: backend batches calls, and the longest the first of them waits.
COALESCE_SECONDS = 0.25
COALESCE_MAX_SECONDS = 2.0
#: Calls of a job whose recent calls ran at most this long (seconds, in the worker) are sent
#: several to a request where the backend takes that (``group_limit``), and together they keep a
#: worker busy for about ``BATCH_SECONDS`` at most.  Calls with a timeout or a memory limit, and the
#: first ``BATCH_AFTER_CALLS`` calls of a job (nothing is known of them yet), go one a request.
BATCH_CALL_SECONDS = 0.02
BATCH_SECONDS = 0.1
BATCH_AFTER_CALLS = 4


@dataclass(slots=True)
class Outcomes:
    """A call's answer: one outcome per item (:mod:`fnmap.runtime.outcome`), and the worker's stats."""

    outcomes: list
    stats: dict | None


class Dispatch:
    """Sends the calls of every job of one scheduler: ``max_workers`` dispatch threads over one queue."""

    def __init__(self, backend, store, secret: bytes, *, begin, decide, after):
        self.backend = backend
        self.store = store
        self.secret = secret
        self.max_workers = backend.max_workers
        #: ``begin(job, state)``: the number of the call's next attempt, or None (not to be sent).
        self._begin = begin
        #: ``decide(job, state, attempt, event, charge=None, final=False)``: apply an attempt's answer.
        self._decide = decide
        #: ``after(delay, action, job, states)``: run ``action(job, states)`` in ``delay`` seconds.
        self._after = after
        self.closed = False
        #: The limit on calls in flight, lowered by 429s (AIMD; :class:`fnmap.policy.Throttle`).
        self.throttle = policy.Throttle(self.max_workers)
        self._room = threading.Condition()
        #: One entry per send in flight (see ``_acquire_slot``).
        self._in_flight: list[None] = []
        #: Calls waiting to be sent together to a backend that batches calls (see ``_coalesce``).
        self._pending: dict = {}
        self._pending_lock = threading.Lock()
        # Daemon threads over one queue of sends; lighter than a ThreadPoolExecutor, which allocates
        # a Future per step (100,000 queued calls carried 100,000 of them).  Each send queued starts
        # one more, up to ``max_workers``: a one-call map starts one, not all (each start waits for
        # the new thread to run, 0.4 - 2 ms on a loaded machine).
        self._sends: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()

    def submit(self, job, states: list) -> None:
        """Send these calls of ``job``: one by one, or together where the backend batches calls
        (then calls submitted one at a time wait ``COALESCE_SECONDS`` for company, so 1,000
        ``Executor.submit`` calls in a loop become one array job, not 1,000)."""
        if not self.backend.fans_out:
            for state in states:
                self._queue(self._send, job, state)
        elif job.run.sealed or len(states) > 1:
            self._queue(self._send_all, job, list(states))
        else:
            self._coalesce(job, states)

    def send(self, job, state) -> None:
        """Send one more attempt of a call (a retry after its backoff, a speculative copy)."""
        self._queue(self._send, job, state)

    def close(self) -> None:
        """Stop the dispatch threads; calls queued later fail as cancelled instead of waiting."""
        with self._threads_lock:
            self.closed = True
            for _ in self._threads:
                self._sends.put(None)

    def _queue(self, send, job, target) -> None:
        if self.closed:  # no thread would take it: fail the call(s) rather than leave them pending
            fault = PlatformFault("cancelled", "the fnmap client was closed before this call was sent")
            for state in target if isinstance(target, list) else [target]:
                self._decide(job, state, 0, fault, final=True)
            return
        self._sends.put((send, job, target))
        if len(self._threads) < self.max_workers:
            self._add_thread()

    def _add_thread(self) -> None:
        with self._threads_lock:
            if len(self._threads) < self.max_workers and not self.closed:
                thread = threading.Thread(target=self._dispatch_loop, name=f"fnmap-dispatch_{len(self._threads)}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)

    def _dispatch_loop(self) -> None:
        """Body of each dispatch thread.  An unexpected error in fnmap's own code fails the
        call(s) with that error rather than vanishing and leaving their futures pending forever."""
        while True:
            item = self._sends.get()
            if item is None:
                return
            send, job, target = item
            try:
                send(job, target)
            except BaseException as e:  # noqa: B036 - nothing may leave a call unresolved
                detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                fault = PlatformFault("client", f"internal error in the fnmap client: {e!r}\n{detail}")
                for state in target if isinstance(target, list) else [target]:
                    self._decide(job, state, 0, fault, charge=True, final=True)

    def _send(self, job, state) -> None:
        """One attempt of one call: begin it, deliver it, decide on its answer."""
        company = self._company(job)
        if company:
            self._send_grouped(job, [state, *company])
            return
        attempt = self._begin(job, state)
        if attempt is None:
            return
        invocation = self._invocation(job, state, attempt)
        if invocation is None:  # finished by another copy meanwhile
            return
        self._deliver_one(job, state, attempt, invocation)

    def _deliver_one(self, job, state, attempt: int, invocation) -> None:
        """Send one begun attempt under the throttle and decide on its answer."""
        ticket, at_floor = self._acquire_slot()
        try:
            answer = self.backend.invoke(invocation)
        except PlatformFault as fault:
            self._release_slot(fault.kind == FaultKind.THROTTLED, ticket)
            self._decide(job, state, attempt, fault, charge=policy.charges_retry(fault.kind, at_floor))
            return
        except Exception as e:  # a backend bug or an unexpected client error: a server-side fault
            self._release_slot(False, ticket)
            self._decide(job, state, attempt, PlatformFault("server", f"{type(e).__name__}: {e}"))
            return
        self._release_slot(False, ticket)
        self._decide(job, state, attempt, self._read(answer))

    def _company(self, job) -> list:
        """Calls of ``job`` waiting in the queue that may go in one request with the one being sent:
        the job's calls are short, the backend takes several a request, and more are queued than
        the idle dispatch threads take one by one.  This thread takes its share of the queue over
        the threads with no send in flight (this one among them): a loop of ``Executor.submit``
        whose calls queue while every thread waits on an answer sends them together from the first
        thread free, and a map's queue is shared by all the threads (else none: the calls spread
        over the workers one by one)."""
        limit = self.backend.group_limit
        if limit < 2 or job.config.timeout is not None or job.config.memory:
            return []
        recent = job.run.durations[-8:]
        if len(recent) < BATCH_AFTER_CALLS:
            return []
        typical = sum(recent) / len(recent)
        if typical > BATCH_CALL_SECONDS:
            return []
        idle = max(1, self.max_workers - len(self._in_flight))
        wanted = min(limit - 1, int(BATCH_SECONDS / max(typical, 1e-4)), -(-self._sends.qsize() // idle))
        company = []
        while len(company) < wanted:
            try:
                item = self._sends.get_nowait()
            except queue.Empty:
                break
            if item is None or item[0] != self._send or item[1] is not job:  # not a call of this job: back
                self._sends.put(item)
                break
            company.append(item[2])
        return company

    def _begin_all(self, job, states: list) -> list[tuple]:
        """``(state, attempt, invocation)`` of each of ``states`` that is still to be sent."""
        ready = []
        for state in states:
            attempt = self._begin(job, state)
            if attempt is not None and (invocation := self._invocation(job, state, attempt)) is not None:
                ready.append((state, attempt, invocation))
        return ready

    def _send_grouped(self, job, states: list) -> None:
        """Short calls in one request (``backend.invoke_group``); each answer is decided as in ``_send``."""
        self._send_group(job, states, self.backend.invoke_group)

    def _send_all(self, job, states: list) -> None:
        """One platform request for many calls (an array job); each answer is decided as in ``_send``."""
        self._send_group(job, states, self.backend.invoke_all)

    def _send_group(self, job, states: list, deliver) -> None:
        """Begin ``states``, hand their invocations to ``deliver`` at once, decide each answer: an
        ``Answer``, or the ``PlatformFault`` that ended that call alone; a fault ``deliver`` raises
        ends them all; None (the platform takes no groups) sends each alone."""
        ready = self._begin_all(job, states)
        if not ready:
            return
        ticket, at_floor = self._acquire_slot()
        try:
            answers = deliver([invocation for _, _, invocation in ready])
        except Exception as e:
            fault = e if isinstance(e, PlatformFault) else PlatformFault("server", f"{type(e).__name__}: {e}")
            answers = [fault] * len(ready)
        if answers is None:  # the platform takes no groups (it just said so): one request each, throttled
            self._release_slot(False, ticket)
            for state, attempt, invocation in ready:
                self._deliver_one(job, state, attempt, invocation)
            return
        throttled = any(isinstance(a, PlatformFault) and a.kind == FaultKind.THROTTLED for a in answers)
        self._release_slot(throttled, ticket)
        for (state, attempt, _), answer in zip(ready, answers, strict=True):
            if isinstance(answer, PlatformFault):
                self._decide(job, state, attempt, answer, charge=policy.charges_retry(answer.kind, at_floor))
            else:
                self._decide(job, state, attempt, self._read(answer))

    def _coalesce(self, job, states: list) -> None:
        """Hold calls submitted one at a time until none has come for ``COALESCE_SECONDS`` (at most
        ``COALESCE_MAX_SECONDS`` after the first), then send them together: a loop of submits is one
        array job however slowly each submit pickles its arguments."""
        now = time.monotonic()
        with self._pending_lock:
            pending = self._pending.get(job)
            first = pending is None
            if first:
                pending = self._pending[job] = [[], now, now]  # calls, first came, last came
            pending[0].extend(states)
            pending[2] = now
        if first:
            self._after(COALESCE_SECONDS, self._flush_pending, job, None)

    def _flush_pending(self, job, _states) -> None:
        now = time.monotonic()
        with self._pending_lock:
            states, since, last = self._pending.get(job, ([], now, 0.0))
            wait = COALESCE_SECONDS - (now - last)
            if states and wait > 0 and now - since < COALESCE_MAX_SECONDS:
                states = None  # still coming: look again when this one has waited its turn
            else:
                self._pending.pop(job, None)
        if states is None:
            self._after(wait, self._flush_pending, job, None)
        elif states:
            self._queue(self._send_all, job, states)

    def _invocation(self, job, state, attempt: int) -> Invocation | None:
        """The signed request of one attempt (None once the call needs it no more)."""
        cfg = job.config
        payload = state.payload
        if payload is None:  # decided meanwhile
            return None
        memory = state.attempt_memory(attempt)
        req = CallRequest(
            job_id=job.id, call_id=state.call_id, func_key=state.func_key, store_url=self.store.url,
            attempt=attempt, timeout=cfg.timeout, items_key=state.items_key,
            inline_result_limit=cfg.inline_limit, extra_env=cfg.extra_env, runtime=_RUNTIME,
            first_index=state.first_index, retry_on=job.retry_on_names,
            # retry_on re-runs share the retries left (speculative copies and 429s use none).
            max_attempts=attempt + max(0, cfg.retries - state.charged), output=cfg.output,
            echo_output=cfg.output == "live" or not self.backend.workers_on_this_terminal,
            memory=memory,
            job_record=keys.job_index_key(job.id, job.created),
        )
        body = encode(req, payload)
        signature = signing.sign_request(self.secret, signing.ROUTE_CALL, job.id, state.call_id, attempt, body,
                                         lifetime=self.backend.signature_lifetime)
        return Invocation(req, body, signature, cfg, memory)

    def _read(self, answer: Answer):
        """Turn the platform's answer into an event for :meth:`_decide` (outside any lock: this
        decodes and may read the result from storage)."""
        if answer.accepted:
            return ACCEPTED
        try:
            resp, payload = decode_response(answer.body)
        except (ValueError, TypeError) as e:
            return PlatformFault("server", f"malformed answer: {e}")
        if not resp.ok:
            return PlatformFault(resp.error_kind or "server", resp.error or "")
        try:
            key = keys.result_key(resp.job_id, resp.call_id)
            data = payload if resp.inline else self.store.get(key)
            outcomes = open_committed(self.secret, key, data)
        except signing.UnauthenticatedObject as e:  # planted or altered: no retry reads it better
            return PlatformFault("rejected", f"cannot read the result: {e}")
        except Exception as e:
            return PlatformFault("server", f"cannot read the result: {e!r}")
        if resp.error_kind == FaultKind.RETRY_ON:  # a user exception the caller asked to retry
            return PlatformFault("retry_on", "the item raised an exception listed in retry_on")
        return Outcomes(outcomes, resp.stats)

    # -- the throttle ----------------------------------------------------------------

    def _acquire_slot(self) -> tuple[int, bool]:
        """Wait for room under the throttle; return the send's ticket and whether the limit is at
        its floor.

        Every send is one entry in ``_in_flight`` (``list.append``/``pop`` are atomic), so the count
        in flight is always exact.  While no 429 has lowered the limit, the dispatch threads
        themselves bound the calls in flight (one each, ``max_workers`` of them) and a send takes
        no lock: a lock shared by every dispatch thread on every call made them queue behind each
        other and tripled the client's CPU per call.
        """
        throttle = self.throttle
        if throttle.limit < throttle.ceiling:
            with self._room:
                while len(self._in_flight) >= throttle.allowed():
                    self._room.wait(0.1)
                self._in_flight.append(None)
                return throttle.ticket(), throttle.at_floor
        self._in_flight.append(None)
        return throttle.ticket(), throttle.at_floor

    def _release_slot(self, throttled: bool, ticket: int | None = None) -> None:
        self._in_flight.pop()
        throttle = self.throttle
        if not throttled and throttle.limit >= throttle.ceiling:
            return  # unthrottled: nothing to update, nobody is waiting for room
        with self._room:
            if throttled:
                throttle.on_throttled(ticket)
            else:
                throttle.on_success()
            self._room.notify_all()

