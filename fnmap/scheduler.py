"""The scheduler: the one owner of every call's life, from its first send to its decision.

A job is a list of calls (:class:`fnmap.run.CallRun`, one chunk of items each) in its run state
(:class:`fnmap.run.JobRun`).  The scheduler alone writes that state, under its lock; the user's
:class:`fnmap.jobs.Job` and the job record read it.  Front-ends (``fnmap.map``, the ``Executor``,
the Dask shim, ``map_reduce``) add calls, :meth:`Scheduler.submit` them and :meth:`Scheduler.seal`
the job when no more will come; everything after that happens here.

The algorithm, in the manner of ``dask.local``:

1. **Send** (:class:`fnmap.dispatch.Dispatch`, which the scheduler builds and hands ``_begin``,
   ``_decide`` and the monitor's timer).  A dispatch thread takes a call from the queue and asks
   :meth:`_begin` for the number of its next attempt.  ``_begin`` is where a call is claimed or
   found cancelled, abandoned or already decided (by another copy); it records the attempt as sent
   (a *copy* when another attempt is still out, a *retry* when the ones before failed).  The thread
   then signs the request, waits for room under the throttle, and hands the invocation to the
   backend.  That is all a dispatch thread does: it never decides anything.
2. **Answer.**  The backend's :class:`~fnmap.backends.base.Answer` or its
   :class:`~fnmap.errors.PlatformFault` is turned into an event (the call's outcomes, ``ACCEPTED``,
   a fault) outside any lock, and :meth:`_decide` applies it under the scheduler's lock.
3. **Decide.**  Outcomes finish the call, unless another copy finished it first (then they are a
   duplicate and dropped).  A fault is retried if its kind is retryable and the call has retries
   left (:func:`fnmap.policy.retry_fault`; a 429 is not charged while the throttle can still slow
   down), else the call fails for good; a call whose worker crashed the same way twice fails
   then (:func:`fnmap.policy.deterministic_crash`); while another copy of the call is still out,
   that copy decides.  A retry is not a sleeping thread: it goes on the monitor's timer heap with
   its backoff delay, and is sent when it is due.  Once a call is decided, its attempts still out end
   as ``superseded`` and the platform is asked to stop them.
4. **Monitor** (:class:`fnmap.monitor.Monitor`, handed the lock, ``_decide``, ``_speculate`` and the
   client's ``on_poll`` hook).  One thread per client wakes for due timers and polls for
   asynchronous results, lost calls, the platform's failure reports and stragglers.

The scheduler, its dispatch and its monitor are three objects: the two parts know the scheduler
only through what it handed their constructors, as CPython's ``ProcessPoolExecutor`` hands its
``_ExecutorManagerThread`` the queues and the pending work.  Only :meth:`_begin`, :meth:`_decide`,
:meth:`cancel`, :meth:`_speculate` and the monitor's bookkeeping take the lock, and they hold it
for plain data changes only: futures are completed, records written and copies stopped after it
is released (``_deliver``).  Every rule about a call (attempts, retries, the
throttle, speculation, cancellation) can be tested by feeding answers synchronously
(``tests/test_scheduler.py``).
"""

from __future__ import annotations

import time

from . import policy
from .dispatch import ACCEPTED, COALESCE_MAX_SECONDS, COALESCE_SECONDS, Dispatch, Outcomes
from .errors import FaultKind, PlatformFault
from .locks import YieldingLock
from .monitor import FETCH_THREADS, LOST_GRACE_SECONDS, POLL_SECONDS, Monitor
from .run import Attempt, CallRun, JobRun
from .runtime import outcome
from .runtime.call_error import call_error

__all__ = ["ACCEPTED", "COALESCE_MAX_SECONDS", "COALESCE_SECONDS", "FETCH_THREADS", "LOST_GRACE_SECONDS",
           "POLL_SECONDS", "Outcomes", "Scheduler"]

# What ``_claim`` found: send this attempt, send the call's first, or nothing (and why).  The cost
# cap refused the attempt: ``_CAPPED_FAILS`` none of the call is out (it fails with the cap),
# ``_CAPPED_OUT`` an attempt of it is out (that one decides the call).
_SEND, _FIRST, _SKIP, _CANCELLED, _ABANDONED, _CAPPED_FAILS, _CAPPED_OUT = range(7)


