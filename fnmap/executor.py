"""``fnmap.Executor``: a real ``concurrent.futures.Executor`` over fnmap backends.

Every ``submit`` is one call of the executor's job; ``map`` chunks its items
the way ``ProcessPoolExecutor.map`` does.  Futures are real
``concurrent.futures.Future`` objects, so ``wait``, ``as_completed``, done
callbacks and Dask's own scheduler (``dask.compute(scheduler=Executor())``)
work unchanged.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent import futures
from concurrent.futures import Future

from . import policy
from .client import get_client
from .config import resolve
from .observe.output import show_call_output
from .runtime.worker import MODE_ARGS


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
        self._config = resolve(**options)
        self._client = get_client(self._config)
        #: How many calls run at once; Dask reads this to size its parallelism.
        self._max_workers = self._client.max_workers
        self._job = self._client.new_job(self._config, kind="executor")
        self._shutdown = False
        self._lock = threading.Lock()
        self._index = itertools.count()

    @property
    def job(self):
        """The :class:`fnmap.jobs.Job` holding every call of this executor (summary, attempts)."""
        return self._job

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        self._submit(fn, [(args, kwargs)], future, unwrap=True)
        return future

    def _submit(self, fn, items: list, future: Future, unwrap: bool) -> Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            func_key = self._client.upload_function(fn, self._job)
            first = next(self._index)
            for _ in range(len(items) - 1):
                next(self._index)
            state = self._client.add_call(self._job, func_key, (MODE_ARGS, items), first, len(items), future, unwrap)
        self._client.submit(self._job, [state])
        return future

    def map(self, fn, *iterables, timeout=None, chunksize=1, buffersize=None):
        """Like ``Executor.map``: results in order, lazily; ``chunksize`` items per call."""
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None:
            if not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
        end_time = None if timeout is None else timeout + time.monotonic()
        chunks = policy.chunks(zip(*iterables), chunksize)  # noqa: B905 - the shortest iterable ends map, as in the stdlib

        def submit_chunk(chunk):
            return self._submit(fn, [(args, {}) for args in chunk], Future(), unwrap=False)

        if buffersize is None:
            fs = collections.deque(submit_chunk(c) for c in chunks)
        else:
            fs = collections.deque(submit_chunk(c) for c in itertools.islice(chunks, buffersize))

        job = self._job

        def result_iterator():
            try:
                while fs:
                    f = fs.popleft()
                    if buffersize is not None:
                        nxt = next(chunks, None)
                        if nxt is not None:
                            fs.append(submit_chunk(nxt))
                    if end_time is None:
                        outcomes = f.result()
                    else:
                        outcomes = f.result(end_time - time.monotonic())
                    state = _state_of(job, f)
                    for offset, outcome in enumerate(outcomes):
                        if outcome[0] == "ok":
                            yield outcome[1]
                        else:
                            raise job.item_exception(state, offset, outcome)
            finally:
                for f in fs:
                    f.cancel()

        return result_iterator()

    def shutdown(self, wait=True, *, cancel_futures=False):
        with self._lock:
            self._shutdown = True
            self._client.seal(self._job)
        if cancel_futures:
            self._job.cancel()
        if wait:
            futures.wait([s.future for s in self._job.calls])
            show_call_output(self._job)  # remote print() output of its calls (output="after", issue 14)


def _state_of(job, future):
    for state in job.calls:  # only on the error path of a chunked map
        if state.future is future:
            return state
    raise LookupError("future not found in the executor's job")
