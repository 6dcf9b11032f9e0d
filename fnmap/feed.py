"""Automatic chunking: a job's calls made while it runs, each sized to the backend's call duration.

A map with ``chunksize`` unset (the default) gives its items to a :class:`ChunkFeed` instead of
cutting them into equal chunks up front. The feed keeps one call per dispatch slot of the
backend outstanding (fewer where the platform runs fewer at once, :func:`parallelism`): it
starts with one-item calls (so a few slow items still spread over the workers), and whenever a
call ends it measures it (the worker's time, else send to answer) and makes the next call, sized
by :class:`fnmap.policy.ChunkSizer` to the backend's ``call_seconds`` (joblib's
``batch_size="auto"``). The last call it makes seals the job. A failure to store a large chunk
fails the items in no call yet, as one call with a ``storage`` fault.

Invariants the front-ends rely on:

* every item is pickled once before anything runs, only to check that it pickles
  (:meth:`fnmap.client.Client.add_items`), so a bad item is named and nothing ran;
* a call's successors are added to ``job.run.calls`` before its own result is delivered, so a
  reader walking ``job.run.calls`` in order (``results``, ``imap``) never reaches the end early;
* a cancelled job's items that are in no call yet become one cancelled call (:meth:`stop`),
  so the record, ``results()`` and ``fnmap.job(ID).results()`` still have one entry per item.
"""

from __future__ import annotations

import threading

from .errors import PlatformFault
from .jobs import ResultSlot
from .policy import ChunkSizer
from .run import ANSWERED, CallRun


class ChunkFeed:
    """Makes the calls of one automatically chunked job from its list of items."""

    def __init__(self, client, job, func_key: str, mode: str, items: list, items_bytes: int = 0,
                 plain: bool = False):
        self._client = client
        self._job = job
        self._func_key = func_key
        self._mode = mode
        self._items = items
        #: No item is a large ``bytes``: chunks are pickled without looking for one (``Client.add_call``).
        self._plain = plain
        self.total = len(items)
        self.sizer = ChunkSizer(client.backend.call_seconds, parallelism(client.backend),
                                item_bytes=items_bytes / max(1, self.total))
        self._lock = threading.Lock()
        #: Index of the first item in no call yet.
        self._next = 0
        self._outstanding = 0
        self._sealed = False
        #: With a result cache: the first index of each run of hits or misses, and the runs.
        runs = job.cache.runs(0, self.total) if job.cache is not None else []
        self._run_starts = [first for _hit, first, _n in runs]
        self._runs = runs

    def start(self, stores: list | None = None) -> list[CallRun]:
        """The first calls (one item each, one per dispatch slot), to submit; large inputs are
        stored on the client's input threads (``stores``, see ``Client.add_call``)."""
        with self._lock:
            return self._make_calls(stores)

    def seal_if_complete(self) -> bool:
        """Whether every item is in a call now and nobody sealed the job yet (the caller seals it)."""
        with self._lock:
            return self._take_seal()

    def call_done(self, state: CallRun) -> None:
        """A call of the job ended (the scheduler calls this before delivering its result):
        measure it and make the calls that keep every dispatch slot busy."""
        if state.cached is not None:  # answered by the cache when it was made: never outstanding
            return
        seconds = _answer_seconds(state)
        with self._lock:
            self._outstanding -= 1
            if seconds is not None:
                self.sizer.observe(state.n_items, seconds)
            failed = error = None
            try:
                new = [] if self._job.run.cancelled else self._make_calls(None)
            except Exception as e:  # storing a large input failed: the rest fail with it
                new, failed, error = [], self._rest_as_one_call(), e
                self._outstanding += failed is not None
            seal = self._take_seal()
        if new:
            self._client.submit(self._job, new)
        if failed is not None:
            fault = PlatformFault("storage", f"{type(error).__name__}: {error}")
            self._client.scheduler.fail(self._job, failed, fault)
        if seal:
            self._client.seal(self._job)

    def stop(self) -> None:
        """The job is cancelled: its items in no call yet become one call (cancelled with the
        job's other unstarted calls), and the job is sealed."""
        with self._lock:
            self._rest_as_one_call()
            seal = self._take_seal()
        if seal:
            self._client.seal(self._job)

    # -- under the lock ----------------------------------------------------------

    def _make_calls(self, stores: list | None) -> list[CallRun]:
        new = []
        while self._outstanding < self.sizer.parallelism and self._next < self.total:
            first = self._next
            hit, run_end = self._run_at(first)
            if hit:  # a run of cache hits: one call, never sent, not outstanding
                new.append(self._client.add_cached_call(self._job, self._func_key, first, run_end - first,
                                                        ResultSlot()))
                self._next = run_end
                continue
            size = min(self.sizer.next_size(self.total - self._next), run_end - first)
            chunk = self._items[first:first + size]
            new.append(self._client.add_call(self._job, self._func_key, (self._mode, chunk), first, size,
                                             ResultSlot(), stores=stores, plain=self._plain))
            self._next += size
            self._outstanding += 1
        if self._next >= self.total:
            self._items = []  # every item is in a call: hold no reference to them any more
        return new

    def _run_at(self, index: int) -> tuple[bool, int]:
        """Whether item ``index`` is a cache hit, and where its run of hits or misses ends."""
        if not self._runs:
            return False, self.total
        import bisect

        hit, first, n = self._runs[bisect.bisect_right(self._run_starts, index) - 1]
        return hit, first + n

    def _rest_as_one_call(self) -> CallRun | None:
        """The items in no call yet as one call that is never sent (nothing pickled)."""
        rest = self.total - self._next
        if rest <= 0:
            return None
        state = CallRun(len(self._job.run.calls), self._next, rest, self._func_key, b"", None, ResultSlot(), False)
        self._client.scheduler.add(self._job, state)
        self._next = self.total
        self._items = []
        return state

    def _take_seal(self) -> bool:
        if self._sealed or self._next < self.total:
            return False
        self._sealed = True
        return True


def parallelism(backend) -> int:
    """Calls of a job kept outstanding: the backend's dispatch slots, or fewer where the platform
    says it runs fewer at once (``platform_concurrency``, e.g. a Lambda function's reserved
    concurrency): more one-item calls than it runs would wait in its queue before any larger call
    was measured (2,000 items on a 2-environment Lambda took 3.9x the best chunksize that way)."""
    slots = backend.max_workers
    platform = backend.platform_concurrency
    return max(1, min(slots, platform)) if isinstance(platform, int) and platform > 0 else slots


def _answer_seconds(state: CallRun) -> float | None:
    """How long the call took: the worker's own time (load, run, write the result) where it said,
    else from the send of the attempt that answered to its answer (results found in storage);
    None if no attempt answered.  The worker's time leaves out the wait for a free worker, which
    depends on the calls ahead of this one, not on its size."""
    stats = state.stats
    if stats and stats.get("written") is not None and stats.get("started") is not None:
        return stats["written"] - stats["started"]
    for attempt in reversed(state.attempts):
        if attempt.ended is not None and attempt.ending in ANSWERED:
            return attempt.ended - attempt.sent
    return None
