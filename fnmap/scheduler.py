"""The scheduler: the one owner of every call's life, from its first send to its final outcome.

A job is a list of calls (:class:`fnmap.jobs.CallState`, one chunk of items each).  Front-ends
(``fnmap.map``, the ``Executor``, the Dask shim, ``map_reduce``) add calls, :meth:`Scheduler.submit`
them and :meth:`Scheduler.seal` the job when no more will come; everything after that happens here.

The algorithm, in the manner of ``dask.local``:

1. **Send.**  A dispatch thread takes a call from the queue and asks :meth:`_begin` for the number
   of its next attempt.  ``_begin`` is where a call is claimed or found cancelled, abandoned or
   already decided (by another copy); it records the attempt as sent.  The thread then signs the
   request, waits for room under the throttle, and hands the invocation to the backend.  That is
   all a dispatch thread does: it never decides anything.
2. **Answer.**  The backend's :class:`~fnmap.backends.base.Answer` (a response body, or "accepted,
   look in storage later") or its :class:`~fnmap.errors.PlatformFault` is turned into an event
   (the call's outcomes, ``ACCEPTED``, a fault) outside any lock, and :meth:`_decide` applies it
   under the scheduler's lock.
3. **Decide.**  Outcomes finish the call, unless another copy finished it first (then they are a
   duplicate and dropped).  A fault is retried if its kind is retryable and the call has retries
   left (:func:`fnmap.policy.retry_fault`; a 429 is not charged while the throttle can still slow
   down), else the call fails for good; while another copy of the call is still out, that copy
   decides.  A retry is not a sleeping thread: it goes on a timer heap with its backoff delay,
   and the monitor sends it when it is due.
4. **Monitor.**  One thread per client wakes for due timers and, with a growing period, polls:
   results of calls accepted asynchronously are found with one LIST per job, calls silent past
   their timeout are declared ``lost`` (a fault like any other), calls the platform reports as
   failed are routed to step 3, and stragglers get a speculative copy once most of the job is done.

Only :meth:`_begin`, :meth:`_decide`, :meth:`cancel` and the monitor's bookkeeping take the lock,
and they hold it for plain data changes only: futures are completed, records written and copies
stopped after it is released (``_deliver``).  With one owner, every rule about a call (attempts,
retries, the throttle, speculation, cancellation) is in this file and can be tested by feeding
answers synchronously (``tests/test_scheduler.py``).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import policy
from .backends.base import Answer, Invocation
from .errors import FaultKind, PlatformFault
from .locks import YieldingLock
from .runtime import compression, keys, signing
from .runtime.call_error import call_error
from .runtime.serialization import loads, runtime_info
from .runtime.wire import CallRequest, decode_response, encode

_RUNTIME = runtime_info()
#: Backends whose workers write to this process's terminal: their captured output is not echoed
#: there unless output="live" (issue 14); cloud workers echo it into the platform's log.
_BACKENDS_ON_THIS_TERMINAL = ("emulator", "local")
#: Seconds past a call's timeout before an asynchronous call counts as lost.
LOST_GRACE_SECONDS = 10.0
#: The monitor's polling period grows from the first to the second value while nothing changes.
POLL_SECONDS = (0.05, 1.0)
#: How long calls submitted one by one wait for the next before being sent together where the
#: backend batches calls, and the longest the first of them waits.
COALESCE_SECONDS = 0.25
COALESCE_MAX_SECONDS = 2.0
#: Results of asynchronous calls read from storage at once by one poll.
FETCH_THREADS = 16


@dataclass(slots=True)
class Outcomes:
    """A call's answer: one outcome tuple per item (see :mod:`fnmap.runtime.worker`), and the stats."""

    outcomes: list
    stats: dict | None


#: The event of an attempt the platform accepted to run asynchronously.
ACCEPTED = "accepted"


