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


def retry_fault(retryable: bool, attempts_made: int, retries: int) -> bool:
    """Whether a call whose latest attempt hit a platform fault runs again."""
    return retryable and attempts_made <= retries


def retry_outcome(exc_types: Iterable[str], retry_on: Iterable[str], attempts_made: int, retries: int) -> bool:
    """Whether a user exception (its class and bases, as qualified names) is in ``retry_on`` with attempts left."""
    wanted = set(retry_on)
    return bool(wanted) and attempts_made <= retries and any(t in wanted for t in exc_types)


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
    """Additive-increase, multiplicative-decrease limit on calls in flight.

    A 429 halves the limit; each success raises it by 1/limit, back up to the
    ceiling.  Plain state only; :class:`fnmap.client.Client` adds the waiting.
    """

    def __init__(self, ceiling: int):
        self.ceiling = max(1, ceiling)
        self.limit = float(self.ceiling)

    def on_throttled(self) -> None:
        self.limit = max(1.0, self.limit / 2)

    def on_success(self) -> None:
        if self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)

    def allowed(self) -> int:
        return int(self.limit)
