"""One ``max_cost`` over the several jobs of one request of a front end (:class:`SharedCap`)."""

from __future__ import annotations

from ..errors import CostCapReached
from .pricing import usd


class SharedCap:
    """One ``max_cost`` over the several jobs of one request of a front end: ``map_reduce``'s map and
    reduce levels, a Cubed computation's operations, the ``Parallel`` runs of a joblib backend.  The
    front end starts each job through it (:meth:`start`, :meth:`executor`: the job gets what the jobs
    before it left, and is counted) inside ``with cap:``, which tells a job's
    :class:`fnmap.CostCapReached` against the whole cap; ``what`` names the request in the error."""

    def __init__(self, cap: float | None, what: str):
        #: The cap (keyword, ``FNMAP_MAX_COST`` or the config file: ``config.max_cost``), or None: no cap.
        self.cap = cap
        self.what = what
        #: The jobs started so far, in order.
        self.jobs: list = []

    def start(self, config, start):
        """The next job, ``start(config)`` with ``config`` (:class:`fnmap.config.Config`) given what is
        left of the cap, counted; raises :class:`fnmap.CostCapReached` when nothing is left."""
        job = start(config if self.cap is None else config.replace(max_cost=self.left()))
        self.jobs.append(job)
        return job

    def executor(self, options: dict):
        """A :class:`fnmap.Executor` for the next job, as :meth:`start`."""
        from ..executor import Executor

        executor = Executor(**(options if self.cap is None else {**options, "max_cost": self.left()}))
        self.jobs.append(executor.job)
        return executor

    def __enter__(self) -> SharedCap:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, CostCapReached) and (told := self.reached(error)) is not error:
            raise told from error

    def spent(self) -> float:
        """What the jobs so far spent, and what their calls still out are expected to cost."""
        return sum(job.run.budget.spent + job.run.budget.reserved for job in self.jobs
                   if job.run.budget is not None)

    def left(self) -> float:
        """What the jobs so far left of the cap; raises :class:`fnmap.CostCapReached` when nothing."""
        spent = self.spent()
        if spent >= self.cap:
            raise CostCapReached(self._stopped(spent, " before the next could start"),
                                 id=self.jobs[-1].id if self.jobs else None, cap=self.cap, spent=spent)
        return self.cap - spent

    def reached(self, error: CostCapReached) -> CostCapReached:
        """``error`` (one job's, against what was left to it) told against the whole cap."""
        if self.cap is None or error.cap == self.cap:  # the first job had the whole cap
            return error
        spent = self.spent()
        return CostCapReached(self._stopped(spent, f"; the last: {error}"), id=error.id, cap=self.cap,
                              spent=spent, calls_done=error.calls_done, calls_not_run=error.calls_not_run,
                              estimate=error.estimate)

    def _stopped(self, spent: float, then: str) -> str:
        return (f"{self.what} stopped at its cost cap max_cost=${self.cap:g}: its jobs "
                f"({', '.join(job.id for job in self.jobs)}) spent {usd(spent)} at list prices{then}")
