"""The client's decisions as plain functions over plain data: chunking, retries, backoff, stragglers.

Nothing here does I/O, so every rule is testable without a server.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterable, Iterator

#: Bytes of pickled input an automatically chunked call carries at most (:class:`ChunkSizer`).
CALL_BYTES = 16 << 20
#: The tail of an automatically chunked job is not cut into calls shorter than this part of the target.
TAIL_FRACTION = 1 / 4


def chunks(items: Iterable, chunksize: int) -> Iterator[list]:
    """Split any iterable (generators too) into lists of ``chunksize`` items, lazily."""
    if chunksize < 1:
        raise ValueError(f"chunksize={chunksize!r} must be at least 1")
    it = iter(items)
    while True:
        chunk = list(itertools.islice(it, chunksize))
        if not chunk:
            return
        yield chunk


class ChunkSizer:
    """How many items the next call of an automatically chunked job gets (``chunksize`` unset).

    joblib's ``batch_size="auto"`` for calls: start with one item per call, measure how long
    calls take, and size later calls so that each takes about ``target`` seconds, long enough
    to amortize what a call costs besides its items (a request, a start, a result object),
    short enough that the work still spreads over the workers.

    * **Start small.**  Until a call has been measured, calls get one item, so a job of ten
      slow items still runs on as many workers as it can, and a slow item is measured (as a
      one-item call) before any larger call is made.
    * **Measure.**  :meth:`observe` takes each finished call's items and seconds.  A call's
      seconds are its fixed cost plus its items' cost: the fastest one-item call measures
      the fixed cost (with one item's), so a call of ``n`` items costs ``(seconds - that) /
      (n - 1)`` per item; one-item calls alone give the fastest one's seconds per item (an
      overestimate, so the chunks grow in steps; a cold start of the first does not linger).
      The estimate is smoothed (0.7 old, 0.3 new) and replaced by each call larger than any
      measured before; calls made before the chunks grew (``growth`` times smaller than the
      largest measured) are left out, as joblib leaves out batches of an old size (they
      waited behind larger ones).
    * **Grow by the measured ratio.**  The next size is what takes ``target`` at the estimated
      cost, but at most the largest call measured times ``target`` over that call's fastest
      seconds (joblib's ratio, fixed cost included, so it undershoots: after a one-item call
      of 1 ms, a 0.1 s target gives 100 items, not the 100,000 the per-item estimate might),
      and that growth beyond ``growth`` times is bounded as the tail is (below).  A tiny-item
      job reaches full-size calls after two measured steps instead of one per factor of
      ``growth``; the chunks shrink at once when items turn out slower.  It is safe for slow
      items because the first calls still have one item each: a slow item is measured, and
      sets the size, before any larger call is made; and a fast first few among slow ones
      cost at most calls of ``1 / (2 * parallelism)`` of the items left (``Pool.map`` cuts all
      the items into chunks of ``1 / (4 * processes)`` up front).
    * **Bounded in bytes.**  With ``item_bytes`` (the items' mean pickled size) a call carries
      at most ``max_bytes`` of input (one item at least).
    * **Keep the tail spread.**  A call takes at most ``1 / (2 * parallelism)`` of the items
      left, so the last calls do not leave workers idle behind one big chunk, but is not cut
      below a quarter of ``target`` (where the idle time is small and more calls cost more).
      Not while only one-item calls were measured: their fixed cost, counted as the item's,
      would make every call look long (on the aws path, 64 slots then cut 2,000 tiny items
      into 15-item calls).

    Plain state only: :class:`fnmap.feed.ChunkFeed` feeds it the measurements.
    """

    def __init__(self, target: float, parallelism: int, growth: int = 8, item_bytes: float = 0.0,
                 max_bytes: int = CALL_BYTES):
        if not target > 0:
            raise ValueError(f"target={target!r} must be a positive number of seconds")
        self.target = target
        self.parallelism = max(1, parallelism)
        self.growth = growth
        #: Items a call may carry at most by its input's bytes (no bound without ``item_bytes``).
        self.max_items = max(1, int(max_bytes // item_bytes)) if item_bytes > 0 else None
        #: Estimated seconds per item; None until a call has been measured.
        self.per_item: float | None = None
        #: The largest call measured so far, in items, and its fastest seconds; the fastest one-item call.
        self.measured = 0
        self._measured_seconds = 0.0
        self._single: float | None = None

    def observe(self, items: int, seconds: float) -> None:
        """A call of ``items`` items took ``seconds`` (from its send to its answer)."""
        if items < 1 or seconds < 0:
            return
        if items == 1:
            self._single = seconds if self._single is None else min(self._single, seconds)
        if items * self.growth <= self.measured:
            return  # a call made before the chunks grew (or a small last one): it says little now
        if items == 1:
            estimate = self._single
        elif self._single is not None:
            estimate = max(seconds - self._single, seconds / 100) / (items - 1)
        else:
            estimate = seconds / items
        estimate = max(estimate, 1e-9)
        if self.per_item is None or items > self.measured or self.measured == 1:
            # Only one-item calls so far: the fastest says most (a first call's cold start, 40x a warm
            # one on Lambda, would otherwise keep the chunks at one item for several calls more).
            self.per_item = estimate
        else:
            self.per_item = 0.7 * self.per_item + 0.3 * estimate
        if items > self.measured:
            self.measured, self._measured_seconds = items, seconds
        elif items == self.measured:
            self._measured_seconds = min(self._measured_seconds, seconds)

    def next_size(self, remaining: int) -> int:
        """Items for the next call, with ``remaining`` items not yet in any call."""
        if remaining < 1:
            return 0
        if self.per_item is None:
            return 1
        quarter = max(1, int(self.target * TAIL_FRACTION / self.per_item + 1e-9))  # items of the shortest tail call
        spread = math.ceil(remaining / (2 * self.parallelism))  # an even share of what is left, halved
        if self.measured > 1:  # not cut below quarter-target calls (a one-item call's quarter is unreliable)
            spread = max(spread, quarter)
        ratio = int(self.measured * self.target / max(self._measured_seconds, 1e-9))  # joblib's ratio
        cap = max(self.growth * self.measured, min(ratio, spread))
        size = min(max(1, int(self.target / self.per_item + 1e-9)), cap)
        if size > quarter and self.measured > 1:  # leave work for every worker, down to quarter-target calls
            size = min(size, spread)
        if self.max_items is not None:
            size = min(size, self.max_items)
        return max(1, min(size, remaining))


def backoff_delay(attempt: int, base: float = 0.05, cap: float = 5.0, rand=random.random) -> float:
    """Exponential backoff with full jitter for the ``attempt``-th retry (1-based)."""
    return rand() * min(cap, base * (2 ** (attempt - 1)))


def retry_fault(retryable: bool, charged: int, retries: int) -> bool:
    """Whether a call whose latest attempt hit a platform fault runs again.

    ``charged`` counts the call's faults so far that used up a retry (this one
    included; see :func:`charges_retry`).  A call whose worker crashed the same way twice is not
    retryable (:func:`deterministic_crash`).
    """
    return retryable and charged <= retries


def charges_retry(kind: str, throttle_at_floor: bool) -> bool:
    """Whether a platform fault of this ``kind`` uses up one of the call's ``retries``.

    A 429 (``throttled``) means the platform refused to start the call: nothing
    ran, and the fix is a lower dispatch rate, which the :class:`Throttle` takes
    care of.  Charging it would fail calls just because a job started with a
    burst, as every job does.  Once the throttle is down to one call at a time
    and the platform still refuses, though, slowing down no longer helps, so a
    429 then counts like any other fault and ``retries`` bounds it.
    """
    if kind == "cancelled":  # another run's stop of an attempt of this number (Scheduler._judge): nothing ran
        return False
    return kind != "throttled" or throttle_at_floor


#: How platforms word the end of a worker that died: the emulator ("killed by signal SIGSEGV",
#: "exit code 3"), Lambda ("Runtime exited with error: signal: segmentation fault", "exit status 3").
_CRASH_EXIT = re.compile(r"killed by signal \w+|signal: [a-z][a-z ]*[a-z]|exit (?:code|status) -?\d+")


def crash_exit(message: str) -> str | None:
    """How a crashed worker ended (``"killed by signal SIGSEGV"``, ``"exit code 3"``), as the
    platform's fault message says; None when it does not say."""
    found = _CRASH_EXIT.findall(message or "")
    return found[-1] if found else None


