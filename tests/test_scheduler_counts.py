"""Honest counts (issue 23), as the scheduler records them: copies are not retries, a finished job
has no attempt left running, and cancelled calls are counted as cancelled, not as done or failed.

Fed synchronously as in test_scheduler.py: each test plays the dispatch threads (``_begin``) and
the platform (``_decide``), then reads the job's summary and record as a user would.
"""

from __future__ import annotations

from concurrent.futures import CancelledError

import pytest
import test_scheduler

from fnmap.errors import PlatformFault
from fnmap.scheduler import Outcomes

sched = test_scheduler.sched  # the fixture: a scheduler on a platform nobody calls, fed by hand


def new_job(sched, n_calls=1, **options):
    return test_scheduler.new_job(sched, n_calls, unwrap=True, **options)


def ok(value):
    return Outcomes([("ok", value)], {"started": 1.0, "finished": 2.0})


def statuses(job) -> list[str]:
    return [call["status"] for call in job.record()["calls"]]


def test_a_speculative_copy_is_counted_as_a_copy_not_a_retry(sched):
    job = new_job(sched)
    call = job.run.calls[0]
    first = sched._begin(job, call)
    copy = sched._begin(job, call)  # sent while the first is still out: a copy
    sched._decide(job, call, first, ok(1))
    summary, record = job.summary(), job.record()["summary"]
    assert (summary["retries"], summary["calls_retried"]) == (0, 0)
    assert (record["retries"], record["calls_retried"]) == (0, 0)
    assert summary["copies"] == 1 and job.record()["calls"][0]["copies"] == [copy]


def test_a_retry_after_a_fault_is_still_a_retry(sched):
    job = new_job(sched, retries=1)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault("server", "503"))
    sched._decide(job, call, sched._begin(job, call), ok(1))  # the retry, sent by the timer
    summary, record = job.summary(), job.record()["summary"]
    assert (summary["retries"], summary["calls_retried"], summary["copies"]) == (1, 1, 0)
    assert (record["retries"], record["calls_retried"]) == (1, 1)


def test_no_attempt_is_left_running_in_a_finished_job(sched):
    job = new_job(sched, n_calls=2)
    a, b = job.run.calls
    first, copy = sched._begin(job, a), sched._begin(job, a)
    sched._decide(job, a, copy, ok("the copy won"))
    sched._decide(job, b, sched._begin(job, b), ok(2))
    assert job.done
    assert job.summary()["attempts"] == {"ok": 2, "superseded": 1}
    assert all(attempt["ended"] is not None for call in job.record()["calls"] for attempt in call["attempts"])
    sched._decide(job, a, first, ok("late"))  # the original's late answer: a duplicate, recorded as such
    assert job.summary()["duplicates_discarded"] == 1
    assert [r[3] for r in job.attempts_summary()[a.call_id]] == ["superseded", "ok"]


def test_cancelled_calls_are_counted_as_cancelled(sched):
    job = new_job(sched, n_calls=4)
    running = job.run.calls[0]
    attempt = sched._begin(job, running)
    job.cancel(stop_platform=False)  # three calls never started
    sched._decide(job, running, attempt, ok("finished anyway"))
    assert job.done
    summary = job.summary()
    assert (summary["calls"], summary["done"], summary["cancelled"], summary["failed_items"]) == (4, 4, 3, 0)
    assert statuses(job) == ["ok", "cancelled", "cancelled", "cancelled"]


def test_a_call_whose_caller_cancelled_its_future_is_recorded_cancelled(sched):
    job = new_job(sched, n_calls=2)
    job.run.calls[1].future.cancel()  # as Executor futures are: the caller cancels before a thread takes it
    assert sched._begin(job, job.run.calls[1]) is None
    sched._decide(job, job.run.calls[0], sched._begin(job, job.run.calls[0]), ok(1))
    assert job.done and statuses(job) == ["ok", "cancelled"]
    assert job.summary()["cancelled"] == 1


def test_a_call_stopped_with_its_abandoned_job_is_cancelled_not_failed(sched):
    job = new_job(sched, n_calls=2, retries=3)
    stopped = job.run.calls[0]
    attempt = sched._begin(job, stopped)
    job.cancel(stop_platform=True)
    sched._decide(job, stopped, attempt, PlatformFault("crashed", "killed by the stop"))
    with pytest.raises(CancelledError):
        stopped.future.result(0)
    summary = job.summary()
    assert (summary["cancelled"], summary["failed_items"]) == (2, 0)
    assert statuses(job) == ["cancelled", "cancelled"]


def test_a_poll_that_fails_with_a_bug_is_said_once_and_storage_errors_are_not(recwarn):
    """The monitor polls again after any failure, but a bug must not pass as silence (a job that
    never ends): a storage error or a missing key is transient, anything else is said, once."""
    from fnmap import monitor
    from fnmap.errors import StorageError

    monitor._unless_transient(StorageError("s3 hiccup"), "polling job t1")
    monitor._unless_transient(KeyError("jobs/t1/out/0/0"), "polling job t1")
    monitor._unless_transient(PlatformFault("connection", "cannot reach AWS Batch"), "asking the platform")
    assert not recwarn.list
    for _ in range(3):
        monitor._unless_transient(ValueError("not enough values to unpack"), "polling job t2")
    [said] = [w for w in recwarn.list if "polling job t2" in str(w.message)]
    assert "ValueError: not enough values to unpack" in str(said.message) and said.category is RuntimeWarning
