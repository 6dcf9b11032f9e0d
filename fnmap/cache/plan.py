"""The cache of one job: its items' keys, the hits found before any call is sent, the entries written.

A job run with ``cache=`` gets a :class:`JobCache` (``job.cache``).  Before its calls are made the
client keys every item and reads the entries (:meth:`JobCache.look_up`): each run of consecutive
hits becomes one call that is never sent (:meth:`fnmap.client.Client.add_cached_call`), the misses
are chunked and sent as usual, so a partly cached map runs only its misses and a fully cached one
invokes nothing.  As each sent call delivers, the values of its items that succeeded are written
as entries (:meth:`JobCache.delivered`; first writer wins, except over an expired, refused or
refreshed entry, which is replaced).
"""

from __future__ import annotations

import inspect
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait

from ..runtime import compression, keys, signing
from ..runtime import outcome as _outcome
from ..runtime.serialization import dumps
from ..runtime.wire import MODE_ONE
from . import store as entries
from .key import Uncacheable, function_digest, item_digest

#: Threads reading and writing entries at once (each is one storage request).
IO_THREADS = 16
#: Entries one thread reads or writes per task (a future per entry cost more than a file store's read).
_BATCH = 32


def _result_options(config) -> tuple:
    """The options that can change what a call returns (what runs before it and the environment it
    sees); retries, timeouts, progress and the like change when or whether, not what."""
    return (("extra_env", dict(config.extra_env or {})), ("initializer", config.initializer),
            ("initargs", tuple(config.initargs)), ("gpu", config.gpu))


class JobCache:
    """What the cache knows and does for one job (see the module's docstring)."""

    def __init__(self, store, secret: bytes | None, job_id: str, func, config):
        self.store = store
        self.secret = secret
        self.job_id = job_id
        self.settings = settings = config.cache
        #: A map_reduce's map stage is keyed by the user's function and item, not the stage's.
        self._stage = getattr(func, "map_func", None) is not None
        target = func.map_func if self._stage else func
        self.name = getattr(target, "__qualname__", None) or type(target).__qualname__
        self.function = function_digest(target, _result_options(config), settings.ignore)
        self._signature = None
        if settings.ignore:
            try:
                self._signature = inspect.signature(target)
            except (TypeError, ValueError):
                raise Uncacheable(f"fnmap.Cache(ignore={list(settings.ignore)!r}): the signature of "
                                  f"{self.name} cannot be read; use key= instead") from None
        #: The entry key of each item, by index.
        self.keys: dict[int, str] = {}
        #: Item index -> (value, the job that wrote its entry), for the hits.
        self.hits: dict[int, tuple] = {}
        #: Items whose entry is replaced when written (expired, refused, or refresh=True).
        self.replace: set[int] = set()
        self.refused = 0
        self.written = 0
        self._named = False
        #: The writes handed to the cache's threads and not waited for (:meth:`flush`).
        self._pending: list = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="fnmap-cache")

    # -- keys ------------------------------------------------------------------------------

    def key_of(self, mode: str, item) -> str:
        """The entry key of one item of a call in ``mode`` (an item, or ``(args, kwargs)``)."""
        if self._stage:
            item = item[1]  # (where a large value is kept, the item)
        args, kwargs = ((item,), {}) if mode == MODE_ONE else item
        if self.settings.key is not None:
            value, where = self.settings.key(*args, **kwargs), f"the value key= returned for {self.name}"
        elif self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            value = {k: v for k, v in bound.arguments.items() if k not in self.settings.ignore}
            where = f"the arguments of {self.name}"
        else:
            value, where = (args, kwargs), f"the arguments of {self.name}"
        return keys.cache_key(self.function, item_digest(value, where))

    # -- before the calls ---------------------------------------------------------------------

    def look_up(self, mode: str, items: list, first: int = 0) -> dict[int, tuple]:
        """Key ``items`` (indexes from ``first``) and read their entries; the hits, by index."""
        self.key_items(mode, items, first)
        indexes = list(range(first, first + len(items)))
        if self.settings.refresh:
            self.replace.update(indexes)
            return {}
        found = {}
        batches = [indexes[i:i + _BATCH] for i in range(0, len(indexes), _BATCH)]
        for batch, hits in zip(batches, self._pool.map(self._read_all, batches), strict=True):
            found.update((index, hit) for index, hit in zip(batch, hits, strict=True) if hit is not None)
        self.hits.update(found)
        return found

    def key_items(self, mode: str, items: list, first: int = 0) -> None:
        """Key ``items`` (indexes from ``first``) without reading their entries: a redrive's, whose
        calls store the values of what they run as a fresh run's would."""
        for offset, item in enumerate(items):
            self.keys[first + offset] = self.key_of(mode, item)

    def _read_all(self, indexes: list[int]) -> list:
        return [self._read(index) for index in indexes]

    def count_hits(self, mode: str, items: list) -> int:
        """How many of ``items`` have an entry young enough to be used, from one listing of the
        function's entries (no entry is read: what ``fnmap.estimate`` prices)."""
        if self.settings.refresh:
            return 0
        prefix = f"{keys.CACHE_PREFIX}{self.function}/"
        oldest = -1.0 if self.settings.expire is None else time.time() - self.settings.expire
        present = {key for key, _size, modified in self.store.list_details(prefix) if modified >= oldest}
        return sum(1 for item in items if self.key_of(mode, item) in present)

    def _read(self, index: int):
        key = self.keys[index]
        try:
            entry = entries.read_entry(self.store, self.secret, key)
            if entry is None:
                return None
            expire = self.settings.expire
            if expire is not None and entry.created + expire < time.time():
                self.replace.add(index)
                return None
            return entries.unpack_value(entry), entry.job
        except signing.UnauthenticatedObject as e:
            self.refused += 1
            self.replace.add(index)
            warnings.warn(f"fnmap: cache entry refused, the call runs again and replaces it: {e}",
                          RuntimeWarning, stacklevel=2)
            return None

    def runs(self, first: int, n: int) -> list[tuple[bool, int, int]]:
        """Items ``first..first+n-1`` as consecutive runs ``(hit, first index, count)``."""
        out: list[list] = []
        for index in range(first, first + n):
            hit = index in self.hits
            if out and out[-1][0] == hit:
                out[-1][2] += 1
            else:
                out.append([hit, index, 1])
        return [tuple(r) for r in out]

    def origins(self, first: int, n: int) -> list[list]:
        """Where the hits ``first..first+n-1`` came from: ``[[first item, count, job id], ...]``."""
        out: list[list] = []
        for index in range(first, first + n):
            job = self.hits[index][1]
            if out and out[-1][2] == job:
                out[-1][1] += 1
            else:
                out.append([index, 1, job])
        return out

    def take(self, first: int, n: int) -> list:
        """The values of hits ``first..first+n-1`` (released here: the call holds them now)."""
        return [self.hits.pop(index)[0] for index in range(first, first + n)]

    # -- after each call --------------------------------------------------------------------------

    def delivered(self, state, result) -> None:
        """A sent call ended with ``result`` (its outcomes, or a fault): store what succeeded.  The
        values are pickled and sealed now (the caller may change them once delivered); the writes
        run on the cache's threads, and :meth:`flush` waits for them."""
        if state.cached is not None or isinstance(result, Exception) or result is None:
            return
        writes = []
        try:
            for offset, item_outcome in enumerate(_outcome.each(result)):
                index = state.first_index + offset
                key = self.keys.pop(index, None)
                packed = self._packed(_outcome.value(item_outcome)) \
                    if key is not None and _outcome.succeeded(item_outcome) else None
                if packed is not None:
                    writes.append((index, key, entries.pack_entry(self.secret, key, packed, self.job_id, self.name)))
        except Exception as e:
            self._warn(e)
        if writes:
            batches = [writes[i:i + _BATCH] for i in range(0, len(writes), _BATCH)]
            with self._lock:
                self._pending.extend(self._pool.submit(self._write_batch, batch) for batch in batches)

    def flush(self) -> None:
        """Wait until every entry handed to :meth:`delivered` so far is written (a failure is warned
        about: the results matter more than the cache)."""
        with self._lock:
            pending = list(self._pending)  # kept there until written: another thread's flush waits for them too
        wait(pending)
        with self._lock:
            written = [future for future in self._pending if future.done()]
            self._pending = [future for future in self._pending if not future.done()]
        for future in written:  # each taken out once, by one flush: its failure is warned about once
            if future.exception() is not None:
                self._warn(future.exception())

    def _warn(self, e: Exception) -> None:
        warnings.warn(f"fnmap: could not write cache entries of job {self.job_id} to {self.store.url}: "
                      f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)

    def _write_batch(self, batch: list) -> None:
        self._name_function()
        for write in batch:
            self._write(write)

    def _name_function(self) -> None:
        with self._lock:
            if self._named:
                return
            self._named = True
        entries.write_function(self.store, self.function, self.name, self.job_id)

    def _write(self, write: tuple) -> None:
        index, key, data = write
        if index in self.replace:
            self.store.put(key, data)
            wrote = True
        else:
            wrote = self.store.put_if_absent(key, data)
        if wrote:
            with self._lock:
                self.written += 1

    def _packed(self, value) -> bytes | None:
        """The pickle of a value to keep; a map stage's value kept in storage is copied from there."""
        from ..runtime.stored import Stored

        if self._stage and isinstance(value, Stored):
            return bytes(signing.unseal(self.secret, value.key, self.store.get(value.key)))
        try:
            return compression.pack(dumps(value))
        except Exception:  # it came back pickled, so this is rare: that item is just not cached
            return None



