"""The scheduler's monitor: timers, results of asynchronous calls, lost calls and the platform's
own failure reports.

:class:`Monitor` is built by the :class:`fnmap.scheduler.Scheduler` and handed what it needs: the
scheduler's lock (for the calls' ``awaiting`` attempts), ``decide`` (apply an attempt's event),
``speculate`` (the scheduler's look for stragglers) and the client's ``on_poll`` hook.  One thread
per client wakes for due timers (retries after their backoff, coalesced batches) and, with a
growing period, polls: results of calls accepted asynchronously are found with one LIST per job,
calls silent past their timeout are declared ``lost`` (a fault like any other), calls the
platform reports as failed are routed to ``decide``, and the scheduler looks for stragglers.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from .dispatch import Outcomes
from .errors import PlatformFault
from .runtime import keys
from .runtime.outcome import open_committed

#: Seconds past a call's timeout before an asynchronous call counts as lost.
LOST_GRACE_SECONDS = 10.0
#: The monitor's polling period grows from the first to the second value while nothing changes.
POLL_SECONDS = (0.05, 1.0)
#: Results of asynchronous calls read from storage at once by one poll.
FETCH_THREADS = 16


#: What a poll may meet and simply try again: storage, a key gone meanwhile, the platform's API.
TRANSIENT_ERRORS = (OSError, LookupError, PlatformFault)
_reported: set = set()


def _unless_transient(error: Exception, doing: str) -> None:
    """A poll failed: storage, platform and AWS errors are transient (the next poll tries again);
    anything else is a bug that would otherwise show only as a job that never ends, so say it (once)."""
    if isinstance(error, TRANSIENT_ERRORS) or type(error).__module__.startswith(("botocore", "boto3", "urllib3")):
        return
    where = (doing, type(error).__name__)
    if where not in _reported:
        _reported.add(where)
        warnings.warn(f"fnmap: {doing} failed with {type(error).__name__}: {error} (a bug in fnmap: please "
                      "report it); the monitor tries again at the next poll", RuntimeWarning, stacklevel=2)


class Monitor:
    """Watches the running jobs of one scheduler from one thread, started on first need."""

    def __init__(self, backend, store, secret: bytes, lock, *, decide, speculate, on_poll=None,
                 on_poll_seconds: float = 1.0):
        self.backend = backend
        self.store = store
        self.secret = secret
        #: The scheduler's lock, held while a call's ``awaiting`` attempts are taken.
        self._lock = lock
        #: ``decide(job, state, attempt, event)``: apply an attempt's event (results, a fault).
        self._decide = decide
        #: ``speculate(job)``: send speculative copies of the job's stragglers, if it has any.
        self._speculate = speculate
        #: Called for each active job every ``on_poll_seconds`` at most (the client's look for
        #: ``fnmap cancel`` requests), or None.
        self._on_poll = on_poll
        self._on_poll_seconds = on_poll_seconds
        self.closed = False
        #: Retries and coalesced batches waiting for their time: ``(due, seq, action, job, states)``.
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._wake = threading.Condition()
        self._active: set = set()
        self._monitor: threading.Thread | None = None
        #: Threads that read asynchronous calls' results from storage (started on first need).
        self._fetchers = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="fnmap-fetch")

    def watch(self, job) -> None:
        """Watch ``job`` until it is done (its calls were added)."""
        if job not in self._active:
            with self._wake:
                self._active.add(job)
            self._ensure_monitor()

    def close(self) -> None:
        self.closed = True
        self._fetchers.shutdown(wait=False)
        with self._wake:
            self._wake.notify()

    def after(self, delay: float, action, job, states) -> None:
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
                self.poll(job)
            except Exception as e:  # a storage hiccup: the next poll tries again
                _unless_transient(e, f"polling job {job.id}")
            self._speculate(job)
            self._run_hook(job)
        try:
            self._platform_failures(jobs)
        except Exception as e:  # the platform's status API hiccupped: the next poll asks again
            _unless_transient(e, "asking the platform for failed calls")

    def _run_hook(self, job) -> None:
        """The client's per-job look (``on_poll``), every ``on_poll_seconds`` at most."""
        now = time.monotonic()
        if self._on_poll is None or job.run.abandoned or now - job.run.polled_at < self._on_poll_seconds:
            return
        job.run.polled_at = now
        self._on_poll(job)

    def poll(self, job) -> None:
        """Results of this job's calls accepted asynchronously (one LIST), and lost calls."""
        waiting = [s for s in job.run.calls if s.awaiting and not s.done]  # a glance; decided under the lock below
        if not waiting:
            return
        finished = {keys.call_id_from_key(k) for k in self.store.list(keys.results_prefix(job.id))}
        now = time.time()
        lost_after = job.config.timeout + LOST_GRACE_SECONDS if job.config.timeout else self.backend.lost_after
        if self.backend.watches_calls:  # the platform reports failed calls itself (poll_failures)
            lost_after = self.backend.lost_after
        done = [state for state in waiting if state.call_id in finished]
        for state, outcomes in zip(done, self._fetch_results(job, done), strict=True):
            with self._lock:
                attempt = max(state.awaiting) if state.awaiting else state.next_attempt - 1
                state.awaiting = None
            self._decide(job, state, attempt, Outcomes(outcomes, None))
        if lost_after is None:
            return
        for state in waiting:
            if state.call_id in finished:
                continue
            lost = []
            with self._lock:
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
            return open_committed(self.secret, key, self.store.get(key))

        if len(states) < 2:
            return [fetch(state) for state in states]
        return self._fetchers.map(fetch, states)

    def _platform_failures(self, jobs: list) -> None:
        """Route the calls the platform reports as failed to ``decide`` (retry or fail)."""
        by_id = {job.id: job for job in jobs}
        for failure in self.backend.poll_failures():
            job = by_id.get(failure.job_id)
            if job is None or not 0 <= failure.call_id < len(job.run.calls):
                continue
            state = job.run.calls[failure.call_id]
            with self._lock:
                if state.done or not state.awaiting or failure.attempt not in state.awaiting:
                    continue
                del state.awaiting[failure.attempt]
            self._decide(job, state, failure.attempt, failure.fault)
