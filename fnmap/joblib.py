"""A joblib backend: scikit-learn's ``n_jobs`` (and any ``joblib.Parallel``) on fnmap.

>>> import joblib, fnmap.joblib                      # registers the "fnmap" backend
>>> from sklearn.model_selection import GridSearchCV
>>> with joblib.parallel_config(backend="fnmap", n_jobs=-1):    # fnmap options go here too
...     search = GridSearchCV(estimator, grid, cv=5).fit(X, y)

Written to joblib >= 1.5's ``submit`` API (``supports_retrieve_callback``), the one joblib calls:
a backend that only overrides ``apply_async`` on top of a pool backend is silently bypassed.
Each batch of joblib tasks (joblib sizes them from their durations) becomes one call of an
:class:`fnmap.Executor`, one per ``Parallel`` run: a managed ``with Parallel(...) as p:`` gets a
new one for each ``p(...)`` of its block (scikit-learn's successive-halving searches call it
several times).  Large arguments (NumPy arrays, pandas objects,
bytes over ``ref_nbytes``) go to the job's storage once, by content hash, and travel as references:
a 5-fold grid search uploads ``X`` and ``y`` once, not once per fit.  A task's exception reaches
joblib as the same type with the remote traceback as its cause; on an error, a timeout
(``Parallel(timeout=...)``) or an interrupt joblib aborts: what has not started is cancelled and
what runs is stopped where the platform can, so the next run does not wait behind it.

Registration is eager, on ``import fnmap.joblib``.  joblib's one hook for lazy backends,
``joblib.parallel.EXTERNAL_BACKENDS`` (how ``backend="dask"`` finds ``joblib._dask``), is a dict
inside ``joblib.parallel``: filling it from ``import fnmap`` would cost that import (about 250 ms)
to every fnmap user, or work only when joblib happened to be imported first; joblib reads no entry
points.  So the one line to write is the import.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from .runtime import forks, keys

try:
    from joblib.parallel import AutoBatchingMixin, ParallelBackendBase, ThreadingBackend, register_parallel_backend
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"fnmap.joblib needs joblib >= 1.5 ({e}); install it with: pip install 'fnmap[joblib]'") from e

#: Arguments larger than this (bytes) are stored once per job and sent by reference.
REF_NBYTES = 100_000
#: Stored arguments a worker process keeps in memory, newest last (a grid search reuses X, y).
_cache: dict[str, Any] = {}
_CACHE_ENTRIES = 8
_cache_lock = threading.Lock()


@forks.at_fork
def _new_cache_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent may have held it at the fork)."""
    global _cache_lock
    _cache_lock = threading.Lock()


class StoredArgument:
    """An argument left in storage: its key and the storage's URL."""

    __slots__ = ("key", "store_url")

    def __init__(self, key: str, store_url: str):
        self.key, self.store_url = key, store_url

    def __reduce__(self):
        return StoredArgument, (self.key, self.store_url)

    def load(self):
        """The argument (read once per worker process, then from memory)."""
        with _cache_lock:
            if self.key in _cache:
                return _cache[self.key]
        import pickle

        from .storage import open_store

        data = open_store(self.store_url).get(self.key)
        # The key names the SHA-256 of what the client stored, and it came in the signed request:
        # anything else (planted or altered in the bucket) is refused before it is unpickled.
        if hashlib.sha256(data).hexdigest() != keys.content_digest(self.key):
            from .runtime.signing import UnauthenticatedObject

            raise UnauthenticatedObject(f"stored joblib argument {self.key!r} does not have the SHA-256 its key "
                                        "names: it was planted or altered; refused, not unpickled")
        value = pickle.loads(data)
        with _cache_lock:
            _cache[self.key] = value
            while len(_cache) > _CACHE_ENTRIES:
                _cache.pop(next(iter(_cache)))
        return value


def run_batch(batch):
    """A joblib batch on a worker: stored arguments loaded, then every task run in order."""
    batch.items = [(func, [_load(a) for a in args], {k: _load(v) for k, v in kwargs.items()})
                   for func, args, kwargs in batch.items]
    return batch()


def _load(value):
    return value.load() if isinstance(value, StoredArgument) else value


