"""The kinds of job, named for the front-end that starts them, and what each kind promises beyond its run.

A job's kind is in its record (``fnmap jobs`` shows it), and this one table says what follows from
it: whether its calls are recorded for a redrive, and whether its process gives it up at exit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    #: Its calls and items are stored before they are sent (:mod:`fnmap.redrive`), so that any
    #: process with the storage and the secret can run again those without a committed result.
    recorded: bool
    #: A process that exits while the job runs gives it up at once (nobody waits for its results
    #: any more; its lease says ``abandoned``: :mod:`fnmap.lease`) instead of finishing it.
    given_up_at_exit: bool


#: Every kind of job: a map is the whole of its items, known when it starts and waited for by its
#: caller; an ``Executor``'s or the Dask shim's job is a stream of futures, which finishes its
#: pending work at exit as the standard library's executors do, and stores nothing for a redrive.
KINDS = {
    "map": Kind(recorded=True, given_up_at_exit=True),  # fnmap.map, starmap, imap
    "reduce": Kind(recorded=True, given_up_at_exit=True),  # the levels of map_reduce's tree
    "executor": Kind(recorded=False, given_up_at_exit=False),  # fnmap.Executor, joblib, Cubed
    "dask": Kind(recorded=False, given_up_at_exit=False),  # fnmap.dask.get
}


def not_recorded(job_id: str, kind: str) -> str:
    """Why a job of ``kind``, which is not recorded, cannot be redriven, and what to do instead."""
    return (f"job {job_id} is an {kind!r} job, whose calls are not stored for a redrive: only maps "
            "(fnmap.map, starmap, imap, map_reduce) store theirs; run its work again")
