"""The scheduler's decisions, fed synchronously: begin an attempt, hand it an answer, look at the call.

No server and no dispatch thread runs a call here: each test plays the platform by calling
``_begin`` (a dispatch thread taking the call) and ``_decide`` (its answer coming back), then checks
what the scheduler decided: finished, retried on the timer heap, failed with which error, or left
to a copy still out.  The end-to-end behaviour is in test_map, test_executor, test_semantics and
test_faults; this is the rulebook.
"""

from __future__ import annotations

from concurrent.futures import CancelledError, Future

import pytest

import fnmap
from fnmap.backends.base import BaseBackend
from fnmap.config import resolve
from fnmap.errors import PlatformFault
from fnmap.jobs import Job
from fnmap.run import CallRun
from fnmap.scheduler import ACCEPTED, Outcomes, Scheduler
from fnmap.storage import open_store


class Unreachable(BaseBackend):
    """A platform nobody calls: the tests deliver every answer themselves."""

    name = "scripted"
    max_workers = 4

    def invoke(self, invocation):
        raise AssertionError("the synchronous tests deliver answers themselves")


@pytest.fixture
def sched(tmp_path):
    scheduler = Scheduler(Unreachable(), open_store(f"file://{tmp_path}"), b"secret")
    yield scheduler
    scheduler.close()


def new_job(sched, n_calls=1, unwrap=False, **options):
    job = Job(sched, sched.store, resolve(backend="local", storage=sched.store.url, progress=False, **options))
    for i in range(n_calls):
        sched.add(job, CallRun(i, i, 1, "functions/f", b"payload", None, Future(), unwrap))
    sched.seal(job)
    return job


def ok(value):
    return Outcomes([("ok", value)], {"started": 1.0, "finished": 2.0})


def timers_for(sched, state):
    return [t for t in sched.monitor._timers if t[4] is state]


def test_an_answer_finishes_the_call_and_a_later_copy_is_a_duplicate(sched):
    job = new_job(sched, unwrap=True)
    call = job.run.calls[0]
    first, copy = sched._begin(job, call), sched._begin(job, call)
    assert (first, copy) == (1, 2) and call.in_flight == 2
    sched._decide(job, call, copy, ok("from the copy"))
    sched._decide(job, call, first, ok("late"))
    assert call.future.result(0) == "from the copy"
    assert job.done and job.run.duplicate_count == 1 and job.run.done_count == 1


def test_a_retryable_fault_goes_on_the_timer_heap_and_a_final_one_fails_with_its_error(sched):
    job = new_job(sched, retries=1, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault("server", "503"))
    assert not call.done and len(timers_for(sched, call)) == 1  # a retry waits; no thread sleeps
    assert call.charged == 1
    sched._decide(job, call, sched._begin(job, call), PlatformFault("crashed", "exit code 9"))
    with pytest.raises(fnmap.WorkerCrashed, match="failed after 2 attempt"):
        call.future.result(0)
    assert job.done and job.run.failed_count == 1


@pytest.mark.parametrize("kind, error", [("signature", fnmap.SignatureError), ("timeout", fnmap.TimeoutError),
                                         ("rejected", fnmap.PlatformError), ("lost", fnmap.CallLost)])
def test_the_error_class_comes_from_the_fault_kind(sched, kind, error):
    job = new_job(sched, retries=0, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault(kind, "no"))
    with pytest.raises(error):
        call.future.result(0)


def test_a_429_does_not_use_a_retry_until_the_throttle_is_at_its_floor(sched):
    job = new_job(sched, retries=0, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault("throttled", "429"))
    assert not call.done and call.charged == 0 and timers_for(sched, call)
    sched.dispatch.throttle.on_throttled()
    sched.dispatch.throttle.on_throttled()  # 4 -> 2 -> 1 call in flight: the floor
    assert sched.dispatch.throttle.at_floor
    sched._decide(job, call, sched._begin(job, call), PlatformFault("throttled", "429"))
    with pytest.raises(fnmap.PlatformError, match="429"):
        call.future.result(0)


