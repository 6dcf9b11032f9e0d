"""A job: the calls of one ``fnmap.map`` (or one Executor), their futures, attempts and results.

A call's future is a real ``concurrent.futures.Future``.  For a map chunk its
result is the chunk's list of outcomes; for ``Executor.submit`` (``unwrap``)
it is the value itself, or the remote exception.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future

from .errors import (
    CallLost,
    FaultKind,
    OutOfMemory,
    PlatformError,
    PlatformFault,
    RemoteExit,
    SignatureError,
    StorageError,
    VersionMismatch,
    WorkerCrashed,
)
from .errors import TimeoutError as CallTimeout
from .observe import records
from .observe.output import show_call_output
from .runtime import keys
from .runtime.serialization import unpack_exception


class CallState:
    """Bookkeeping of one call (one chunk of items)."""

    __slots__ = (
        "call_id", "first_index", "n_items", "func_key", "payload", "items_key", "future",
        "unwrap", "attempts", "next_attempt", "sent_at", "in_flight", "done", "speculated",
        "stats", "awaiting", "charged", "claimed", "result", "memory_step",
    )

    def __init__(self, call_id, first_index, n_items, func_key, payload, items_key, future, unwrap):
        self.call_id = call_id
        self.first_index = first_index
        self.n_items = n_items
        self.func_key = func_key
        self.payload = payload
        self.items_key = items_key
        self.future = future
        self.unwrap = unwrap
        #: One ``[attempt, sent, ended, outcome, memory MB or None]`` per attempt, for the job summary.
        self.attempts: list[list] = []
        self.next_attempt = 1
        self.sent_at = 0.0
        self.in_flight = 0
        self.done = False
        self.speculated = False
        self.stats: dict | None = None
        #: Attempt number -> time, for attempts accepted asynchronously whose result is in storage.
        self.awaiting: dict[int, float] | None = None
        #: Faults that used up one of ``retries`` (429s and speculative copies use none; issue 3).
        self.charged = 0
        #: Set, under the job's lock, by whoever settles the first attempt's fate: a dispatch
        #: thread starting the call, or ``Job.cancel`` cancelling it (never both; issue 12).
        self.claimed = False
        #: The final outcome list, or the fault that failed the call, until :meth:`Job.deliver` hands it on.
        self.result = None
        #: Index into the job's ``memory`` steps that the next attempt runs with (out of memory climbs it).
        self.memory_step = 0

    def describe(self) -> str:
        last = self.first_index + self.n_items - 1
        items = f"item {self.first_index}" if self.n_items == 1 else f"items {self.first_index}..{last}"
        return f"call {self.call_id} ({items})"


_PENDING, _RUNNING, _FINISHED, _FAILED, _CANCELLED = range(5)


class CallOutcome:
    """The result slot of one call of ``fnmap.map``: the part of a ``Future`` a job uses.

    A ``concurrent.futures.Future`` carries a Condition, a lock, a deque and two
    lists, about 1.3 KB; 100,000 of them were a third of the client's memory for
    a 100,000-call map (issue 9).  Nobody outside the job sees these, so they do
    not block: :meth:`Job.results` waits on the job and reads them when done.
    A call is either started by a dispatch thread or cancelled by its job, never
    both (:meth:`Job.start_call`), so nothing here needs a lock.
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


