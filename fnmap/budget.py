"""The cost cap (``max_cost``): what a map will cost before it runs (:func:`estimate`, and the
check that refuses a map whose estimate is above its cap), and while it runs, the budget of the job:
what its attempts cost so far, what those still out will cost, and whether one more may be sent.

The :class:`fnmap.scheduler.Scheduler` keeps one :class:`Budget` per capped job (``job.run.budget``)
and calls it under its lock: :meth:`Budget.admit` before an attempt is sent (a first attempt, a
retry, a speculative copy), :meth:`Budget.settle` when it ends.  An attempt is admitted while

    spent + reserved + expected <= cap

where ``spent`` is the priced cost of every attempt that ended (its measured duration, memory,
request and S3 requests: :class:`fnmap.observe.cost.Pricing`), ``reserved`` what the attempts
still out are expected to cost, and ``expected`` what one more will: the mean of the attempts so
far, never less than the least an attempt costs (the minimum billed duration).  An attempt not
expected to fit waits while others are out (they may cost less than expected: as each ends, one
waiting call is looked at again), so the calls in flight, which were expected to fit, end with
their results.  The cap is reached when even at the least each can cost the attempts out and one
more would pass it (the calls in flight then pass it too: the scheduler stops them where the
backend can), or when one more is not expected to fit and none is out: nothing more is sent.

Before a map runs, its estimate is made from one of two bases:

* **measured**: the newest job in the storage's index that ran the same function (the same
  pickled bytes, so the same code and the same closure) and reported its calls' durations: the
  items' measured seconds, priced as its calls would be (:class:`fnmap.observe.cost.Pricing`);
* **minimum**: nothing measured yet: every call at the minimum billed duration (1 ms on Lambda, a
  minute of instance time on Batch), plus its request and S3 requests: what the map costs at least.

An estimate runs, starts and stores nothing: the function is pickled (to know it), the index is read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from .backends import backend_class
from .config import resolve
from .errors import CostCapReached
from .observe.cost import Pricing, requests
from .observe.history import get_json_many, index_keys
from .observe.prices import prices_basis
from .runtime import keys
from .runtime.serialization import pickle_function
from .runtime.setup import with_initializer


def pricing_of(config) -> Pricing:
    """The pricing of a job run with ``config`` (:class:`fnmap.config.Config`)."""
    return Pricing.of(config.backend, {"region": config.region, "memory": config.memory, "gpu": config.gpu,
                                       "instance_type": getattr(config, "instance_type", None)})


#: How many attempts of a capped job are out at once before any has ended (when no earlier run of
#: its function measured one): until then what a call costs is unknown, and a first wave as wide as
#: the backend's concurrency (hundreds on Lambda) could pass the cap many times over.
FIRST_WAVE = 4
#: What :meth:`Budget.admit` answers when an attempt must wait: the first wave is out, or it is not
#: expected to fit while others are out.
WAIT = "wait"


class Budget:
    """The running cost of one job against its cap, in US dollars at list prices."""

    __slots__ = ("cap", "pricing", "least", "spent", "reserved", "attempts", "reached_at", "in_flight",
                 "stopped", "refused_estimate", "attempts_usd",
                 "first_calls", "out", "waiting", "pressed")

    def __init__(self, cap: float, pricing: Pricing, spent: float = 0.0):
        self.cap = float(cap)
        self.pricing = pricing
        #: The least an attempt at the job's memory costs (asked before every attempt: priced once).
        self.least = pricing.minimum()
        #: What the attempts that ended cost (and the job's own storage requests).
        self.spent = spent
        #: What the attempts still out are expected to cost (released as each ends), and how many.
        self.reserved = 0.0
        self.out = 0
        #: Calls waiting for the first attempt's price (:data:`FIRST_WAVE`), or for room under the cap.
        self.waiting: list = []
        #: A call waited for room under the cap (then each end releases one call, not all).
        self.pressed = False
        #: Attempts that ended and were priced, and what they cost.
        self.attempts = 0
        self.attempts_usd = 0.0
        #: When an attempt was first refused (the cap was reached), or None.
        self.reached_at: float | None = None
        #: Calls out when the cap was reached (stopped where the backend can).
        self.in_flight = 0
        #: The scheduler has stopped the job for its cap (once).
        self.stopped = False
        #: What each call is expected to cost before any has ended: what an earlier run of the same
        #: function measured (:func:`check_cap`), else 0 (then the minimum).
        self.first_calls = 0.0
        #: The estimate that refused the job before any call (:meth:`refuse`), or None.
        self.refused_estimate: dict | None = None

    @property
    def reached(self) -> bool:
        return self.reached_at is not None

    def expected(self, memory_mb: int | None = None) -> float:
        """What one more attempt is expected to cost: the mean so far (before any ended, what an
        earlier run of the function measured, if one did), at least the minimum."""
        mean = self.attempts_usd / self.attempts if self.attempts else self.first_calls
        return max(self._least(memory_mb), mean)

    def _least(self, memory_mb: int | None) -> float:
        return self.least if memory_mb in (None, self.pricing.memory_mb) else self.pricing.minimum(memory_mb)

    def admit(self, memory_mb: int | None = None) -> float | None:
        """Reserve what one more attempt is expected to cost and return it, or say why not:

        * None, and the cap is reached: even at the least each attempt can cost, the ones out and
          this one would take the job past its cap; or this one is not expected to fit and none is
          out whose end could make room;
        * :data:`WAIT`: it is not expected to fit, but attempts are out that may cost less than
          expected (it is looked at again as one ends, see :meth:`release`); or :data:`FIRST_WAVE`
          attempts are out and nothing is known yet of what one costs (none has ended, no earlier
          run of the function measured one)."""
        if self.reached_at is not None:
            return None
        if self.spent + self.out * self.least + self._least(memory_mb) > self.cap:
            return self._reach()
        expected = self.expected(memory_mb)
        if self.spent + self.reserved + expected > self.cap:
            if not self.out:
                return self._reach()
            self.pressed = True
            return WAIT
        if not self.attempts and not self.first_calls and self.out >= FIRST_WAVE:
            return WAIT
        self.reserved += expected
        self.out += 1
        return expected

    def _reach(self) -> None:
        self.reached_at = time.time()
        return None

    def wait(self, state) -> None:
        """``state`` (a call) was told to :data:`WAIT`: it is sent again by :meth:`release`."""
        self.waiting.append(state)

    def release(self) -> list:
        """The calls waiting that may be sent now, as an attempt ends: one while the cap is near
        (its end made room for one at most), all once the first wave is priced."""
        if not self.attempts:
            room = max(0, FIRST_WAVE - self.out)
        else:
            room = 1 if self.pressed else len(self.waiting)
        released, self.waiting = self.waiting[:room], self.waiting[room:]
        return released

    def release_all(self) -> list:
        """Every call waiting (the job stops: none will be sent)."""
        released, self.waiting = self.waiting, []
        return released

    def charge(self, reserved: float, attempt, stats: dict | None, stored_input: bool) -> None:
        """Attempt ``attempt`` (:class:`fnmap.run.Attempt`, ended), which reserved ``reserved``, is
        priced in: the worker's own time and cold start when it reported (``stats``), else the
        client's view, sent until it ended (an upper bound)."""
        init = 0.0
        if stats and stats.get("started") is not None and (stats.get("written") or stats.get("finished")):
            seconds = (stats.get("written") or stats["finished"]) - stats["started"]
            init = (stats.get("init_seconds") or 0.0) if stats.get("cold") else 0.0
        else:
            seconds = (attempt.ended or time.time()) - attempt.sent
        puts, gets = requests(stored_input, attempt.number == 1, bool(stats and stats.get("cold")))
        self.settle(reserved, self.pricing.attempt(seconds, memory_mb=attempt.memory, init_seconds=init,
                                                   puts=puts, gets=gets))

    def refuse(self, estimate: dict) -> None:
        """The job is refused before any call: ``estimate`` (:func:`estimate_for`) is above the cap."""
        self.reached_at = time.time()
        self.stopped = True
        self.refused_estimate = estimate

    def settle(self, reserved: float, usd: float) -> None:
        """An attempt that reserved ``reserved`` ended, and cost ``usd`` (0 if it was never sent)."""
        self.reserved = self.reserved - reserved
        self.out -= 1
        if self.reserved < 1e-12:  # what is left of the sums of the same reservations: nothing
            self.reserved = 0.0
        if usd:
            self.spent += usd
            self.attempts_usd += usd
            self.attempts += 1

    def as_record(self) -> dict:
        """What the job record says of the cap (``fnmap job``, ``summary()``)."""
        return {
            "max_cost": self.cap,
            "spent_usd": self.spent,
            "in_flight_usd": self.reserved,
            "reached": self.reached,
            "reached_at": self.reached_at,
            "calls_in_flight": self.in_flight,
            "model": self.pricing.model,
            **({"refused": self.refused_estimate} if self.refused_estimate else {}),
        }