def test_a_stop_this_client_did_not_ask_for_sends_the_call_again_using_no_retry(sched):
    """The emulator stopped an attempt because an earlier, killed run of the job asked it to stop
    one of that number: the next attempt takes the call's result."""
    job = new_job(sched, retries=0, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault("cancelled", "409: stopped (POST /cancel)"))
    assert not call.done and call.charged == 0 and timers_for(sched, call)
    sched._decide(job, call, sched._begin(job, call), ok("committed"))
    assert call.future.result(0) == "committed"


def test_while_a_copy_is_out_a_fault_of_the_other_attempt_decides_nothing(sched):
    job = new_job(sched, retries=0, unwrap=True)
    call = job.run.calls[0]
    first, copy = sched._begin(job, call), sched._begin(job, call)
    sched._decide(job, call, first, PlatformFault("crashed", "gone"))
    assert not call.done and not timers_for(sched, call)
    sched._decide(job, call, copy, ok(42))
    assert call.future.result(0) == 42


def test_an_accepted_call_waits_for_its_result_and_is_lost_after_its_timeout(sched):
    job = new_job(sched, retries=0, timeout=1, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), ACCEPTED)
    assert list(call.awaiting) == [1] and not call.done
    call.awaiting[1] -= 60  # accepted a minute ago: past timeout + grace
    sched.monitor.poll(job)
    with pytest.raises(fnmap.CallLost, match="no result"):
        call.future.result(0)


def test_a_cancelled_job_starts_no_call_but_one_already_begun_ends_with_its_own_result(sched):
    job = new_job(sched, n_calls=2, unwrap=True)
    running, waiting = job.run.calls
    attempt = sched._begin(job, running)
    job.cancel(stop_platform=False)
    assert sched._begin(job, waiting) is None
    with pytest.raises(CancelledError):
        waiting.future.result(0)
    sched._decide(job, running, attempt, ok("finished anyway"))
    assert running.future.result(0) == "finished anyway" and job.done


def test_an_abandoned_job_does_not_retry(sched):
    job = new_job(sched, retries=3, unwrap=True)
    call = job.run.calls[0]
    attempt = sched._begin(job, call)
    job.cancel(stop_platform=True)
    sched._decide(job, call, attempt, PlatformFault("server", "503"))
    assert call.done and not timers_for(sched, call)
    # The attempt was in flight when the job was abandoned, so the scheduler stopped it: it ends as
    # cancelled, whatever fault its stopping produced (issue 24: joblib's aborts stop running calls).
    with pytest.raises(CancelledError, match="abandoned"):
        call.future.result(0)


def test_a_retry_on_exception_is_retried_and_charged(sched):
    job = new_job(sched, retries=1, unwrap=True)
    call = job.run.calls[0]
    sched._decide(job, call, sched._begin(job, call), PlatformFault("retry_on", "ConnectionError"))
    assert call.charged == 1 and timers_for(sched, call) and not call.done


def test_an_unknown_fault_kind_is_refused():
    with pytest.raises(ValueError, match="unknown fault kind 'throtled'"):
        PlatformFault("throtled", "a typo")


class OneAtATime(BaseBackend):
    """A platform that runs two calls at once and answers 429 to any more, like Lambda at its
    reserved concurrency; it answers ``ok`` after a short run."""

    name = "scripted"
    max_workers = 8

    def __init__(self):
        import threading

        self.running = 0
        self.refused = 0
        self.lock = threading.Lock()

    def invoke(self, invocation):
        import time

        from fnmap.backends.base import Answer
        from fnmap.runtime.wire import CallResponse, encode

        with self.lock:
            if self.running >= 2:
                self.refused += 1
                raise PlatformFault("throttled", "429 TooManyRequestsException")
            self.running += 1
        try:
            time.sleep(0.01)
        finally:
            with self.lock:
                self.running -= 1
        from fnmap.runtime import compression, keys, signing
        from fnmap.runtime.serialization import dumps

        req = invocation.request
        resp = CallResponse(job_id=req.job_id, call_id=req.call_id, attempt=req.attempt, inline=True)
        outcomes = compression.pack(dumps([("ok", invocation.request.call_id)]))
        # Sealed as a worker seals results, with the scheduler's secret (the client checks it).
        return Answer(encode(resp, signing.seal(b"secret", keys.result_key(req.job_id, req.call_id), outcomes)))