def deterministic_crash(exits: list) -> str | None:
    """The exit a call's worker died with on its last two crashed attempts, when it was the same
    known one both times (None otherwise): then the call itself crashes its worker.

    ``retries`` is for platform faults, and a worker that died is one, once: a host going away,
    a worker killed from outside.  A function that crashes its worker the same way twice (a
    segfault in native code, ``os._exit``) does so on every run, as a bug raises the same
    exception every time, so a third run would only be paid for; DESIGN.md's rule for user
    exceptions (not re-run) then holds for it too.
    """
    if len(exits) >= 2 and exits[-1] is not None and exits[-1] == exits[-2] and exits[-1] not in _FROM_OUTSIDE:
        return exits[-1]
    return None


#: Exits that come from outside the function (``kill -9``, the OOM killer, a platform stopping a
#: host): no function sends them to itself by accident, so twice in a row says nothing about it.
_FROM_OUTSIDE = frozenset({"killed by signal SIGKILL", "killed by signal SIGTERM"})


def deterministic_crash_message(exit: str, detail: str) -> str:
    """Why a call whose function crashed its worker twice the same way fails, with what to do."""
    return (f"{detail}; the call crashed its worker twice the same way ({exit}), so its function "
            "crashes it (native code that segfaults, os._exit, a C extension aborting), and it is not "
            "run again: run the function on these items locally (python -X faulthandler shows where "
            "native code crashed)")


