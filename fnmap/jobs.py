"""A job: the calls of one ``fnmap.map`` (or one Executor), their futures, attempts and results.

A call's future is a real ``concurrent.futures.Future``.  For a map chunk its
result is the chunk's list of outcomes; for ``Executor.submit`` (``unwrap``)
it is the value itself, or the remote exception.
"""

from __future__ import annotations

import abc
import threading
import time
from concurrent.futures import CancelledError, Future

from . import lease
from .blocking import warn_if_you_wait
from .errors import (
    CallLost,
    CostCapReached,
    FaultKind,
    OutOfMemory,
    PlatformError,
    PlatformFault,
    RedriveError,
    RemoteExit,
    SignatureError,
    StorageError,
    VersionMismatch,
    WorkerCrashed,
)
from .errors import TimeoutError as CallTimeout
from .kinds import not_recorded
from .observe import records, report
from .observe.output import show_call_output
from .observe.report import usd
from .run import ANSWERED, CallRun, JobRun
from .runtime import keys
from .runtime import outcome as _outcome
from .runtime.serialization import unpack_exception
from .twins import with_aio

_PENDING, _RUNNING, _FINISHED, _FAILED, _CANCELLED = range(5)


class ResultSlot:
    """The result slot of one call of ``fnmap.map``: the part of a ``Future`` a job uses.

    A ``concurrent.futures.Future`` carries a Condition, a lock, a deque and two
    lists, about 1.3 KB; 100,000 of them were a third of the client's memory for
    a 100,000-call map.  Nobody outside the job sees these, so they do
    not block: :meth:`Job.results` waits on the job and reads them when done.
    A call is either started by a dispatch thread or cancelled by its job, never
    both (the scheduler claims it under its lock), so nothing here needs a lock.
    """

    __slots__ = ("_status", "_value")

    def __init__(self):
        self._status = _PENDING
        self._value = None

    def done(self) -> bool:
        return self._status >= _FINISHED

    def cancelled(self) -> bool:
        return self._status == _CANCELLED

    def cancel(self) -> bool:
        if self._status == _PENDING:
            self._status = _CANCELLED
        return self._status == _CANCELLED

    def set_running_or_notify_cancel(self) -> bool:
        if self._status == _CANCELLED:
            return False
        if self._status != _PENDING:
            raise RuntimeError("the call was already started")
        self._status = _RUNNING
        return True

    def set_result(self, result) -> None:
        self._value = result
        self._status = _FINISHED

    def set_exception(self, exception: BaseException) -> None:
        self._value = exception
        self._status = _FAILED

    def result(self):
        if self._status == _FINISHED:
            return self._value
        if self._status == _FAILED:
            raise self._value
        if self._status == _CANCELLED:
            raise CancelledError()
        raise RuntimeError("the call has not finished; wait on its job first")


#: Longest a waiting user thread sleeps at once: a SIGINT the kernel delivers to another thread of
#: the process only sets CPython's flag, run when the main thread next wakes (then Ctrl-C works).
SIGNAL_CHECK_SECONDS = 0.25
#: Longest one wait of ``wait.aio`` holds a thread of fnmap's (it waits again until the job ends).
_AIO_WAIT_SECONDS = 2.0
#: Lines of a failing call's output added to its exception's notes.
_LOG_NOTE_LINES = 20
#: Stored outputs read per job for exception notes when results came without stats.
_LOG_NOTE_READS = 20

#: The error a call's final platform fault raises (any other kind: :class:`PlatformError`).
FAULT_ERRORS = {
    FaultKind.CRASHED: WorkerCrashed,
    FaultKind.OUT_OF_MEMORY: OutOfMemory,
    FaultKind.LOST: CallLost,
    FaultKind.TIMEOUT: CallTimeout,
    FaultKind.VERSION: VersionMismatch,
    FaultKind.STORAGE: StorageError,
    FaultKind.SIGNATURE: SignatureError,
}


