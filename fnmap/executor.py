"""``fnmap.Executor``: a real ``concurrent.futures.Executor`` over fnmap backends.

Every ``submit`` is one call of the executor's job; ``map`` chunks its items
the way ``ProcessPoolExecutor.map`` does.  Futures are real
``concurrent.futures.Future`` objects, so ``wait``, ``as_completed``, done
callbacks and Dask's own scheduler (``dask.compute(scheduler=Executor())``)
work unchanged.

At the program's end it behaves as the standard library's executors (CPython
``Lib/concurrent/futures/thread.py`` ``_python_exit``): work submitted and not
cancelled is finished before the interpreter exits, before the embedded
emulator is stopped (``threading._register_atexit`` callbacks run before
``atexit``'s), and ``submit`` raises ``RuntimeError`` from then on.  The job
keeps each call's bookkeeping, not its result: a result lives as long as the
caller keeps its future (bpo-14406).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import time
import weakref
from concurrent import futures
from concurrent.futures import Future

from . import policy
from .blocking import warn_if_you_wait
from .client import get_client
from .config import resolve
from .observe.output import show_call_output
from .runtime import forks
from .runtime import outcome as _outcome
from .runtime.wire import MODE_ARGS


class Executor(futures.Executor):
    """Run calls on an fnmap backend (the local emulator by default).

    Takes the same options as :func:`fnmap.map` (``backend``, ``storage``,
    ``timeout``, ``retries``, ...).  The backend starts (or is reused) when the
    executor is created, so a configuration mistake raises here.

    >>> import fnmap
    >>> with fnmap.Executor() as ex:
    ...     ex.submit(pow, 2, 10).result()
    1024
    """

    def __init__(self, **options):
        _register_exit_hook()  # raises once the interpreter is exiting, before a backend starts
        self._config = resolve(**options)
        self._client = get_client(self._config)
        #: How many calls run at once; Dask reads this to size its parallelism.
        self._max_workers = self._client.max_workers
        self._job = self._client.new_job(self._config, kind="executor")
        if self._config.cache is not None:  # cache=: each call's items are looked up before it is sent
            from .cache.plan import FunctionCaches

            self._job.cache = FunctionCaches(self._client.store, self._client.secret, self._job)
        self._shutdown = False
        self._lock = threading.Lock()
        self._index = itertools.count()
        #: The process whose client runs the calls: a forked child must make an executor of its own.
        self._pid = os.getpid()
        _open_jobs.add(self._job)

    @property
    def job(self):
        """The :class:`fnmap.jobs.Job` holding every call of this executor (summary, attempts)."""
        return self._job

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = AwaitableFuture()
        self._submit(fn, [(args, kwargs)], future, unwrap=True)
        return future

    def _submit(self, fn, items: list, future: Future, unwrap: bool):
        """Add one call of ``fn`` over ``items`` whose result goes to ``future``; its state."""
        if self._pid != os.getpid():
            raise RuntimeError(
                f"this fnmap.Executor was made in process {self._pid}, which this process was forked from: "
                "its job and the threads that send its calls are that process's; make a new "
                "fnmap.Executor() in this process")
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if _exiting:
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            func_key = self._client.upload_function(fn, self._job)
            first = next(self._index)
            for _ in range(len(items) - 1):
                next(self._index)
            cache = self._job.cache
            if cache is not None and cache.look_up_call(func_key, fn, MODE_ARGS, items, first):
                state = self._client.add_cached_call(self._job, func_key, first, len(items), _Link(future), unwrap)
            else:
                state = self._client.add_call(self._job, func_key, (MODE_ARGS, items), first, len(items),
                                              _Link(future), unwrap)
        self._client.submit(self._job, [state])
        if state.call_id == 0:
            _await_claim(state)
        elif state.call_id < self._client.max_workers:
            # The next first calls: let a dispatch thread take each now, as a standard executor's
            # worker takes a submitted item at once.  Later calls find the threads busy; sleep(0)
            # costs ~70 us, so not for them.
            time.sleep(0)
        return state

    def map(self, fn, *iterables, timeout=None, chunksize=1, buffersize=None):
        """Like ``Executor.map``: results in order, lazily; ``chunksize`` items per call."""
        _check_map_options(chunksize, buffersize)
        end_time = None if timeout is None else timeout + time.monotonic()
        chunks = policy.chunks(zip(*iterables), chunksize)  # noqa: B905 - the shortest iterable ends map, as in the stdlib
        first = chunks if buffersize is None else itertools.islice(chunks, buffersize)
        calls = collections.deque(self._submit_chunk(fn, chunk) for chunk in first)
        return self._results(fn, calls, None if buffersize is None else chunks, end_time)

    def _submit_chunk(self, fn, chunk) -> tuple:
        future = Future()
        return future, self._submit(fn, [(args, {}) for args in chunk], future, unwrap=False)

    def _results(self, fn, calls: collections.deque, more, end_time):
        """Each item's result in order, keeping none the caller was given (bpo-14406); a chunk of
        ``more`` is submitted for each one taken (``buffersize``); leaving early cancels the rest."""
        job = self._job
        try:
            while calls:
                future, state = calls.popleft()
                if more is not None and (chunk := next(more, None)) is not None:
                    calls.append(self._submit_chunk(fn, chunk))
                outcomes = _outcomes_or_cancel(future, end_time)
                values = _outcome.plain_values(outcomes)
                if values is not None:  # every item returned a value (the plain form)
                    values.reverse()  # popped from the end, so the chunk lets go of what it gave
                    while values:
                        yield values.pop()
                    continue
                outcomes.reverse()  # popped from the end, so the chunk lets go of what it gave
                offset = 0
                while outcomes:
                    yield _item_value(job, state, offset, outcomes.pop())
                    offset += 1
        finally:
            for future, _ in calls:
                future.cancel()

    def shutdown(self, wait=True, *, cancel_futures=False):
        if self._pid != os.getpid():  # a forked child's copy: the job is the parent's to finish
            self._shutdown = True
            return
        with self._lock:
            self._shutdown = True
            self._client.seal(self._job)
        if cancel_futures:
            self._job.cancel(stop_platform=False)
        if wait:
            futures.wait([s.future for s in self._job.run.calls])
            _open_jobs.discard(self._job)
            show_call_output(self._job)  # remote print() output of its calls (output="after")


class AwaitableFuture(Future):
    """The future of ``Executor.submit``: a real ``concurrent.futures.Future`` that a coroutine may
    also ``await`` (and ``asyncio.wait``, ``as_completed`` and ``gather`` take).  Awaited, it is
    wrapped in the awaiting loop (``asyncio.wrap_future``): cancelling the awaiting task cancels the
    call if it has not started, as ``future.cancel()`` does."""

    def result(self, timeout=None):
        if not self.done():
            warn_if_you_wait("future.result()", "await future")
        return super().result(timeout)

    def __await__(self):
        import asyncio

        return asyncio.wrap_future(self).__await__()

    def add_done_callback(self, fn, *, context=None) -> None:
        """As ``Future.add_done_callback``; a callback of asyncio's own (``asyncio.wait`` adds one to
        each future it is given) is called on its loop, as asyncio calls callbacks, not on the thread
        that completed the call."""
        loop = _asyncio_loop(fn)
        if loop is None:
            return super().add_done_callback(fn)

        def on_its_loop(future):
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(fn, future, context=context)

        on_its_loop.added = fn
        return super().add_done_callback(on_its_loop)

    def remove_done_callback(self, fn) -> int:
        """Remove callback ``fn`` (asyncio's futures have this; ``asyncio.wait`` calls it)."""
        with self._condition:
            kept = [c for c in self._done_callbacks if c is not fn and getattr(c, "added", None) is not fn]
            removed = len(self._done_callbacks) - len(kept)
            self._done_callbacks[:] = kept
        return removed


def _asyncio_loop(fn):
    """The running loop of this thread if ``fn`` is a callback of asyncio's own, else None."""
    if not getattr(fn, "__module__", "").startswith("asyncio."):
        return None
    import asyncio

    return asyncio.events._get_running_loop()


def _await_claim(state, limit: float = 1.0) -> None:
    """Wait (at most ``limit`` seconds) until a dispatch thread has taken an executor's first call,
    as a standard executor's worker takes its first item at once: submits then
    ``shutdown(cancel_futures=True)`` always leave that call to run (CPython's
    ``test_cancel_futures``: 'at least one finished').  A yield alone left every call cancelled
    when a loaded machine gave the dispatch thread no turn within the loop of submits."""
    deadline = time.monotonic() + limit
    while not (state.claimed or state.done) and time.monotonic() < deadline:
        time.sleep(0.0002)


def _check_map_options(chunksize, buffersize) -> None:
    if chunksize < 1:
        raise ValueError("chunksize must be >= 1.")
    if buffersize is not None and not isinstance(buffersize, int):
        raise TypeError("buffersize must be an integer or None")
    if buffersize is not None and buffersize < 1:
        raise ValueError("buffersize must be None or > 0")


def _outcomes_or_cancel(future: Future, end_time: float | None) -> list:
    """A chunk's outcomes; a chunk whose wait ended without them (the timeout) is cancelled, as the
    standard library's ``map`` cancels the future it waited on (``_base._result_or_cancel``)."""
    try:
        return future.result() if end_time is None else future.result(end_time - time.monotonic())
    finally:
        future.cancel()


def _item_value(job, state, offset: int, outcome: tuple):
    if _outcome.succeeded(outcome):
        return _outcome.value(outcome)
    raise job.item_exception(state, offset, outcome)


class _Link(Future):
    """What the job holds for a call of this executor in place of the caller's future.

    It passes the call's start, cancellation and result on to the caller's future, then lets go
    of it: the value stays only in the future the caller holds, so a result the caller dropped is
    freed (bpo-14406), while the job keeps its bookkeeping.  Until then it holds the caller's
    future, so done callbacks run even when the caller kept no reference (as a work item does).
    Done, it reads as a success with no value whatever the result: nothing reads its value.
    """

    def __init__(self, target: Future):
        super().__init__()
        self._target: Future | None = target

    def cancel(self) -> bool:
        target = self._target
        if target is not None:
            target.cancel()
        return super().cancel()

    def set_running_or_notify_cancel(self) -> bool:
        target = self._target
        if target is not None and not target.set_running_or_notify_cancel():  # the caller cancelled it
            self._target = None
            super().cancel()
        return super().set_running_or_notify_cancel()

    def set_result(self, result) -> None:
        self._pass_on(result=result)

    def set_exception(self, exception) -> None:
        self._pass_on(exception=exception)

    def _pass_on(self, result=None, exception=None) -> None:
        target, self._target = self._target, None
        if target is not None and not target.done():
            try:
                if exception is not None:
                    target.set_exception(exception)
                else:
                    target.set_result(result)
            except futures.InvalidStateError:  # lost a race with the caller's cancel()
                pass
        super().set_result(None)


# -- the program's end ------------------------------------------------------------------------

#: Set once the interpreter began to exit: ``submit`` raises from then on, as in the stdlib.
_exiting = False
_exit_lock = threading.Lock()
_registered = False
#: Executors' jobs whose calls the interpreter's exit waits for (dropped at ``shutdown(wait=True)``).
_open_jobs: weakref.WeakSet = weakref.WeakSet()


@forks.at_fork
def _forget_open_jobs() -> None:
    """In a forked child: the executors' jobs are the parent's, and so is waiting for them at exit."""
    global _exit_lock, _open_jobs
    forks.keep(_open_jobs)
    _exit_lock, _open_jobs = threading.Lock(), weakref.WeakSet()


def _register_exit_hook() -> None:
    """Have the interpreter's exit wait for the executors' calls (registered at the first executor:
    ``threading``'s exit hooks run last-registered first, so this one runs before those of the
    ``ThreadPoolExecutor``s fnmap's client uses); raise once the interpreter is exiting."""
    global _registered, _exiting
    with _exit_lock:
        if not _registered and not _exiting:
            try:
                threading._register_atexit(_finish_at_exit)
                _registered = True
            except RuntimeError:  # "can't register atexit after shutdown": the interpreter is exiting
                _exiting = True
        if _exiting:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")


def _finish_at_exit() -> None:
    """At interpreter exit (before ``atexit`` stops the embedded emulator): refuse new work, finish
    what every executor has pending (those cancelled, e.g. ``shutdown(cancel_futures=True)``, end
    at once), and show the calls' output as ``shutdown`` would."""
    global _exiting
    with _exit_lock:
        _exiting = True
        jobs = list(_open_jobs)
    for job in jobs:
        futures.wait([state.future for state in list(job.run.calls)])
        show_call_output(job)
