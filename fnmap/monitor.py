"""The scheduler's monitor: timers, results of asynchronous calls, lost calls, the platform's own
failure reports and speculative copies of stragglers (a part of :class:`fnmap.scheduler.Scheduler`).

One thread per client wakes for due timers (retries after their backoff, coalesced batches) and,
with a growing period, polls: results of calls accepted asynchronously are found with one LIST per
job, calls silent past their timeout are declared ``lost`` (a fault like any other), calls the
platform reports as failed are routed to ``_decide``, and stragglers get a speculative copy once
most of the job is done.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from . import policy
from .dispatch import Outcomes
from .errors import PlatformFault
from .runtime import compression, keys, signing
from .runtime.serialization import loads

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
    """The monitoring half of the scheduler (mixed into :class:`fnmap.scheduler.Scheduler`)."""

    def _start_monitor(self) -> None:
        #: Retries and coalesced batches waiting for their time: ``(due, seq, action, job, states)``.
        self._timers: list = []
        self._timer_seq = itertools.count()
        self._wake = threading.Condition()
        self._active: set = set()
        self._monitor: threading.Thread | None = None
        #: Called by the monitor for each active job, every ``on_poll_seconds`` at most (the
        #: client's look for ``fnmap cancel`` requests).
        self.on_poll = None
        self.on_poll_seconds = 1.0
        #: Threads that read asynchronous calls' results from storage (started on first need).
        self._fetchers = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="fnmap-fetch")

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
        if self.on_poll is None or job.run.abandoned or now - job.run.polled_at < self.on_poll_seconds:
            return
        job.run.polled_at = now
        self.on_poll(job)

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
        open speculates only if its front-end asks (``speculate_open``: a Dask graph, whose
        frontier waiting on a few slow tasks is when a copy helps most, issue 4); an Executor's
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
            self._queue(self._send, job, state)
