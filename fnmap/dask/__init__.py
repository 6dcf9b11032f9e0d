"""Dask scheduler shim: ``dask.compute(x, scheduler=fnmap.dask.get)`` runs a whole graph on fnmap.

``get(dsk, keys)`` follows Dask's scheduler ``get`` specification.  It is an
event loop in the client, like ``dask.local.get_async``, with three changes
that make it fit serverless calls (see :mod:`fnmap.dask.plan` for the graph
side and :mod:`fnmap.runtime.dask_tasks` for the worker side):

* **Fewer, fuller invocations.**  Linear chains are fused into one unit, and
  ready units (in ``dask.order`` priority) share a call up to about
  ``TARGET_CALL_SECONDS`` of measured work, at most ``ceil(ready / (2 *
  slots))`` of them (*factoring*, Hummel, Schonberg & Flynn 1992, so that the
  last calls of a layer are short and the workers finish together).  A unit
  of a kind (Dask's key prefix) not yet measured goes alone, which measures
  it.  A wide layer of tiny tasks thus costs a handful of calls, while tasks
  of a second or more still run one per call.
* **Reductions travel with their inputs.**  When the next ready unit feeds a
  single unit whose other inputs are all ready or available too, and enough
  other units are ready to keep the remaining call slots busy, the producers
  and their consumer share one call: the producers' outputs stay in the
  worker's memory (a matrix product's partial blocks never reach storage).
* **No waves.**  A unit is dispatched as soon as its last input exists and a
  call slot is free, not when the slowest task of its level is done.
* **Values by reference.**  Intermediate values stay in object storage
  (under the job's ``blobs/dask/`` folder); only small ones travel inline.
  The client downloads the requested keys only.  A stored value is deleted
  once every unit reading it is done (as ``dask.local`` releases data), and
  whatever is left when the computation ends, failed or not.

Retries, ``retry_on`` and ``timeout`` of the fnmap configuration apply to each
call (one batch of tasks), through the same client as ``fnmap.map``.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import math
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import dask
from dask.callbacks import local_callbacks, unpack_callbacks
from dask.local import nested_get
from dask.utils import key_split

from ..client import get_client
from ..config import OPTIONS, resolve
from ..errors import SerializationError
from ..observe.progress import make_progress
from ..runtime import keys as _keys
from ..runtime import outcome as _outcome
from ..runtime import signing
from ..runtime.dask_tasks import Batch, BatchResult, Stored, run_batch
from ..runtime.serialization import dumps, dumps_checked, loads
from ..runtime.wire import MODE_ONE
from .plan import Plan, make_plan, requested_keys

__all__ = ["get", "RunStats", "collect_stats"]

#: Values whose pickle is at most this many bytes travel inline; larger ones stay in storage.
INLINE_BYTES = 64 << 10
#: Most units in one invocation, and the measured work one invocation aims at.
MAX_BATCH = 128
TARGET_CALL_SECONDS = 0.2
_DASK_OPTIONS = ("cache", "callbacks", "num_workers")


@dataclass
class RunStats:
    """What one ``get`` did: see :func:`collect_stats`."""

    job_id: str = ""
    tasks: int = 0
    units: int = 0
    #: Invocations (calls), and attempts including retries and speculative copies.
    calls: int = 0
    attempts: int = 0
    #: Bytes of values written to storage by workers and by the client (data uploaded once).
    bytes_stored: int = 0
    #: Bytes of stored values read back by workers, and by the client (requested keys).
    bytes_loaded: int = 0
    bytes_fetched: int = 0
    #: Bytes of the calls' own objects in storage: result records, and inputs too big to inline.
    call_bytes: int = 0
    wall_seconds: float = 0.0

    @property
    def storage_bytes(self) -> int:
        """Every byte written to or read from storage."""
        return self.bytes_stored + self.bytes_loaded + self.bytes_fetched + self.call_bytes


_collectors: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "fnmap_dask_stats", default=None
)


@contextlib.contextmanager
def collect_stats():
    """Collect a :class:`RunStats` for every ``get`` run inside the block.

    >>> import dask.array as da, fnmap.dask
    >>> with fnmap.dask.collect_stats() as runs:
    ...     da.ones(10, chunks=5).sum().compute(scheduler=fnmap.dask.get)
    np.float64(10.0)
    >>> runs[0].calls >= 1
    True
    """
    runs: list[RunStats] = []
    token = _collectors.set(runs)
    try:
        yield runs
    finally:
        _collectors.reset(token)


def get(dsk, keys, **kwargs):
    """Compute ``keys`` of the Dask graph ``dsk`` on an fnmap backend (Dask's ``get`` spec).

    Keywords: fnmap options (``backend``, ``storage``, ``timeout``, ``retries``,
    ``retry_on``, ``progress``, ...; the usual configuration fills the rest),
    and Dask's ``cache`` (values known already), ``callbacks``,
    ``num_workers`` (most calls in flight; default: the backend's) and
    ``inline_bytes`` (largest pickled value sent inline, default 64 KiB).

    A failing task raises its own exception, with the task's key in a note.
    Dask callbacks (``dask.diagnostics.ProgressBar``, ``Profiler``) see every
    task; ``posttask`` gets the value only for values small enough to travel
    inline, else ``None``, since the client never downloads the others.

    >>> import fnmap.dask
    >>> fnmap.dask.get({"x": 1, "y": (abs, -2), "z": (max, "x", "y")}, "z")
    2
    """
    unknown = sorted(set(kwargs) - set(OPTIONS) - set(_DASK_OPTIONS) - {"inline_bytes"})
    if unknown:
        raise TypeError(
            f"fnmap.dask.get() got unknown keyword(s) {', '.join(map(repr, unknown))}; it takes "
            f"Dask's {', '.join(_DASK_OPTIONS)}, inline_bytes, and fnmap's options: "
            f"{', '.join(OPTIONS)}"
        )
    # ``cache`` is Dask's here (values known already), not fnmap's result cache, which the shim does not use.
    config = resolve(**{k: v for k, v in kwargs.items() if k in OPTIONS and k not in _DASK_OPTIONS})
    num_workers = kwargs.get("num_workers") or dask.config.get("num_workers", None)
    inline_bytes = kwargs.get("inline_bytes", INLINE_BYTES)
    for name, value, least in (("num_workers", num_workers, 1), ("inline_bytes", inline_bytes, 0)):
        if value is not None and (type(value) is not int or value < least):
            raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    wanted = requested_keys(keys)
    plan = make_plan(dsk, wanted, kwargs.get("cache"))
    run = _Run(plan, config, num_workers, inline_bytes)
    collector = _collectors.get()
    try:
        with local_callbacks(kwargs.get("callbacks")) as callbacks:
            values = run.execute(wanted, callbacks)
    finally:
        if collector is not None:
            collector.append(run.stats)
    return nested_get(keys, values)


class _Run:
    """The state of one ``get``: which keys have values, what is ready, what is in flight."""

    def __init__(self, plan: Plan, config, num_workers: int | None, inline_bytes: int):
        self.plan = plan
        self.config = config
        self.client = get_client(config)
        self.store = self.client.store
        self.slots = max(1, num_workers or self.client.max_workers)
        self.inline_bytes = inline_bytes
        self.job = None
        self.progress = None
        self.units_done = 0
        #: Key -> pickled bytes or Stored: what a worker gets for that key.
        self.remote: dict = {}
        self.local = dict(plan.data)
        self.missing = {uid: len(needs) for uid, needs in plan.needs.items()}
        self.ready: list[tuple[int, int]] = []  # heap of (priority, unit id)
        self.dispatched: set[int] = set()
        self.sent: dict[int, list[int]] = {}  # call id -> unit ids
        self.done: queue.Queue = queue.Queue()
        self.stored: set[str] = set()  # storage keys of values not deleted yet
        self.deleter: ThreadPoolExecutor | None = None  # deletes values no unit reads any more
        self.uploads = 0
        self.keep: set = set()  # keys (alias targets) the caller asked for
        self.readers: dict = {}  # key (alias target) -> units yet to read it
        for needs in plan.needs.values():
            for key in needs:
                root = self._root(key)
                self.readers[root] = self.readers.get(root, 0) + 1
        self.durations: dict[str, list] = {}  # key prefix -> [seconds, units] measured
        self.stats = RunStats(tasks=plan.n_tasks, units=len(plan.units))
        self.state = {  # Dask's scheduler state, for callbacks (ProgressBar reads these)
            "dependencies": plan.dependencies, "dependents": {}, "cache": {},
            "waiting": {k: set(d) for k, d in plan.dependencies.items()},
            "waiting_data": {}, "ready": [], "running": set(), "finished": set(), "released": set(),
        }

    def execute(self, wanted: list, callbacks) -> dict:
        started = time.time()
        _, start_state, pretask, posttask, _ = unpack_callbacks(callbacks)
        self.pretask, self.posttask = pretask, posttask
        started_cbs, failed = [], True
        self.keep = {self._root(k) for k in wanted}
        try:
            for cb in callbacks:
                if cb[0]:
                    cb[0](self.plan.graph)
                started_cbs.append(cb)
            for f in start_state:
                f(self.plan.graph, self.state)
            if self.plan.units:
                self._start_job()
            for uid, n in self.missing.items():
                if not n:
                    heapq.heappush(self.ready, (self.plan.priority[uid], uid))
            for key in list(self.local):
                self._resolved(key)
            while self.ready or self.sent:
                self._fire()
                self._collect(self.done.get())
            if self.units_done != len(self.plan.units):
                raise ValueError("Found no accessible jobs in dask: the graph has a cycle")
            values = self._fetch(wanted)
            failed = False
            return values
        finally:
            for cb in started_cbs:
                if cb[4]:
                    cb[4](self.plan.graph, self.state, failed)
            self._finish(failed)
            self.stats.wall_seconds = time.time() - started

    # -- dispatch ------------------------------------------------------------

    def _start_job(self) -> None:
        # Copies before the job is sealed: the graph's frontier is what waits on a straggler.
        self.job = self.client.new_job(self.config, kind="dask", speculate_open=True)
        self.func_key = self.client.upload_function(run_batch, self.job)
        self.prefix = _keys.blob_key(self.job.id, "dask/")
        self.progress = make_progress(self.config.progress, self.plan.n_tasks, "fnmap dask")
        self.stats.job_id = self.job.id

    def _resolved(self, key) -> None:
        """``key`` has a value now: release what waited for it."""
        for alias in self.plan.alias_waiters.get(key, ()):
            self._alias(alias, key)
        for waiter in self.plan.waiters.get(key, ()):
            if waiter in self.dispatched:  # it ran in the same call as this key's producer
                continue
            self.missing[waiter] -= 1
            if not self.missing[waiter]:
                heapq.heappush(self.ready, (self.plan.priority[waiter], waiter))

    def _alias(self, alias, target) -> None:
        if target in self.local:
            self.local[alias] = self.local[target]
        if target in self.remote:
            self.remote[alias] = self.remote[target]
        self._resolved(alias)

    def _fire(self) -> None:
        while self.ready and len(self.sent) < self.slots:
            group = self._group()
            if group:
                taken = set(group)
                self.ready = [entry for entry in self.ready if entry[1] not in taken]
                heapq.heapify(self.ready)
                self._send(group)
                continue
            cap = min(MAX_BATCH, math.ceil(len(self.ready) / (2 * self.slots)))
            uids, work = [], 0.0
            while self.ready and len(uids) < cap:
                estimate = self._estimate(self.ready[0][1])
                if uids and (estimate is None or work + estimate > TARGET_CALL_SECONDS):
                    break
                uids.append(heapq.heappop(self.ready)[1])
                work += TARGET_CALL_SECONDS if estimate is None else estimate
            self._send(uids)

    def _group(self) -> list[int] | None:
        """The next ready unit, its consumer's other producers and the consumer, or None."""
        head = self.plan.units[self.ready[0][1]]
        consumers = self.plan.waiters.get(head.output, ())
        if len(consumers) != 1 or head.output in self.keep:
            return None
        if self.plan.alias_waiters.get(head.output):
            return None
        consumer = consumers[0]
        ready = {uid for _, uid in self.ready}
        producers = []
        for key in self.plan.needs[consumer]:
            if key in self.remote or key in self.local:
                continue
            uid = self.plan.producer.get(key)
            if uid not in ready:  # produced later, or through an alias
                return None
            producers.append(uid)
        if len(self.ready) - len(producers) < self.slots or len(producers) >= MAX_BATCH:
            return None
        producers.sort(key=self.plan.priority.__getitem__)
        for uid in producers:
            out = self.plan.units[uid].output
            self.plan.units[uid].export = not (
                self.plan.waiters.get(out) == [consumer] and not self.plan.alias_waiters.get(out)
                and out not in self.keep
            )
        return [*producers, consumer]

    def _estimate(self, uid: int) -> float | None:
        """Mean measured seconds of units of this kind, or None before the first one ends."""
        seen = self.durations.get(key_split(self.plan.units[uid].output))
        return None if seen is None else seen[0] / seen[1]

    def _send(self, uids: list[int]) -> None:
        units = [self.plan.units[u] for u in uids]
        inside = {u.output for u in units}
        inputs = {k: self._shipped(k) for u in uids for k in self.plan.needs[u] if k not in inside}
        self.dispatched.update(uids)
        blob = self._pickle(Batch(self.store.url, self.prefix, self.inline_bytes, inputs, units))
        call = self.client.add_call(self.job, self.func_key, (MODE_ONE, [blob]), len(self.job.run.calls), 1)
        if call.items_key is not None:
            self.stats.call_bytes += len(blob)
        self.sent[call.call_id] = uids
        for unit in units:
            for node in unit.nodes:
                self.state["waiting"].pop(node.key, None)
                self.state["running"].add(node.key)
                for f in self.pretask:
                    f(node.key, self.plan.graph, self.state)
        call.future.add_done_callback(lambda _f, c=call: self.done.put(c))
        self.client.submit(self.job, [call])

    def _shipped(self, key):
        """What a worker gets for ``key``; a local value is pickled (and stored, if big) once."""
        ref = self.remote.get(key)
        if ref is None:
            data = dumps_checked(self.local[key], f"the Dask data value {key!r}")
            if len(data) > self.inline_bytes:
                name = f"{self.prefix}data/{self.uploads}"
                self.uploads += 1
                self.store.put(name, signing.seal(self.client.secret, name, data))  # workers check it
                self.stored.add(name)
                self.stats.bytes_stored += len(data)
                data = Stored(name, len(data))
            ref = self.remote[key] = data
        return ref

    def _pickle(self, batch: Batch) -> bytes:
        try:
            return dumps(batch)
        except Exception as e:
            for unit in batch.units:
                for node in unit.nodes:
                    dumps_checked(node, f"the Dask task {node.key!r}")
            raise SerializationError(f"a batch of Dask tasks cannot be pickled: {e}") from e

    # -- results -------------------------------------------------------------

    def _collect(self, call) -> None:
        uids = self.sent.pop(call.call_id)
        units = [self.plan.units[u] for u in uids]
        task_keys = [n.key for u in units for n in u.nodes]
        try:
            outcome = _outcome.first(call.future.result())
        except BaseException as exc:  # the platform failed the call for good (crash, timeout, lost)
            exc.add_note(f"fnmap.dask: while running Dask task(s) {_some(task_keys)}")
            raise
        if not _outcome.succeeded(outcome):
            exc = self.job.item_exception(call, 0, outcome)
            key = getattr(exc, "_fnmap_dask_key", None)
            where = f"task {key!r}" if key is not None else f"task(s) {_some(task_keys)}"
            exc.add_note(f"fnmap.dask: raised by Dask {where}")
            raise exc
        result: BatchResult = _outcome.value(outcome)
        self._account(call, result)
        for unit, out, seconds in zip(units, result.outputs, result.durations, strict=True):
            if out is not None:
                self.remote[unit.output] = out
            seen = self.durations.setdefault(key_split(unit.output), [0.0, 0])
            seen[0] += seconds
            seen[1] += 1
            if isinstance(out, Stored):
                self.stored.add(out.key)
            inline = loads(out) if self.posttask and isinstance(out, bytes) else None
            for node in unit.nodes:
                self.state["running"].discard(node.key)
                self.state["finished"].add(node.key)
                for f in self.posttask:
                    f(node.key, inline if node.key == unit.output else None,
                      self.plan.graph, self.state, result.worker)
            if self.progress is not None:
                self.progress.update(len(unit.nodes))
        self.units_done += len(units)
        for unit in units:
            self._resolved(unit.output)
        for uid in uids:
            for key in self.plan.needs[uid]:
                self._release(key)

    def _root(self, key):
        while key in self.plan.aliases:
            key = self.plan.aliases[key]
        return key

    def _release(self, key) -> None:
        """A unit reading ``key`` is done; delete its stored value once no unit needs it."""
        root = self._root(key)
        self.readers[root] -= 1
        if self.readers[root] or root in self.keep:
            return
        self.state["released"].add(root)
        ref = self.remote.get(root)
        if isinstance(ref, Stored) and ref.key in self.stored:
            self.stored.discard(ref.key)
            if self.deleter is None:
                self.deleter = ThreadPoolExecutor(1, thread_name_prefix="fnmap-dask-release")
            self.deleter.submit(self.store.delete, [ref.key])

    def _account(self, call, result: BatchResult) -> None:
        self.stats.bytes_stored += result.bytes_written
        self.stats.bytes_loaded += result.bytes_read
        if call.stats:
            self.stats.call_bytes += call.stats.get("bytes_out", 0)

    def _fetch(self, wanted: list) -> dict:
        """Values of the requested keys: the only values the client downloads."""
        values = {k: self.local[k] for k in wanted if k in self.local}
        todo = [k for k in dict.fromkeys(wanted) if k not in values]
        stored = [k for k in todo if isinstance(self.remote[k], Stored)]
        for k in todo:
            if k not in stored:
                values[k] = loads(self.remote[k])
        if stored:
            with ThreadPoolExecutor(min(8, len(stored))) as pool:
                datas = list(pool.map(lambda k: self.store.get(self.remote[k].key), stored))
            for k, data in zip(stored, datas, strict=True):
                self.stats.bytes_fetched += len(data)
                values[k] = loads(signing.unseal(self.client.secret, self.remote[k].key, data))
        return values

    def _finish(self, failed: bool) -> None:
        if self.job is None:
            return
        if failed:
            self.job.cancel(stop_platform=False)
            for call_id in self.sent:  # calls still running: delete what they store when they end
                self.job.run.calls[call_id].future.add_done_callback(self._discard_late)
        self.client.seal(self.job)
        if self.progress is not None:
            self.progress.close()
        self.stats.calls = len(self.job.run.calls)
        self.stats.attempts = sum(len(c.attempts) for c in self.job.run.calls)
        if self.deleter is not None:
            self.deleter.shutdown(wait=True)
        if self.stored:
            self.store.delete(sorted(self.stored))

    def _discard_late(self, future) -> None:
        try:
            outcome = _outcome.first(future.result())
            if _outcome.succeeded(outcome):
                self.store.delete([o.key for o in _outcome.value(outcome).outputs if isinstance(o, Stored)])
        except BaseException:  # noqa: B036 - a late call of a failed run: nothing left to clean
            pass


def _some(keys: list, n: int = 5) -> str:
    shown = ", ".join(map(repr, keys[:n]))
    return shown + (f" and {len(keys) - n} more" if len(keys) > n else "")


def _register() -> None:
    """Make ``scheduler="fnmap"`` work where Dask's table of named schedulers exists.

    Dask has no public registration, so a Dask without that table imports us cleanly all the same.
    """
    try:
        from dask.base import named_schedulers
    except ImportError:
        return
    if isinstance(named_schedulers, dict):
        named_schedulers.setdefault("fnmap", get)


_register()
