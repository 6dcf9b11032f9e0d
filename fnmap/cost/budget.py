"""The cost cap (``max_cost``) while a job runs: the budget of the job, what its attempts cost so
far, what those still out will cost, and whether one more may be sent.

The :class:`fnmap.scheduler.Scheduler` keeps one :class:`Budget` per capped job (``job.run.budget``)
and calls it under its lock: :meth:`Budget.admit` before an attempt is sent (a first attempt, a
retry, a speculative copy), :meth:`Budget.settle` when it ends.  An attempt is admitted while

    spent + reserved + expected <= cap

where ``spent`` is the priced cost of every attempt that ended (its measured duration, memory,
request and S3 requests: :class:`fnmap.cost.pricing.Pricing`), ``reserved`` what the attempts
still out are expected to cost, and ``expected`` what one more will: the mean of the attempts so
far, never less than the least an attempt costs (the minimum billed duration).  An attempt not
expected to fit waits while others are out (they may cost less than expected: as each ends, one
waiting call is looked at again), so the calls in flight, which were expected to fit, end with
their results.  The cap is reached when even at the least each can cost the attempts out and one
more would pass it (the calls in flight then pass it too: the scheduler stops them where the
backend can), or when one more is not expected to fit and none is out: nothing more is sent.
"""

from __future__ import annotations

import time

from .pricing import Pricing, requests

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
        #: function measured (:func:`fnmap.cost.forecast.check_cap`), else 0 (then the minimum).
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
        """The job is refused before any call: ``estimate`` (:func:`fnmap.cost.forecast.estimate_for`)
        is above the cap."""
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
