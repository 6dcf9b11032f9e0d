"""The client: one per deployment (backend + storage + secret), shared by every job of the process.

It holds what jobs share (the backend and its emulator or connections, the store, the signing
secret, the functions uploaded so far) and offers the front-ends (``fnmap.map``, the ``Executor``,
the Dask shim, ``map_reduce``) one small API: :meth:`Client.new_job`, :meth:`Client.add_call`,
:meth:`Client.submit`, :meth:`Client.seal`.  Everything that happens to a call after it is
submitted is the :class:`fnmap.scheduler.Scheduler`'s.  What makes a job durable stays beside
this path: a front-end hands :meth:`Client.new_job` a :class:`Recorder` for a job whose calls are
stored for a redrive, and the job holds its own lease (:mod:`fnmap.lease`).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from .backends import create_backend
from .chunk_pickle import dump_chunk
from .errors import STORAGE_REFUSED_ERRNOS, ConfigError, KeyNotFound, StorageError, storage_fix
from .jobs import Job
from .run import CallRun
from .runtime import cancel, forks, keys
from .runtime.serialization import parts_size, pickle_function
from .runtime.setup import with_initializer
from .scheduler import Scheduler
from .scopes import adopt
from .storage import open_store

#: Seconds between two looks for a ``fnmap cancel`` request of a running job.
CANCEL_CHECK_SECONDS = 1.0
#: Threads storing a map's large inputs at once (SHA-256 and file writes release the GIL).
INPUT_THREADS = 4


class Recorder(Protocol):
    """What stores a job's calls and items as they are sent, so that they can be run again from
    another process (:class:`fnmap.recorder.StorageRecorder`): the front-end that starts the job hands
    one to :meth:`Client.new_job`, and the client calls it beside the send path."""

    def record_items(self, job: Job, mode: str, parts: list) -> None:
        """The pickle (``parts``) of every item of an automatically chunked ``job``, at its start."""

    def record_calls(self, job: Job, states: list[CallRun]) -> None:
        """What these calls of ``job`` run, before they are sent; a failure is the recorder's to report."""

    def redrive(self, job: Job, **options) -> Job:
        """Run the calls of ``job`` that have no committed result, as ``fnmap redrive`` does; the running job."""


