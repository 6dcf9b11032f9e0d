"""``fnmap.map``, ``starmap``, ``imap`` and ``map_reduce``: thin wrappers over the process-wide client.

Data in object storage: a storage URL, glob or list of URLs as
``items`` is listed and split into partitions by :mod:`fnmap.data`;
``map_reduce`` keeps large map outputs in storage and reduces them as a tree
(:mod:`fnmap.runtime.reduce`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from . import policy, stream
from .blocking import warn_if_in_coroutine
from .client import get_client
from .config import resolve
from .errors import ConfigError, RemoteTraceback
from .feed import ChunkFeed
from .jobs import ResultSlot
from .kinds import KINDS
from .observe.progress import make_progress
from .recorder import StorageRecorder
from .runtime import keys
from .runtime.wire import MODE_ARGS, MODE_ONE

#: Default ``reduce_fanin`` of ``map_reduce``: up to this many map outputs reduce in one call.
REDUCE_FANIN = 64


def remote_error_from_here(func: Callable | None = None, *, warn: bool = True) -> Callable:
    """Make an exception an item raised remotely start at the caller's line: the frames it passed
    through inside fnmap (the job's results, the call's outcomes) are dropped, so a traceback reads
    the caller's code, then the remote traceback it is chained to, not three fnmap frames between.
    The one frame left is this wrapper's (pytest hides it, ``__tracebackhide__``; IPython shows the
    frame an exception was raised in always).
    fnmap's own errors keep their frames: there they say where fnmap failed.
    ``warn``: called from a coroutine on a running loop, it warns (:mod:`fnmap.blocking`)."""
    if func is None:
        return functools.partial(remote_error_from_here, warn=warn)

    @functools.wraps(func)
    def from_the_caller(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841 (read by IPython's and pytest's traceback printers)
        if warn:
            warn_if_in_coroutine(f"fnmap.{func.__name__}(...)", f"await fnmap.{func.__name__}.aio(...)", kwargs)
        try:
            return func(*args, **kwargs)
        except Exception as e:
            if not isinstance(e.__cause__, RemoteTraceback):
                raise
            raise e.with_traceback(None) from e.__cause__  # your function's exception: its traceback is above

    return from_the_caller


@remote_error_from_here
def map(
    func: Callable,
    items: Iterable,
    *,
    return_exceptions: bool = False,
    return_job: bool = False,
    obj_chunk_size: int | None = None,
    obj_chunk_number: int | None = None,
    job_name: str | None = None,
    **options: Any,
):
    """Run ``func(item)`` for every item, in parallel, and return the results in input order.

    ``items`` may be any iterable, generators included.  Options (all optional):
    ``backend``, ``storage``, ``chunksize`` (items per invocation), ``timeout``
    (seconds per call), ``retries``, ``retry_on``, ``memory``, ``gpu``,
    ``progress``, ``extra_env`` and the rest of :class:`fnmap.config.Config`.

    ``items`` may also name data in object storage: ``"s3://bucket/prefix/"``,
    a glob such as ``"s3://bucket/logs/*.csv"``, a list of object URLs, or
    the ``file://`` equivalents.  Then ``func`` gets one
    :class:`fnmap.runtime.partition.Partition` per object, or per ``obj_chunk_size``
    bytes (or ``obj_chunk_number`` pieces) of each object, split at line
    boundaries; ``part.stream()`` and ``part.read()`` give its records.

    A remote exception is raised here as the same type, with the remote
    traceback as its cause and the item's index in a note; with
    ``return_exceptions=True`` exception objects take the failed items' places.
    With ``return_job=True`` the :class:`fnmap.jobs.Job` is returned instead; its
    ``results()`` gives the list (it answers what ``fnmap.job(ID)`` does: :class:`fnmap.jobs.JobHandle`).

    ``job_name``: a name for the job in its storage (``"nightly-2026-12-04"``).  Run again with
    the same name and items, the map finishes that job: its results if it has them all, else it
    runs the items with no result and those that failed (with this function, which may differ
    from the first run's only for a job that failed: a bug fixed); other items, or another
    function for a job with no failure, are refused (:mod:`fnmap.named`).

    >>> import fnmap
    >>> fnmap.map(lambda x: x * x, range(5))
    [0, 1, 4, 9, 16]
    """
    config = resolve(**options)
    items = _input_items(items, obj_chunk_size, obj_chunk_number)
    if job_name is not None:
        job = _start_named(func, items, config, job_name)
    else:
        job = start_map(func, items, config)
    if return_job:
        return job
    return job.results(return_exceptions=return_exceptions)


@remote_error_from_here
def starmap(
    func: Callable,
    iterable: Iterable,
    *,
    return_exceptions: bool = False,
    return_job: bool = False,
    job_name: str | None = None,
    **options: Any,
):
    """Run ``func(*args)`` for every tuple ``args`` of ``iterable``; results in input order.

    The serverless twin of ``multiprocessing.Pool.starmap`` (and Modal's
    ``starmap``); options, errors, ``return_exceptions`` and ``job_name`` as in :func:`map`.

    >>> import fnmap
    >>> fnmap.starmap(pow, [(2, 3), (10, 2)])
    [8, 100]
    """
    config = resolve(**options)
    if isinstance(iterable, (str, bytes)):
        raise TypeError(
            f"iterable={iterable!r:.80} is a {type(iterable).__name__}; starmap takes an iterable of "
            "argument tuples, e.g. [(1, 2), (3, 4)]"
        )
    items = (_star_args(i, args) for i, args in enumerate(iterable))
    if job_name is not None:
        job = _start_named(func, items, config, job_name, mode=MODE_ARGS)
    else:
        job = start_map(func, items, config, mode=MODE_ARGS)
    if return_job:
        return job
    return job.results(return_exceptions=return_exceptions)


def imap(func: Callable, items: Iterable, *, return_exceptions: bool = False, buffersize: int | None = None,
         **options: Any):
    """Like :func:`map`, but an iterator that yields each result, in input order, as soon as it
    and those before it are in (``multiprocessing.Pool.imap``).

    Errors are raised when the failing item's turn comes (or put in place with
    ``return_exceptions=True``); closing the iterator early cancels what has not run.
    ``buffersize=N`` (``Executor.map``'s name, Python 3.14): at most N items are read ahead of
    the results taken, so an endless generator works in bounded memory (:mod:`fnmap.stream`).
    """
    warn_if_in_coroutine("fnmap.imap(...)", "async for r in fnmap.imap.aio(...)", options)
    return _stream(func, items, options, ordered=True, return_exceptions=return_exceptions, buffersize=buffersize)


def imap_unordered(func: Callable, items: Iterable, *, return_exceptions: bool = False,
                   buffersize: int | None = None, **options: Any):
    """Like :func:`imap`, but yields results as their calls finish, in any order
    (``multiprocessing.Pool.imap_unordered``; pair them with their items by returning both)."""
    warn_if_in_coroutine("fnmap.imap_unordered(...)", "async for r in fnmap.imap_unordered.aio(...)", options)
    return _stream(func, items, options, ordered=False, return_exceptions=return_exceptions, buffersize=buffersize)


def _stream(func: Callable, items: Iterable, options: dict, ordered: bool, return_exceptions: bool,
            buffersize: int | None = None):
    # The job starts here, not at the first next(): a bad option or item fails at the call.
    config = resolve(**options)
    return start_stream(func, items, config, ordered, return_exceptions, buffersize)[1]


def start_stream(func: Callable, items: Iterable, config, ordered: bool, return_exceptions: bool,
                 buffersize: int | None = None, mode: str = MODE_ONE) -> tuple:
    """Start the job of an ``imap``: ``(job, an iterator of its results as they come)``."""
    if buffersize is not None:
        client = get_client(config)
        recorder = StorageRecorder(client.store, client.secret, redrive_job)
        job, states = stream.start(func, _input_items(items, None, None), config, buffersize, ordered, mode, recorder)
    else:
        job = _start(get_client(config), config, func, "map", lambda _job_id: _input_items(items, None, None),
                     mode, stream=True)
        states = _in_order(job) if ordered else _as_completed(job)
    return job, _results_as_they_come(job, states, return_exceptions)


def _results_as_they_come(job, states, return_exceptions: bool):
    __tracebackhide__ = True  # noqa: F841 (see remote_error_from_here)
    finished = True
    try:
        for state in states:
            yield from job.call_results(state, return_exceptions)
        if job.cache is not None:  # the entries of what it yielded are written when it ends
            job.cache.flush()
    except Exception as e:
        finished = False
        job.stop(e)  # it reached the caller's loop: the job ended for it (failed), as a map's
        if not isinstance(e.__cause__, RemoteTraceback):
            raise
        raise e.with_traceback(None) from e.__cause__  # from the caller's loop, as in map
    except BaseException as e:
        finished = False
        if not isinstance(e, GeneratorExit):  # Ctrl-C while it waited: ended for its caller (cancelled)
            job.stop(e)
        raise
    finally:
        if job.raised is None and (not finished or not job.done):  # the reader stopped early (close(), break)
            job.cancel(stop_platform=True)


def _as_completed(job):
    """The job's calls as they are done; an automatically chunked job's calls are counted once it is
    sealed (its feed makes calls until then, each before the call that made room for it is done)."""
    taken = 0
    while not (job.run.sealed and taken == len(job.run.calls)):
        yield job.run.completed.get()
        taken += 1


def _in_order(job):
    """The job's calls in input order, each as soon as it and those before it are done."""
    for state in job.run.calls:
        while not state.future.done():
            job.run.completed.get()  # some call finished: look again
        yield state


def _star_args(index: int, args) -> tuple:
    if isinstance(args, (str, bytes)) or not isinstance(args, Iterable):
        raise TypeError(
            f"starmap item {index} is {type(args).__name__} {args!r:.80}, not a tuple of arguments: "
            "pass (x,) for a single argument, or use fnmap.map"
        )
    return tuple(args), {}


def _input_items(items, obj_chunk_size: int | None, obj_chunk_number: int | None):
    """Partitions when ``items`` names data in storage, else ``items`` as given."""
    from . import data

    if data.is_data_input(items):
        return data.partitions(items, obj_chunk_size, obj_chunk_number)
    if obj_chunk_size is not None or obj_chunk_number is not None:
        raise ConfigError(
            f"obj_chunk_size/obj_chunk_number split objects in storage, but items={items!r:.80} is "
            "not a storage URL, glob or list of URLs (e.g. 's3://bucket/logs/'); drop the option"
        )
    if isinstance(items, (str, bytes)):
        raise TypeError(
            f"items={items!r:.80} is a {type(items).__name__}; pass a list or other iterable of "
            "items, or a storage URL such as 's3://bucket/prefix/' or 'file:///data/'"
        )
    return items


def start_map(func: Callable, items: Iterable, config, mode: str = MODE_ONE):
    """Serialize every chunk first (so a bad item fails before anything runs), then dispatch all."""
    return _start(get_client(config), config, func, "map", lambda _job_id: items, mode)


def _start_named(func: Callable, items: Iterable, config, name: str, mode: str = MODE_ONE):
    """The job named ``name`` (:mod:`fnmap.named`): started now, re-attached, or redriven; refused if it differs."""
    from . import named  # with its re-attach and redrive machinery: loaded by a named job only

    named.check_name(name)
    client = get_client(config)
    items = items if isinstance(items, list) else list(items)
    claim = named.claim(client, config, name, func, items, mode)
    if claim.job is not None:
        return claim.job
    return _start(client, config, func, "map", lambda _job_id: items, mode, job_id=claim.job_id,
                  first_run=claim.first_run)


def _start(
    client,
    config,
    func: Callable,
    kind: str,
    make_items: Callable[[str], Iterable],
    mode: str = MODE_ONE,
    label: str | None = None,
    stream: bool = False,
    job_id: str | None = None, first_run: dict | None = None,
):
    """Start a job over ``make_items(job_id)`` (items may name keys under the job's prefix);
    ``job_id`` and ``first_run``: a named job's (:meth:`fnmap.client.Client.new_job`).

    With ``chunksize`` set, every chunk is made and pickled here; unset (automatic), the first
    calls are made here and a :class:`fnmap.feed.ChunkFeed` makes the rest as calls end."""
    recorder = StorageRecorder(client.store, client.secret, redrive_job) if KINDS[kind].recorded else None
    job = client.new_job(config, kind, function=func, stream=stream, job_id=job_id, recorder=recorder,
                         first_run=first_run)
    index = 0
    states = []
    stores: list = []  # large inputs being stored meanwhile, by the client's input threads
    pending: list = []  # with chunksize set: each call's input store (None: its input travels inline)
    try:
        func_key = client.upload_function(func, job)  # a function that does not pickle: recorded too
        if config.max_cost is not None or config.cache is not None:
            items = make_items(job.id)
            items = items if isinstance(items, list) else list(items)
            make_items = lambda _job_id, items=items: items  # noqa: E731
            hits = _look_up_cache(client, job, func, mode, items)  # hits are answered, never sent
        if config.max_cost is not None:  # refused before any call runs if even its least is above the cap
            from .cost.forecast import check_cap  # with the price tables: loaded by a capped job only
            check_cap(job, func_key, len(items) - hits)
        if config.chunksize is None:
            items = make_items(job.id)
            items = items if isinstance(items, list) else list(items)
            size, plain = client.add_items(job, mode, items)  # a bad item is named before anything runs
            client.use_feed(job, ChunkFeed(client, job, func_key, mode, items, size, plain))
            states = job.run.feed.start(stores)
            index = len(items)
            client.finish_stores(stores)
        else:
            index = _add_chunked_calls(client, job, func_key, mode, make_items(job.id), (states, stores, pending))
            if stores:  # a storage that refuses the inputs refuses the first: then nothing has run
                stores[0].result()
    except BaseException as e:
        client.finish_stores(stores, abandon=True)  # nothing is left writing for a job that will not run
        client.setup_failed(job, e)  # nothing runs; the record says why
        raise
    label = label or f"fnmap {getattr(func, '__name__', 'map')}"
    client.show_progress(job, make_progress(config.progress, index, label))
    if job.run.feed is None or job.run.feed.seal_if_complete():
        client.seal(job)
    else:  # its "running" entry with every item counted: a re-attach after the client died aligns
        job.save_record(final=False)
    if stores and config.chunksize is not None:
        _submit_as_stored(client, job, states, pending, stores)
    else:
        client.submit(job, states)
    return job


def _add_chunked_calls(client, job, func_key: str, mode: str, items: Iterable, into: tuple) -> int:
    """Add the calls of ``chunksize`` items each (a run of cache hits as one call, never sent) to
    ``into``: (the calls, the pending input stores, each call's store or None).  How many items."""
    states, stores, pending = into
    index = 0
    for chunk in _chunks(items, job.config.chunksize, job.cache):
        stored_before = len(stores)
        if isinstance(chunk, int):  # a run of cache hits
            states.append(client.add_cached_call(job, func_key, index, chunk, ResultSlot()))
        else:
            states.append(client.add_call(job, func_key, (mode, chunk), index, len(chunk), ResultSlot(),
                                          stores=stores))
        pending.append(stores[stored_before] if len(stores) > stored_before else None)
        index += chunk if isinstance(chunk, int) else len(chunk)
    return index


def _look_up_cache(client, job, func: Callable, mode: str, items: list) -> int:
    """With ``cache=``: key every item and read its entry (:mod:`fnmap.cache.plan`); how many hit."""
    if job.config.cache is None:
        return 0
    client.use_cache(job, func)
    return len(job.cache.look_up(mode, items))


def _chunks(items: Iterable, chunksize: int, cache):
    """The chunks of ``chunksize`` items to send; with a result cache, each run of hits as its
    length (an int: one call that is never sent) and the misses between chunked apart."""
    if cache is None:
        yield from policy.chunks(items, chunksize)
        return
    for hit, first, n in cache.runs(0, len(items)):
        if hit:
            yield n
        else:
            yield from policy.chunks(items[first:first + n], chunksize)


def _submit_as_stored(client, job, states: list, pending: list, stores: list) -> None:
    """Send the calls in order, each once its input is stored: the first calls run while the
    client's input threads still hash and write the last inputs (a map of 200 one-megabyte items
    waited for all 200 before its first call).  A store that fails after calls were sent abandons
    the job (its unsent calls are cancelled, the sent ones stopped) and raises its error."""
    ready = []
    try:
        for state, store in zip(states, pending, strict=True):
            if store is not None and not store.done() and ready:
                client.submit(job, ready)  # what is stored so far goes while the rest is written
                ready = []
            if store is not None:
                store.result()
            ready.append(state)
    except BaseException:
        client.finish_stores(stores, abandon=True)
        job.cancel(stop_platform=True)
        raise
    client.submit(job, ready)


@remote_error_from_here
def map_reduce(
    map_func: Callable,
    items: Iterable,
    reduce_func: Callable,
    *,
    reduce_fanin: int | None = REDUCE_FANIN,
    reduce_by_key: bool = False,
    obj_chunk_size: int | None = None,
    obj_chunk_number: int | None = None,
    return_job: bool = False,
    **options: Any,
):
    """Map ``map_func`` over ``items``, then reduce the results with ``reduce_func``, all remotely.

    ``reduce_func`` gets a list of map results.  Map results larger than about
    a kilobyte stay in storage and the reducers fetch them, so neither the
    client nor any one reducer holds them all: with more than
    ``reduce_fanin`` (default 64) results the reduce runs as a tree, each
    reducer combining at most ``reduce_fanin`` values -- the map results or
    its own earlier outputs -- so ``reduce_func`` must accept a list of its
    own results (``sum``, ``max`` and merging ``Counter`` objects do).
    ``reduce_fanin=None`` reduces everything in one call.

    ``items`` may name data in object storage as in :func:`map`.  With
    ``reduce_by_key=True`` each object's partitions are reduced separately
    and a dict ``{object URL: reduced value}`` is returned, in object order.
    With ``return_job=True`` the last reduce level's :class:`fnmap.jobs.Job` is
    returned (after everything has run).

    >>> import fnmap
    >>> fnmap.map_reduce(lambda x: x * x, range(4), sum)
    14
    """
    from .cost.shared import SharedCap
    from .runtime.reduce import MapStage, ReduceStage

    config = resolve(**options)
    items = _reduce_inputs(items, reduce_func, reduce_fanin, reduce_by_key, obj_chunk_size, obj_chunk_number)
    client = get_client(config)
    name = getattr(map_func, "__name__", "map")
    with SharedCap(config.max_cost, "map_reduce") as cap:  # one max_cost over the map and every reduce level
        map_job = cap.start(config, lambda config: _start(
            client,
            config,
            MapStage(map_func, client.store.url),
            "map",
            lambda job_id: [(keys.blob_key(job_id, f"map/{i}"), item) for i, item in enumerate(items)],
            label=f"fnmap {name}",
        ))
        groups = _groups(items, map_job.results(), reduce_by_key)
        stage = ReduceStage(reduce_func, client.store.url)
        reduce_config = config.replace(chunksize=1, cache=None)  # cache=: the map's calls are cached
        results, last_job = _reduce_tree(client, reduce_config, stage, groups, reduce_fanin, cap)
    if return_job:
        return last_job
    return results if reduce_by_key else results[None]


def _groups(items: list, outputs: list, by_key: bool) -> dict:
    """The map outputs to reduce, by group: one per object with ``reduce_by_key``, else one."""
    if not by_key:
        return {None: outputs}
    groups: dict = {}
    for item, out in zip(items, outputs, strict=True):
        groups.setdefault(item.url, []).append(out)
    return groups


def _reduce_inputs(items, reduce_func, reduce_fanin, reduce_by_key: bool, obj_chunk_size, obj_chunk_number) -> list:
    """The items of a ``map_reduce``, once its reduce options are checked."""
    from .runtime.partition import Partition
    from .runtime.reduce import check_fanin

    check_fanin(reduce_fanin)
    if not callable(reduce_func):
        raise TypeError(
            f"reduce_func must be callable, got {type(reduce_func).__name__}: {reduce_func!r:.100}"
        )
    items = list(_input_items(items, obj_chunk_size, obj_chunk_number))
    if reduce_by_key and not all(isinstance(item, Partition) for item in items):
        raise ConfigError(
            "reduce_by_key=True reduces each object's partitions separately, so items must name "
            "data in object storage (a URL, glob or list of URLs); use reduce_by_key=False for "
            "other items"
        )
    return items


def _reduce_tree(client, config, stage, groups: dict, fanin: int | None, cap):
    """Reduce each group's values level by level; one job per level for all groups together
    (``cap``: the :class:`fnmap.cost.shared.SharedCap` of the ``map_reduce``, what each level may spend)."""
    from .runtime.reduce import Stored, plan_level

    done: dict = {}
    job = None
    pending = groups
    while pending:
        nodes = []  # (group, final, inputs) per reducer of this level
        for group, inputs in pending.items():
            level = plan_level(len(inputs), fanin)
            nodes.extend((group, len(level) == 1, [inputs[i] for i in r]) for r in level)
        job = cap.start(config, lambda config, nodes=nodes: _start(
            client,
            config,
            stage,
            "reduce",
            lambda job_id: [
                (None if final else keys.blob_key(job_id, f"reduce/{n}"), inputs)
                for n, (_group, final, inputs) in enumerate(nodes)
            ],
            label=f"fnmap {getattr(stage.reduce_func, '__name__', 'reduce')}",
        ))
        values = job.results()
        # This level's inputs are consumed: free the stored ones now, not at the end.
        consumed = [v.key for _g, _f, inputs in nodes for v in inputs if isinstance(v, Stored)]
        client.store.delete(consumed)
        pending = {}
        for (group, final, _inputs), value in zip(nodes, values, strict=True):
            if final:
                done[group] = value
            else:
                pending.setdefault(group, []).append(value)
    return {group: done[group] for group in groups}, job


def redrive_job(job, **options):
    """``job.redrive()`` of a map's job: its redrive machinery loads here, when asked, not with every map."""
    from .redrive import redrive_job

    return redrive_job(job, **options)
