"""The client's decisions and the emulator's fault plan as plain functions: no server (issue 3)."""

from __future__ import annotations

import pytest

from fnmap import policy
from fnmap.emulator.faults import FaultPlan
from fnmap.runtime.worker import retry_outcome

# -- backoff and retries -------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 10, 30])
def test_backoff_is_exponential_with_full_jitter(attempt):
    ceiling = min(5.0, 0.05 * 2 ** (attempt - 1))
    assert policy.backoff_delay(attempt, rand=lambda: 1.0) == pytest.approx(ceiling)
    assert policy.backoff_delay(attempt, rand=lambda: 0.0) == 0.0
    delays = {policy.backoff_delay(attempt) for _ in range(50)}
    assert all(0 <= d <= ceiling for d in delays) and len(delays) > 1  # jittered


def test_retry_fault_is_bounded_by_retries():
    assert policy.retry_fault(True, 1, 2) and policy.retry_fault(True, 2, 2)
    assert not policy.retry_fault(True, 3, 2)
    assert not policy.retry_fault(False, 1, 2)  # e.g. a version mismatch: retrying cannot help
    assert not policy.retry_fault(True, 1, 0)


def test_throttling_is_charged_only_at_the_floor():
    assert not policy.charges_retry("throttled", throttle_at_floor=False)
    assert policy.charges_retry("throttled", throttle_at_floor=True)
    for kind in ("server", "crashed", "lost", "connection"):
        assert policy.charges_retry(kind, throttle_at_floor=False)
    assert not policy.charges_retry("cancelled", throttle_at_floor=True)  # another run's stop: nothing ran


def test_retry_outcome_matches_bases_and_is_bounded():
    names = ["builtins.ConnectionResetError", "builtins.ConnectionError", "builtins.OSError"]
    assert retry_outcome(names, ["builtins.ConnectionError"], 1, 2)
    assert not retry_outcome(names, ["builtins.ValueError"], 1, 2)
    assert not retry_outcome(names, [], 1, 2)
    assert not retry_outcome(names, ["builtins.OSError"], 3, 2)


# -- stragglers ------------------------------------------------------------------------


def test_stragglers_wait_until_most_of_the_job_is_done():
    running = {7: 0.0}
    assert policy.stragglers(running, [0.1] * 80, 80, 100, now=100.0) == []
    assert policy.stragglers(running, [0.1] * 95, 95, 100, now=100.0) == [7]


def test_stragglers_are_slow_relative_to_the_median_and_the_slowest_come_first():
    durations = [2.0] * 95
    running = {1: 100.0 - 5.0, 2: 100.0 - 7.0, 3: 100.0 - 20.0}  # running 5 s, 7 s, 20 s
    assert policy.stragglers(running, durations, 95, 100, now=100.0) == [3, 2]  # 3 x 2 s = 6 s
    assert policy.stragglers(running, durations, 95, 100, now=100.0, limit=1) == [3]


def test_stragglers_need_at_least_min_seconds():
    running = {1: 99.5}
    assert policy.stragglers(running, [0.01] * 99, 99, 100, now=100.0) == []  # 0.5 s < 1 s
    assert policy.stragglers(running, [0.01] * 99, 99, 100, now=100.0, min_seconds=0.2) == [1]


def test_stragglers_of_an_empty_job():
    assert policy.stragglers({}, [], 0, 0, now=1.0) == []


# -- AIMD throttle -----------------------------------------------------------------------


def test_throttle_halves_once_per_burst():
    t = policy.Throttle(16)
    tickets = [t.ticket() for _ in range(16)]  # a burst of 16 sends ...
    assert t.on_throttled(tickets[0])  # ... the first 429 halves the limit ...
    assert t.allowed() == 8
    assert not any(t.on_throttled(k) for k in tickets[1:])  # ... the rest of the burst does not
    assert t.allowed() == 8 and t.cuts == 1
    later = t.ticket()  # a send after the cut that is refused again cuts again
    assert t.on_throttled(later) and t.allowed() == 4


def test_throttle_floor_and_additive_increase_to_the_ceiling():
    t = policy.Throttle(4)
    for _ in range(10):
        t.on_throttled(t.ticket())
    assert t.allowed() == 1 and t.at_floor
    for _ in range(500):
        t.on_success()
    assert t.allowed() == 4 and not t.at_floor  # back up, never above the ceiling