class FunctionCaches:
    """The result cache of a job whose calls may each run another function (an ``Executor``): one
    :class:`JobCache` per function, and the one that answered or keyed each call's items."""

    def __init__(self, store, secret: bytes, job):
        self._store, self._secret, self._job = store, secret, job
        self._by_function: dict[str, JobCache] = {}
        self._by_first: dict[int, JobCache] = {}
        self._lock = threading.Lock()

    def look_up_call(self, func_key: str, func, mode: str, items: list, first: int) -> bool:
        """Key one call's items (indexes from ``first``) and read their entries: True when every
        item hit (the call is answered, :meth:`fnmap.client.Client.add_cached_call`), else the call
        is sent and its values stored as it ends."""
        with self._lock:
            cache = self._by_function.get(func_key)
            if cache is None:
                cache = self._by_function[func_key] = JobCache(self._store, self._secret, self._job.id, func,
                                                               self._job.config)
            self._by_first[first] = cache
        hits = cache.look_up(mode, items, first)
        if len(hits) == len(items):
            return True
        for index in hits:  # a call partly answered is sent whole: its values come back with it
            cache.hits.pop(index, None)
        return False

    def origins(self, first: int, n: int) -> list[list]:
        return self._by_first[first].origins(first, n)

    def take(self, first: int, n: int) -> list:
        return self._by_first.pop(first).take(first, n)

    def delivered(self, state, result) -> None:
        cache = self._by_first.pop(state.first_index, None)
        if cache is not None:
            cache.delivered(state, result)

    def flush(self) -> None:
        with self._lock:
            caches = list(self._by_function.values())
        for cache in caches:
            cache.flush()