def next_memory_step(steps: tuple, step: int) -> int | None:
    """The ``memory`` step a call killed for memory at ``steps[step]`` retries with; None at the top.

    Only out-of-memory kills climb (other faults retry at the same memory), and a climb uses up
    none of ``retries``: the steps themselves bound it.
    """
    return step + 1 if step + 1 < len(steps) else None


def out_of_memory_message(steps: tuple, step: int, detail: str) -> str:
    """Why a call killed for memory at the top of its ``memory`` steps fails, with the fix."""
    if not steps:
        return (f"{detail}; it ran out of the platform's default memory: ask for more, e.g. "
                "memory=[2048, 8192] (MB; a call killed for memory climbs the list on its retries)")
    top = steps[min(step, len(steps) - 1)]
    listed = ", ".join(map(str, steps))
    return (f"{detail}; it ran out of memory at {top} MB, the last step of memory=[{listed}]: add a "
            f"larger step, e.g. memory=[{listed}, {top * 2}] (Lambda allows up to 10240 MB)")


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def stragglers(
    running: dict[int, float],
    durations: list[float],
    done: int,
    total: int,
    now: float,
    *,
    min_done_fraction: float = 0.9,
    slow_factor: float = 3.0,
    min_seconds: float = 1.0,
    limit: int = 16,
    items: dict[int, int] | None = None,
) -> list[int]:
    """Calls that deserve a speculative copy (MapReduce's backup tasks).

    Once ``min_done_fraction`` of the job is done, a call that has been running
    for ``slow_factor`` times the median finished duration (and at least
    ``min_seconds``) gets a copy; the slowest first, at most ``limit``.
    With ``items`` (call -> its items; automatically chunked calls differ in
    size), ``durations`` are seconds per item and a call's median is scaled by
    its items, so a large chunk is not taken for a straggler among small ones.
    """
    if total == 0 or done < min_done_fraction * total or not durations or not running:
        return []
    median = _median(durations)

    def threshold(call: int) -> float:
        return max(min_seconds, slow_factor * median * (items[call] if items else 1))

    slow = [(now - start, call) for call, start in running.items() if now - start >= threshold(call)]
    slow.sort(reverse=True)
    return [call for _, call in slow[:limit]]


class Throttle:
    """Additive-increase, multiplicative-decrease limit on calls in flight (TCP's congestion window).

    A 429 halves the limit; each success raises it by 1/limit, back up to the
    ceiling.  A burst of 429s answers one overload, so it halves the limit
    once: a 429 only cuts when its call was sent after the latest cut (each
    send takes a ticket; TCP likewise cuts once per window of losses).  Within
    one call of the level where the platform last pushed back, the limit grows
    ``probe_slowdown`` times slower (as TCP CUBIC plateaus near its last
    maximum), so a small platform limit is not hit every few calls.  Plain
    state only; :class:`fnmap.client.Client` adds the waiting.
    """

    def __init__(self, ceiling: int, probe_slowdown: float = 8.0):
        self.ceiling = max(1, ceiling)
        self.limit = float(self.ceiling)
        self.probe_slowdown = probe_slowdown
        # itertools.count: taking a ticket is atomic, so unthrottled sends take one without a lock.
        self._tickets = itertools.count(1)
        self._cut_after = 0
        self._pushed_back_at = float("inf")
        self.cuts = 0

    def ticket(self) -> int:
        """Number a send; pass it back to :meth:`on_throttled` when that send gets a 429."""
        return next(self._tickets)

    def on_throttled(self, ticket: int | None = None) -> bool:
        """Halve the limit for a 429 (once per burst); returns whether it was cut."""
        if ticket is not None and ticket <= self._cut_after:
            return False
        self._pushed_back_at = self.limit
        self.limit = max(1.0, self.limit / 2)
        self._cut_after = next(self._tickets)  # every send numbered before the cut is <= it
        self.cuts += 1
        return True

    def on_success(self) -> None:
        if self.limit < self.ceiling:
            step = 1.0 / self.limit
            if self.limit + 1.0 >= self._pushed_back_at:
                step /= self.probe_slowdown
            self.limit = min(float(self.ceiling), self.limit + step)

    def allowed(self) -> int:
        return int(self.limit)

    @property
    def at_floor(self) -> bool:
        """Down to one call at a time: slowing down further is impossible."""
        return self.limit < 2.0


def _median(values) -> float:
    """``statistics.median`` without importing ``statistics`` (fractions, decimal: a few ms of a
    fresh process's first map)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