def _nbytes(value) -> int:
    """Size of an argument worth storing once (arrays, frames, bytes); 0 for anything else."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    size = getattr(value, "nbytes", None)  # numpy arrays, pandas Series/Index
    if isinstance(size, int):
        return size
    usage = getattr(value, "memory_usage", None)  # pandas DataFrame
    if callable(usage) and type(value).__name__ == "DataFrame":
        return int(usage(index=True, deep=False).sum())
    return 0


class FnmapBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's parallel backend "fnmap"; keyword arguments are fnmap options (``backend=``,
    ``memory=``, ``timeout=``, ``storage=``...) plus ``ref_nbytes`` (see :data:`REF_NBYTES`)."""

    supports_retrieve_callback = True
    supports_timeout = True
    uses_threads = False
    supports_sharedmem = False
    default_n_jobs = -1

    def __init__(self, nesting_level=None, inner_max_num_threads=None, ref_nbytes: int = REF_NBYTES,
                 **fnmap_options):
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self.fnmap_options = fnmap_options
        self.ref_nbytes = ref_nbytes
        self.executor = None
        #: ``max_cost`` is one cap for every run on this backend (a ``parallel_config`` block: a
        #: successive-halving search is several runs), made when the first starts.
        self._cap = None
        self._refs: dict[int, tuple[Any, StoredArgument]] = {}
        self._store = None

    @property
    def jobs(self) -> list:
        """The fnmap job of every ``Parallel`` run on this backend (summary, record, cost)."""
        return self._cap.jobs if self._cap is not None else []

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None or n_jobs < 0:  # as many as the deployment runs at once
            from .client import get_client
            from .config import resolve

            return get_client(resolve(**self.fnmap_options)).max_workers
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **backend_kwargs):
        """Get ready for ``parallel``'s runs; returns the calls it runs at once.  Each run (each
        ``p(...)``, several within one ``with Parallel(...) as p:``) is one fnmap job, started by
        :meth:`start_call`.

        ``backend_kwargs`` are joblib's settings for its process pools (``temp_folder``,
        ``max_nbytes``, ``mmap_mode``...): there is no shared memory with a cloud worker, so they
        do not apply; fnmap's options come to the constructor (``parallel_config(backend="fnmap",
        **options)``)."""
        from .config import resolve
        from .storage import open_store

        self.parallel = parallel
        n_jobs = self.effective_n_jobs(n_jobs)
        self._store = open_store(resolve(**self.fnmap_options).storage_url)  # where the job's calls read
        return n_jobs

    def start_call(self):
        """A ``Parallel`` run begins: a new executor (one fnmap job) for its tasks."""
        from .config import resolve
        from .cost.shared import SharedCap

        self.stop_call()
        if self._cap is None:
            self._cap = SharedCap(resolve(**self.fnmap_options).max_cost, "the joblib backend's Parallel runs")
        self.executor = self._cap.executor(self.fnmap_options)
        self._refs = {}

    def submit(self, func, callback=None):
        """Send one joblib batch as one fnmap call, its large arguments by reference."""
        func.items = [(f, [self._by_reference(a) for a in args],
                       {k: self._by_reference(v) for k, v in kwargs.items()}) for f, args, kwargs in func.items]
        if self.executor is None:  # a joblib that does not call start_call
            self.start_call()
        future = self.executor.submit(run_batch, func)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def get_nested_backend(self):
        """A ``Parallel`` inside a task (a forest's ``n_jobs`` within a fit) runs in threads on the
        worker that runs the task: a worker has no client to start fnmap calls of its own, and this
        backend (its executor) is not sent to workers."""
        return ThreadingBackend(nesting_level=(self.nesting_level or 0) + 1), None

    def retrieve_result_callback(self, future):
        if self._cap is None:
            return future.result()
        with self._cap:  # a cost cap reached is told against the backend's cap, not what its last run was left
            return future.result()

    def _by_reference(self, value):
        if _nbytes(value) < self.ref_nbytes:
            return value
        known = self._refs.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        import pickle

        data = pickle.dumps(value, protocol=5)
        key = keys.joblib_argument_key(self.executor.job.id, hashlib.sha256(data).hexdigest())
        if not self._store.exists(key):
            self._store.put(key, data)
        ref = StoredArgument(key, self._store.url)
        self._refs[id(value)] = (value, ref)  # the value is kept, so its id is not reused meanwhile
        return ref

    def abort_everything(self, ensure_ready=True):
        """A task failed, the run timed out (``Parallel(timeout=...)``) or was interrupted: what has
        not started is cancelled and the calls still running are stopped where the platform can
        (the emulator kills their worker processes, Batch terminates their containers), so the
        next run starts on free workers.  The next run gets a new job either way."""
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
            executor.job.cancel(stop_platform=True)

    def stop_call(self):
        """The ``Parallel`` run is over: no more calls on its executor (those running end)."""
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def terminate(self):
        self.stop_call()
        self._refs = {}


register_parallel_backend("fnmap", FnmapBackend)
