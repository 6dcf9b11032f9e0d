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
    PlatformError,
    RemoteExit,
    SerializationError,
    SignatureError,
    StorageError,
    VersionMismatch,
    WorkerCrashed,
)
from .errors import TimeoutError as CallTimeout
from .locks import YieldingLock
from .observe import records
from .observe.output import show_call_output
from .runtime import keys
from .runtime.serialization import dumps, dumps_checked, unpack_exception


class CallState:
    """Bookkeeping of one call (one chunk of items)."""

    __slots__ = (
        "call_id", "first_index", "n_items", "func_key", "payload", "items_key", "future",
        "unwrap", "attempts", "next_attempt", "sent_at", "in_flight", "done", "speculated",
        "stats", "awaiting", "charged", "claimed",
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
        #: One ``[attempt, sent, ended, outcome]`` per attempt, for the job summary.
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


#: Lines of a failing call's output added to its exception's notes.
_LOG_NOTE_LINES = 20
#: Stored outputs read per job for exception notes when results came without stats.
_LOG_NOTE_READS = 20

_FAULT_ERRORS = {
    "crashed": WorkerCrashed,
    "lost": CallLost,
    "timeout": CallTimeout,
    "version": VersionMismatch,
    "storage": StorageError,
}


class Job:
    """The calls of one job.  Created and driven by :class:`fnmap.client.Client`."""

    def __init__(self, client, config, kind: str = "map"):
        self.id = keys.new_job_id()
        self.client = client
        self.config = config
        self.kind = kind
        self.created = time.time()
        self.finished: float | None = None
        self.calls: list[CallState] = []
        self.sealed = False
        #: No call starts any more; calls already started complete with their own results.
        self.cancelled = False
        #: Nobody waits for the results any more: no retries, no copies, failures are final.
        self.abandoned = False
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
        self._lock = YieldingLock()
        self._all_done = threading.Event()
        #: Set when every call is done or a call failed: what ``results`` waits on (fail fast).
        self._wake = threading.Event()
        #: A queue that receives each call's state when it is done, for ``fnmap.imap``;
        #: None (no cost) unless a reader set one before the calls were dispatched.
        self.completed = None

    # -- building ------------------------------------------------------------

    def add_call(self, func_key: str, chunk: tuple, first_index: int, n_items: int,
                 future: Future | None = None, unwrap: bool = False) -> CallState:
        """Pickle a chunk (storing it if it is large) and record the call; does not dispatch it."""
        try:
            payload = dumps(chunk)
        except Exception:
            _raise_unpicklable(chunk, first_index)
        items_key = None
        if len(payload) > self.config.inline_limit:
            items_key = keys.input_key(self.id, len(self.calls))
            with self.client.storage_errors("store the input of the call"):
                self.client.store.put(items_key, payload)
            payload = b""
        state = CallState(len(self.calls), first_index, n_items, func_key, payload, items_key,
                          future or Future(), unwrap)
        with self._lock:
            self.calls.append(state)
            self._all_done.clear()
        return state

    def seal(self) -> None:
        """No more calls will be added (a map job); the job is done when every call is."""
        with self._lock:
            self.sealed = True
            if self.progress is not None and self.progress.calls is None:
                self.progress.calls = len(self.calls)
            self._check_all_done()
        if not self._save_record_if_last():
            self._save_record(final=False)  # a "running" index entry, so `fnmap jobs` shows the job

    # -- outcomes ------------------------------------------------------------

    def next_attempt(self, state: CallState) -> int:
        return self.next_attempts([state])[0][1]

    def next_attempts(self, states: list[CallState]) -> list[tuple[CallState, int]]:
        """``next_attempt`` for many calls under one lock."""
        with self._lock:
            out = []
            for state in states:
                out.append((state, state.next_attempt))
                state.next_attempt += 1
            return out

    def finish(self, state: CallState, outcomes: list, stats: dict | None, attempt: int) -> bool:
        """Deliver a call's outcomes; returns False for a duplicate (a later copy)."""
        with self._lock:  # one lock section per call: dispatch threads share this lock (issue 9)
            if state.done:
                self.duplicate_count += 1
                return False
            state.done = True
            state.stats = stats
            if stats and "started" in stats and "finished" in stats:
                self.durations.append(stats["finished"] - stats["started"])
            self.done_count += 1
            failed = 0
            for outcome in outcomes:
                if outcome[0] != "ok":
                    failed += 1
            self.failed_count += failed
            if failed:
                self.call_errors[state.call_id] = records.call_error(outcomes)
            self._mark_attempt(state, attempt, "ok" if not failed else "error")
            state.payload = None
            others = _attempts_out(state)
            write_record, all_done = self._settle()
        if write_record:  # before the last result is out: a returned map has its record
            self._save_record(final=True)
        if state.unwrap:
            outcome = outcomes[0]
            if outcome[0] == "ok":
                _set(state.future, result=outcome[1])
            else:
                _set(state.future, exception=self.item_exception(state, 0, outcome))
        else:
            _set(state.future, result=outcomes)
        if self.completed is not None:
            self.completed.put(state)
        self._progress_update(state.n_items, failed, state.call_id)
        if failed:
            self._wake.set()
        if all_done:
            self._after_done()
        if others:
            self.client.stop_copies(self, state, others)
        return True

    def fail(self, state: CallState, fault, attempt: int) -> None:
        """The call failed at platform level for good: every item of it gets the same error."""
        with self._lock:
            if state.done:
                return
            state.done = True
            self.done_count += 1
            self.failed_count += state.n_items
            self.call_errors[state.call_id] = (fault.kind, fault.message)
            self._mark_attempt(state, attempt, fault.kind)
            state.payload = None
            attempts = len(state.attempts)
            others = _attempts_out(state)
            write_record, all_done = self._settle()
        cls = _FAULT_ERRORS.get(fault.kind, PlatformError)
        if fault.kind == "rejected" and ("401" in fault.message or "403" in fault.message):
            cls = SignatureError
        exc = cls(
            f"{state.describe()} of job {self.id} failed after {attempts} attempt(s): {fault.message}"
        )
        exc.add_note(f"fnmap: {state.describe()} of job {self.id}; retries={self.config.retries}")
        if write_record:
            self._save_record(final=True)
        _set(state.future, exception=exc)
        if self.completed is not None:
            self.completed.put(state)
        self._progress_update(state.n_items, state.n_items, state.call_id)
        self._wake.set()
        if all_done:
            self._after_done()
        if others:
            self.client.stop_copies(self, state, others)

    def _settle(self) -> tuple[bool, bool]:
        """Under ``_lock``, after a call is done: (write the final record now, every call is done)."""
        all_done = self.sealed and self.done_count == len(self.calls)
        write_record = all_done and not self._record_saved
        if write_record:
            self._record_saved = True
            self.finished = self.finished or time.time()
        return write_record, all_done

    def record_attempt(self, state: CallState, attempt: int, sent: float) -> None:
        with self._lock:
            state.attempts.append([attempt, sent, None, None])
            state.sent_at = sent
            state.in_flight += 1
            if attempt > 1:
                self.retry_count += 1
                if self.progress is not None:
                    self.progress.retrying(state.call_id)

    def record_fault(self, state: CallState, attempt: int, kind: str) -> None:
        with self._lock:
            self._mark_attempt(state, attempt, kind)

    def _mark_attempt(self, state: CallState, attempt: int, outcome: str) -> None:
        for record in state.attempts:
            if record[0] == attempt and record[2] is None:
                record[2], record[3] = time.time(), outcome
                state.in_flight -= 1
                break

    def start_call(self, state: CallState) -> bool:
        """Claim a call for its first attempt; False when it must not run.

        The claim and the job's ``cancelled`` flag are read and set under one lock, so a call
        is either started here or cancelled by :meth:`cancel`, never both: a call a dispatch
        thread has taken runs and ends with its own result (``shutdown(cancel_futures=True)``
        cancels pending futures only, as the standard library's executors do).
        """
        with self._lock:
            if state.claimed or state.done:
                return False
            state.claimed = True
            cancel = self.cancelled
        if cancel:  # cancelled before any thread took it
            self._cancel_unstarted(state)
            return False
        try:
            running = state.future.set_running_or_notify_cancel()
        except RuntimeError:  # notified already (by its owner): treat as cancelled
            running = False
        if not running:  # the caller cancelled this future itself
            self.cancelled_before_start(state)
        return running

    def _cancel_unstarted(self, state: CallState) -> None:
        """Cancel the future of a call no thread started, and notify its waiters as an
        executor's worker would on pickup (``concurrent.futures.wait`` sees it then)."""
        if state.future.cancel():
            try:
                state.future.set_running_or_notify_cancel()
            except RuntimeError:  # notified already
                pass
        self.cancelled_before_start(state)

    def cancelled_before_start(self, state: CallState) -> None:
        with self._lock:
            newly_done = not state.done
            if newly_done:
                state.done = True
                self.done_count += 1
                state.payload = None
            write_record, all_done = self._settle()
        if write_record:
            self._save_record(final=True)
        if newly_done and self.completed is not None:
            self.completed.put(state)
        if all_done:
            self._after_done()

    def _after_done(self) -> None:
        with self._lock:
            self._check_all_done()

    def _check_all_done(self) -> None:
        if self.sealed and self.done_count == len(self.calls) and not self._all_done.is_set():
            self.finished = self.finished or time.time()  # set already if the record was written
            if self.progress is not None:  # before the waiters wake: the bar's last draw precedes their next line
                self.progress.close()
            self._all_done.set()
            self._wake.set()

    def _progress_update(self, n: int, failed: int, call_id: int | None = None) -> None:
        if self.progress is not None:
            self.progress.update(n, failed, call_id)

    # -- the job record (issue 8) ---------------------------------------------

    def _save_record_if_last(self) -> bool:
        """Write the full record once, when every call is done; True if this call wrote it."""
        with self._lock:
            if self._record_saved or not self.sealed or self.done_count != len(self.calls):
                return False
            self._record_saved = True
            self.finished = self.finished or time.time()
        self._save_record(final=True)
        return True

    def _save_record(self, final: bool) -> None:
        try:
            if final:
                records.write(self.client.store, records.build(self))
            else:
                records.write_index(self.client.store, records.started_summary(self))
        except Exception as e:  # results matter more than the record: warn, do not fail the job
            import warnings

            self.record_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"fnmap: could not write the record of job {self.id} to "
                          f"{self.client.store.url}: {self.record_error}", RuntimeWarning,
                          stacklevel=2)

    # -- results -------------------------------------------------------------

    def item_exception(self, state: CallState, offset: int, outcome: tuple) -> BaseException:
        """The exception an item raised remotely, ready to raise here (an ``Exception`` always)."""
        exc = unpack_exception(outcome[1], outcome[2])
        if not isinstance(exc, Exception):  # sys.exit, KeyboardInterrupt: the item's failure only
            exc = RemoteExit.of(exc, state.first_index + offset)
        exc.add_note(
            f"fnmap: raised remotely by item {state.first_index + offset} "
            f"(job {self.id}, {state.describe()})"
        )
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
            data = self.client.store.get(keys.log_key(self.id, state.call_id, attempt))
        except Exception:  # KeyNotFound (the call printed nothing) or storage trouble: no note
            return None
        return data.decode("utf-8", errors="replace")[-2000:]

    def wait(self, timeout: float | None = None) -> bool:
        return self._all_done.wait(timeout)

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
            raise
        except BaseException as exc:  # the call failed at platform level
            if not return_exceptions:
                raise
            return [exc] * state.n_items
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
                self._wake.wait()

    def cancel(self, stop_platform: bool = False) -> None:
        """Stop starting this job's calls: those no dispatch thread took yet are cancelled; those
        already running go on and end with their own results (retried after platform faults).

        ``stop_platform``: nobody wants the results any more (a map raised its first failure, or
        was interrupted): no more retries or copies, and the backend stops what it still runs
        where it can (Batch array jobs are terminated).
        """
        with self._lock:
            self.cancelled = True
            if stop_platform:
                self.abandoned = True
            unstarted = [s for s in self.calls if not s.claimed and not s.done]
            for state in unstarted:
                state.claimed = True
        for state in unstarted:
            self._cancel_unstarted(state)
        self._wake.set()
        if stop_platform and not self.done:
            try:
                self.client.backend.cancel(self.id)
            except Exception as e:  # the caller is already handling an error; say, do not mask it
                import warnings

                warnings.warn(f"fnmap: could not stop the platform's work for job {self.id}: {e}",
                              RuntimeWarning, stacklevel=3)

    def attempts_summary(self) -> dict:
        """Attempts per call, for the job summary: ``{call_id: [[attempt, sent, ended, outcome], ...]}``."""
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
            "storage": self.client.store.url,
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
        found = records.read_logs(self.client.store, self.id, call)
        return "".join(f"--- call {c} attempt {a} ---\n{text}"
                       + ("" if text.endswith("\n") else "\n") for c, a, text in found)

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


def _attempts_out(state: CallState) -> list[int]:
    """Under the job's lock: the call's attempts sent and not yet ended (copies still running)."""
    return [record[0] for record in state.attempts if record[2] is None]


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


def _raise_unpicklable(chunk: tuple, first_index: int) -> None:
    from .runtime.worker import MODE_ARGS

    mode, items = chunk
    for offset, item in enumerate(items):
        where = f"item {first_index + offset}"
        if mode == MODE_ARGS:  # (args, kwargs) of Executor.submit / starmap: name the argument
            args, kwargs = item
            for position, arg in enumerate(args):
                dumps_checked(arg, f"argument {position} of {where}")
            for name, arg in kwargs.items():
                dumps_checked(arg, f"keyword argument {name!r} of {where}")
        dumps_checked(item, where)
    raise SerializationError(f"the chunk starting at item {first_index} cannot be pickled")
