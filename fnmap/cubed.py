"""A Cubed executor: each pipeline's tasks run as fnmap calls, with fnmap's retries and copies.

>>> import cubed, cubed.array_api as xp
>>> from fnmap.cubed import FnmapExecutor
>>> spec = cubed.Spec(work_dir="/tmp/cubed", allowed_mem="500MB", executor=FnmapExecutor())
>>> a = xp.ones((1000, 1000), chunks=(250, 250), spec=spec)
>>> float(xp.sum(a).compute())
1000000.0

Cubed plans an array computation as a graph of operations, each a function mapped over the
chunks it writes (``pipeline.mappable``); the intermediate arrays live in ``work_dir`` (a folder,
or ``s3://...`` for cloud workers).  This executor visits the operations in order and sends each
one's tasks through one :class:`fnmap.Executor`, firing Cubed's callbacks (progress bars, timing
and memory reports) as each task ends.  A task that raises is retried (``retries``, 2 by default,
as Cubed's own executors do: ``retry_on=(Exception,)``), and fnmap launches speculative copies
of stragglers; keyword arguments are fnmap's options (``backend=``, ``memory=``, ...).
``max_cost`` caps the whole computation: each operation's job gets what the ones before it left.
"""

from __future__ import annotations

from concurrent.futures import as_completed
from typing import Any

try:
    from cubed.runtime.pipeline import visit_nodes
    from cubed.runtime.types import DagExecutor
    from cubed.runtime.utils import (
        execution_stats,
        handle_callbacks,
        handle_operation_end_callbacks,
        handle_operation_start_callbacks,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"fnmap.cubed needs cubed ({e}); install it with: pip install 'fnmap[cubed]'") from e

#: fnmap options this executor sets unless given: Cubed tasks are idempotent writes of chunks,
#: so any failure is worth a retry (Cubed's own executors retry twice).
DEFAULTS = {"retries": 2, "retry_on": (Exception,), "progress": False}


@execution_stats
def run_task(item, func=None, config=None, name=None, compute_id=None):
    """One Cubed task, on a worker; ``execution_stats`` adds its timing and peak memory."""
    return func(item, config=config)


class FnmapExecutor(DagExecutor):
    """Runs a Cubed plan on fnmap (``cubed.Spec(..., executor=FnmapExecutor(**fnmap_options))``)."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        #: The fnmap job of each operation of the last computation, ``{operation name: Job}``.
        self.jobs: dict = {}

    def __getstate__(self):
        # The plan's tasks carry the spec, and so this executor, to the workers: without its jobs.
        return {"kwargs": self.kwargs, "jobs": {}}

    @property
    def name(self) -> str:
        return "fnmap"

    def execute_dag(self, dag, callbacks=None, spec=None, compute_id=None, **kwargs: Any) -> None:
        """Run every operation of ``dag`` in topological order; ``kwargs`` (Cubed's
        ``compute_arrays_in_parallel`` and the like) are accepted and not needed: fnmap already
        runs all the tasks of an operation at once."""
        from fnmap.config import resolve
        from fnmap.cost.shared import SharedCap

        options = {**DEFAULTS, **self.kwargs}
        _check_memory(spec, options.get("memory"))
        self.jobs = {}
        # One job per operation, one max_cost for the whole computation.
        with SharedCap(resolve(**options).max_cost, "the Cubed computation") as cap:
            for name, node in visit_nodes(dag):
                self._run_operation(cap, options, name, node["pipeline"], callbacks, compute_id)

    def _run_operation(self, cap, options: dict, name: str, pipeline, callbacks, compute_id) -> None:
        """One operation of the plan: one fnmap job (its executor from ``cap``) of all its tasks."""
        handle_operation_start_callbacks(callbacks, name)
        with cap.executor(options) as executor:
            self.jobs[name] = executor.job
            futures = [executor.submit(run_task, item, func=pipeline.function, config=pipeline.config,
                                       name=name, compute_id=compute_id) for item in pipeline.mappable]
            executor.shutdown(wait=False)  # all its tasks are in: stragglers may now get copies
            try:
                for future in as_completed(futures):
                    result, stats = future.result()
                    handle_callbacks(callbacks, result, {**stats, "name": name})
            except BaseException:  # a cost cap reached too: `cap` tells it against the whole cap
                executor.shutdown(wait=False, cancel_futures=True)
                raise
        handle_operation_end_callbacks(callbacks, name)


def _check_memory(spec, memory_mb) -> None:
    """Cubed plans each task to fit ``spec.allowed_mem``: a smaller fnmap ``memory=`` would fail
    tasks out of memory, so say so before anything runs (as Cubed's Lithops executor does)."""
    allowed = getattr(spec, "allowed_mem", None)
    if isinstance(memory_mb, (list, tuple)) and memory_mb:  # memory steps: tasks start at the first
        memory_mb = memory_mb[0]
    if allowed is not None and memory_mb is not None and memory_mb * 1_000_000 < allowed:
        raise ValueError(f"fnmap memory={memory_mb} MB is less than the Cubed spec's allowed_mem "
                         f"({allowed / 1e6:.0f} MB): raise memory= or lower allowed_mem")
