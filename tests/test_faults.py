"""Jobs survive an unreliable platform: every result, correct, exactly once, in order (issue 3).

Each test starts its own ``fnmap emulator`` subprocess with fault injection
(``use_emulator``) and runs real jobs against it.  Fates are drawn from
``(seed, call id, attempt)``, so :class:`FaultPlan` doubles as the oracle that
says which attempts the emulator fails.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

import fnmap
from fnmap.emulator.faults import FaultPlan
from fnmap.runtime import keys
from fnmap.storage import open_store

N = 500  # the "jobs of at least 500 calls"


def double(x):
    return 2 * x


def _run(n=N, **options):
    job = fnmap.map(double, range(n), chunksize=1, return_job=True, **options)
    return job, job.results()


def _assert_exactly_once(job, results, n=N):
    assert results == [2 * x for x in range(n)]  # every result, correct, in order
    assert job.run.done_count == len(job.run.calls) == n  # each call delivered once
    store = open_store(job.store.url)
    committed = [keys.call_id_from_key(k) for k in store.list(keys.results_prefix(job.id))]
    assert sorted(committed) == list(range(n))  # one committed result object per call


# With fault probability p per attempt, a call fails for good with probability
# p ** (retries + 1); retries=5 makes that about 1e-6 per call at p=0.1 (and
# 6e-5 at p=0.2, all faults together), so these jobs always finish.
RETRIES = 5


def test_fail_rate_every_result_exactly_once(use_emulator):
    use_emulator("--fail-rate", "0.1", "--seed", "11", workers=2)
    job, results = _run(retries=RETRIES)
    _assert_exactly_once(job, results)
    plan = FaultPlan(fail_rate=0.1, seed=11)
    attempts = job.attempts_summary()
    for call_id, records in attempts.items():
        # The emulator's 500s fall exactly where the plan put them; each one was retried.
        planned = 0
        while plan.fate(call_id, planned + 1).fail:
            planned += 1
        assert [r[3] for r in records] == ["server"] * planned + ["ok"], call_id
    summary = job.summary()
    assert summary["attempts"]["server"] == sum(
        1 for r in attempts.values() for a in r if a[3] == "server"
    )
    assert summary["attempts"]["server"] > 20  # about 10% of 500
    assert summary["retries"] == summary["attempts"]["server"]


def test_kill_rate_worker_dies_mid_call_and_is_replaced(use_emulator):
    emu = use_emulator("--kill-rate", "0.1", "--seed", "12", workers=2)
    pids_before = set(emu.health()["worker_pids"])
    job, results = _run(retries=RETRIES)
    _assert_exactly_once(job, results)
    health = emu.health()
    crashed = job.summary()["attempts"].get("crashed", 0)
    assert crashed == health["kills"] == health["crashes"] > 20
    assert health["status"] == "ok" and len(health["worker_pids"]) == 2
    assert not pids_before & set(health["worker_pids"])  # the killed workers were replaced
    store = open_store(job.store.url)
    committed_then_killed = killed_before_commit = 0
    for call_id, records in job.attempts_summary().items():
        # One attempt answered; the others were killed, or (a speculative copy on a loaded machine,
        # which may crash before the attempt it copies answers) ended "superseded" when it did.
        outcomes = sorted(r[3] for r in records if r[3] != "superseded")
        assert outcomes == ["crashed"] * (len(outcomes) - 1) + ["ok"], call_id
        for r in (r for r in records if r[3] == "crashed"):  # a status record is written after the result is committed
            if store.exists(keys.status_key(job.id, call_id, r[0])):
                committed_then_killed += 1
            else:
                killed_before_commit += 1
    # Kills land on both sides of the commit (each about half of them): a retry after a kill
    # that came after the commit finds the committed result and returns it, not a second one.
    assert committed_then_killed > 0 and killed_before_commit > 0


def test_throttling_at_half_the_workers_slows_dispatch(use_emulator):
    emu = use_emulator("--max-concurrency", "2", workers=4)
    job, results = _run()  # default retries: 429s cost none of them while the client slows down
    _assert_exactly_once(job, results)
    throttled = emu.health()["injected"].get("throttled", 0)
    assert throttled == job.summary()["attempts"].get("throttled", 0)
    assert throttled > 0  # the client starts with 16 calls in flight: the emulator pushed back ...
    assert throttled < N // 4  # ... and the client slowed down instead of hammering


def test_stragglers_every_result_exactly_once(use_emulator):
    use_emulator("--straggler-rate", "0.1", "--straggler-factor", "10", "--seed", "13", workers=2)
    job, results = _run()
    _assert_exactly_once(job, results)


def test_all_faults_together(use_emulator):
    emu = use_emulator(
        "--fail-rate",
        "0.1",
        "--kill-rate",
        "0.1",
        "--max-concurrency",
        "2",
        "--straggler-rate",
        "0.1",
        "--cold-start-ms",
        "5",
        "--seed",
        "14",
        workers=4,
    )
    # Two more retries than alone: 429s at the throttle's floor also cost retries here, and
    # they shift which (call, attempt) draws of the seeded plan each call meets.
    job, results = _run(retries=RETRIES + 2)
    _assert_exactly_once(job, results)
    injected = emu.health()["injected"]
    assert {"fail", "kill", "straggle", "throttled"} <= set(injected)
    outcomes = job.summary()["attempts"]
    assert outcomes["server"] > 0 and outcomes["crashed"] > 0 and outcomes["throttled"] > 0


def test_speculative_copy_of_a_straggler_wins(use_emulator):
    # Stragglers take 200 x 20 ms: the client's speculative copy (after 1 s) finishes first.
    use_emulator(
        "--straggler-rate",
        "0.1",
        "--straggler-factor",
        "200",
        "--latency-ms",
        "20",
        "--seed",
        "5",
        workers=2,
    )
    plan = FaultPlan(straggler_rate=0.1, straggler_factor=200, latency_ms=20, seed=5)
    n = 40
    stragglers = {c for c in range(n) if plan.fate(c, 1).straggle}
    assert stragglers and all(not plan.fate(c, 2).straggle for c in stragglers)
    job, results = _run(n)
    _assert_exactly_once(job, results, n)
    attempts = job.attempts_summary()
    copied = {c for c, records in attempts.items() if len(records) > 1}
    assert copied == stragglers
    for c in copied:
        original, copy = attempts[c]
        assert copy[3] == "ok"
        # The copy finished first: the original was still out when the job ended, or ended later.
        assert original[2] is None or original[2] >= copy[2]
    assert job.summary()["speculative_copies"] == len(stragglers)
    # Honest counts (issue 23): a fault-free job retried nothing, its copies are copies, and no
    # attempt is left "running" once it is done (the originals a copy beat end "superseded").
    summary, record = job.summary(), job.record()["summary"]
    assert (summary["retries"], summary["calls_retried"], record["retries"], record["calls_retried"]) == (0, 0, 0, 0)
    assert summary["copies"] == len(stragglers) and "running" not in summary["attempts"], summary


def test_speculation_can_be_turned_off(use_emulator):
    use_emulator(
        "--straggler-rate",
        "0.1",
        "--straggler-factor",
        "60",
        "--latency-ms",
        "20",
        "--seed",
        "5",
        workers=2,
    )
    job, results = _run(40, speculation=False)
    _assert_exactly_once(job, results, 40)
    assert job.summary()["speculative_copies"] == 0
    assert all(len(r) == 1 for r in job.attempts_summary().values())


def test_lost_calls_are_relaunched(use_emulator):
    # A dropped call is accepted and never answered: after timeout + grace the client
    # declares it lost and launches it again.
    use_emulator("--drop-rate", "0.2", "--seed", "3", workers=2)
    plan = FaultPlan(drop_rate=0.2, seed=3)
    n = 20
    dropped = {c for c in range(n) if plan.fate(c, 1).drop}
    assert dropped
    # Without speculation: a silent call would otherwise get a speculative copy before it is lost.
    job, results = _run(n, timeout=1, retries=RETRIES, speculation=False)
    _assert_exactly_once(job, results, n)
    attempts = job.attempts_summary()
    assert {c for c, r in attempts.items() if r[0][3] == "lost"} == dropped
    assert all(attempts[c][-1][3] == "ok" for c in dropped)


def test_cold_start_and_latency_only_slow_calls_down(use_emulator):
    emu = use_emulator("--cold-start-ms", "50", "--latency-ms", "5", workers=2)
    job, results = _run(30)
    _assert_exactly_once(job, results, 30)
    calls = requests.get(emu.url + "/calls", timeout=5).json()
    assert sum(1 for c in calls if c.get("cold")) == 2  # one cold start per worker process


def test_platform_faults_fail_the_call_after_retries(use_emulator):
    use_emulator("--fail-rate", "1.0", workers=2)
    job = fnmap.map(double, range(3), retries=1, return_job=True)
    results = job.results(return_exceptions=True)
    for i, exc in enumerate(results):
        assert isinstance(exc, fnmap.PlatformError)
        assert f"item {i}" in str(exc) and "2 attempt(s)" in str(exc) and "answered 500" in str(exc)
    assert all(
        [r[3] for r in recs] == ["server", "server"] for recs in job.attempts_summary().values()
    )


# -- timeouts ----------------------------------------------------------------------


def _unusual_calls(emu) -> str:
    """Records of the calls that did not end well, and the emulator's stderr (for failures)."""
    calls = requests.get(emu.url + "/calls", timeout=5).json()
    unusual = [c for c in calls if c.get("outcome") != "ok"]
    return f"calls: {unusual}\nemulator stderr: {emu.output()[-3000:]}"


