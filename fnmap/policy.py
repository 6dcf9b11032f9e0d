"""The client's decisions as plain functions over plain data: chunking, retries, backoff, stragglers.

Nothing here does I/O, so every rule is testable without a server.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Iterable, Iterator


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


def backoff_delay(attempt: int, base: float = 0.05, cap: float = 5.0, rand=random.random) -> float:
    """Exponential backoff with full jitter for the ``attempt``-th retry (1-based)."""
    return rand() * min(cap, base * (2 ** (attempt - 1)))


def retry_fault(retryable: bool, charged: int, retries: int) -> bool:
    """Whether a call whose latest attempt hit a platform fault runs again.

    ``charged`` counts the call's faults so far that used up a retry (this one
    included; see :func:`charges_retry`).
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
    return kind != "throttled" or throttle_at_floor


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
) -> list[int]:
    """Calls that deserve a speculative copy (MapReduce's backup tasks).

    Once ``min_done_fraction`` of the job is done, a call that has been running
    for ``slow_factor`` times the median finished duration (and at least
    ``min_seconds``) gets a copy; the slowest first, at most ``limit``.
    """
    if total == 0 or done < min_done_fraction * total or not durations or not running:
        return []
    threshold = max(min_seconds, slow_factor * statistics.median(durations))
    slow = [(now - start, call) for call, start in running.items() if now - start >= threshold]
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
