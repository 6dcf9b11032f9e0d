"""The cost cap (issue 36): ``max_cost`` stops a map before it spends more, refuses one whose
estimate is above it, and ``fnmap.estimate`` says what a map will cost; against a real emulator.

Caps are computed from the pricing (:class:`fnmap.cost.pricing.Pricing`), never written as dollar
figures, so a price update does not break them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest
from test_emulator_aws import offline_aws  # noqa: F401 (a fixture)

import fnmap
from fnmap.cost.budget import Budget
from fnmap.cost.pricing import Pricing

LAMBDA = Pricing.of("emulator", {})
SLEEP = 0.1
#: Calls at 10 GB: a call's compute is then most of its cost, so a cap that allows a third of the
#: calls is above the least the whole map costs (short calls at 1 GB cost mostly their S3 requests).
BIG = 10240


def _ran(folder) -> list[int]:
    """The items whose calls started, in the order they did."""
    path = os.path.join(folder, "ran")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def _counted(folder, sleep=SLEEP):
    """A call that notes its item in a side file (before it works: a call stopped midway counts)."""

    def work(x):
        with open(os.path.join(folder, "ran"), "a") as f:
            f.write(f"{x}\n")
        time.sleep(sleep)
        return x * 2

    return work


def test_a_cap_stops_the_map_after_about_as_many_calls_as_it_allows(module_emulator, tmp_path):
    per_call = LAMBDA.attempt(0.3, memory_mb=BIG, gets=3)  # at least its sleep; a cold worker's GET
    cap = LAMBDA.job_overhead() + 10 * per_call  # about a third of the 30 calls
    assert LAMBDA.job_overhead() + 30 * LAMBDA.minimum(BIG) < cap  # not refused before it starts
    with pytest.raises(fnmap.CostCapReached) as caught:
        fnmap.map(_counted(str(tmp_path), 0.3), range(30), chunksize=1, memory=BIG, max_cost=cap, workers=2)
    e = caught.value
    ran = _ran(tmp_path)
    # The calls done fit the cap; those in flight when it was reached (2 workers) were stopped.
    assert 5 <= e.calls_done <= 10, (e.calls_done, str(e))
    assert e.calls_done <= len(ran) <= e.calls_done + 2, (ran, str(e))
    assert e.calls_done + e.calls_not_run == 30
    assert e.cap == cap and 0 < e.spent <= cap + 2 * per_call, str(e)
    assert f"max_cost=${cap:g}" in str(e) and "not run" in str(e) and f"fnmap redrive {e.id}" in str(e)
    summary = fnmap.job(e.id).summary()
    assert summary["status"] == "capped"
    record = fnmap.job(e.id).record()
    assert record["options"]["max_cost"] == cap
    capped = record["cost_cap"]
    assert capped["reached"] and capped["max_cost"] == cap
    assert e.spent <= capped["spent_usd"] <= cap + 2 * per_call  # and what the stopped calls ran, once they ended
    # The calls with no result: those never sent did not run, those in flight then were stopped.
    assert capped["calls_not_run"] - capped["calls_in_flight"] <= 30 - len(ran) <= capped["calls_not_run"]
    results = fnmap.job(e.id).results(return_exceptions=True)
    assert any(isinstance(r, fnmap.CostCapReached) for r in results)  # read later, the items not run say why
    # One entry per item; the calls done have their results (a call being stopped may have finished)
    assert len(results) == 30
    assert e.calls_done <= sum(1 for r in results if r in range(0, 60, 2)) <= e.calls_done + 2


def test_a_cap_below_the_least_the_map_costs_refuses_it_before_anything_runs(module_emulator, tmp_path):
    least = LAMBDA.job_overhead() + 20 * LAMBDA.minimum()
    with pytest.raises(fnmap.CostCapReached, match="refused before any call ran") as caught:
        fnmap.map(_counted(str(tmp_path)), range(20), chunksize=1, max_cost=least * 0.9)
    time.sleep(0.3)
    assert _ran(tmp_path) == []
    e = caught.value
    assert e.calls_done == 0 and e.calls_not_run == 20
    assert e.estimate["basis"] == "minimum" and e.estimate["usd"] == pytest.approx(least)
    assert "20 call(s) at the minimum billed duration" in str(e)
    assert fnmap.job(e.id).summary()["status"] == "capped"
    # The least is a cap it fits under: the same map at that cap is not refused.
    assert fnmap.map(abs, range(-2, 1), chunksize=1, max_cost=least) == [2, 1, 0]


def test_without_a_cap_the_map_is_unchanged(module_emulator, tmp_path):
    job = fnmap.map(_counted(str(tmp_path)), range(12), chunksize=1, return_job=True)
    assert job.results() == [x * 2 for x in range(12)]
    assert sorted(map(int, _ran(tmp_path))) == list(range(12))
    assert job.run.budget is None
    record = job.record()
    assert "cost_cap" not in record and record["options"]["max_cost"] is None
    assert record["summary"]["status"] == "succeeded"
    # A cap far above the cost changes nothing either, but the record says what was spent.
    capped = fnmap.map(_counted(str(tmp_path)), range(12), chunksize=1, max_cost=1.0, return_job=True)
    assert capped.results() == [x * 2 for x in range(12)]
    assert capped.record()["cost_cap"]["reached"] is False
    assert capped.record()["cost_cap"]["spent_usd"] == pytest.approx(capped.cost["usd"], rel=0.2)


def _sleepy(x):
    time.sleep(0.05)
    return x


def test_estimate_of_a_repeated_function_is_within_a_fifth_of_what_it_cost(module_emulator, tmp_path):
    storage = (tmp_path / "store").as_uri()
    items = list(range(24))
    first = fnmap.estimate(_sleepy, items, chunksize=1, storage=storage)
    assert first["basis"] == "minimum" and first["calls"] == 24 and first["from_job"] is None
    job = fnmap.map(_sleepy, items, chunksize=1, storage=storage, return_job=True)
    job.results()
    measured = job.cost["usd"]
    again = fnmap.estimate(_sleepy, items, chunksize=1, storage=storage)
    assert again["basis"] == "measured" and again["from_job"] == job.id
    assert again["seconds_per_item"] == pytest.approx(0.05, rel=0.5)
    assert again["usd"] == pytest.approx(measured, rel=0.2), (again, measured)
    assert again["usd"] > first["usd"]  # the sleep is billed now, not the minimum
    # A capped run of it expects its first calls to cost what was measured, before any has ended.
    capped = fnmap.map(_sleepy, items[:4], chunksize=1, storage=storage, max_cost=1.0, return_job=True)
    capped.results()
    assert capped.run.budget.first_calls == pytest.approx(
        (fnmap.estimate(_sleepy, items[:4], chunksize=1, storage=storage)["usd"] - LAMBDA.job_overhead()) / 4,
        rel=0.5)
    # Another function is not taken for this one.
    assert fnmap.estimate(abs, items, chunksize=1, storage=storage)["basis"] == "minimum"


def test_the_budget_admits_while_spent_plus_out_plus_one_more_fit():
    from fnmap.cost.budget import FIRST_WAVE, WAIT

    least = LAMBDA.minimum()
    budget = Budget(10.5 * least, LAMBDA)
    held = [budget.admit() for _ in range(FIRST_WAVE)]
    assert all(h == pytest.approx(least) for h in held)
    assert budget.admit() == WAIT  # the first wave is out and nothing is priced yet
    budget.wait("a call")
    assert budget.release() == []
    budget.settle(held.pop(), least)  # one ended, priced at the least
    assert budget.release() == ["a call"]
    more = [budget.admit() for _ in range(10 - FIRST_WAVE)]  # 1 spent + 3 out + 6 = 10
    assert all(h == pytest.approx(least) for h in more)
    assert budget.admit() is None and budget.reached  # even at the least, the eleventh passes the cap
    assert budget.admit() is None  # and once reached, nothing more

    budget = Budget(10.5 * least, LAMBDA)
    first = budget.admit()
    budget.settle(first, 3 * least)  # an attempt that cost three times the least
    assert budget.spent == pytest.approx(3 * least) and budget.reserved == 0
    assert budget.expected() == pytest.approx(3 * least)  # the mean so far, not the least
    out = [budget.admit(), budget.admit()]  # 3 spent + 2 x 3 reserved = 9
    assert budget.admit() == WAIT  # 12 > 10.5 expected, but what is out may cost less: it waits
    assert not budget.reached
    budget.wait("next")
    budget.settle(out.pop(), least)  # it did: 4 spent + 3 reserved + 3 = 10, room for one
    assert budget.release() == ["next"]
    assert budget.admit() == pytest.approx(2 * least)  # the mean is now (3 + 1) / 2
    budget.settle(out.pop(), 3 * least)
    budget.settle(2 * least, 2 * least)  # 4 + 3 + 2 = 9 spent, nothing out
    assert budget.admit() is None and budget.reached  # not expected to fit, and nothing out to wait for
    assert budget.spent == pytest.approx(9 * least) and budget.attempts == 4 and budget.out == 0


def test_a_bad_cap_is_a_clear_error(monkeypatch):
    with pytest.raises(fnmap.ConfigError, match=r"max_cost=-1 \(from keyword\) must be a positive number"):
        fnmap.map(abs, [1], max_cost=-1)
    monkeypatch.setenv("FNMAP_MAX_COST", "nope")
    with pytest.raises(fnmap.ConfigError, match="FNMAP_MAX_COST"):
        fnmap.map(abs, [1])


def test_a_lambda_cold_start_bills_its_init_phase(offline_aws, tmp_path):  # noqa: F811 (the fixture)
    """On the offline AWS path (AWS's Lambda runtime client under the emulator), a cold call reports
    its INIT phase (its process's start to the handler's import), and the cost counts it."""
    _exports, env, env_file = offline_aws
    script = (f"source {env_file}\npython -c '"
              "import fnmap, json; job = fnmap.map(abs, [-1, -2], chunksize=1, return_job=True); job.results(); "
              "calls = job.record()[\"calls\"]; "
              "print(json.dumps([[c.get(\"cold\"), c.get(\"init_seconds\"), c[\"written\"] - c[\"started\"]] "
              "for c in calls]), job.cost[\"gb_seconds\"])'\n")
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    calls, gb_seconds = ran.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    cold = [(init, seconds) for was_cold, init, seconds in json.loads(calls) if was_cold]
    assert cold and all(init and init > 0 for init, _ in cold), calls
    # 1024 MB: a GB-second per second; every call's duration, and its INIT when cold, rounded up to 1 ms.
    billed = sum(math.ceil(s * 1000) / 1000 for _c, _i, s in json.loads(calls)) + sum(
        math.ceil(init * 1000) / 1000 for init, _ in cold)
    assert float(gb_seconds) == pytest.approx(billed, abs=0.01)


def _stamped(folder):
    """A call that notes when it started and ended, in a side file."""

    def work(x):
        with open(os.path.join(folder, "times"), "a") as f:
            f.write(f"start {time.time()}\n")
        time.sleep(0.3)
        with open(os.path.join(folder, "times"), "a") as f:
            f.write(f"end {time.time()}\n")
        return x

    return work


def test_until_a_call_has_ended_a_capped_map_sends_only_a_first_wave(tmp_path):
    """Nothing is known of what a call costs before one ends: a capped map whose function never ran
    here sends FIRST_WAVE calls, then the rest once one is priced (a cap checked against the minimum
    alone let a backend's whole concurrency pass it)."""
    from fnmap.cost.budget import FIRST_WAVE

    assert fnmap.map(_stamped(str(tmp_path)), range(12), backend="local", chunksize=1, workers=12,
                     max_cost=1.0) == list(range(12))
    with open(tmp_path / "times") as f:
        events = sorted((float(t), kind) for kind, t in (line.split() for line in f))
    first_end = next(t for t, kind in events if kind == "end")
    assert sum(1 for t, kind in events if kind == "start" and t < first_end) == FIRST_WAVE
    assert sum(1 for _t, kind in events if kind == "start") == 12