class Client:
    def __init__(self, config):
        self.config = config
        self.store = open_store(config.storage_url, config.storage_origin)
        self.backend = create_backend(config)
        secret = config.secret.encode() if config.secret else self.backend.secret
        if not secret:
            raise ConfigError(
                f"the {config.backend} backend needs the deployment's shared secret to sign requests: "
                "set FNMAP_SECRET (or secret=...) to the value the deploy script printed"
            )
        self.secret = secret
        self.max_workers = self.backend.max_workers
        self.scheduler = Scheduler(self.backend, self.store, secret, on_poll=self._cancel_if_asked,
                                   on_poll_seconds=CANCEL_CHECK_SECONDS)
        #: Shared objects this process stored or found: key -> the job it last looked for.
        self._uploaded: dict[str, str] = {}
        #: Threads that store a map's large inputs (a pool starts its threads on first use).
        self._inputs = ThreadPoolExecutor(INPUT_THREADS, thread_name_prefix="fnmap-store")

    @property
    def closed(self) -> bool:
        return self.scheduler.closed

    # -- the front-ends' API -------------------------------------------------------

    def new_job(self, config, kind: str = "map", *, function=None, stream: bool = False,
                speculate_open: bool = False, job_id: str | None = None, created: float | None = None,
                recorder: Recorder | None = None, first_run: dict | None = None) -> Job:
        """A new, empty job of this deployment (``kind`` names the front-end in its record,
        ``function`` the job in ``fnmap jobs``; ``stream``: its calls are handed on as they are
        done, for ``imap``; ``speculate_open``: stragglers get copies before it is sealed;
        ``job_id``/``created``: those of a job run again, a redrive or a named job; ``recorder``:
        what stores its calls and items for a redrive, or None; ``first_run``: the summary of the
        job run again, whose "started by" and "from" the job keeps).

        Its "running" index entry is written now, before any function or input is looked up: a
        ``fnmap gc`` in another process then sees a job being built and keeps every shared object
        (one small PUT per job; it is rewritten with the counts when the job is sealed)."""
        job = Job(self.scheduler, self.store, config, kind, function=function, stream=stream,
                  speculate_open=speculate_open, job_id=job_id, created=created, recorder=recorder,
                  first_run=first_run)
        adopt(job)  # an awaited call's jobs: cancelling the task that awaits it stops them (fnmap.scopes)
        job.save_record(final=False)
        return job

    def upload_function(self, func, job: Job) -> str:
        """Pickle ``func`` and store it under its content hash, for ``job`` (looked up once per job)."""
        if not callable(func):
            raise TypeError(f"fnmap needs a callable to run, got {type(func).__name__}: {func!r:.100}")
        digest, data = pickle_function(with_initializer(func, job.config))
        key = keys.function_key(digest)
        self._put_shared(key, data, job, "store the function")
        return key

    def _put_shared(self, key: str, data: bytes | list, job: Job, doing: str) -> None:
        """Store a content-addressed object (a function) unless it is there, looked up once per job:
        ``fnmap gc`` removes those no job uses, so a later job looks again.  A job names it in its
        index entry from its first call on, and gc keeps what kept jobs name."""
        if self._uploaded.get(key) == job.id:
            return
        with self.storage_errors(doing):
            if not self.store.exists(key):
                self.store.put(key, data)
        self._uploaded[key] = job.id

    def add_call(self, job: Job, func_key: str, chunk: tuple, first_index: int, n_items: int,
                 future: Future | None = None, unwrap: bool = False, stores: list | None = None,
                 plain: bool = False) -> CallRun:
        """Pickle a chunk (storing it if it is large) and add the call to ``job``; not sent until
        :meth:`submit`.  An item that cannot be pickled is named, with its index, before anything runs.

        ``stores``: store a large chunk on the client's input threads and add the pending store
        here; the caller calls :meth:`finish_stores` before submitting (a map stores its inputs
        two or more at a time: hashing and writing release the GIL).  ``plain``: the caller
        checked that no item is a large ``bytes`` (a pass over every item saved per chunk)."""
        parts, _ = dump_chunk(chunk, first_index, plain)  # an item that cannot be pickled is named
        by_reference = parts_size(parts) > job.config.inline_limit
        payload = b"" if by_reference else parts[0] if len(parts) == 1 else b"".join(parts)
        state = CallRun(len(job.run.calls), first_index, n_items, func_key, payload, None, future or Future(), unwrap)
        if by_reference and stores is None:
            self._store_input(state, parts, job)
        elif by_reference:
            stores.append(self._inputs.submit(self._store_input, state, parts, job))
        self.scheduler.add(job, state)
        return state

    def add_cached_call(self, job: Job, func_key: str, first_index: int, n_items: int,
                        future: Future | None = None, unwrap: bool = False) -> CallRun:
        """Add to ``job`` a call of items ``first_index..`` that the result cache answered (their
        values are taken from ``job.cache``): never sent, it is decided when :meth:`submit` sees it.
        Its outcomes are committed as its result, as a worker's would be (one PUT for the run of
        hits), so ``fnmap.job(ID).results()``, a named job's re-attach and a redrive find them; a
        recorded job records the call first (its items' range, answered by the cache), so a redrive
        never sends its id over other items (:mod:`fnmap.redrive`)."""
        from .runtime import compression, outcome, signing
        from .runtime.outcome import dump_all

        cache = job.cache
        state = CallRun.answered(len(job.run.calls), first_index, n_items, func_key, future or Future(), unwrap,
                                 cache.origins(first_index, n_items), outcome.all_ok(cache.take(first_index, n_items)))
        if job.recorder is not None:
            job.recorder.record_calls(job, [state])
        key = keys.result_key(job.id, state.call_id)
        with self.storage_errors("store the result of a call the cache answered"):
            self.store.put_if_absent(key, signing.seal(self.secret, key, compression.pack(dump_all(state.result))))
        self.scheduler.add(job, state)
        return state

    def add_answered_call(self, job: Job, call: tuple, result, future: Future | None = None) -> CallRun:
        """Add to ``job``, under its own id, a call of an earlier run that the result cache answered
        (``call``: its :class:`fnmap.recorder.CallRecord`), with ``result``, its committed outcomes: a
        redrive's, never sent."""
        if call.call_id != len(job.run.calls):
            raise ValueError(f"call {call.call_id} of job {job.id} added as call {len(job.run.calls)}: "
                             "add them in order")
        state = CallRun.answered(call.call_id, call.first_index, call.n_items, call.func_key, future or Future(),
                                 False, call.cached, result)
        self.scheduler.add(job, state)
        return state

    def use_cache(self, job: Job, func) -> None:
        """Give ``job`` (run with ``cache=``) its :class:`fnmap.cache.plan.JobCache`."""
        from .cache.plan import JobCache

        job.cache = JobCache(self.store, self.secret, job.id, func, job.config)

    def add_stored_call(self, job: Job, call_id: int, first_index: int, n_items: int, func_key: str,
                        items_key: str | None, payload: bytes, future: Future | None = None,
                        first_attempt: int = 1) -> CallRun:
        """Add to ``job`` a call whose input is pickled already (inline ``payload``, or stored at
        ``items_key``), under its own id: a redrive sends a stopped job's calls again, numbering
        their attempts from ``first_attempt`` (after those of the runs before)."""
        if call_id != len(job.run.calls):
            raise ValueError(f"call {call_id} of job {job.id} added as call {len(job.run.calls)}: add them in order")
        state = CallRun(call_id, first_index, n_items, func_key, payload, items_key, future or Future(), False,
                        first_attempt)
        self.scheduler.add(job, state)
        return state

    def add_items(self, job: Job, mode: str, items: list) -> tuple[int, bool]:
        """Pickle every item of an automatically chunked ``job`` (its feed pickles its chunks as it
        runs, so this is what names an item that cannot be pickled before anything runs) and hand
        the pickle to the job's recorder.  Returns its size in bytes and whether no item is a large
        ``bytes`` that travels out of band (the feed's chunks then skip that scan: :meth:`add_call`'s
        ``plain``)."""
        parts, plain = dump_chunk((mode, items))  # large buffers are not copied
        if job.recorder is not None:
            with self.storage_errors("store the items of the map"):
                job.recorder.record_items(job, mode, parts)
        return parts_size(parts), plain

    def _store_input(self, state: CallRun, parts: list, job: Job) -> None:
        """Store a call's chunk for that call under its SHA-256, which authenticates it (the call's
        signed request names the key; the worker checks the bytes against it before unpickling),
        and name it in the call; its large buffers go from the caller's memory to storage without a
        copy (``dump_parts``).  The worker that commits the call's result deletes it."""
        digest = hashlib.sha256()
        for part in parts:  # the GIL is released while each buffer is hashed: stores run on threads
            digest.update(part)
        items_key = keys.input_key(job.id, state.call_id, digest.hexdigest())
        with self.storage_errors("store the input of the call"):
            self.store.put(items_key, parts)
        self.scheduler.input_stored(state, items_key)

    @staticmethod
    def finish_stores(stores: list, abandon: bool = False) -> None:
        """Wait until every pending store of :meth:`add_call` has ended and raise the first error;
        ``abandon``: the job will not run, so cancel those not started and raise nothing."""
        for pending in stores if abandon else ():
            pending.cancel()
        futures.wait(stores)
        for pending in stores if not abandon else ():
            pending.result()

    def submit(self, job: Job, states: list[CallRun]) -> None:
        """Send these calls of ``job``; their futures complete as they finish."""
        if job.recorder is not None:  # what they run, stored first: a redrive can run them again
            sent = [s for s in states if s.cached is None]  # a cache hit runs nothing
            if sent:
                job.recorder.record_calls(job, sent)
        self.scheduler.submit(job, states)

    def seal(self, job: Job) -> None:
        """No more calls will be added to ``job``."""
        self.scheduler.seal(job)

    def setup_failed(self, job: Job, error: BaseException) -> None:
        """``job`` could not be set up (``error``): nothing runs, its record says why."""
        self.scheduler.setup_failed(job, f"{type(error).__name__}: {error}")

    def use_feed(self, job: Job, feed) -> None:
        """``feed`` makes the calls of ``job`` as it runs (see :mod:`fnmap.feed`)."""
        self.scheduler.use_feed(job, feed)

    def show_progress(self, job: Job, progress) -> None:
        """Show ``job``'s calls on ``progress`` (a bar from ``make_progress``, or None)."""
        self.scheduler.show_progress(job, progress)

    @contextlib.contextmanager
    def storage_errors(self, doing: str):
        """Turn a refused write into a :class:`StorageError` naming the storage, the setting it came
        from and the fix (a raw ``OSError: Read-only file system: '.../functions'`` named none)."""
        try:
            yield
        except OSError as e:
            if isinstance(e, (KeyNotFound, StorageError)):  # a StorageError says all this already
                raise
            where = self.config.storage_origin
            fix = storage_fix(e) if e.errno in STORAGE_REFUSED_ERRNOS else "check that the storage is reachable"
            err = StorageError(f"cannot {doing} in {self.store.url}, {where}: "
                               f"{e.strerror or e} ({getattr(e, 'filename', None) or ''}); {fix}")
            err.errno = e.errno
            raise err from e

    def _cancel_if_asked(self, job: Job) -> None:
        """Called by the scheduler's monitor for each running job, every ``CANCEL_CHECK_SECONDS`` at
        most: stop it if ``fnmap cancel`` (from any process that reaches the storage) asked to."""
        reason = cancel.cancel_requested(self.store, job.id)
        if reason:
            self.scheduler.cancel(job, stop_platform=True, reason=reason)

    def close(self) -> None:
        self.scheduler.close()
        self.backend.close()
        self._inputs.shutdown(wait=False)


_clients: dict[tuple, Client] = {}
_clients_lock = threading.Lock()


@forks.at_fork
def _forget_clients() -> None:
    """In a forked child: the parent's clients (their threads, locks and connections) are the
    parent's; the child's first job makes its own."""
    global _clients, _clients_lock
    forks.keep(_clients)
    _clients, _clients_lock = {}, threading.Lock()


def get_client(config) -> Client:
    """The process-wide client for a deployment (created on first use)."""
    key = config.deployment_key()
    with _clients_lock:
        client = _clients.get(key)
        if client is not None and not client.closed and not _usable(client):
            client.close()  # its emulator is gone (killed): a new client starts a new one
        if client is None or client.closed:
            client = _clients[key] = Client(config)
        return client


def _usable(client: Client) -> bool:
    return client.backend.usable()