#: How many of the newest index entries are searched for an earlier run of the same function.
HISTORY_ENTRIES = 200


class SharedCap:
    """One ``max_cost`` over the several jobs of one request of a front end: ``map_reduce``'s map and
    reduce levels, a Cubed computation's operations, the ``Parallel`` runs of a joblib backend.  Each
    new job gets what the jobs before it left of the cap; ``what`` names the request in the error."""

    def __init__(self, cap: float | None, what: str):
        #: The cap (keyword, ``FNMAP_MAX_COST`` or the config file: ``config.max_cost``), or None: no cap.
        self.cap = cap
        self.what = what
        self.jobs: list = []

    def spent(self) -> float:
        """What the jobs so far spent, and what their calls still out are expected to cost."""
        return sum(job.run.budget.spent + job.run.budget.reserved for job in self.jobs
                   if job.run.budget is not None)

    def options(self, options: dict) -> dict:
        """``options`` for the next job: ``max_cost`` is what is left of the cap; raises
        :class:`fnmap.CostCapReached` when nothing is left."""
        return options if self.cap is None else {**options, "max_cost": self.left()}

    def config(self, config):
        """:class:`fnmap.config.Config` ``config`` for the next job, as :meth:`options`."""
        return config if self.cap is None else config.replace(max_cost=self.left())

    def left(self) -> float:
        """What the jobs so far left of the cap; raises :class:`fnmap.CostCapReached` when nothing."""
        spent = self.spent()
        if spent >= self.cap:
            raise CostCapReached(
                f"{self.what} stopped at its cost cap max_cost=${self.cap:g}: its jobs "
                f"({', '.join(job.id for job in self.jobs)}) spent ${spent:.6f} at list prices before the next "
                "could start", id=self.jobs[-1].id if self.jobs else None, cap=self.cap, spent=spent)
        return self.cap - spent

    def reached(self, error: CostCapReached) -> CostCapReached:
        """``error`` (one job's, against what was left to it) told against the whole cap."""
        if self.cap is None or error.cap == self.cap:  # the first job had the whole cap
            return error
        spent = self.spent()
        return CostCapReached(
            f"{self.what} stopped at its cost cap max_cost=${self.cap:g}: its jobs "
            f"({', '.join(job.id for job in self.jobs)}) spent ${spent:.6f} at list prices; the last: {error}",
            id=error.id, cap=self.cap, spent=spent, calls_done=error.calls_done,
            calls_not_run=error.calls_not_run, estimate=error.estimate)


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
    return estimate_for(config, keys.function_key(digest), len(items))


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
    from .storage import open_store

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


def check_cap(job, func_key: str, n_items: int) -> dict | None:
    """Before a job with ``max_cost`` sends anything: its estimate when that is above the cap (the job
    is refused: its record says so), else None.  An estimate measured by an earlier run of the same
    function is what each of its first calls is expected to cost, until its own calls have ended."""
    config, budget = job.config, job.run.budget
    found = estimate_for(config, func_key, n_items)
    if found["usd"] > config.max_cost:
        budget.refuse(found)
        return found
    if found["basis"] == "measured" and found["calls"]:
        budget.first_calls = (found["usd"] - budget.pricing.job_overhead()) / found["calls"]
    return None
