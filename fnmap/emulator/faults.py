"""A seeded fault plan: what the emulator does wrong, and to which call.

The emulator plays an unreliable platform on purpose: it can answer 500
without running a call (``fail_rate``), kill the worker process in the middle
of a call (``kill_rate``), accept a call and never answer (``drop_rate``),
delay the first call of a new worker (``cold_start_ms``) or every call
(``latency_ms``), answer 429 beyond ``max_concurrency`` calls at once, and
run some calls ``straggler_factor`` times slower (``straggler_rate``).

Every random choice is drawn from a generator seeded with ``(seed, call id,
attempt)``, not from one shared stream, so the same request meets the same
fate whatever order requests arrive in: with the same ``seed`` a job sees the
same faults at the same calls on every run, and a retry (a new attempt) draws
afresh.  Only throttling depends on timing, as it does on a real platform.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, fields

#: Default slowdown of a straggler.
DEFAULT_STRAGGLER_FACTOR = 10.0


@dataclass(frozen=True)
class Fate:
    """What happens to one request."""

    #: Answer 500 without running anything.
    fail: bool = False
    #: Accept the request and never answer it (a lost call).
    drop: bool = False
    #: Kill the worker process this fraction of a typical call's duration after handing it the call.
    kill_at: float | None = None
    #: Run this call ``straggler_factor`` times slower.
    straggle: bool = False

    @property
    def labels(self) -> list[str]:
        """The faults planned for this request, by name (a straggler may be killed as well)."""
        names = [name for name in ("fail", "drop", "straggle") if getattr(self, name)]
        return names + (["kill"] if self.kill_at is not None else [])


@dataclass(frozen=True)
class FaultPlan:
    """The emulator's fault options, validated; ``fate(call_id, attempt)`` draws one fate."""

    fail_rate: float = 0.0
    kill_rate: float = 0.0
    drop_rate: float = 0.0
    cold_start_ms: float = 0.0
    latency_ms: float = 0.0
    max_concurrency: int | None = None
    straggler_rate: float = 0.0
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR
    seed: int = 0

    def __post_init__(self):
        for name in ("fail_rate", "kill_rate", "drop_rate", "straggler_rate"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"--{_flag(name)}={value!r} is not a probability; use a number from 0 to 1, "
                                 f"e.g. --{_flag(name)} 0.1 for 10% of calls")
        if self.fail_rate + self.kill_rate + self.drop_rate > 1.0:
            raise ValueError(f"--fail-rate {self.fail_rate} + --kill-rate {self.kill_rate} + --drop-rate "
                             f"{self.drop_rate} exceed 1; a call meets at most one of these faults, so their "
                             "sum must be at most 1")
        for name in ("cold_start_ms", "latency_ms"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 3_600_000:
                raise ValueError(f"--{_flag(name)}={value!r} must be a number of milliseconds, 0 or more "
                                 f"(and under an hour), e.g. --{_flag(name)} 200")
        concurrency = self.max_concurrency
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"--max-concurrency={concurrency!r} must be an integer of at least 1 (calls running "
                             "at once before the emulator answers 429); leave it out for no limit")
        if not _is_number(self.straggler_factor) or not 1.0 <= self.straggler_factor <= 10_000:
            raise ValueError(f"--straggler-factor={self.straggler_factor!r} must be a number from 1 to 10000 "
                             "(how many times slower a straggler runs), e.g. --straggler-factor 10")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"--seed={self.seed!r} must be an integer, e.g. --seed 1")

    @property
    def active(self) -> bool:
        """Whether any fault is planned at all."""
        return bool(self.fail_rate or self.kill_rate or self.drop_rate or self.cold_start_ms or self.latency_ms
                    or self.max_concurrency or self.straggler_rate)

    def fate(self, call_id, attempt) -> Fate:
        """The fate of one request, drawn from ``(seed, call_id, attempt)`` alone."""
        rng = random.Random(f"fnmap-faults:{self.seed}:{call_id}:{attempt}")
        u_fault, u_kill_at, u_straggle = rng.random(), rng.random(), rng.random()
        fail = u_fault < self.fail_rate
        kill = not fail and u_fault < self.fail_rate + self.kill_rate
        drop = not (fail or kill) and u_fault < self.fail_rate + self.kill_rate + self.drop_rate
        return Fate(fail=fail, drop=drop, kill_at=u_kill_at if kill else None,
                    straggle=not (fail or drop) and u_straggle < self.straggler_rate)

    def straggler_delay(self, typical_seconds: float) -> float:
        """Extra seconds that make a straggler take ``straggler_factor`` times a typical call."""
        return (self.straggler_factor - 1.0) * max(typical_seconds, self.latency_ms / 1000.0)

    def options(self) -> list[str]:
        """The command-line options that recreate this plan (for logs and the health route)."""
        out = []
        default = FaultPlan()
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out += [f"--{_flag(f.name)}", str(value)]
        return out


class RequestKeys:
    """Stand-in ``(call id, attempt)`` for requests whose header cannot be read: a counter."""

    def __init__(self):
        self._count = itertools.count()

    def key(self, header: dict) -> tuple:
        call_id, attempt = header.get("call_id"), header.get("attempt")
        if isinstance(call_id, int) and isinstance(attempt, int):
            return call_id, attempt
        return f"unreadable-{next(self._count)}", 0


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _flag(name: str) -> str:
    return name.replace("_", "-")