def slow_at_3(x, marker):
    if x == 3:
        time.sleep(60)
        open(marker, "w").close()  # only reached if the call was not stopped
    return x


def test_timeout_stops_the_call_inside_the_worker(module_emulator, tmp_path):
    emu = module_emulator
    marker = str(tmp_path / "not-stopped")
    before = emu.health()
    pids = before["worker_pids"]
    results = fnmap.map(lambda x: slow_at_3(x, marker), range(6), timeout=1, return_exceptions=True)
    exc = results[3]
    assert isinstance(exc, fnmap.TimeoutError) and isinstance(exc, TimeoutError)
    assert "item 3" in str(exc) and "timeout of 1" in str(exc)
    assert results[:3] + results[4:] == [0, 1, 2, 4, 5]
    health = emu.health()
    # The worker's own timer stopped the item: the emulator's hard kill, due at timeout + 2 s,
    # never fired, and the same worker processes still serve.
    assert (health["timeouts"], health["crashes"]) == (before["timeouts"], before["crashes"]), _unusual_calls(emu)
    assert health["worker_pids"] == pids
    assert not os.path.exists(marker)


def ignores_alarm(x):
    if x == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    return x


def test_timeout_kills_a_call_that_ignores_the_timer(module_emulator):
    emu = module_emulator
    timeouts = emu.health()["timeouts"]
    results = fnmap.map(ignores_alarm, range(4), timeout=1, return_exceptions=True)
    exc = results[1]
    assert isinstance(exc, fnmap.TimeoutError)
    assert "item 1" in str(exc) and "timeout" in str(exc)
    assert [results[0], results[2], results[3]] == [0, 2, 3]
    health = emu.health()
    assert health["timeouts"] == timeouts + 1  # the emulator killed that worker at timeout + 2 s ...
    for _ in range(100):  # ... and replaces it in the background
        if len(emu.health()["worker_pids"]) == 2:
            break
        time.sleep(0.1)
    assert len(emu.health()["worker_pids"]) == 2


