"""The run state of a job and of its calls: what the scheduler decided, written by it alone.

:class:`JobRun` (one per job) and :class:`CallRun` (one per call) hold the counters, flags,
attempts (:class:`Attempt`, one per send) and errors of a job while it runs.  The
:class:`fnmap.scheduler.Scheduler` (with the two parts it builds, :class:`fnmap.dispatch.Dispatch`
and :class:`fnmap.monitor.Monitor`) is the only writer, under its lock; everyone else reads: the
user's :class:`fnmap.jobs.Job` handle (``job.run``), the job record, the feed, the front-ends.
``tests/test_run_state_owner.py`` checks that no other module assigns these fields.  A call's
definition (its items, function, future) is given when it is made; its ``items_key``, known once
its input is stored, is handed over with :meth:`Scheduler.input_stored`.
"""

from __future__ import annotations

import threading
import time

#: How an attempt ended when another attempt of its call decided the call first: a copy that lost
#: the race, or an attempt still out when a copy answered (it is stopped where the platform can).
SUPERSEDED = "superseded"
#: How attempts that ended with the item's own results are recorded (``error``: some items raised).
ANSWERED = ("ok", "error")


class Attempt:
    """One send of a call, written by the scheduler alone: its number, when it was sent and ended,
    how it ended (:attr:`ending`) and the memory it asked for; ``copy`` marks a speculative copy
    sent while another attempt of the call was still out (a copy is not a retry)."""

    __slots__ = ("number", "sent", "ended", "ending", "memory", "copy", "reserved")

    def __init__(self, number: int, sent: float, memory: int | None = None, copy: bool = False):
        self.number = number
        self.sent = sent
        self.ended: float | None = None
        #: How it ended: ``"ok"``, ``"error"`` (some items raised), a fault kind, ``"cancelled"``, or
        #: :data:`SUPERSEDED`; None while it is out.
        self.ending: str | None = None
        self.memory = memory
        self.copy = copy
        #: What the job's budget reserved for this attempt while it is out (``max_cost``), or None.
        self.reserved: float | None = None

    @property
    def open(self) -> bool:
        """Sent and not ended yet."""
        return self.ended is None

    def as_list(self) -> list:
        """``[attempt, sent, ended, ending, memory MB or None]``, as ``Job.attempts_summary`` gives it."""
        return [self.number, self.sent, self.ended, self.ending, self.memory]

    def __repr__(self) -> str:
        copy = " copy" if self.copy else ""
        return f"<Attempt {self.number}{copy} sent={self.sent} ended={self.ended} ending={self.ending}>"


class CallRun:
    """One call (one chunk of items): its definition, then its attempts and fate."""

    __slots__ = (
        "call_id", "first_index", "n_items", "func_key", "payload", "items_key", "future",
        "unwrap", "attempts", "first_attempt", "next_attempt", "sent_at", "in_flight", "done", "speculated",
        "stats", "awaiting", "charged", "claimed", "result", "memory_step", "cancelled", "crash_exits",
        "cached",
    )

    def __init__(self, call_id, first_index, n_items, func_key, payload, items_key, future, unwrap, first_attempt=1):
        self.call_id = call_id
        self.first_index = first_index
        self.n_items = n_items
        self.func_key = func_key
        self.payload = payload
        self.items_key = items_key
        self.future = future
        self.unwrap = unwrap
        #: One :class:`Attempt` per send, in order.
        self.attempts: list[Attempt] = []
        #: The number of its first attempt in this run: 1, or after the attempts of an earlier run of
        #: its job (a redrive), so that no two attempts of a call ever share a number.
        self.first_attempt = first_attempt
        self.next_attempt = first_attempt
        self.sent_at = 0.0
        self.in_flight = 0
        self.done = False
        self.speculated = False
        self.stats: dict | None = None
        #: Attempt number -> time, for attempts accepted asynchronously whose result is in storage.
        self.awaiting: dict[int, float] | None = None
        #: Faults that used up one of ``retries`` (429s and speculative copies use none).
        self.charged = 0
        #: Set, under the scheduler's lock, by whoever settles the first attempt's fate: a dispatch
        #: thread starting the call, or the scheduler cancelling it (never both).
        self.claimed = False
        #: The call's item outcomes, or the fault that failed the call, until they are delivered.
        self.result = None
        #: Index into the job's ``memory`` steps that the next attempt runs with (out of memory climbs it).
        self.memory_step = 0
        #: The call ended cancelled (never started, or stopped with its abandoned job): not a failure.
        self.cancelled = False
        #: How its worker died on each attempt that crashed (:func:`fnmap.policy.crash_exit`), in order.
        self.crash_exits: list[str | None] = []
        #: A call answered from the result cache, never sent: where its items came from,
        #: ``[[first item, count, job id], ...]`` (:meth:`fnmap.cache.plan.JobCache.origins`); else None.
        self.cached: list | None = None

    @classmethod
    def answered(cls, call_id, first_index, n_items, func_key, future, unwrap, origins: list, result) -> CallRun:
        """A call the result cache answered: never sent, its ``result`` known and its items'
        ``origins`` (:attr:`cached`) set from the start; the scheduler decides it when it is submitted."""
        state = cls(call_id, first_index, n_items, func_key, b"", None, future, unwrap)
        state.cached, state.result = origins, result
        return state

    def describe(self) -> str:
        last = self.first_index + self.n_items - 1
        items = f"item {self.first_index}" if self.n_items == 1 else f"items {self.first_index}..{last}"
        return f"call {self.call_id} ({items})"

    def attempt(self, number: int) -> Attempt | None:
        """The attempt numbered ``number``, or None."""
        for record in self.attempts:
            if record.number == number:
                return record
        return None

    def attempt_memory(self, attempt: int) -> int | None:
        """The memory (MB) attempt ``attempt`` was sent with (None: the platform's own)."""
        record = self.attempt(attempt)
        return record.memory if record is not None else None

    def open_attempts(self) -> list[int]:
        """The numbers of the attempts sent and not ended."""
        return [record.number for record in self.attempts if record.ended is None]

    def end_attempt(self, attempt: int, ending: str) -> None:
        """Under the lock: attempt ``attempt`` ended as ``ending`` (nothing if it ended already)."""
        for record in self.attempts:
            if record.number == attempt and record.ended is None:
                record.ended, record.ending = time.time(), str(ending)
                self.in_flight -= 1
                return

    def end_open_attempts(self) -> list[int]:
        """Under the lock, once the call is decided: the attempts still out end as superseded (their
        late answers are duplicates); their numbers, for the platform to stop them."""
        others = self.open_attempts()
        for attempt in others:
            self.end_attempt(attempt, SUPERSEDED)
        return others


