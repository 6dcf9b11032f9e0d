"""``fnmap.map`` and ``fnmap.map_reduce``: thin wrappers over the process-wide client."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from . import policy
from .client import get_client
from .config import resolve
from .progress import make_progress
from .worker import MODE_ONE


def map(func: Callable, items: Iterable, *, return_exceptions: bool = False,
        return_job: bool = False, **options: Any):
    """Run ``func(item)`` for every item, in parallel, and return the results in input order.

    ``items`` may be any iterable, generators included.  Options (all optional):
    ``backend``, ``storage``, ``chunksize`` (items per invocation), ``timeout``
    (seconds per call), ``retries``, ``retry_on``, ``memory``, ``gpu``,
    ``progress``, ``extra_env`` and the rest of :class:`fnmap.config.Config`.

    A remote exception is raised here as the same type, with the remote
    traceback as its cause and the item's index in a note; with
    ``return_exceptions=True`` exception objects take the failed items' places.
    With ``return_job=True`` the :class:`fnmap.job.Job` is returned instead; its
    ``results()`` gives the list.

    >>> import fnmap
    >>> fnmap.map(lambda x: x * x, range(5))
    [0, 1, 4, 9, 16]
    """
    config = resolve(**options)
    if isinstance(items, (str, bytes)):
        raise TypeError(
            f"items={items!r:.80} is a {type(items).__name__}; pass a list or other iterable of items"
        )
    job = start_map(func, items, config)
    if return_job:
        return job
    return job.results(return_exceptions=return_exceptions)


def start_map(func: Callable, items: Iterable, config, mode: str = MODE_ONE, kind: str = "map"):
    """Serialize every chunk first (so a bad item fails before anything runs), then dispatch all."""
    client = get_client(config)
    func_key = client.upload_function(func)
    job = client.new_job(config, kind)
    index = 0
    states = []
    try:
        for chunk in policy.chunks(items, config.chunksize):
            states.append(job.add_call(func_key, (mode, chunk), index, len(chunk)))
            index += len(chunk)
    except BaseException:
        job.cancel()
        job.seal()
        raise
    job.progress = make_progress(config.progress, index, f"fnmap {getattr(func, '__name__', 'map')}")
    job.seal()
    client.dispatch_many(job, states)
    return job


def map_reduce(map_func: Callable, items: Iterable, reduce_func: Callable, *,
               return_job: bool = False, **options: Any):
    """Map ``map_func`` over ``items`` remotely, then run ``reduce_func(list_of_results)`` remotely.

    >>> import fnmap
    >>> fnmap.map_reduce(lambda x: x * x, range(4), sum)
    14
    """
    config = resolve(**options)
    results = map(map_func, items, **options)
    reduce_config = config.replace(chunksize=1)
    job = start_map(reduce_func, [results], reduce_config, kind="reduce")
    if return_job:
        return job
    return job.results()[0]
