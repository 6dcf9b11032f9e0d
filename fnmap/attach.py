"""``fnmap.job(job_id)``: a handle on a past or running job, from any process that reaches its storage.

The process that ran ``fnmap.map`` may be gone (a restarted kernel, a closed laptop): every call's item
outcomes are committed to storage by the worker that ran it, and the client writes the job's record
when the job ends, so results, summary and logs can be read back by id.  A running job can be
followed (``wait``) and stopped (``cancel``: the client running it sees the request within a second
or two and cancels as Ctrl-C would).
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

from .blocking import warn_if_in_coroutine
from .errors import CallLost, CostCapReached, KeyNotFound, PlatformError
from .jobs import Job, JobHandle, remote_exception
from .lease import ABANDONED
from .observe import history, records, report
from .observe.report import FINAL
from .runtime import cancel, keys, signing
from .runtime import outcome as _outcome
from .twins import with_aio


def job(job_id: str, **options) -> AttachedJob:
    """The job ``job_id`` (or a unique prefix of it, as ``fnmap jobs`` shows) in the configured
    storage (``storage=`` or the usual settings); raises ``JobNotFound`` (a ``LookupError``) if none."""
    from .config import resolve
    from .storage import open_store

    config = resolve(**options)
    store = open_store(config.storage_url, config.storage_origin, create=False)  # reading creates nothing
    return AttachedJob(store, history.resolve_id(store, job_id), secret=config.secret)


class AttachedJob(JobHandle):
    """A job read back from storage, by id: it answers what the job ``fnmap.map(...,
    return_job=True)`` returns answers (:class:`fnmap.jobs.JobHandle`), from its record."""

    def __init__(self, store, job_id: str, secret: str | None = None):
        self.store = store
        #: Checks the stored results before they are unpickled: the configured secret, else this
        #: user's own (that of the emulators ``fnmap.map`` starts by itself).
        self._secret = secret
        self.id = job_id
        records.load(store, job_id)  # no record and no status record: JobNotFound now, not later

    def record(self) -> dict:
        """The job's record (a snapshot rebuilt from the workers' reports while it runs)."""
        return records.load(self.store, self.id)

    @property
    def done(self) -> bool:
        """Whether the job has ended (its status is final: nothing about it changes any more)."""
        return self.status in FINAL

    @with_aio(JobHandle._wait_aio)
    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the job has ended (polling its storage); False if ``timeout`` passed first.
        ``await job.wait.aio()`` waits without blocking the event loop."""
        warn_if_in_coroutine("fnmap.job(...).wait()", "await fnmap.job(...).wait.aio()")
        return self._wait(timeout)

    def _wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.2
        while not self.done:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(2.0, delay * 1.5)
        return True

    @with_aio(JobHandle._results_aio)
    def results(self, return_exceptions: bool = False) -> list:
        """Every item's result in input order, as ``fnmap.map`` returned them (waits for the job):
        one entry per item, always.  An item's exception is raised (or put in place with
        ``return_exceptions``); a call that never ran gives ``CancelledError`` (``CostCapReached``
        when its job's ``max_cost`` stopped it), one that failed on
        the platform ``PlatformError``, one that never reported (its client stopped first) ``CallLost``.
        ``await job.results.aio()`` waits and reads them without blocking the event loop."""
        warn_if_in_coroutine("fnmap.job(...).results()", "await fnmap.job(...).results.aio()")
        return self._results(return_exceptions)

    def _results(self, return_exceptions: bool) -> list:
        self._wait(None)
        record = self.record()
        unreported = record.get("unreported", [])
        again = report.retried_calls(record["calls"])
        spans = [(c["first_item"] or 0, c) for c in record["calls"] if c["call"] not in again]
        spans += [(first, {"unreported": n, "first_item": first}) for first, n in unreported]
        out = []
        for _, call in sorted(spans, key=lambda span: span[0]):
            out.extend(self._unreported(call, record, return_exceptions) if "unreported" in call
                       else self._call_results(call, record, return_exceptions))
        return out

    def _unreported(self, span: dict, record: dict, return_exceptions: bool) -> list:
        """Placeholders for items no call reported: a clear exception each, raised for the first."""
        first, n = span["first_item"], span["unreported"]
        status = record["summary"]["status"]
        why = "its client stopped before it ran or reported" if status == ABANDONED else f"the job is {status}"
        excs = [CallLost(f"item {first + i} of job {self.id} has no result: its call never ran or never "
                         f"reported ({why}); see `fnmap job {self.id[:12]}`") for i in range(n)]
        if excs and not return_exceptions:
            raise excs[0]
        return excs

    def _call_results(self, call: dict, record: dict, return_exceptions: bool) -> list:
        try:
            key = keys.result_key(self.id, call["call"])
            secret = (self._secret or signing.local_secret()).encode()
            outcomes = _outcome.open_committed(secret, key, self.store.get(key))
        except KeyNotFound:
            cap = record.get("cost_cap") or {}
            if call["status"] == "cancelled" and cap.get("reached"):  # not run: its job reached its max_cost
                exc: BaseException = CostCapReached(
                    f"call {call['call']} of job {self.id} did not run: the job stopped at its cost cap "
                    f"max_cost=${cap['max_cost']:g} (`fnmap redrive {self.id[:12]} --max-cost USD` runs it)",
                    id=self.id, cap=cap["max_cost"], spent=cap["spent_usd"])
            elif call["status"] == "cancelled":
                exc = CancelledError(f"call {call['call']} of job {self.id} was cancelled")
            else:
                exc = PlatformError(f"call {call['call']} of job {self.id} has no result: "
                                    f"{call.get('error') or call['status']}")
            if not return_exceptions:
                raise exc from None
            return [exc] * call["items"]
        plain = _outcome.plain_values(outcomes)
        if plain is not None:  # every item returned a value
            return plain
        values = []
        for offset, outcome in enumerate(outcomes):
            if _outcome.succeeded(outcome):
                values.append(_outcome.value(outcome))
                continue
            item = (call.get("first_item") or 0) + offset
            exc = remote_exception(outcome, item, f"job {self.id}, call {call['call']}")
            if not return_exceptions:
                raise exc
            values.append(exc)
        return values

    def _redrive_defaults(self) -> dict:
        """The job's storage and the secret it was read with (the job's client may be gone, on any machine)."""
        return {"storage": self.store.url, **({"secret": self._secret} if self._secret else {})}

    def _redrive(self, options: dict) -> Job:
        from .redrive import redrive

        return redrive(self.store, self.id, **options)

    def cancel(self) -> None:
        """Ask the client running this job to stop it, as Ctrl-C would (no effect on a job that has ended)."""
        cancel.request_cancel(self.store, self.id, "fnmap.job(...).cancel()")

    def __repr__(self) -> str:
        s = self.summary()
        return f"<fnmap.job {self.id} {s.get('function') or '?'} {s['status']} {s['calls_done']}/{s['calls']} calls>"
