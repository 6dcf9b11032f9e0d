"""What a map will cost before it runs (:func:`estimate`), and the check that refuses a map with
``max_cost`` whose estimate is above its cap (:func:`check_cap`).

The estimate is made from one of two bases:

* **measured**: the newest job in the storage's index that ran the same function (the same
  pickled bytes, so the same code and the same closure) and reported its calls' durations: the
  items' measured seconds, priced as its calls would be (:class:`fnmap.cost.pricing.Pricing`);
* **minimum**: nothing measured yet: every call at the minimum billed duration (1 ms on Lambda, a
  minute of instance time on Batch), plus its request and S3 requests: what the map costs at least.

An estimate runs, starts and stores nothing: the function is pickled (to know it), the index is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ..backends import backend_class
from ..config import resolve
from ..errors import CostCapReached
from ..observe.history import get_json_many, index_keys
from ..runtime import keys
from ..runtime.serialization import pickle_function
from ..runtime.setup import with_initializer
from .prices import prices_basis
from .pricing import pricing_of, usd

#: How many of the newest index entries are searched for an earlier run of the same function.
HISTORY_ENTRIES = 200


def estimate(func: Callable, items: Iterable, **options: Any) -> dict:
    """What ``fnmap.map(func, items, **options)`` would cost, at list prices, without running it.

    Returns a dict: ``usd`` (the estimate), ``basis`` (``"measured"`` from an earlier job of the
    same function, named in ``from_job``, or ``"minimum"``), ``minimum_usd`` (the least it can cost),
    ``calls``, ``items``, ``seconds_per_item`` (measured, or None), ``platform`` (what it is priced
    as), ``prices`` (the date of the price tables) and ``made_from`` (one line saying all that).

    >>> import fnmap
    >>> fnmap.estimate(abs, range(1000), chunksize=100)["calls"]
    10
    """
    config = resolve(**options)
    items = items if isinstance(items, list) else list(items)
    digest, _ = pickle_function(with_initializer(func, config))
    hits = _cache_hits(config, func, items) if config.cache is not None else 0
    found = estimate_for(config, keys.function_key(digest), len(items) - hits)
    if hits:  # a result-cache hit is one GET and no call (cache=)
        per_get = pricing_of(config).per_get
        found.update(items=len(items), cache_hits=hits, usd=found["usd"] + hits * per_get,
                     minimum_usd=found["minimum_usd"] + hits * per_get,
                     made_from=f"{hits} item(s) from the result cache at one GET each; {found['made_from']}")
    return found


def _cache_hits(config, func: Callable, items: list) -> int:
    """How many of ``items`` the result cache would answer (one listing of the function's entries)."""
    from ..cache.plan import JobCache
    from ..runtime.wire import MODE_ONE
    from ..storage import open_store

    try:
        store = open_store(config.storage_url, config.storage_origin, create=False)
    except Exception:  # no storage yet: nothing cached
        return 0
    return JobCache(store, None, "estimate", func, config).count_hits(MODE_ONE, items)


def estimate_for(config, func_key: str, n_items: int) -> dict:
    """The estimate of a job of ``config`` running the function stored as ``func_key`` over ``n_items``."""
    pricing = pricing_of(config)
    measured = _measured(config, func_key)
    seconds = measured["seconds_per_item"] if measured else None
    calls = _calls(config, n_items, seconds)
    memory = config.memory_steps[0] if config.memory_steps else None
    least = calls * pricing.minimum(memory) + pricing.job_overhead()
    if seconds is None:
        usd, basis = least, "minimum"
        how = (f"{calls} call(s) at the minimum billed duration, their requests and S3 requests "
               "(no earlier run of this function in the storage's index)")
    else:
        per_call = seconds * n_items / max(1, calls)
        usd = calls * pricing.attempt(per_call, memory_mb=memory) + pricing.job_overhead()
        basis = "measured"
        how = (f"{calls} call(s) of {per_call:.3f} s each: {seconds:.4f} s per item measured by job "
               f"{measured['job_id']}")
    return {
        "usd": usd,
        "minimum_usd": least,
        "basis": basis,
        "from_job": measured["job_id"] if measured else None,
        "calls": calls,
        "items": n_items,
        "seconds_per_item": seconds,
        "platform": pricing.describe(),
        "prices": prices_basis()["date"],
        "made_from": f"{how}; priced as {pricing.describe()}, list prices of {prices_basis()['date']}",
    }


def _calls(config, n_items: int, seconds_per_item: float | None) -> int:
    """How many calls the job makes: ``chunksize`` given, exactly; automatic, as the feed would size
    them to the backend's call duration (at least one call, and no more calls than items)."""
    if n_items == 0:
        return 0
    if config.chunksize:
        return math.ceil(n_items / config.chunksize)
    if seconds_per_item is None:
        return 1  # the least an automatically chunked job can make
    target = backend_class(config.backend).call_seconds  # what the feed sizes its calls to
    return max(1, min(n_items, math.ceil(n_items * seconds_per_item / target)))


def _measured(config, func_key: str) -> dict | None:
    """The newest index entry of a job that ran ``func_key`` and measured its items, or None."""
    from ..storage import open_store

    try:
        store = open_store(config.storage_url, config.storage_origin, create=False)
        entries = sorted(index_keys(store).values(), reverse=True)[:HISTORY_ENTRIES]
    except Exception:  # no storage yet, or none reachable: nothing measured
        return None
    for start in range(0, len(entries), 16):
        for summary in sorted(get_json_many(store, entries[start:start + 16]),
                              key=lambda s: s.get("created") or 0, reverse=True):
            if func_key in (summary.get("shared") or []) and summary.get("seconds_per_item"):
                return summary
    return None


def check_cap(job, func_key: str, n_items: int) -> None:
    """Before a job with ``max_cost`` sends anything: refuse it when its estimate is above the cap
    (its record says so; raises :class:`fnmap.CostCapReached`).  An estimate measured by an earlier
    run of the same function is what each of its first calls is expected to cost, until its own
    calls have ended."""
    config, budget = job.config, job.run.budget
    found = estimate_for(config, func_key, n_items)
    if found["usd"] > config.max_cost:
        budget.refuse(found)
        raise CostCapReached(
            f"job {job.id} refused before any call ran: max_cost=${config.max_cost:g} is below its estimate "
            f"{usd(found['usd'])} ({found['made_from']}). Raise max_cost, or run fewer items; "
            "fnmap.estimate(func, items, **options) gives the estimate without running anything.",
            id=job.id, cap=config.max_cost, spent=budget.spent, calls_not_run=found["calls"], estimate=found)
    if found["basis"] == "measured" and found["calls"]:
        budget.first_calls = (found["usd"] - budget.pricing.job_overhead()) / found["calls"]