class JobHandle(abc.ABC):
    """What every job object answers, the job of ``fnmap.map(..., return_job=True)`` (an Executor's
    ``.job``, :class:`Job`) and the job read back by id (``fnmap.job(ID)``,
    :class:`fnmap.attach.AttachedJob`) alike: ``id``, ``status``, ``done``, ``wait()``,
    ``results()``, ``cancel()``, ``redrive()``, ``record()``, ``summary()``, ``cost``, ``plot()``,
    ``logs()``.  What a member derives from the job's record is said here, once; each subclass says
    how it waits, reads its results, cancels, and what a redrive defaults to."""

    #: The job's id (32 hex digits; ``job_id`` in its record's JSON), under which its storage keeps it.
    id: str

    @abc.abstractmethod
    def record(self) -> dict:
        """The job's record: per call its times, worker, cold start, attempts, bytes, memory, status
        and error, plus ``record["summary"]``; while the job runs, a snapshot."""

    def summary(self) -> dict:
        """The record's summary: status, calls per state, items, failures, retries, durations
        p50/p95/max, throughput, cost (and ``cost_cap`` for a job run with ``max_cost``)."""
        return self.record()["summary"]

    @property
    def status(self) -> str:
        """``running``, ``succeeded``, ``failed``, ``cancelled``, ``capped`` (stopped at its
        ``max_cost``), ``incomplete`` or ``abandoned``."""
        return self.summary()["status"]

    @property
    def cost(self) -> dict:
        """Estimated cost: Lambda GB-seconds and requests (Batch: instance time); ``["usd"]``."""
        return self.summary()["cost"]

    def plot(self, path: str) -> str:
        """Save a timeline (one row per call; queued, cold start, running, writing) and a histogram
        of call durations to ``path`` (PNG, SVG or PDF by its extension); needs matplotlib."""
        from .observe.plot import plot_record

        return plot_record(self.record(), path)

    def logs(self, call: int | None = None) -> str:
        """The captured stdout and stderr of every call (or of call ``call``), by attempt."""
        return records.logs_text(self.store, self.id, call)

    def redrive(self, **options) -> Job:
        """Run the calls of this job that have no committed result (stopped, never run, never
        reported), from this process, under the same id; the running :class:`Job`, whose
        ``results()`` are every item's.  ``failed=True`` also runs again the calls whose items failed
        (under new call ids; the failures stay in the record).  Options as for ``fnmap.map``; what is not given is the
        job's own (its storage and secret; for a job of this process, its keyword options but
        ``max_cost``: a redrive's cap counts what the redrive spends, and is given or none)."""
        for name, value in self._redrive_defaults().items():
            options.setdefault(name, value)
        return self._redrive(options)

    @abc.abstractmethod
    def _redrive_defaults(self) -> dict:
        """The options a redrive of this job takes from it when not given."""

    @abc.abstractmethod
    def _redrive(self, options: dict) -> Job:
        """Start the redrive with these options; the running job."""

    # -- the awaitable forms of wait() and results(): ``await job.wait.aio()`` (fnmap.twins) --

    @abc.abstractmethod
    def _wait(self, timeout: float | None) -> bool:
        """Block until the job ended or ``timeout`` passed; whether it ended."""

    @abc.abstractmethod
    def _results(self, return_exceptions: bool) -> list:
        """Every item's result, in input order (blocking)."""

    async def _wait_aio(self, timeout: float | None = None) -> bool:
        from .loop import run_blocking

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # in short waits: a cancelled wait leaves no thread polling for long
            left = _AIO_WAIT_SECONDS if deadline is None else min(_AIO_WAIT_SECONDS, deadline - time.monotonic())
            if await run_blocking(self._wait, max(0.0, left)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    async def _results_aio(self, return_exceptions: bool = False) -> list:
        from .loop import run_blocking

        return await run_blocking(self._results, return_exceptions)


class Job(JobHandle):
    """The user's handle on one job: its calls' futures, results, summary, record, logs and cost.

    The :class:`fnmap.scheduler.Scheduler` decides everything about the calls and keeps what it
    decided in the job's run state (:class:`fnmap.run.JobRun`, written by it alone under its lock);
    the job reads that state (:attr:`run`, read-only) and turns the scheduler's decisions
    into what a user sees: completed futures, the progress bar, the job record in storage.
    """

    def __init__(self, scheduler, store, config, kind: str = "map", *, function=None, stream: bool = False,
                 speculate_open: bool = False, job_id: str | None = None, created: float | None = None,
                 recorder=None, first_run: dict | None = None):
        self.id = job_id or keys.new_job_id()  # a given id: a redrive or a named job (fnmap.redrive)
        self._scheduler = scheduler
        #: What the scheduler decided about this job and its calls (read it; only the scheduler writes it).
        self._run: JobRun = scheduler.new_run(speculate_open=speculate_open, stream=stream,
                                              budget=new_budget(config))
        self.store = store
        self.config = config
        self.kind = kind
        #: What stores the job's calls and items for a redrive (``fnmap.client.Recorder``), or None.
        self.recorder = recorder
        #: The name of the function the job runs (``fnmap jobs``, the plot), or None.
        self.function_name: str | None = function_label(function) if function is not None else None
        self.created = created or time.time()
        #: The summary of this job's earlier run, when this is a redrive: who started it, from where.
        self.first_run = first_run
        self.run_started = time.time()
        self._log_reads = 0
        #: Why the job record could not be written, if it could not (also warned about).
        self.record_error: str | None = None
        #: The exception of this job that reached its caller, once one did: ``{"error": "Type:
        #: message", "status": "failed" or "cancelled"}``.  The job ended there, whatever its calls
        #: still settling do, and its record says so (:func:`fnmap.observe.records.build`).
        self.raised: dict | None = None
        #: Why this process gave the job up unfinished (its exit: :mod:`fnmap.lease`), or None.
        self.given_up: str | None = None
        #: Held while the record is built and written: a snapshot never lands after a later record.
        self._record_lock = threading.Lock()
        self.retry_on_names = sorted(
            {f"{t.__module__}.{t.__qualname__}" for t in config.retry_on}
        )
        #: The job's result cache (:class:`fnmap.cache.plan.JobCache`) when it runs with ``cache=``.
        self.cache = None
        #: The scheduler's lock: held while reading the calls' state for a record or summary.
        self._lock = scheduler.lock

    # -- the run state, as the scheduler keeps it (read-only) ----------------------

    @property
    def run(self) -> JobRun:
        """What the scheduler decided about this job and its calls: read it, never write it."""
        return self._run

    # -- what the scheduler's decisions become ------------------------------------

    def deliver(self, state: CallRun, result, failed: int) -> None:
        """A call is decided (``result``: its item outcomes, or the fault that failed it; ``failed``
        of its items failed): complete its future, tell ``imap`` and the progress bar (its items
        that succeeded are stored in the result cache first, when the job has one)."""
        if self.cache is not None:
            self.cache.delivered(state, result)
        if isinstance(result, PlatformFault):
            _set(state.future, exception=self._fault_error(state, result))
        else:
            if not state.unwrap:
                _set(state.future, result=result)
            elif _outcome.succeeded(first := _outcome.first(result)):
                _set(state.future, result=_outcome.value(first))
            else:
                _set(state.future, exception=self.item_exception(state, 0, first))
        run = self._run
        if run.completed is not None:
            run.completed.put(state)
        if run.progress is not None:  # a call stopped with its job is not a failure
            run.progress.update(state.n_items, 0 if state.cancelled else failed, state.call_id,
                                cached=state.cached is not None)

    def _fault_error(self, state: CallRun, fault: PlatformFault) -> BaseException:
        run = self._run
        if fault.kind == FaultKind.CANCELLED and run.budget is not None and run.budget.reached:
            return self.cost_cap_error()
        if fault.kind == FaultKind.CANCELLED and (run.cancel_reason or run.abandoned):  # not its own failure
            if run.cancel_reason:
                return CancelledError(f"job {self.id} was cancelled from outside by `{run.cancel_reason}` "
                                      f"while {state.describe()} ran")
            return CancelledError(f"{state.describe()} of job {self.id}: {fault.message}")
        cls = FAULT_ERRORS.get(fault.kind, PlatformError)
        exc = cls(f"{state.describe()} of job {self.id} failed after {len(state.attempts)} attempt(s): "
                  f"{fault.message}")
        exc.add_note(f"fnmap: {state.describe()} of job {self.id}; retries={self.config.retries}")
        return exc

    def cost_cap_error(self) -> CostCapReached:
        """The error of a job stopped at its ``max_cost``: the cap, what was spent, the calls done
        and not run, what the calls in flight mean, and how to finish the job."""
        run = self._run
        budget = run.budget
        with self._lock:
            done = sum(1 for s in run.calls if s.done and not s.cancelled)
            not_run = [s for s in run.calls if s.cancelled or not s.done]
            spent, in_flight = budget.spent, budget.in_flight
        items = sum(s.n_items for s in not_run)
        stoppable = self._scheduler.backend.stops_attempts
        out = ""
        if in_flight:
            out = (f" {in_flight} call(s) in flight when the cap was reached still bill until they end"
                   + (" (fnmap is stopping them)." if stoppable
                      else " (this platform cannot stop a call that started)."))
        return CostCapReached(
            f"job {self.id} stopped at its cost cap max_cost=${budget.cap:g}: {usd(spent)} spent at list "
            f"prices ({budget.pricing.describe()}) by {done} call(s) done; {len(not_run)} call(s) "
            f"({items} item(s)) not run.{out} Finish it with `fnmap redrive {self.id} --max-cost USD` "
            "(the new cap counts what the redrive spends).",
            id=self.id, cap=budget.cap, spent=spent, calls_done=done, calls_not_run=len(not_run))

    # -- the job record ---------------------------------------------

    def save_record(self, final: bool) -> None:
        """Write the job's record (``final``) or its "running" index entry; a failure to write
        it is warned about, never the job's failure."""
        try:
            if final:
                with self._record_lock:
                    records.write(self.store, records.build(self))
                lease.release(self)  # the job has ended: its lease is not renewed any more
            else:
                records.write_index(self.store, records.started_summary(self))
                lease.hold(self)  # renewed in storage while this process runs the job, released above
        except Exception as e:  # results matter more than the record: warn, do not fail the job
            if isinstance(e, StorageError) and not final and not self._run.calls:
                raise  # the job's first write: a storage that refuses it refuses the job, one error
            self._record_failed(e)

    def save_ended_record(self) -> None:
        """Write the record of a job that ended before its stopped calls settled: its ``max_cost``
        stopped it, its exception reached its caller (then, should the process end first, a script's
        last line or a kill, the job reads as what its caller saw: ``failed``, or ``cancelled`` for
        an interrupt), or its process gave it up at exit (:attr:`given_up`; its lease says
        ``abandoned``).  Its calls still out are recorded as stopped; the record the scheduler
        writes once every call is done, if the process lives that long, replaces this one."""
        with self._record_lock:
            if self._run.record_saved:  # the scheduler's own final record is written (or about to be)
                return
            try:
                records.write(self.store, records.build(self))
            except Exception as e:
                self._record_failed(e)

    def give_up(self, reason: str) -> None:
        """This process gave the job up at its exit (:mod:`fnmap.lease`), an interrupt that reached its
        caller included (a kernel's restart interrupts the running cell first): its record says so,
        whatever was written before; its lease, marked by the caller, makes it ``abandoned``."""
        with self._record_lock:
            self.given_up, self.raised = reason, None
            try:
                records.write(self.store, records.build(self))
            except Exception as e:
                self._record_failed(e)

    def _record_failed(self, e: Exception) -> None:
        import warnings

        self.record_error = f"{type(e).__name__}: {e}"
        warnings.warn(f"fnmap: could not write the record of job {self.id} to "
                      f"{self.store.url}: {self.record_error}", RuntimeWarning, stacklevel=3)

    def _reached_caller(self, exc: BaseException) -> None:
        """``exc`` is raised to this job's caller: the job has ended for it (see :attr:`raised`)."""
        if self.raised is None:
            stopped = isinstance(exc, (CancelledError, KeyboardInterrupt))  # asked to stop, not a failure
            self.raised = {"error": f"{type(exc).__name__}: {exc}"[:500],
                           "status": "cancelled" if stopped else "failed"}
            if isinstance(exc, KeyboardInterrupt):  # the user's Ctrl-C, or a kernel's restart (lease decides at exit)
                lease.interrupted(self)

    # -- results -------------------------------------------------------------

    def item_exception(self, state: CallRun, offset: int, outcome: tuple) -> BaseException:
        """The exception an item raised remotely, ready to raise here (an ``Exception`` always)."""
        exc = remote_exception(outcome, state.first_index + offset, f"job {self.id}, {state.describe()}")
        tail = state.stats.get("log_tail") if state.stats else self._stored_log_tail(state)
        if tail:  # the call's own output, shown with its exception
            lines = tail.rstrip("\n").splitlines()[-_LOG_NOTE_LINES:]
            exc.add_note(f"fnmap: output of {state.describe()} (last {len(lines)} lines; all "
                         f"of it: fnmap logs {self.id} --call {state.call_id}):\n"
                         + "\n".join("    " + line for line in lines))
        return exc

    def _stored_log_tail(self, state: CallRun) -> str | None:
        """A failing call's output from storage, when its result came from there with no stats
        (asynchronous backends); a few reads per job at most, on the error path only."""
        attempt = next((a.number for a in reversed(state.attempts) if a.ending in ANSWERED), None)
        with self._lock:
            if attempt is None or self._log_reads >= _LOG_NOTE_READS:
                return None
            self._log_reads += 1
        try:
            data = self.store.get(keys.log_key(self.id, state.call_id, attempt))
        except Exception:  # KeyNotFound (the call printed nothing) or storage trouble: no note
            return None
        return data.decode("utf-8", errors="replace")[-2000:]

    @with_aio(JobHandle._wait_aio)
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every call of the job is decided; False if ``timeout`` passed first.
        ``await job.wait.aio()`` waits without blocking the event loop."""
        if not self.done:
            warn_if_you_wait("job.wait()", "await job.wait.aio()", self.config.blocking_warning)
        return self._wait(timeout)

    def _wait(self, timeout: float | None) -> bool:
        if timeout is not None:
            return self._run.all_done.wait(timeout)
        while not self._run.all_done.wait(SIGNAL_CHECK_SECONDS):  # interruptible by Ctrl-C (see _wait_call)
            pass
        return True

    @property
    def done(self) -> bool:
        return self._run.all_done.is_set()

    @with_aio(JobHandle._results_aio)
    def results(self, return_exceptions: bool = False) -> list:
        """Every item's result in input order; raises the first failure unless ``return_exceptions``.
        ``await job.results.aio()`` waits and reads them without blocking the event loop."""
        if not self.done:
            warn_if_you_wait("job.results()", "await job.results.aio()", self.config.blocking_warning)
        return self._results(return_exceptions)

    def _results(self, return_exceptions: bool) -> list:
        out = []
        try:
            for state in self._in_input_order():
                self._wait_call(state)
                out.extend(self.call_results(state, return_exceptions))
        except BaseException as exc:
            self.stop(exc)
            raise
        finally:
            if self.cache is not None:  # the entries of what it returns are written when it returns
                self.cache.flush()
            if self._run.progress is not None:  # ended before the caller's next line, even on a failure
                self._run.progress.close()
            show_call_output(self)  # remote print() output, per call, after the bar
        return out

    def _in_input_order(self):
        """The calls whose outcomes are the items', in input order: the calls as they are made for a
        job with a feed (it makes them in input order while ``results`` reads them), else sorted by
        first item without those run again by a later call (a redrive's retries come last)."""
        if self._run.feed is not None:
            return self._run.calls
        with self._lock:
            calls = list(self._run.calls)
        again = report.retried((s.call_id, s.first_index, s.n_items) for s in calls)
        return sorted((s for s in calls if s.call_id not in again), key=lambda s: s.first_index)

    def call_results(self, state: CallRun, return_exceptions: bool) -> list:
        """The results of a finished call's items, in order; raises the first failure unless
        ``return_exceptions`` (then exceptions take the failed items' places).  What it raises
        reaches the job's caller (``results``, ``imap``): the job has ended (:attr:`raised`)."""
        try:
            return self._call_results(state, return_exceptions)
        except BaseException as exc:
            self._reached_caller(exc)
            raise

    def _call_results(self, state: CallRun, return_exceptions: bool) -> list:
        try:
            outcomes = state.future.result()
        except CancelledError as stopped:  # in place with ``return_exceptions``, as fnmap.job(ID) reads it
            cancelled = stopped if not self._run.cancel_reason else CancelledError(
                f"job {self.id} was cancelled from outside by `{self._run.cancel_reason}` before all its "
                "calls had run")
            if not return_exceptions:
                raise cancelled from None
            return [cancelled] * state.n_items
        except BaseException as exc:  # the call failed at platform level
            if not return_exceptions:
                raise
            return [exc] * state.n_items
        if state.call_id not in self._run.call_errors:  # no item failed: a chunk of 10,000 in one pass
            return _outcome.values(outcomes)
        out = []
        for offset, outcome in enumerate(_outcome.each(outcomes)):
            if _outcome.succeeded(outcome):
                out.append(_outcome.value(outcome))
                continue
            exc = self.item_exception(state, offset, outcome)
            if not return_exceptions:
                raise exc
            out.append(exc)
        return out

    def _wait_call(self, state: CallRun) -> None:
        """Block until ``state`` is done: on the job while no call has failed (one wake-up, not
        one per call), then briefly polling, so a failure is raised without waiting for the rest."""
        future = state.future
        if isinstance(future, Future):
            return  # its result() blocks
        while not future.done():
            if self._run.wake.is_set():
                self._run.all_done.wait(0.05)
            else:
                # Not an endless wait: a Ctrl-C the kernel hands to one of the client's other threads
                # only sets a flag, and the main thread runs the KeyboardInterrupt when it wakes.
                self._run.wake.wait(SIGNAL_CHECK_SECONDS)

    def stop(self, reason: BaseException) -> None:
        """Its caller stopped waiting, with ``reason`` (an exception, an interrupt, a cancelled
        task): the job ends for it, and is abandoned as :meth:`cancel` with ``stop_platform`` does."""
        self._reached_caller(reason)
        self.cancel(stop_platform=True)

    def cancel(self, stop_platform: bool = True) -> None:
        """Stop the job, as ``fnmap cancel`` and ``fnmap.job(ID).cancel()`` do: its calls not started
        are cancelled, and it is abandoned: no retries or copies, and the platform stops what it can
        (see :meth:`fnmap.scheduler.Scheduler.cancel`), its progress bar ends now (nobody watches
        it: the calls being stopped would draw it again, in a notebook's next cell), and a job whose
        exception reached its caller records that it ended (:meth:`save_ended_record`).  With
        ``stop_platform=False`` (an Executor's ``shutdown(cancel_futures=True)``) only the calls not
        started are cancelled; those running end with their own results."""
        self._scheduler.cancel(self, stop_platform)
        if not stop_platform:
            return
        if self._run.progress is not None:
            self._run.progress.close()
        if self.raised is not None:
            self.save_ended_record()

    def attempts_summary(self) -> dict:
        """Attempts per call: ``{call_id: [[attempt, sent, ended, ending, memory], ...]}`` (memory
        in MB as the attempt asked for it, None without a ``memory`` option)."""
        with self._lock:
            return {s.call_id: [a.as_list() for a in s.attempts] for s in self._run.calls}

    def summary(self) -> dict:
        """The record's summary (:meth:`JobHandle.summary`: what ``fnmap.job(ID).summary()`` reads),
        and the counts only the scheduler running the job knows: calls decided (``done``) and among
        them ``cancelled`` ones, speculative copies (calls that got one; ``copies``: copies sent),
        late answers discarded as duplicates, and attempts by how they ended (``ok``, ``crashed``,
        ``superseded``...; ``running`` only while the job runs)."""
        run = self._run
        with self._lock:
            speculative = sum(1 for s in run.calls if s.speculated)
            attempts: dict[str, int] = {}  # ending -> attempts (ok, crashed, server, throttled, ...)
            for s in run.calls:
                for record in s.attempts:
                    ending = record.ending or "running"
                    attempts[ending] = attempts.get(ending, 0) + 1
            counts = {"done": run.done_count, "cancelled": run.cancelled_count, "copies": run.copy_count,
                      "duplicates_discarded": run.duplicate_count}
        return {**super().summary(), **counts, "speculative_copies": speculative, "attempts": attempts}

    # -- observability ---------------------------------------------

    def record(self) -> dict:
        """The job record: per call its times, worker, cold start, attempts, bytes, memory and
        status, plus ``record["summary"]`` (durations p50/p95/max, throughput, cost).  What
        ``fnmap job ID --json`` prints; while the job runs, a snapshot."""
        return records.build(self)

    def _redrive_defaults(self) -> dict:
        """The options this job was given by keyword, but ``max_cost``, and its storage."""
        cfg = self.config
        given = {name: getattr(cfg, name) for name, source in cfg.sources.items()
                 if source == "keyword" and name != "max_cost"}
        return {**given, "storage": self.store.url}

    def _redrive(self, options: dict) -> Job:
        """Through the job's recorder, which stored its calls; a job of a kind that stores none cannot be."""
        if self.recorder is None:
            raise RedriveError(not_recorded(self.id, self.kind))
        return self.recorder.redrive(self, **options)

    def __repr__(self) -> str:
        return f"<fnmap.Job {self.id} {self._run.done_count}/{len(self._run.calls)} calls done>"


def new_budget(config):
    """The :class:`fnmap.cost.budget.Budget` of a job run with ``max_cost``, or None."""
    if config.max_cost is None:
        return None
    from .cost.budget import Budget
    from .cost.pricing import pricing_of

    pricing = pricing_of(config)
    return Budget(config.max_cost, pricing, spent=pricing.job_overhead())


def function_label(func) -> str:
    """The name a job running ``func`` is shown by (``fnmap jobs``, the plot); a stage of
    ``map_reduce`` is named after the user's function it runs."""
    func = getattr(func, "map_func", None) or getattr(func, "reduce_func", None) or func
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


def remote_exception(outcome: tuple, item: int, where: str) -> Exception:
    """The exception an item raised remotely (an ``("err", ...)`` outcome), ready to raise here: an
    ``Exception`` always (a remote ``sys.exit`` becomes :class:`RemoteExit`), noting the item."""
    failure = _outcome.failure(outcome)
    exc = unpack_exception(failure.data, failure.traceback)
    if not isinstance(exc, Exception):  # sys.exit, KeyboardInterrupt: the item's failure only
        exc = RemoteExit.of(exc, item)
    exc.add_note(f"fnmap: raised remotely by item {item} ({where})")
    return exc


def _set(future: Future, result=None, exception=None) -> None:
    if future.done():  # cancelled by the user meanwhile
        return
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except Exception:  # InvalidStateError: lost a race with cancel()
        pass