class Job:
    """The user's handle on one job: its calls' futures, results, summary, record, logs and cost.

    The :class:`fnmap.scheduler.Scheduler` decides everything about the calls (it updates the
    counters below under its lock); the job turns those decisions into what a user sees:
    completed futures, the progress bar, the job record in storage.
    """

    def __init__(self, scheduler, store, config, kind: str = "map", job_id: str | None = None,
                 created: float | None = None):
        self.id = job_id or keys.new_job_id()  # a given id: a redrive or a named job (fnmap.redrive)
        self._scheduler = scheduler
        self.store = store
        self.config = config
        self.kind = kind
        self.created = created or time.time()
        self.finished: float | None = None
        self.calls: list[CallState] = []
        self.sealed = False
        #: No call starts any more; calls already started complete with their own results.
        self.cancelled = False
        #: Nobody waits for the results any more: no retries, no copies, failures are final.
        self.abandoned = False
        #: ``(call id, attempt)`` the scheduler stopped because the job was abandoned: they end as cancelled.
        self.stopped_attempts: set[tuple[int, int]] = set()
        #: Stragglers get speculative copies before the job is sealed (the Dask shim sets it).
        self.speculate_open = False
        #: Who asked another process to stop this job (``fnmap cancel``), once the client saw it.
        self.cancel_reason: str | None = None
        self.cancel_checked = 0.0
        self.done_count = 0
        self.failed_count = 0
        self.retry_count = 0
        self.duplicate_count = 0
        self.durations: list[float] = []
        self.progress = None
        #: Call id -> (status, "Type: message") of calls that failed, for the job record (issue 8).
        self.call_errors: dict[int, tuple[str, str]] = {}
        self._record_saved = False
        self._log_reads = 0
        #: Why the job record could not be written, if it could not (also warned about).
        self.record_error: str | None = None
        self.retry_on_names = sorted(
            {f"{t.__module__}.{t.__qualname__}" for t in config.retry_on}
        )
        #: The scheduler's lock: held while reading the calls' state for a record or summary.
        self._lock = scheduler.lock
        self._all_done = threading.Event()
        #: Set when every call is done or a call failed: what ``results`` waits on (fail fast).
        self._wake = threading.Event()
        #: A queue that receives each call's state when it is done, for ``fnmap.imap``;
        #: None (no cost) unless a reader set one before the calls were dispatched.
        self.completed = None
        #: The :class:`fnmap.feed.ChunkFeed` that makes this job's calls as it runs (``chunksize``
        #: unset), or None when every call was made up front.
        self.feed = None

    # -- what the scheduler's decisions become ------------------------------------

    def deliver(self, state: CallState, failed: int) -> None:
        """A call's outcome is final (``state.result``: its outcomes, or the fault that failed it;
        ``failed`` of its items failed): complete its future, tell ``imap`` and the progress bar."""
        result, state.result = state.result, None
        if isinstance(result, PlatformFault):
            _set(state.future, exception=self._fault_error(state, result))
        else:
            if not state.unwrap:
                _set(state.future, result=result)
            elif result[0][0] == "ok":
                _set(state.future, result=result[0][1])
            else:
                _set(state.future, exception=self.item_exception(state, 0, result[0]))
        if self.completed is not None:
            self.completed.put(state)
        if self.progress is not None:
            self.progress.update(state.n_items, failed, state.call_id)
        if failed:
            self._wake.set()

    def _fault_error(self, state: CallState, fault: PlatformFault) -> BaseException:
        if fault.kind == FaultKind.CANCELLED and (self.cancel_reason or self.abandoned):  # not its own failure
            if self.cancel_reason:
                return CancelledError(f"job {self.id} was cancelled from outside by `{self.cancel_reason}` "
                                      f"while {state.describe()} ran")
            return CancelledError(f"{state.describe()} of job {self.id}: {fault.message}")
        cls = FAULT_ERRORS.get(fault.kind, PlatformError)
        exc = cls(f"{state.describe()} of job {self.id} failed after {len(state.attempts)} attempt(s): "
                  f"{fault.message}")
        exc.add_note(f"fnmap: {state.describe()} of job {self.id}; retries={self.config.retries}")
        return exc

    def all_done(self) -> None:
        """Every call is done and no more will come: close the bar, then wake the waiters."""
        if self._all_done.is_set():
            return
        self.finished = self.finished or time.time()  # set already if the record was written
        if self.progress is not None:  # before the waiters wake: the bar's last draw precedes their next line
            self.progress.close()
        self._all_done.set()
        self._wake.set()

    # -- the job record (issue 8) ---------------------------------------------

    def save_record(self, final: bool) -> None:
        """Write the job's record (``final``) or its "running" index entry; a failure to write
        it is warned about, never the job's failure."""
        try:
            if final:
                records.write(self.store, records.build(self))
            else:
                records.write_index(self.store, records.started_summary(self))
        except Exception as e:  # results matter more than the record: warn, do not fail the job
            import warnings

            self.record_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"fnmap: could not write the record of job {self.id} to "
                          f"{self.store.url}: {self.record_error}", RuntimeWarning,
                          stacklevel=2)

    # -- results -------------------------------------------------------------

    def item_exception(self, state: CallState, offset: int, outcome: tuple) -> BaseException:
        """The exception an item raised remotely, ready to raise here (an ``Exception`` always)."""
        exc = remote_exception(outcome, state.first_index + offset, f"job {self.id}, {state.describe()}")
        tail = state.stats.get("log_tail") if state.stats else self._stored_log_tail(state)
        if tail:  # the call's own output, shown with its exception (issue 8)
            lines = tail.rstrip("\n").splitlines()[-_LOG_NOTE_LINES:]
            exc.add_note(f"fnmap: output of {state.describe()} (last {len(lines)} lines; all "
                         f"of it: fnmap logs {self.id} --call {state.call_id}):\n"
                         + "\n".join("    " + line for line in lines))
        return exc

    def _stored_log_tail(self, state: CallState) -> str | None:
        """A failing call's output from storage, when its result came from there with no stats
        (asynchronous backends); a few reads per job at most, on the error path only."""
        attempt = next((a[0] for a in reversed(state.attempts) if a[3] in ("ok", "error")), None)
        with self._lock:
            if attempt is None or self._log_reads >= _LOG_NOTE_READS:
                return None
            self._log_reads += 1
        try:
            data = self.store.get(keys.log_key(self.id, state.call_id, attempt))
        except Exception:  # KeyNotFound (the call printed nothing) or storage trouble: no note
            return None
        return data.decode("utf-8", errors="replace")[-2000:]

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return self._all_done.wait(timeout)
        while not self._all_done.wait(SIGNAL_CHECK_SECONDS):  # interruptible by Ctrl-C (see _wait_call)
            pass
        return True

    @property
    def done(self) -> bool:
        return self._all_done.is_set()

    def results(self, return_exceptions: bool = False) -> list:
        """Every item's result in input order; raises the first failure unless ``return_exceptions``."""
        out = []
        try:
            for state in self.calls:
                self._wait_call(state)
                out.extend(self.call_results(state, return_exceptions))
        except BaseException:
            self.cancel(stop_platform=True)
            raise
        finally:
            if self.progress is not None:  # ended before the caller's next line, even on a failure
                self.progress.close()
            show_call_output(self)  # remote print() output, per call, after the bar (issue 14)
        return out

    def call_results(self, state: CallState, return_exceptions: bool) -> list:
        """The results of a finished call's items, in order; raises the first failure unless
        ``return_exceptions`` (then exceptions take the failed items' places)."""
        try:
            outcomes = state.future.result()
        except CancelledError:
            if self.cancel_reason:
                raise CancelledError(f"job {self.id} was cancelled from outside by `{self.cancel_reason}` "
                                     "before all its calls had run") from None
            raise
        except BaseException as exc:  # the call failed at platform level
            if not return_exceptions:
                raise
            return [exc] * state.n_items
        if state.call_id not in self.call_errors:  # no item failed: a chunk of 10,000 in one pass
            return [outcome[1] for outcome in outcomes]
        out = []
        for offset, outcome in enumerate(outcomes):
            if outcome[0] == "ok":
                out.append(outcome[1])
                continue
            exc = self.item_exception(state, offset, outcome)
            if not return_exceptions:
                raise exc
            out.append(exc)
        return out

    def _wait_call(self, state: CallState) -> None:
        """Block until ``state`` is done: on the job while no call has failed (one wake-up, not
        one per call), then briefly polling, so a failure is raised without waiting for the rest."""
        future = state.future
        if isinstance(future, Future):
            return  # its result() blocks
        while not future.done():
            if self._wake.is_set():
                self._all_done.wait(0.05)
            else:
                # Not an endless wait: a Ctrl-C the kernel hands to one of the client's other threads
                # only sets a flag, and the main thread runs the KeyboardInterrupt when it wakes.
                self._wake.wait(SIGNAL_CHECK_SECONDS)

    def cancel(self, stop_platform: bool = False) -> None:
        """Stop starting this job's calls; those running end with their own results.  With
        ``stop_platform`` the job is abandoned: no retries or copies, and the platform stops what
        it can (see :meth:`fnmap.scheduler.Scheduler.cancel`)."""
        self._scheduler.cancel(self, stop_platform)

    def attempts_summary(self) -> dict:
        """Attempts per call: ``{call_id: [[attempt, sent, ended, outcome, memory], ...]}`` (memory
        in MB as the attempt asked for it, None without a ``memory`` option)."""
        with self._lock:
            return {s.call_id: [list(a) for a in s.attempts] for s in self.calls}

    def summary(self) -> dict:
        with self._lock:
            calls = len(self.calls)
            retried = sum(1 for s in self.calls if len(s.attempts) > 1)
            speculative = sum(1 for s in self.calls if s.speculated)
            attempts: dict[str, int] = {}  # outcome -> attempts (ok, crashed, server, throttled, ...)
            for s in self.calls:
                for record in s.attempts:
                    outcome = record[3] or "running"
                    attempts[outcome] = attempts.get(outcome, 0) + 1
        end = self.finished or time.time()
        return {
            "job_id": self.id,
            "kind": self.kind,
            "backend": self.config.backend,
            "storage": self.store.url,
            "calls": calls,
            "done": self.done_count,
            "failed_items": self.failed_count,
            "retries": self.retry_count,
            "calls_retried": retried,
            "duplicates_discarded": self.duplicate_count,
            "speculative_copies": speculative,
            "attempts": attempts,
            "wall_seconds": end - self.created,
        }

    # -- observability (issue 8) ---------------------------------------------

    def record(self) -> dict:
        """The job record: per call its times, worker, cold start, attempts, bytes, memory and
        status, plus ``record["summary"]`` (durations p50/p95/max, throughput, cost).  What
        ``fnmap job ID --json`` prints; while the job runs, a snapshot."""
        return records.build(self)

    def logs(self, call: int | None = None) -> str:
        """The captured stdout and stderr of every call (or of call ``call``), by attempt."""
        return records.logs_text(self.store, self.id, call)

    @property
    def cost(self) -> dict:
        """Estimated cost: Lambda GB-seconds and requests (Batch: instance time); ``["usd"]``."""
        return records.build(self)["summary"]["cost"]

    def plot(self, path: str) -> str:
        """Save a timeline (one row per call; queued, cold start, running, writing) and a histogram
        of call durations to ``path`` (PNG, SVG or PDF by its extension); needs matplotlib."""
        from .observe.plot import plot_record

        return plot_record(records.build(self), path)

    def __repr__(self) -> str:
        return f"<fnmap.Job {self.id} {self.done_count}/{len(self.calls)} calls done>"


def remote_exception(outcome: tuple, item: int, where: str) -> Exception:
    """The exception an item raised remotely (an ``("err", ...)`` outcome), ready to raise here: an
    ``Exception`` always (a remote ``sys.exit`` becomes :class:`RemoteExit`), noting the item."""
    exc = unpack_exception(outcome[1], outcome[2])
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
