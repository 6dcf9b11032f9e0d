"""The event loop fnmap owns, in a thread of its own, and the bridge between it and the caller's.

The ``.aio`` front ends (:mod:`fnmap.aio`) never run fnmap's work on the caller's loop: pickling
the function and the items, storage and HTTP all block.  As Dask's ``LoopRunner`` and Cubed's
``asyncio_run`` do, fnmap keeps a loop of its own (:func:`runner`) in a daemon thread, with a pool
of threads for what blocks.  An awaited call (:func:`run_blocking`) is a task on fnmap's loop that
runs the blocking front end on a pool thread, inside a :class:`fnmap.scopes.Scope` holding the jobs
it makes; the caller's loop only waits for one future.  Cancelling the caller's task cancels
fnmap's task, which stops the scope's jobs (as Ctrl-C stops the blocking form) before the
caller's ``CancelledError`` is raised; ``asyncio.shield`` keeps them running.

Results that stream (``imap.aio``) come through an :class:`Inbox`: a pool thread takes them from the
job and puts them in, and the caller's loop is woken with one ``call_soon_threadsafe`` for every
batch that arrived meanwhile, not one per result.  An async iterable of items is read on the
caller's loop (where it lives) one item at a time, as the job's thread asks (:func:`sync_items`).
The blocking forms need no loop at all, so they work unchanged inside a running one (a notebook
cell, ``asyncio.run``) without ``nest_asyncio``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .errors import RemoteTraceback
from .runtime import forks
from .scopes import Scope

if TYPE_CHECKING:
    import asyncio

#: Threads that run the blocking steps of awaited calls (one for each call waiting on its job).
POOL_THREADS = 256
#: How often a thread waiting on the caller's loop for an item looks whether it was stopped.
_STOP_CHECK_SECONDS = 0.25


class _Runner:
    """fnmap's event loop, running in a daemon thread, and its pool of threads for blocking work."""

    def __init__(self):
        import asyncio  # here, not at the top: a plain fnmap.map, which hangs the twins, loads no asyncio

        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="fnmap-aio")
        self.loop.set_default_executor(self.pool)
        self.thread = threading.Thread(target=self.loop.run_forever, name="fnmap-asyncio", daemon=True)
        self.thread.start()


_runner: _Runner | None = None
_runner_lock = threading.Lock()


def runner() -> _Runner:
    """fnmap's loop and pool (started on first use)."""
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = _Runner()
        return _runner


@forks.at_fork
def _forget_runner() -> None:
    """In a forked child: the loop's thread is the parent's; the child's first awaited call starts its own."""
    global _runner, _runner_lock
    forks.keep(_runner)
    _runner, _runner_lock = None, threading.Lock()


def from_the_caller(exc: BaseException) -> BaseException:
    """An exception an item raised remotely, made to start at the caller's ``await`` (as the
    blocking forms make it start at the caller's line): fnmap's frames are dropped."""
    if isinstance(exc, Exception) and isinstance(exc.__cause__, RemoteTraceback):
        cause = exc.__cause__
        exc = exc.with_traceback(None)
        exc.__cause__ = cause
    return exc


async def run_blocking(fn, /, *args, **kwargs):
    """Await ``fn(*args, **kwargs)`` (a blocking front end) run by fnmap's loop on one of its
    threads; cancelling the awaiting task stops the jobs it made, then raises ``CancelledError``."""
    import asyncio

    scope = Scope("the task awaiting it was cancelled")
    run = runner()
    done = concurrent.futures.Future()
    tasks: list = []

    def begin() -> None:  # on fnmap's loop
        task = run.loop.create_task(_on_a_thread(scope, fn, args, kwargs))
        task.add_done_callback(lambda t: _settle(done, t))
        tasks.append(task)

    run.loop.call_soon_threadsafe(begin)
    waiting = asyncio.wrap_future(done)
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        if not done.done():
            run.loop.call_soon_threadsafe(lambda: tasks[0].cancel())  # after begin(): same queue
            with contextlib.suppress(BaseException):
                await waiting  # its jobs are stopped when fnmap's task ends
        raise
    except Exception as e:
        raise from_the_caller(e) from e.__cause__


async def _on_a_thread(scope: Scope, fn, args: tuple, kwargs: dict):
    """fnmap's task for one awaited call: ``fn`` on a pool thread; a cancel stops the scope's jobs."""
    import asyncio

    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, lambda: scope.run(fn, *args, **kwargs))
    except asyncio.CancelledError:
        await loop.run_in_executor(None, scope.cancel)
        raise


def _settle(done: concurrent.futures.Future, task: asyncio.Task) -> None:
    if task.cancelled():
        done.cancel()
    elif task.exception() is not None:
        done.set_exception(task.exception())
    else:
        done.set_result(task.result())


class Inbox:
    """Results put in by a thread, taken by a coroutine on ``loop``; the loop is woken once per
    batch (what arrived since it last took), never once per result."""

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._arrived: list = []
        self._woken = False
        self._ready: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None

    def put(self, value) -> None:
        """From any thread: one more result."""
        with self._lock:
            self._arrived.append(value)
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody takes it
            self._loop.call_soon_threadsafe(self._take_arrived)

    def end(self, error: BaseException | None = None) -> None:
        """From any thread: no more results (``error``: raised after those put in)."""
        self.put(self._END if error is None else _Failed(error))

    def _take_arrived(self) -> None:
        with self._lock:
            arrived, self._arrived, self._woken = self._arrived, [], False
        self._ready.extend(arrived)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self):
        """The next result; StopAsyncIteration after the last, or the error that ended them."""
        while not self._ready:
            self._waiter = self._loop.create_future()
            await self._waiter
        return self.get_nowait()

    def get_nowait(self):
        """As :meth:`get`, without waiting: :data:`EMPTY` when no result is in yet."""
        if not self._ready:
            return EMPTY
        value = self._ready.popleft()
        if value is self._END:
            self._ready.appendleft(value)
            raise StopAsyncIteration
        if isinstance(value, _Failed):
            self._ready.appendleft(value)
            raise from_the_caller(value.error) from value.error.__cause__
        return value


#: What :meth:`Inbox.get_nowait` gives when no result is in.
EMPTY = object()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def sync_items(items, loop: asyncio.AbstractEventLoop, stopped: threading.Event):
    """``items`` for a blocking front end: an async iterable is read on ``loop`` (the caller's,
    where it lives), one item each time the job's thread asks; any other iterable as it is."""
    if not hasattr(items, "__aiter__"):
        return items
    return _pulled(items.__aiter__(), loop, stopped)


def _pulled(iterator, loop: asyncio.AbstractEventLoop, stopped: threading.Event):
    import asyncio

    while True:
        pending = asyncio.run_coroutine_threadsafe(_next(iterator), loop)
        while True:
            try:
                more, item = pending.result(_STOP_CHECK_SECONDS)
                break
            except concurrent.futures.TimeoutError:
                if stopped.is_set():
                    pending.cancel()
                    return
        if not more:
            return
        yield item


async def _next(iterator) -> tuple:
    try:
        return True, await iterator.__anext__()
    except StopAsyncIteration:
        return False, None