def _cap_fault() -> PlatformFault:
    """The fault of a call not sent because its job reached its ``max_cost``."""
    return PlatformFault(FaultKind.CANCELLED, "not sent: the job reached its cost cap (max_cost)")


class Scheduler:
    """Sends, retries and settles the calls of every job of one client (backend + storage + secret).

    ``on_poll(job)`` is called from the monitor for each running job every ``on_poll_seconds`` at
    most (the client's look for ``fnmap cancel`` requests)."""

    def __init__(self, backend, store, secret: bytes, *, on_poll=None, on_poll_seconds: float = 1.0):
        self.backend = backend
        self.store = store
        self.secret = secret
        #: The lock every decision about a call is made under (and only those).
        self.lock = YieldingLock()
        self.closed = False
        self.monitor = Monitor(backend, store, secret, self.lock, decide=self._decide, speculate=self._speculate,
                               on_poll=on_poll, on_poll_seconds=on_poll_seconds)
        self.dispatch = Dispatch(backend, store, secret, begin=self._begin, decide=self._decide,
                                 after=self.monitor.after)

    # -- the front door: jobs and their calls ------------------------------------

    @staticmethod
    def new_run(speculate_open: bool = False, stream: bool = False, budget=None) -> JobRun:
        """The run state of a new job (``stream``: it hands each call on as it is done, for ``imap``;
        ``budget``: its :class:`fnmap.cost.budget.Budget` when it runs with ``max_cost``)."""
        run = JobRun(speculate_open=speculate_open, stream=stream)
        run.budget = budget
        return run

    def add(self, job, state: CallRun) -> None:
        """Register a call of ``job`` (not sent until :meth:`submit`)."""
        run = job.run
        with self.lock:
            run.calls.append(state)
            run.all_done.clear()
        self.monitor.watch(job)

    def input_stored(self, state: CallRun, items_key: str) -> None:
        """The call's input is in storage under ``items_key`` (its signed request names it)."""
        state.items_key = items_key

    def use_feed(self, job, feed) -> None:
        """``feed`` (a :class:`fnmap.feed.ChunkFeed`) makes the calls of ``job`` as it runs."""
        job.run.feed = feed

    def show_progress(self, job, progress) -> None:
        """``progress`` (a bar, or None) shows the job's calls as they are done."""
        job.run.progress = progress

    def submit(self, job, states: list) -> None:
        """Send these calls of ``job`` (see :meth:`fnmap.dispatch.Dispatch.submit`); those the
        result cache answered (``state.cached``) are decided here, never sent."""
        hits = [state for state in states if state.cached is not None]
        if hits:
            states = [state for state in states if state.cached is None]
            for state in hits:
                self._answered_by_cache(job, state)
        if states:
            self.dispatch.submit(job, states)

    def _answered_by_cache(self, job, state) -> None:
        """A call whose items all came from the result cache: done with no attempt (nothing billed,
        nothing reserved under ``max_cost``), its values delivered as any call's."""
        with self.lock:
            if state.done:
                return
            state.done = state.claimed = True
            job.run.done_count += 1
            after = (0, *self._settle(job, state))
        self._deliver(job, state, *after)

    def seal(self, job) -> None:
        """No more calls will be added to ``job``: it is done when every call is."""
        run = job.run
        with self.lock:
            run.sealed = True
            if run.progress is not None and run.progress.calls is None:
                run.progress.calls = len(run.calls)
            write, all_done, _ = self._settle(job)
        if write:
            job.save_record(final=True)
        elif not all_done:
            job.save_record(final=False)  # a "running" index entry, so `fnmap jobs` shows the job
        if all_done:
            self._all_done(job)

    def setup_failed(self, job, error: str) -> None:
        """The job could not be set up (``error``: why; a function or an item that does not pickle,
        storage refusing its inputs): nothing runs, the job is sealed, its record says why."""
        with self.lock:
            job.run.setup_error = error
        self.cancel(job)
        self.seal(job)

    def cancel(self, job, stop_platform: bool = False, reason: str | None = None, capped: bool = False) -> None:
        """Stop starting ``job``'s calls: those no dispatch thread took yet are cancelled; those
        already running go on and end with their own results (retried after platform faults).

        ``stop_platform``: nobody wants the results any more (a map raised its first failure, or
        was interrupted): the job is *abandoned*, so no more retries or copies, and the backend
        stops what it still runs where it can (Batch array jobs are terminated, the emulator's
        attempts in flight are stopped: joblib's next run would wait behind them).
        ``reason``: who asked from outside (``fnmap cancel``), for the calls' errors.
        ``capped``: the job reached its ``max_cost`` (:meth:`_reach_cap`): the calls not sent fail
        with the cap's error, not as cancelled futures.
        """
        run = job.run
        if run.feed is not None:  # items in no call yet become one unstarted call, cancelled below
            run.feed.stop()
        with self.lock:
            run.cancelled = True
            run.cancel_reason = reason or run.cancel_reason
            run.abandoned = run.abandoned or stop_platform
            unstarted = [s for s in run.calls if not s.claimed and not s.done]
            for state in unstarted:
                state.claimed = True
            running = [(s.call_id, a) for s in run.calls if not s.done
                       for a in s.open_attempts()] if stop_platform else []
            run.stopped_attempts.update(running)
            if capped:
                run.budget.in_flight = len(running)
            capped = run.budget is not None and run.budget.reached
            if run.abandoned and run.budget is not None:  # retries waiting for room: none will come
                unstarted += [s for s in run.budget.release_all() if s.next_attempt > s.first_attempt and not s.done
                              and not s.in_flight]
        for state in unstarted:
            if capped:
                self._decide(job, state, 0, _cap_fault(), final=True)
            elif state.next_attempt > state.first_attempt:  # a retry that waited under the cap: the job was abandoned
                self._decide(job, state, state.next_attempt - 1, PlatformFault(
                    "cancelled", "the job was abandoned before this call could be retried"), final=True)
            else:
                self._cancel_unstarted(job, state)
        run.wake.set()
        if stop_platform and not job.done:
            self._stop_platform(job, running)

    def _stop_platform(self, job, running: list) -> None:
        try:
            self.backend.cancel(job.id)
            if running:  # the emulator kills their worker processes: the next job finds them free
                self.backend.stop_attempts(job.id, running, self.secret)
        except Exception as e:  # the caller is already handling an error; say, do not mask it
            import warnings

            warnings.warn(f"fnmap: could not stop the platform's work for job {job.id}: {e}",
                          RuntimeWarning, stacklevel=4)

    def fail(self, job, state, fault: PlatformFault) -> None:
        """Fail a call of ``job`` that was never sent with ``fault`` (its items' inputs could not be stored)."""
        self._decide(job, state, 0, fault, final=True)

    # -- decisions (under the lock) ------------------------------------------------

    def _begin(self, job, state) -> int | None:
        """Claim an attempt of ``state``: its number, or None when the call must not run again.

        A first attempt claims the call under the lock that :meth:`cancel` takes too, so a call is
        either started or cancelled, never both (``shutdown(cancel_futures=True)`` cancels pending
        futures only, as the standard library's executors do).  A later attempt (a retry, a copy)
        of an abandoned job ends the call instead, unless another attempt is still out to decide.
        """
        with self.lock:
            found, attempt = self._claim(job, state)
        if found == _SEND:
            return attempt
        if found == _FIRST:
            return self._start_first(job, state, attempt)
        if found == _ABANDONED:
            fault = PlatformFault("cancelled", "the job was abandoned before this call could be retried")
            self._decide(job, state, state.next_attempt - 1, fault, final=True)
        elif found == _CANCELLED:
            self._cancel_unstarted(job, state)
        elif found in (_CAPPED_FAILS, _CAPPED_OUT):
            if found == _CAPPED_FAILS:
                self._decide(job, state, 0, _cap_fault(), final=True)
            self._reach_cap(job)
        return None

    def _reach_cap(self, job) -> None:
        """The job's budget refused an attempt: send nothing more, fail the calls not sent with
        the cap's error, stop what the platform runs (the emulator's workers, Batch's jobs; Lambda
        cannot stop an invocation: those bill until they end).  Once per job."""
        run = job.run
        with self.lock:
            first, run.budget.stopped = not run.budget.stopped, True
        if first:
            self.cancel(job, stop_platform=True, capped=True)
            job.save_ended_record()  # read now, from any process, it is capped (its last calls settle later)

    def _claim(self, job, state) -> tuple[int, int]:
        """Under the lock: what :meth:`_begin` found, and the attempt it recorded as sent."""
        if state.done:
            return _SKIP, 0
        run = job.run
        first = state.next_attempt == state.first_attempt
        if first:
            if state.claimed:
                return _SKIP, 0
            state.claimed = True
            if run.budget is not None and run.budget.reached:
                return _CAPPED_FAILS, 0
            if run.cancelled:  # cancelled before any thread took it
                return _CANCELLED, 0
        elif run.abandoned:
            return (_ABANDONED if state.in_flight == 0 else _SKIP), 0
        reserved = None
        if run.budget is not None:
            from .cost.budget import WAIT  # loaded with the budget of a capped job (max_cost)

            steps = job.config.memory_steps
            reserved = run.budget.admit(steps[state.memory_step] if steps else None)
            if reserved == WAIT:  # the first wave is out: sent again when its first attempt is priced
                if first:  # unclaimed again: cancel() may still take it
                    state.claimed = False
                run.budget.wait(state)
                return _SKIP, 0
            if reserved is None:  # the cap: this call fails with it unless an attempt of it is out
                return (_CAPPED_FAILS if state.in_flight == 0 else _CAPPED_OUT), 0
        attempt = self._new_attempt(job, state)
        state.attempts[-1].reserved = reserved
        return (_FIRST if first else _SEND), attempt

    def _new_attempt(self, job, state) -> int:
        """Under the lock: record the next attempt of ``state`` as sent; a copy if another is out."""
        run = job.run
        attempt = state.next_attempt
        state.next_attempt += 1
        now = time.time()
        steps = job.config.memory_steps
        copy = state.in_flight > 0
        state.attempts.append(Attempt(attempt, now, steps[state.memory_step] if steps else None, copy))
        state.sent_at = now
        state.in_flight += 1
        if attempt > 1:
            if copy:
                run.copy_count += 1
            else:
                run.retry_count += 1
            if run.progress is not None:
                run.progress.retrying(state.call_id)
        return attempt

    def _start_first(self, job, state, attempt: int) -> int | None:
        """Mark the future of a call's first attempt running, unless its caller cancelled it."""
        try:
            running = state.future.set_running_or_notify_cancel()
        except RuntimeError:  # notified already (by its owner): treat as cancelled
            running = False
        if running:
            return attempt
        with self.lock:  # the caller cancelled this future itself
            state.end_attempt(attempt, "cancelled")
            self._bill(job, state, attempt, never_sent=True)
        self._cancelled_before_start(job, state)
        return None

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
            charge = policy.charges_retry(fault.kind, self.dispatch.throttle.at_floor)
        with self.lock:
            retry = self._judge(job, state, attempt, fault, charge, final)
            if retry is False:
                self._fail_locked(job, state, self._final_fault(job, state, attempt, fault))
                after = (state.n_items, *self._settle(job, state))
        if retry is None:
            return
        if retry:
            if fault.retry_after is not None:
                delay = fault.retry_after
            else:
                delay = policy.backoff_delay(max(1, state.charged if charge else len(state.attempts)))
            self.monitor.after(delay, self._retry, job, state)
            return
        self._deliver(job, state, *after)

    def _judge(self, job, state, attempt: int, fault: PlatformFault, charge: bool, final: bool) -> bool | None:
        """Under the lock: end the attempt and say whether the call is retried (True), fails
        (False), or nothing is decided now (None: decided already, or another copy is out)."""
        state.end_attempt(attempt, fault.kind)
        self._bill(job, state, attempt)
        if state.done:
            return None
        climbed = fault.kind == FaultKind.OUT_OF_MEMORY and self._climb_memory(job, state, attempt)
        if charge and not climbed:
            state.charged += 1
        if fault.kind == FaultKind.CRASHED:
            state.crash_exits.append(policy.crash_exit(fault.message))
        if state.in_flight > 0 and not final:  # another copy is out: it decides
            return None
        retryable = fault.retryable and not (fault.kind == FaultKind.CRASHED
                                             and policy.deterministic_crash(state.crash_exits))
        # A platform's stop this client did not ask for (its own end superseded or abandoned above):
        # another run of the job (a killed client) stopped an attempt of this number; a fresh one
        # takes the call's committed result, or runs it.
        return not final and not job.run.abandoned and (
            fault.kind in (FaultKind.RETRY_ON, FaultKind.CANCELLED) or climbed
            or policy.retry_fault(retryable, state.charged, job.config.retries))

    @staticmethod
    def _final_fault(job, state, attempt: int, fault: PlatformFault) -> PlatformFault:
        """The fault a call fails with: a stopped attempt's is the job's cancellation, an out of
        memory one says which steps were tried."""
        if (state.call_id, attempt) in job.run.stopped_attempts:  # stopped by cancel(): not its own fault
            return PlatformFault(FaultKind.CANCELLED, "the job was abandoned while this call ran, "
                                 f"and its attempt was stopped ({fault.message})")
        if fault.kind == FaultKind.OUT_OF_MEMORY:
            return PlatformFault(fault.kind, policy.out_of_memory_message(
                job.config.memory_steps, state.memory_step, fault.message))
        crashed_twice = fault.kind == FaultKind.CRASHED and policy.deterministic_crash(state.crash_exits)
        if crashed_twice:
            return PlatformFault(fault.kind, policy.deterministic_crash_message(crashed_twice, fault.message))
        return fault

    def _climb_memory(self, job, state, attempt: int) -> bool:
        """Under the lock: an attempt was killed for memory; the next runs one ``memory`` step up
        (True), unless the call is at the top already (False: it fails).  A copy killed at a
        lower step than the call has reached meanwhile needs no new climb."""
        steps = job.config.memory_steps
        if state.attempt_memory(attempt) != (steps[state.memory_step] if steps else None):
            return True
        step = policy.next_memory_step(steps, state.memory_step)
        if step is None:
            return False
        state.memory_step = step
        return True

    def _finish(self, job, state, attempt: int, answer: Outcomes) -> None:
        run = job.run
        with self.lock:  # one lock section per call: dispatch threads share this lock
            if state.done:  # a later copy: the first result stands (billed as it was superseded)
                run.duplicate_count += 1
                return
            state.done = True
            state.stats = stats = answer.stats
            if stats and "started" in stats and "finished" in stats:
                run.durations.append(stats["finished"] - stats["started"])
            run.done_count += 1
            failed = outcome.count_failed(answer.outcomes)
            run.failed_count += failed
            if failed:
                run.call_errors[state.call_id] = call_error(answer.outcomes)
            state.end_attempt(attempt, "ok" if not failed else "error")
            self._bill(job, state, attempt, stats)
            state.payload = None
            state.result = answer.outcomes
            after = (failed, *self._settle(job, state))
        self._deliver(job, state, *after)

    @staticmethod
    def _fail_locked(job, state, fault: PlatformFault) -> None:
        run = job.run
        state.done = True
        run.done_count += 1
        if fault.kind == FaultKind.CANCELLED:  # stopped, not failed: counted as cancelled
            state.cancelled = True
            run.cancelled_count += 1
        else:
            run.failed_count += state.n_items
        run.call_errors[state.call_id] = (str(fault.kind), fault.message)
        state.payload = None
        state.result = fault

    def _deliver(self, job, state, failed: int, write: bool, all_done: bool, others: list[int]) -> None:
        """After a call is decided (outside the lock; ``failed`` of its items failed, the
        rest is what :meth:`_settle` found): complete its future, update the progress and the
        record, stop copies still out.  An automatically chunked job's next calls are made first
        (see :mod:`fnmap.feed`): readers of ``job.run.calls`` then never reach its end early."""
        run = job.run
        if run.feed is not None:
            run.feed.call_done(state)
        if write:  # before the last result is out: a returned map has its record
            job.save_record(final=True)
        result, state.result = state.result, None
        job.deliver(state, result, failed)
        if failed:
            run.wake.set()
        if all_done:
            self._all_done(job)
        if others:
            self._stop_copies(job, state, others)

    def _settle(self, job, state=None) -> tuple[bool, bool, list[int]]:
        """Under the lock, after a call is done: (write the final record now, every call is done,
        the attempts of ``state`` still out, which end as superseded)."""
        run = job.run
        all_done = run.sealed and run.done_count == len(run.calls)
        write = all_done and not run.record_saved
        if write:
            run.record_saved = True
            run.finished = run.finished or time.time()
        others = state.end_open_attempts() if state is not None and state.in_flight else []
        for attempt in others:
            self._bill(job, state, attempt)
        return write, all_done, others

    def _bill(self, job, state, number: int, stats: dict | None = None, never_sent: bool = False) -> None:
        """Under the lock, as attempt ``number`` of ``state`` ends: price it into the job's budget
        (``max_cost``).  The worker's own time and cold start when it reported (``stats``), else the
        client's view, sent until now (an upper bound); nothing for an attempt never sent."""
        budget = job.run.budget
        record = state.attempt(number) if budget is not None else None
        if record is None or record.reserved is None:
            return
        reserved, record.reserved = record.reserved, None
        if never_sent:
            budget.settle(reserved, 0.0)
        else:
            budget.charge(reserved, record, stats, stored_input=bool(state.items_key))
        if budget.waiting:
            released = budget.release()
            if released:
                self.monitor.after(0.0, self._resend, job, released)

    def _resend(self, job, states: list) -> None:
        """Send calls that waited for the first wave of a capped job (:data:`fnmap.cost.budget.FIRST_WAVE`),
        together where the backend batches calls (one array job, not one per call)."""
        states = [state for state in states if not state.done]
        if states:
            self.dispatch.submit(job, states)

    def _all_done(self, job) -> None:
        """Every call is done and no more will come: close the bar, then wake the waiters."""
        run = job.run
        if run.all_done.is_set():
            return
        run.finished = run.finished or time.time()  # set already if the record was written
        if job.cache is not None:  # its results' cache entries are written before anyone sees it done
            job.cache.flush()
        if run.progress is not None:  # before the waiters wake: the bar's last draw precedes their next line
            run.progress.close()
        run.all_done.set()
        run.wake.set()

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
        run = job.run
        with self.lock:
            newly_done = not state.done
            if newly_done:
                state.done = state.cancelled = True
                run.done_count += 1
                run.cancelled_count += 1
                state.payload = None
            write, all_done, _ = self._settle(job)
        if write:
            job.save_record(final=True)
        if newly_done and run.completed is not None:
            run.completed.put(state)
        if all_done:
            self._all_done(job)

    def _retry(self, job, state) -> None:
        if not state.done:
            self.dispatch.send(job, state)

    def _speculate(self, job) -> None:
        """Speculative copies of stragglers once most of the job's calls are done.  A job still
        open speculates only if its front-end asks (``speculate_open``: a Dask graph, whose
        frontier waiting on a few slow tasks is when a copy helps most); an Executor's
        ``submit`` calls do not get copies before ``shutdown``, as with the standard executors."""
        run = job.run
        if not job.config.speculation or run.abandoned or not (run.sealed or run.speculate_open):
            return
        items = None
        with self.lock:
            calls = run.calls
            running = {s.call_id: s.sent_at for s in calls if not s.done and s.in_flight and not s.speculated}
            durations = list(run.durations)
            done, total = run.done_count, len(calls)
            if run.feed is not None and running:  # chunks of different sizes: compare seconds per item
                durations = [(s.stats["finished"] - s.stats["started"]) / s.n_items for s in calls
                             if s.stats and "started" in s.stats and "finished" in s.stats]
                items = {call_id: calls[call_id].n_items for call_id in running}
        for call_id in policy.stragglers(running, durations, done, total, time.time(), items=items):
            state = run.calls[call_id]
            state.speculated = True
            self.dispatch.send(job, state)

    def _stop_copies(self, job, state, attempts: list[int]) -> None:
        """A call is decided while ``attempts`` of it are still out (speculative copies, an
        attempt declared lost): have the backend stop them where it can (the emulator kills their
        worker processes, Batch terminates their containers).  Best effort: a copy that is not
        stopped costs only its own run, and its late result is discarded as a duplicate."""
        try:
            self.backend.stop_attempts(job.id, [(state.call_id, a) for a in attempts], self.secret)
        except Exception:  # see above
            pass

    def close(self) -> None:
        self.closed = True
        self.dispatch.close()
        self.monitor.close()