def test_429s_lower_the_calls_in_flight_instead_of_hammering(tmp_path):
    """With 8 dispatch threads and room for 2, the throttle halves the calls in flight on the
    first 429s and then probes slowly: a few dozen refusals for 60 calls, where sending at full
    width gets about three refusals per call."""
    platform = OneAtATime()
    scheduler = Scheduler(platform, open_store(f"file://{tmp_path}"), b"secret")
    try:
        job = Job(scheduler, scheduler.store, resolve(backend="local", storage=scheduler.store.url, progress=False,
                                                       retries=0))
        states = [CallRun(i, i, 1, "functions/f", b"x", None, Future(), True) for i in range(60)]
        for state in states:
            scheduler.add(job, state)
        scheduler.seal(job)
        scheduler.submit(job, states)
        assert job.wait(60)
        assert [s.future.result() for s in states] == list(range(60))
        assert scheduler.dispatch.throttle.cuts >= 1
        assert platform.refused < 60, platform.refused
    finally:
        scheduler.close()


def test_the_on_poll_hook_given_to_the_scheduler_looks_at_each_running_job(tmp_path):
    """The client's look for ``fnmap cancel`` requests is handed to the scheduler when it is built,
    and its monitor calls it for a job still running."""
    import threading

    looked = []
    seen = threading.Event()

    def hook(job):
        looked.append(job.id)
        seen.set()

    scheduler = Scheduler(Unreachable(), open_store(f"file://{tmp_path}"), b"secret", on_poll=hook,
                          on_poll_seconds=0.0)
    try:
        running = new_job(scheduler)
        assert seen.wait(10), "the monitor never called the hook"
        assert set(looked) == {running.id} and not running.done
    finally:
        scheduler.close()


def test_a_capped_job_whose_cap_is_reached_while_a_retry_waits_for_room_ends(sched):
    """A retry that waits for room under ``max_cost`` is decided when the cap is reached by another
    call (its job would otherwise never end: no attempt is left out to release it)."""
    from fnmap.cost.pricing import Pricing

    pricing = Pricing.of("local", {})
    least, second = pricing.minimum(), pricing.attempt(1.0)  # ok() reports a call of one second
    # Room for the first wave and a retry at the least, not for one more at the mean; two seconds
    # and two least calls are past it.
    cap = pricing.job_overhead() + (second + 3 * least + 1.5 * second + 2.5 * least) / 2
    job = new_job(sched, n_calls=4, unwrap=True, retries=1, max_cost=cap)
    c0, c1, c2, c3 = job.run.calls
    a0, a1, a2 = sched._begin(job, c0), sched._begin(job, c1), sched._begin(job, c2)
    sched._decide(job, c0, a0, ok("zero"))
    sched._decide(job, c1, a1, PlatformFault("throttled", "429", retry_after=3600))  # retried in an hour
    assert sched._begin(job, c3) is None and sched._begin(job, c1) is None  # both wait for room
    assert job.run.budget.waiting == [c3, c1]
    sched._decide(job, c2, a2, ok("two"))  # room for one to be looked at: c3, which reaches the cap
    assert job.wait(10), [c.done for c in job.run.calls]
    for call in (c1, c3):
        with pytest.raises(fnmap.CostCapReached):
            call.future.result(0)
    assert c0.future.result(0) == "zero" and c2.future.result(0) == "two"