def test_throttle_probes_slowly_near_the_level_that_was_refused():
    t = policy.Throttle(16)
    for _ in range(3):
        t.on_throttled(t.ticket())  # 16 -> 8 -> 4 -> 2, refused last at 4
    assert t.allowed() == 2
    fast = 0
    while t.allowed() < 3:  # below the refused level minus one: +1/limit per success
        t.on_success()
        fast += 1
    slow = 0
    while t.allowed() < 4:  # within one call of it: eight times slower
        t.on_success()
        slow += 1
    assert slow > 4 * fast


def test_throttle_ceiling_of_zero_is_one():
    assert policy.Throttle(0).allowed() == 1


# -- chunking ------------------------------------------------------------------------------


def test_chunks_are_lazy_and_reject_nonpositive_sizes():
    assert list(policy.chunks(iter(range(5)), 2)) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="chunksize=0"):
        list(policy.chunks([1], 0))


# -- the fault plan ------------------------------------------------------------------------


def test_fates_are_deterministic_under_the_seed_and_independent_of_order():
    plan = FaultPlan(fail_rate=0.1, kill_rate=0.1, straggler_rate=0.1, seed=7)
    forward = {(c, a): plan.fate(c, a) for c in range(200) for a in (1, 2)}
    again = FaultPlan(fail_rate=0.1, kill_rate=0.1, straggler_rate=0.1, seed=7)
    backward = {(c, a): again.fate(c, a) for c in reversed(range(200)) for a in (2, 1)}
    assert forward == backward
    other = FaultPlan(fail_rate=0.1, kill_rate=0.1, straggler_rate=0.1, seed=8)
    assert [other.fate(c, 1) for c in range(200)] != [plan.fate(c, 1) for c in range(200)]


def test_fates_follow_the_rates():
    plan = FaultPlan(fail_rate=0.1, kill_rate=0.1, drop_rate=0.05, straggler_rate=0.1, seed=1)
    fates = [plan.fate(c, 1) for c in range(20_000)]
    share = {
        name: sum(name in f.labels for f in fates) / len(fates)
        for name in ("fail", "kill", "drop", "straggle")
    }
    assert share["fail"] == pytest.approx(0.10, abs=0.01)
    assert share["kill"] == pytest.approx(0.10, abs=0.01)
    assert share["drop"] == pytest.approx(0.05, abs=0.01)
    # A call that is not run (fail, drop) cannot straggle: 10% of the other 85%.
    assert share["straggle"] == pytest.approx(0.085, abs=0.01)
    assert all(not (f.fail and f.kill_at is not None) for f in fates)
    assert all(0 <= f.kill_at < 1 for f in fates if f.kill_at is not None)


def test_a_retry_draws_afresh():
    plan = FaultPlan(fail_rate=0.5, seed=2)
    first = [plan.fate(c, 1).fail for c in range(200)]
    second = [plan.fate(c, 2).fail for c in range(200)]
    assert first != second


def test_no_faults_by_default():
    assert not FaultPlan().active
    assert FaultPlan(max_concurrency=3).active
    assert FaultPlan().fate(0, 1).labels == []
    assert FaultPlan().options() == []
    assert FaultPlan(fail_rate=0.2, seed=3).options() == ["--fail-rate", "0.2", "--seed", "3"]


def test_straggler_delay_scales_with_a_typical_call():
    plan = FaultPlan(straggler_rate=1.0, straggler_factor=10, latency_ms=50)
    assert plan.straggler_delay(0.2) == pytest.approx(9 * 0.2)
    assert plan.straggler_delay(0.001) == pytest.approx(9 * 0.05)  # at least the latency


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fail_rate": 1.5}, r"--fail-rate=1.5 is not a probability; use a number from 0 to 1"),
        ({"kill_rate": -0.1}, r"--kill-rate=-0.1 is not a probability"),
        ({"straggler_rate": float("nan")}, r"--straggler-rate=nan is not a probability"),
        ({"fail_rate": 0.6, "kill_rate": 0.6}, r"exceed 1"),
        ({"latency_ms": -5}, r"--latency-ms=-5 must be a number of milliseconds"),
        ({"cold_start_ms": "slow"}, r"--cold-start-ms='slow' must be a number"),
        ({"max_concurrency": 0}, r"--max-concurrency=0 must be an integer of at least 1"),
        ({"max_concurrency": True}, r"--max-concurrency=True must be an integer"),
        ({"straggler_factor": 0.5}, r"--straggler-factor=0.5 must be a number from 1 to 10000"),
        ({"seed": 1.5}, r"--seed=1.5 must be an integer"),
    ],
)
def test_bad_fault_options_name_the_value_and_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        FaultPlan(**options)