class Scheduler:
    """Sends, retries and settles the calls of every job of one client (backend + storage + secret)."""

    def __init__(self, backend, store, secret: bytes):
        self.backend = backend
        self.store = store
        self.secret = secret
        self.max_workers = backend.max_workers
        #: The lock every decision about a call is made under (and only those).
        self.lock = YieldingLock()
        self.closed = False
        # A fixed set of daemon threads over one queue of sends; lighter than a ThreadPoolExecutor,
        # which allocates a Future per step (100,000 queued calls carried 100,000 of them).
        self._sends: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._dispatch_loop, name=f"fnmap-dispatch_{i}", daemon=True)
                         for i in range(self.max_workers)]
        for thread in self._threads:
            thread.start()
        self._throttle = policy.Throttle(self.max_workers)
        self._room = threading.Condition()
        #: One entry per send in flight (see ``_acquire_slot``).
        self._in_flight: list[None] = []
        #: Calls waiting to be sent together to a backend that batches calls (see ``_coalesce``).
        self._pending: dict = {}
        self._pending_lock = threading.Lock()
        #: Retries and coalesced batches waiting for their time: ``(due, seq, action, job, states)``.
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._wake = threading.Condition()
        self._active: set = set()
        self._monitor: threading.Thread | None = None
        #: Called by the monitor for each active job on each poll (``fnmap cancel`` requests).
        self.on_poll = None
        #: Threads that read asynchronous calls' results from storage (started on first need).
        self._fetchers = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="fnmap-fetch")

    # -- the front door: jobs and their calls ------------------------------------

    def add(self, job, state) -> None:
        """Register a call of ``job`` (not sent until :meth:`submit`)."""
        with self.lock:
            job.calls.append(state)
            job._all_done.clear()
        if job not in self._active:
            with self._wake:
                self._active.add(job)
            self._ensure_monitor()

    def submit(self, job, states: list) -> None:
        """Send these calls of ``job``: one by one, or together where the backend batches calls
        (then calls submitted one at a time wait ``COALESCE_SECONDS`` for company, so 1,000
        ``Executor.submit`` calls in a loop become one array job, not 1,000)."""
        if not self.backend.batches_calls:
            for state in states:
                self._queue(self._send, job, state)
        elif job.sealed or len(states) > 1:
            self._queue(self._send_many, job, list(states))
        else:
            self._coalesce(job, states)

    def seal(self, job) -> None:
        """No more calls will be added to ``job``: it is done when every call is."""
        with self.lock:
            job.sealed = True
            if job.progress is not None and job.progress.calls is None:
                job.progress.calls = len(job.calls)
            write, all_done, _ = self._settle(job)
        if write:
            job.save_record(final=True)
        elif not all_done:
            job.save_record(final=False)  # a "running" index entry, so `fnmap jobs` shows the job
        if all_done:
            job.all_done()

    def cancel(self, job, stop_platform: bool = False) -> None:
        """Stop starting ``job``'s calls: those no dispatch thread took yet are cancelled; those
        already running go on and end with their own results (retried after platform faults).

        ``stop_platform``: nobody wants the results any more (a map raised its first failure, or
        was interrupted): the job is *abandoned*, so no more retries or copies, and the backend
        stops what it still runs where it can (Batch array jobs are terminated, the emulator's
        attempts in flight are stopped: issue 24, joblib's next run waited behind them).
        """
        if job.feed is not None:  # items in no call yet become one unstarted call, cancelled below
            job.feed.stop()
        with self.lock:
            job.cancelled = True
            if stop_platform:
                job.abandoned = True
            unstarted = [s for s in job.calls if not s.claimed and not s.done]
            for state in unstarted:
                state.claimed = True
            running = [(s.call_id, record[0]) for s in job.calls if not s.done
                       for record in s.attempts if record[2] is None] if stop_platform else []
            job.stopped_attempts.update(running)
        for state in unstarted:
            self._cancel_unstarted(job, state)
        job._wake.set()
        if stop_platform and not job.done:
            try:
                self.backend.cancel(job.id)
                if running:  # the emulator kills their worker processes: the next job finds them free
                    self.backend.stop_attempts(job.id, running, self.secret)
            except Exception as e:  # the caller is already handling an error; say, do not mask it
                import warnings

                warnings.warn(f"fnmap: could not stop the platform's work for job {job.id}: {e}",
                              RuntimeWarning, stacklevel=3)

    def fail(self, job, state, fault: PlatformFault) -> None:
        """Fail a call of ``job`` that was never sent with ``fault`` (its items' inputs could not be stored)."""
        self._decide(job, state, 0, fault, final=True)

    # -- sending (dispatch threads) ------------------------------------------------

    def _queue(self, send, job, target) -> None:
        if self.closed:  # no thread would take it: fail the call(s) rather than leave them pending
            fault = PlatformFault("cancelled", "the fnmap client was closed before this call was sent")
            for state in target if isinstance(target, list) else [target]:
                self._decide(job, state, 0, fault, final=True)
            return
        self._sends.put((send, job, target))

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
        attempt = self._begin(job, state)
        if attempt is None:
            return
        invocation = self._invocation(job, state, attempt)
        if invocation is None:  # finished by another copy meanwhile
            return
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

    def _send_many(self, job, states: list) -> None:
        """One platform request for many calls (an array job); each answer is decided as in ``_send``."""
        ready = []
        for state in states:
            attempt = self._begin(job, state)
            if attempt is not None and (invocation := self._invocation(job, state, attempt)) is not None:
                ready.append((state, attempt, invocation))
        if not ready:
            return
        ticket, _at_floor = self._acquire_slot()
        try:
            answers = self.backend.invoke_many([invocation for _, _, invocation in ready])
        except Exception as e:
            fault = e if isinstance(e, PlatformFault) else PlatformFault("server", f"{type(e).__name__}: {e}")
            self._release_slot(fault.kind == FaultKind.THROTTLED, ticket)
            for state, attempt, _ in ready:
                self._decide(job, state, attempt, fault)
            return
        self._release_slot(False, ticket)
        for (state, attempt, _), answer in zip(ready, answers, strict=True):
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
            self._queue(self._send_many, job, states)

    def _invocation(self, job, state, attempt: int) -> Invocation | None:
        """The signed request of one attempt (None once the call needs it no more)."""
        cfg = job.config
        payload = state.payload
        if payload is None:  # decided meanwhile
            return None
        memory = _attempt_memory(state, attempt)
        req = CallRequest(
            job_id=job.id, call_id=state.call_id, func_key=state.func_key, store_url=self.store.url,
            attempt=attempt, timeout=cfg.timeout, items_key=state.items_key,
            inline_result_limit=cfg.inline_limit, extra_env=cfg.extra_env, runtime=_RUNTIME,
            first_index=state.first_index, retry_on=job.retry_on_names,
            # retry_on re-runs share the retries left (speculative copies and 429s use none).
            max_attempts=attempt + max(0, cfg.retries - state.charged), output=cfg.output,
            echo_output=cfg.output == "live" or cfg.backend not in _BACKENDS_ON_THIS_TERMINAL,
            memory=memory,
            job_record=keys.job_index_key(job.id, job.created),
        )
        body = encode(req, payload)
        lifetime = getattr(self.backend, "signature_lifetime", None)
        signature = signing.sign_request(self.secret, signing.ROUTE_CALL, job.id, state.call_id, attempt, body,
                                         lifetime=lifetime)
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
            outcomes = loads(compression.unpack(signing.unseal(self.secret, key, data)))
        except signing.UnauthenticatedObject as e:  # planted or altered: no retry reads it better
            return PlatformFault("rejected", f"cannot read the result: {e}")
        except Exception as e:
            return PlatformFault("server", f"cannot read the result: {e!r}")
        if resp.error_kind == FaultKind.RETRY_ON:  # a user exception the caller asked to retry
            return PlatformFault("retry_on", "the item raised an exception listed in retry_on")
        return Outcomes(outcomes, resp.stats)

    # -- decisions (under the lock) ------------------------------------------------

    def _begin(self, job, state) -> int | None:
        """Claim an attempt of ``state``: its number, or None when the call must not run again.

        A first attempt claims the call under the lock that :meth:`cancel` takes too, so a call is
        either started or cancelled, never both (``shutdown(cancel_futures=True)`` cancels pending
        futures only, as the standard library's executors do).  A later attempt (a retry, a copy)
        of an abandoned job ends the call instead, unless another attempt is still out to decide.
        """
        first = False
        abandoned_fault = None
        with self.lock:
            if state.done:
                return None
            if state.next_attempt == 1:
                if state.claimed:
                    return None
                state.claimed = first = True
                if job.cancelled:  # cancelled before any thread took it
                    first = None
            elif job.abandoned:
                if state.in_flight == 0:
                    abandoned_fault = PlatformFault("cancelled", "the job was abandoned before this call could be "
                                                    "retried")
                else:
                    return None
            if first is not None and abandoned_fault is None:
                attempt = state.next_attempt
                state.next_attempt += 1
                now = time.time()
                steps = job.config.memory_steps
                state.attempts.append([attempt, now, None, None, steps[state.memory_step] if steps else None])
                state.sent_at = now
                state.in_flight += 1
                if attempt > 1:
                    job.retry_count += 1
                    if job.progress is not None:
                        job.progress.retrying(state.call_id)
        if abandoned_fault is not None:
            self._decide(job, state, state.next_attempt - 1, abandoned_fault, final=True)
            return None
        if first is None:
            self._cancel_unstarted(job, state)
            return None
        if first:
            try:
                running = state.future.set_running_or_notify_cancel()
            except RuntimeError:  # notified already (by its owner): treat as cancelled
                running = False
            if not running:  # the caller cancelled this future itself
                with self.lock:
                    _end_attempt(state, attempt, "cancelled")
                self._cancelled_before_start(job, state)
                return None
        return attempt

    def _decide(self, job, state, attempt: int, event, charge: bool | None = None, final: bool = False) -> None:
        """Apply one attempt's event (:class:`Outcomes`, ``ACCEPTED`` or a fault) to its call."""
        if event is ACCEPTED:
            with self.lock:
                if state.awaiting is None:
                    state.awaiting = {}
                state.awaiting[attempt] = time.time()
            return
        if isinstance(event, Outcomes):
            self._finish(job, state, attempt, event)
            return
        fault: PlatformFault = event
        if fault.kind == FaultKind.RETRY_ON:
            charge = True
        elif charge is None:
            charge = policy.charges_retry(fault.kind, self._throttle.at_floor)
        with self.lock:
            _end_attempt(state, attempt, fault.kind)
            if state.done:
                return
            climbed = fault.kind == FaultKind.OUT_OF_MEMORY and self._climb_memory(job, state, attempt)
            if charge and not climbed:
                state.charged += 1
            if state.in_flight > 0 and not final:  # another copy is out: it decides
                return
            retry = not final and not job.abandoned and (
                fault.kind == FaultKind.RETRY_ON or climbed
                or policy.retry_fault(fault.retryable, state.charged, job.config.retries))
            if not retry:
                if (state.call_id, attempt) in job.stopped_attempts:  # stopped by cancel(): not its own fault
                    fault = PlatformFault(FaultKind.CANCELLED, "the job was abandoned while this call ran, "
                                          f"and its attempt was stopped ({fault.message})")
                elif fault.kind == FaultKind.OUT_OF_MEMORY:
                    fault = PlatformFault(fault.kind, policy.out_of_memory_message(
                        job.config.memory_steps, state.memory_step, fault.message))
                self._fail_locked(job, state, fault)
                after = (state.n_items, *self._settle(job, state))
        if retry:
            if fault.retry_after is not None:
                delay = fault.retry_after
            else:
                delay = policy.backoff_delay(max(1, state.charged if charge else len(state.attempts)))
            self._after(delay, self._retry, job, state)
            return
        self._deliver(job, state, *after)

    def _climb_memory(self, job, state, attempt: int) -> bool:
        """Under the lock: an attempt was killed for memory; the next runs one ``memory`` step up
        (True), unless the call is at the top already (False: it fails).  A copy killed at a
        lower step than the call has reached meanwhile needs no new climb."""
        steps = job.config.memory_steps
        if _attempt_memory(state, attempt) != (steps[state.memory_step] if steps else None):
            return True
        step = policy.next_memory_step(steps, state.memory_step)
        if step is None:
            return False
        state.memory_step = step
        return True

    def _finish(self, job, state, attempt: int, answer: Outcomes) -> None:
        with self.lock:  # one lock section per call: dispatch threads share this lock (issue 9)
            if state.done:  # a later copy: the first outcome stands
                job.duplicate_count += 1
                return
            state.done = True
            state.stats = stats = answer.stats
            if stats and "started" in stats and "finished" in stats:
                job.durations.append(stats["finished"] - stats["started"])
            job.done_count += 1
            failed = len(answer.outcomes) - [outcome[0] for outcome in answer.outcomes].count("ok")
            job.failed_count += failed
            if failed:
                job.call_errors[state.call_id] = call_error(answer.outcomes)
            _end_attempt(state, attempt, "ok" if not failed else "error")
            state.payload = None
            state.result = answer.outcomes
            after = (failed, *self._settle(job, state))
        self._deliver(job, state, *after)

    def _fail_locked(self, job, state, fault: PlatformFault) -> None:
        state.done = True
        job.done_count += 1
        job.failed_count += state.n_items
        job.call_errors[state.call_id] = (str(fault.kind), fault.message)
        state.payload = None
        state.result = fault

    def _deliver(self, job, state, failed: int, write: bool, all_done: bool, others: list[int]) -> None:
        """After a call's outcome is final (outside the lock; ``failed`` of its items failed, the
        rest is what :meth:`_settle` found): complete its future, update the progress and the
        record, stop copies still out.  An automatically chunked job's next calls are made first
        (see :mod:`fnmap.feed`): readers of ``job.calls`` then never reach its end early."""
        if job.feed is not None:
            job.feed.call_done(state)
        if write:  # before the last result is out: a returned map has its record
            job.save_record(final=True)
        job.deliver(state, failed)
        if all_done:
            job.all_done()
        if others:
            self._stop_copies(job, state, others)

    def _settle(self, job, state=None) -> tuple[bool, bool, list[int]]:
        """Under the lock, after a call is done: (write the final record now, every call is done,
        the attempts of ``state`` still out)."""
        all_done = job.sealed and job.done_count == len(job.calls)
        write = all_done and not job._record_saved
        if write:
            job._record_saved = True
            job.finished = job.finished or time.time()
        others = [record[0] for record in state.attempts if record[2] is None] if state is not None else []
        return write, all_done, others

    def _cancel_unstarted(self, job, state) -> None:
        """Cancel the future of a call no thread started, and notify its waiters as an executor's
        worker would on pickup (``concurrent.futures.wait`` sees it then)."""
        if state.future.cancel():
            try:
                state.future.set_running_or_notify_cancel()
            except RuntimeError:  # notified already
                pass
        self._cancelled_before_start(job, state)

    def _cancelled_before_start(self, job, state) -> None:
        with self.lock:
            newly_done = not state.done
            if newly_done:
                state.done = True
                job.done_count += 1
                state.payload = None
            write, all_done, _ = self._settle(job)
        if write:
            job.save_record(final=True)
        if newly_done and job.completed is not None:
            job.completed.put(state)
        if all_done:
            job.all_done()

    def _retry(self, job, state) -> None:
        if not state.done:
            self._queue(self._send, job, state)

    def _stop_copies(self, job, state, attempts: list[int]) -> None:
        """A call's outcome is final while ``attempts`` of it are still out (speculative copies, an
        attempt declared lost): have the backend stop them where it can (the emulator kills their
        worker processes, Batch terminates their containers).  Best effort: a copy that is not
        stopped costs only its own run, and its late result is discarded as a duplicate."""
        try:
            self.backend.stop_attempts(job.id, [(state.call_id, a) for a in attempts], self.secret)
        except Exception:  # see above
            pass

    # -- the throttle ----------------------------------------------------------------

    def _acquire_slot(self) -> tuple[int, bool]:
        """Wait for room under the throttle; return the send's ticket and whether the limit is at
        its floor.

        Every send is one entry in ``_in_flight`` (``list.append``/``pop`` are atomic), so the count
        in flight is always exact.  While no 429 has lowered the limit, the dispatch threads
        themselves bound the calls in flight (one each, ``max_workers`` of them) and a send takes
        no lock: a lock shared by every dispatch thread on every call made them queue behind each
        other and tripled the client's CPU per call (issue 9).
        """
        throttle = self._throttle
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
        throttle = self._throttle
        if not throttled and throttle.limit >= throttle.ceiling:
            return  # unthrottled: nothing to update, nobody is waiting for room
        with self._room:
            if throttled:
                throttle.on_throttled(ticket)
            else:
                throttle.on_success()
            self._room.notify_all()

    # -- the monitor: timers, asynchronous results, lost calls, stragglers ----------------

    def _after(self, delay: float, action, job, states) -> None:
        """Run ``action(job, states)`` on the monitor thread in ``delay`` seconds (a retry's backoff)."""
        with self._wake:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), action, job, states))
            self._active.add(job)
            self._wake.notify()
        self._ensure_monitor()

    def _ensure_monitor(self) -> None:
        with self._wake:
            if self._monitor is None or not self._monitor.is_alive():
                self._monitor = threading.Thread(target=self._monitor_loop, name="fnmap-monitor", daemon=True)
                self._monitor.start()

    def _monitor_loop(self) -> None:
        period = POLL_SECONDS[0]
        next_poll = time.monotonic() + period
        while not self.closed:
            with self._wake:
                self._active = {job for job in self._active if not job.done}
                if not self._active and not self._timers:
                    self._monitor = None
                    return
                jobs = list(self._active)
                due = []
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    due.append(heapq.heappop(self._timers))
            for _, _, action, job, states in due:
                action(job, states)
            if now >= next_poll:
                self._poll_all(jobs)
                period = min(POLL_SECONDS[1], period * 1.5)
                next_poll = time.monotonic() + period
            with self._wake:
                wait = next_poll - time.monotonic()
                if self._timers:
                    wait = min(wait, self._timers[0][0] - time.monotonic())
                if wait > 0:
                    self._wake.wait(wait)

    def _poll_all(self, jobs: list) -> None:
        for job in jobs:
            if job.done:
                continue
            try:
                self._poll(job)
            except Exception:  # storage hiccup: the next poll tries again
                pass
            self._speculate(job)
            if self.on_poll is not None:
                self.on_poll(job)
        try:
            self._platform_failures(jobs)
        except Exception:  # the platform's status API hiccupped: the next poll asks again
            pass

    def _poll(self, job) -> None:
        """Results of this job's calls accepted asynchronously (one LIST), and lost calls."""
        waiting = [s for s in job.calls if s.awaiting and not s.done]  # a glance; decided under the lock below
        if not waiting:
            return
        finished = {keys.call_id_from_key(k) for k in self.store.list(keys.results_prefix(job.id))}
        now = time.time()
        lost_after = job.config.timeout + LOST_GRACE_SECONDS if job.config.timeout else self.backend.lost_after
        if self.backend.watches_calls:  # the platform reports failed calls itself (poll_failures)
            lost_after = self.backend.lost_after
        done = [state for state in waiting if state.call_id in finished]
        for state, outcomes in zip(done, self._fetch_results(job, done), strict=True):
            with self.lock:
                attempt = max(state.awaiting) if state.awaiting else state.next_attempt - 1
                state.awaiting = None
            self._finish(job, state, attempt, Outcomes(outcomes, None))
        if lost_after is None:
            return
        for state in waiting:
            if state.call_id in finished:
                continue
            lost = []
            with self.lock:
                for attempt, since in list((state.awaiting or {}).items()):
                    if now - since > lost_after:
                        del state.awaiting[attempt]
                        lost.append(attempt)
            for attempt in lost:
                self._decide(job, state, attempt,
                             PlatformFault("lost", f"no result {lost_after:.0f} s after it was accepted"))

    def _fetch_results(self, job, states: list):
        """The stored outcomes of these calls, read in parallel: one GET each, ``FETCH_THREADS`` at a
        time (a poll that finds 1,000 results waited for 1,000 round trips one after another)."""
        def fetch(state):
            key = keys.result_key(job.id, state.call_id)
            return loads(compression.unpack(signing.unseal(self.secret, key, self.store.get(key))))

        if len(states) < 2:
            return [fetch(state) for state in states]
        return self._fetchers.map(fetch, states)

    def _platform_failures(self, jobs: list) -> None:
        """Route the calls the platform reports as failed to :meth:`_decide` (retry or fail)."""
        by_id = {job.id: job for job in jobs}
        for failure in self.backend.poll_failures():
            job = by_id.get(failure.job_id)
            if job is None or not 0 <= failure.call_id < len(job.calls):
                continue
            state = job.calls[failure.call_id]
            with self.lock:
                if state.done or not state.awaiting or failure.attempt not in state.awaiting:
                    continue
                del state.awaiting[failure.attempt]
            self._decide(job, state, failure.attempt, failure.fault)

    def _speculate(self, job) -> None:
        """Speculative copies of stragglers once most of the job's calls are done.  A job still
        open speculates only if its front-end asks (``job.speculate_open``: a Dask graph, whose
        frontier waiting on a few slow tasks is when a copy helps most, issue 4); an Executor's
        ``submit`` calls do not get copies before ``shutdown``, as with the standard executors."""
        if not job.config.speculation or job.abandoned or not (job.sealed or job.speculate_open):
            return
        items = None
        with self.lock:
            running = {s.call_id: s.sent_at for s in job.calls if not s.done and s.in_flight and not s.speculated}
            durations = list(job.durations)
            done, total = job.done_count, len(job.calls)
            if job.feed is not None and running:  # chunks of different sizes: compare seconds per item
                durations = [(s.stats["finished"] - s.stats["started"]) / s.n_items for s in job.calls
                             if s.stats and "started" in s.stats and "finished" in s.stats]
                items = {call_id: job.calls[call_id].n_items for call_id in running}
        for call_id in policy.stragglers(running, durations, done, total, time.time(), items=items):
            state = job.calls[call_id]
            state.speculated = True
            self._queue(self._send, job, state)

    def close(self) -> None:
        self.closed = True
        self._fetchers.shutdown(wait=False)
        for _ in self._threads:
            self._sends.put(None)
        with self._wake:
            self._wake.notify()


def _attempt_memory(state, attempt: int) -> int | None:
    """The memory (MB) attempt ``attempt`` of ``state`` was sent with (None: the platform's own)."""
    for record in state.attempts:
        if record[0] == attempt:
            return record[4]
    return None


def _end_attempt(state, attempt: int, outcome: str) -> None:
    """Under the lock: the attempt ``attempt`` of ``state`` ended with ``outcome``."""
    for record in state.attempts:
        if record[0] == attempt and record[2] is None:
            record[2], record[3] = time.time(), str(outcome)
            state.in_flight -= 1
            return