class JobRun:
    """The scheduler's state of one job (see the module's docstring)."""

    __slots__ = (
        "calls", "sealed", "cancelled", "abandoned", "stopped_attempts", "speculate_open", "cancel_reason",
        "done_count", "failed_count", "cancelled_count", "retry_count", "copy_count", "duplicate_count",
        "durations", "call_errors", "record_saved", "finished", "setup_error", "feed", "progress",
        "completed", "polled_at", "all_done", "wake", "budget",
    )

    def __init__(self, speculate_open: bool = False, stream: bool = False):
        self.calls: list[CallRun] = []
        self.sealed = False
        #: No call starts any more; calls already started complete with their own results.
        self.cancelled = False
        #: Nobody waits for the results any more: no retries, no copies, failures are final.
        self.abandoned = False
        #: ``(call id, attempt)`` stopped because the job was abandoned: they end as cancelled.
        self.stopped_attempts: set[tuple[int, int]] = set()
        #: Stragglers get speculative copies before the job is sealed (the Dask shim asks for it).
        self.speculate_open = speculate_open
        #: Who asked another process to stop this job (``fnmap cancel``), once the client saw it.
        self.cancel_reason: str | None = None
        #: Calls decided (finished, failed or cancelled); items that failed; calls cancelled.
        self.done_count = 0
        self.failed_count = 0
        self.cancelled_count = 0
        #: Attempts after the first sent because the ones before failed (retries), sent while
        #: another was still out (speculative copies), and answers after the call was decided.
        self.retry_count = 0
        self.copy_count = 0
        self.duplicate_count = 0
        self.durations: list[float] = []
        #: Call id -> (status, "Type: message"[, traceback]) of calls that failed.
        self.call_errors: dict[int, tuple] = {}
        self.record_saved = False
        self.finished: float | None = None
        #: Why nothing ran (an item that does not pickle, a function that does not), for the record.
        self.setup_error: str | None = None
        #: The :class:`fnmap.feed.ChunkFeed` making this job's calls as it runs (``chunksize`` unset).
        self.feed = None
        #: The job's progress bar, once its calls are made (None: no bar).
        self.progress = None
        #: A queue that receives each call when it is done, for ``fnmap.imap`` (None: no cost).
        self.completed = None
        if stream:
            import queue

            self.completed = queue.SimpleQueue()
        #: When the monitor last ran the client's per-job hook (``fnmap cancel`` requests).
        self.polled_at = 0.0
        #: Set when every call is done and no more will come.
        self.all_done = threading.Event()
        #: Set when every call is done or a call failed: what ``results`` waits on (fail fast).
        self.wake = threading.Event()
        #: The job's :class:`fnmap.cost.budget.Budget` when it runs with ``max_cost``, else None.
        self.budget = None