# -- user exceptions ----------------------------------------------------------------


class Flaky(Exception):
    pass


def flaky(path):
    """Raise Flaky the first two times it runs (counted in a file), then succeed."""
    with open(path, "a") as f:
        f.write("x")
    with open(path) as f:
        runs = len(f.read())
    if runs <= 2:
        raise Flaky(f"run {runs}")
    return runs


def test_user_exceptions_are_not_retried(module_emulator, tmp_path):
    path = str(tmp_path / "runs")
    with pytest.raises(Flaky, match="run 1"):
        fnmap.map(flaky, [path], retries=5)
    with open(path) as f:
        assert f.read() == "x"  # ran once: a user exception is a result, not a fault


def test_retry_on_reruns_the_named_exceptions(module_emulator, tmp_path):
    path = str(tmp_path / "runs")
    job = fnmap.map(flaky, [path], retries=2, retry_on=(Flaky,), return_job=True)
    assert job.results() == [3]
    assert [r[3] for r in job.attempts_summary()[0]] == ["retry_on", "retry_on", "ok"]


def test_retry_on_is_bounded_by_retries(module_emulator, tmp_path):
    path = str(tmp_path / "runs")
    with pytest.raises(Flaky, match="run 2"):
        fnmap.map(flaky, [path], retries=1, retry_on=(Flaky,))
