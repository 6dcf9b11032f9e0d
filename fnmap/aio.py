"""The asyncio twins of fnmap's front ends: ``await fnmap.map.aio(...)``, ``async for r in
fnmap.imap.aio(...)``.

Each takes the same arguments and options and gives the same results, errors and job records as
its blocking form, which it runs on fnmap's own loop and threads (:mod:`fnmap.loop`): the
caller's loop is never blocked.  ``fnmap.map.aio``, ``starmap.aio`` and ``map_reduce.aio`` are
coroutines; ``imap.aio`` and ``imap_unordered.aio`` are async generators whose items may be an
async iterable too (read on the caller's loop as the job asks for them; with ``buffersize`` at
most that many ahead of the results taken).  Cancelling the awaiting task (``task.cancel()``,
``asyncio.wait_for``'s timeout) or closing an ``imap.aio`` early (``aclose()``, leaving an
``async with contextlib.aclosing(...)``) cancels the job as Ctrl-C cancels the blocking form.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

from . import api
from .config import resolve
from .loop import EMPTY, Inbox, run_blocking, runner, sync_items
from .scopes import Scope

#: How often a stream's thread, waiting for the reader to take a result, looks whether it stopped.
_CREDIT_CHECK_SECONDS = 0.25


async def map(func: Callable, items, **kwargs: Any):
    """``await fnmap.map.aio(func, items, **options)``: :func:`fnmap.map` without blocking the loop
    (``items`` may be an async iterable)."""
    import asyncio  # here, not at the top: a plain fnmap.map, whose twin this is, loads no asyncio

    stopped = threading.Event()
    try:
        return await run_blocking(api.map, func, sync_items(items, asyncio.get_running_loop(), stopped), **kwargs)
    finally:
        stopped.set()


async def starmap(func: Callable, iterable, **kwargs: Any):
    """``await fnmap.starmap.aio(func, iterable, **options)``: :func:`fnmap.starmap` without blocking the loop."""
    import asyncio

    stopped = threading.Event()
    try:
        return await run_blocking(api.starmap, func, sync_items(iterable, asyncio.get_running_loop(), stopped),
                                  **kwargs)
    finally:
        stopped.set()


async def map_reduce(map_func: Callable, items, reduce_func: Callable, **kwargs: Any):
    """``await fnmap.map_reduce.aio(...)``: :func:`fnmap.map_reduce` without blocking the loop;
    a cancel stops the level running and starts no other."""
    return await run_blocking(api.map_reduce, map_func, items, reduce_func, **kwargs)


def imap(func: Callable, items, *, return_exceptions: bool = False, buffersize: int | None = None,
         **options: Any):
    """``async for r in fnmap.imap.aio(func, items, **options)``: results in input order as they come."""
    return _stream(func, items, options, True, return_exceptions, buffersize)


def imap_unordered(func: Callable, items, *, return_exceptions: bool = False, buffersize: int | None = None,
                   **options: Any):
    """``async for r in fnmap.imap_unordered.aio(func, items, **options)``: results as calls finish."""
    return _stream(func, items, options, False, return_exceptions, buffersize)


async def _stream(func, items, options: dict, ordered: bool, return_exceptions: bool, buffersize):
    """The results of an ``imap`` job run by a thread of fnmap's: batched into this loop, or one
    at a time as they are asked for with ``buffersize`` (then the job reads ahead at most that)."""
    import asyncio

    loop = asyncio.get_running_loop()
    inbox = Inbox(loop)
    stopped = threading.Event()
    credits = threading.Semaphore(0) if buffersize is not None else None
    scope = Scope("the async iteration over its results was closed or cancelled")

    def start() -> tuple:
        config = resolve(**options)
        return api.start_stream(func, sync_items(items, loop, stopped), config, ordered, return_exceptions,
                                buffersize)

    runner().pool.submit(scope.run, _pump, start, inbox, stopped, credits)
    ended = False  # the thread said the results ended (all given, or an error raised here)
    try:
        while True:
            if credits is not None:
                credits.release()  # the thread may take one more result from the job
            try:
                value = inbox.get_nowait()  # those of a batch already in: no wait, no coroutine
                if value is EMPTY:
                    value = await inbox.get()
            except StopAsyncIteration:
                ended = True
                return
            except BaseException as e:
                ended = not isinstance(e, asyncio.CancelledError)
                raise
            yield value
    finally:
        stopped.set()
        if not ended:  # stopped early: the job is cancelled, as Ctrl-C cancels imap
            await asyncio.wrap_future(runner().pool.submit(scope.cancel))


def _pump(start: Callable, inbox: Inbox, stopped: threading.Event, credits) -> None:
    """On a thread of fnmap's: start the job, and put its results in ``inbox`` until it ends or stops."""
    try:
        job, results = start()
        try:
            while not stopped.is_set():
                if credits is not None and not credits.acquire(timeout=_CREDIT_CHECK_SECONDS):
                    continue
                try:
                    value = next(results)
                except StopIteration:
                    break
                inbox.put(value)
        finally:
            if stopped.is_set() and not job.done:  # its record says why: the reader stopped
                job.stop(CancelledError("the async iteration over its results was closed"))
            results.close()  # left early: the job is cancelled
    except BaseException as e:
        inbox.end(e)
    else:
        inbox.end()


def _twin(blocking: Callable, aio: Callable) -> None:
    """Hang ``aio`` on ``blocking`` as its ``.aio``."""
    aio.__qualname__ = f"{blocking.__name__}.aio"
    blocking.aio = aio


_twin(api.map, map)
_twin(api.starmap, starmap)
_twin(api.map_reduce, map_reduce)
_twin(api.imap, imap)
_twin(api.imap_unordered, imap_unordered)
