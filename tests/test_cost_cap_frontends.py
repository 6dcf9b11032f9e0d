"""The cost cap (``max_cost``, issue 36) through every front end and on the offline platforms.

Each test counts the calls that really ran in a side file (each call appends a line) and takes
its cap from :class:`fnmap.cost.pricing.Pricing`, never a dollar figure: a price update moves
the cap with the prices.  Front ends run on the embedded emulator (priced as AWS Lambda); the
platforms are the ``aws`` backend against the emulator's Lambda API and the ``batch`` backend
against its Batch API (``use_backend``), each call priced at its minimum of instance time there.
"""

from __future__ import annotations

import functools
import time

import cubed
import cubed.array_api as xp
import dask
import joblib
import numpy as np
import pytest

import fnmap
import fnmap.dask
import fnmap.joblib  # noqa: F401 - registers the "fnmap" backend
from fnmap.cost.pricing import Pricing
from fnmap.cubed import FnmapExecutor

pytestmark = pytest.mark.timeout(120)

N = 30  # calls of a capped map; its cap allows about a third of them


def lambda_cap(calls: int, seconds: float, **options) -> float:
    """A cap that allows ``calls`` calls of ``seconds`` each, priced as the emulator's (Lambda)."""
    pricing = Pricing.of("emulator", options)
    return pricing.job_overhead() + calls * pricing.attempt(seconds)


def counted(path, x, seconds: float = 0.02):
    """A short call that says it ran: one line in ``path``."""
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"{x}\n")
    return x


def ran(path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def assert_capped(error: fnmap.CostCapReached, cap: float, side, n: int = N, pricing: Pricing | None = None) -> None:
    """The cap stopped the run part-way: some calls ran, clearly fewer than all, and no more than
    the cap admits at the least a call costs (each attempt reserves at least that before it is sent)."""
    pricing = pricing or Pricing.of("emulator", {})
    assert error.cap == pytest.approx(cap)
    assert 0 < ran(side) < n * 2 // 3, ran(side)
    assert ran(side) <= (cap - pricing.job_overhead()) / pricing.minimum()
    assert error.calls_not_run > 0
    assert error.spent > 0


def assert_recorded(job_id: str, cap: float, side, pricing: Pricing | None = None) -> dict:
    """The job's record in storage (once its stopped calls ended) says its cap, that the cap
    stopped it, and what every call that ran cost in total."""
    pricing = pricing or Pricing.of("emulator", {})
    job = fnmap.job(job_id)
    assert job.wait(timeout=30)
    record = job.record()
    assert record["cost_cap"]["max_cost"] == pytest.approx(cap)
    assert record["cost_cap"]["reached"] is True
    assert record["cost_cap"]["spent_usd"] >= pricing.job_overhead() + ran(side) * pricing.minimum() * 0.999
    summary = record["summary"]
    assert summary["status"] == "capped"
    assert summary["cost"]["usd"] > 0
    return record


# -- front ends ------------------------------------------------------------------------------


def test_an_executors_map_stops_at_its_cap_and_later_submits_fail_with_it(tmp_path):
    side = tmp_path / "ran"
    cap = lambda_cap(N // 3, 0.03)
    with fnmap.Executor(max_cost=cap, workers=2) as ex:
        with pytest.raises(fnmap.CostCapReached) as caught:
            list(ex.map(counted, [side] * N, range(N)))
        late = ex.submit(counted, side, -1)
        with pytest.raises(fnmap.CostCapReached):  # the cap's error, not a bare CancelledError
            late.result(timeout=30)
    assert_capped(caught.value, cap, side)
    assert "-1" not in side.read_text().split()
    assert_recorded(ex.job.id, cap, side)


def test_an_executor_under_its_cap_runs_everything(tmp_path):
    side = tmp_path / "ran"
    with fnmap.Executor(max_cost=lambda_cap(3 * N, 0.5), workers=2) as ex:
        assert list(ex.map(counted, [side] * N, range(N))) == list(range(N))
    assert ran(side) == N
    record = ex.job.record()
    assert record["cost_cap"]["reached"] is False and record["summary"]["status"] == "succeeded"


def test_a_joblib_run_stops_at_the_cap_of_its_parallel_config(tmp_path):
    side = tmp_path / "ran"
    cap = lambda_cap(N // 3, 0.03)
    with joblib.parallel_config(backend="fnmap", max_cost=cap, workers=2):
        with pytest.raises(fnmap.CostCapReached) as caught:
            joblib.Parallel(n_jobs=2, batch_size=1)(joblib.delayed(counted)(side, i) for i in range(N))
    assert_capped(caught.value, cap, side)


def test_the_joblib_runs_of_one_parallel_config_share_its_cap(tmp_path):
    """A successive-halving search is several ``Parallel`` runs on one backend: one cap for all."""
    side = tmp_path / "ran"
    cap = lambda_cap(N // 3, 0.03)
    runs = 0
    with joblib.parallel_config(backend="fnmap", max_cost=cap, workers=2):
        with pytest.raises(fnmap.CostCapReached) as caught:
            for _ in range(N // 6):  # 5 runs of 6 calls: each alone fits the cap, all of them do not
                joblib.Parallel(n_jobs=2, batch_size=1)(joblib.delayed(counted)(side, i) for i in range(6))
                runs += 1
    assert 1 <= runs < N // 6 - 1
    assert caught.value.cap == pytest.approx(cap)  # the whole cap, not what its last run was left
    assert 0 < ran(side) < N * 2 // 3


def _slow_sum(path, values):
    """A reduce call of a second: what costs the money of a map_reduce below."""
    return counted(path, sum(values), 1.0)


def test_a_map_reduce_has_one_cap_for_its_map_and_every_reduce_level(tmp_path):
    """The map and each reduce level are jobs of their own: the cap is the map_reduce's.  The map
    (16 short calls) fits it; the first level's 8 one-second calls do not: that level stops with
    what the map left, and the error says the whole cap."""
    side = tmp_path / "ran"
    pricing = Pricing.of("emulator", {})
    cap = 2 * pricing.job_overhead() + 16 * pricing.attempt(0.2) + pricing.attempt(1.5)
    with pytest.raises(fnmap.CostCapReached) as caught:
        fnmap.map_reduce(functools.partial(counted, side), range(16), functools.partial(_slow_sum, side),
                         reduce_fanin=2, max_cost=cap, workers=2)
    assert caught.value.cap == pytest.approx(cap)  # told against the whole cap, not what the level was left
    assert str(caught.value).startswith("map_reduce stopped at its cost cap"), caught.value
    assert 16 <= ran(side) < 16 + 8


def test_a_dask_graph_stops_at_its_cap(tmp_path):
    side = tmp_path / "ran"
    seconds = 0.25  # above the shim's target call duration: one task per call once measured
    cap = lambda_cap(N // 3, seconds + 0.02)
    tasks = [dask.delayed(counted)(side, i, seconds) for i in range(N)]
    with pytest.raises(fnmap.CostCapReached) as caught:
        dask.compute(*tasks, scheduler=fnmap.dask.get, max_cost=cap, num_workers=2)
    assert_capped(caught.value, cap, side)
    assert any("fnmap.dask" in note for note in caught.value.__notes__)
    assert_recorded(caught.value.id, cap, side)


def _cubed_chain(tmp_path, executor, ops: int = 5):
    """``ops`` operations of 4 tasks each after the array's creation (``optimize_graph=False``
    keeps them apart)."""
    spec = cubed.Spec(work_dir=str(tmp_path), allowed_mem="200MB", executor=executor)
    x = xp.asarray(np.arange(64.0).reshape(8, 8), chunks=(4, 4), spec=spec)
    for _ in range(ops):
        x = x + 1
    return x


def test_a_cubed_computation_has_one_cap_for_all_its_operations(tmp_path):
    """Each operation is a job of its own; the cap is the computation's, not each job's."""
    pricing = Pricing.of("emulator", {})
    # About two operations' worth (5 short tasks each): more than any one costs, far less than all.
    cap = 2 * (pricing.job_overhead() + 5 * pricing.attempt(0.1))
    # Without a cap, unchanged (and the workers are warm after: a cold start's INIT costs more).
    done = _cubed_chain(tmp_path / "uncapped", FnmapExecutor()).compute(optimize_graph=False)
    np.testing.assert_allclose(done, np.arange(64.0).reshape(8, 8) + 5)
    capped = FnmapExecutor(max_cost=cap)
    with pytest.raises(fnmap.CostCapReached) as caught:
        _cubed_chain(tmp_path / "capped", capped).compute(optimize_graph=False)
    assert caught.value.cap == pytest.approx(cap)  # the whole computation's cap, as the user gave it
    jobs = list(capped.jobs.values())
    assert 2 <= len(jobs) < 6  # stopped part-way through its six operations
    assert all(job.run.budget.spent < cap for job in jobs)  # no one operation reached the cap alone


# -- platforms -------------------------------------------------------------------------------


def test_a_map_on_the_aws_backend_stops_at_its_cap(use_backend, tmp_path):
    """The ``aws`` backend (boto3's Lambda client) against the emulator's Lambda API."""
    side = tmp_path / "ran"
    cap = lambda_cap(N // 3, 0.03)
    with fnmap.Executor(backend=use_backend("aws"), max_cost=cap, workers=2) as ex:
        with pytest.raises(fnmap.CostCapReached) as caught:
            list(ex.map(counted, [side] * N, range(N)))
    assert_capped(caught.value, cap, side)
    record = assert_recorded(ex.job.id, cap, side)
    assert record["cost_cap"]["model"] == "aws-lambda"


def batch_call() -> float:
    """What one short call costs on Batch: a minute of instance time, whatever it ran."""
    return Pricing.of("batch", {}).attempt(0.05)


def test_a_map_on_batch_stops_at_its_cap(use_backend, tmp_path):
    """The ``batch`` backend (boto3's Batch client) against the emulator's Batch API."""
    side = tmp_path / "ran"
    n = 12  # each call is a process: fewer of them
    pricing = Pricing.of("batch", {})
    cap = pricing.job_overhead() + n // 3 * batch_call()
    with fnmap.Executor(backend=use_backend("batch"), max_cost=cap) as ex:
        with pytest.raises(fnmap.CostCapReached) as caught:
            list(ex.map(counted, [side] * n, range(n)))
    assert_capped(caught.value, cap, side, n, pricing)
    record = assert_recorded(ex.job.id, cap, side, pricing)  # each call that ran billed its minute at least
    assert record["cost_cap"]["model"] == "aws-batch"


def test_fnmap_map_on_batch_under_a_third_of_its_minimum_is_refused_before_any_call(use_backend, tmp_path):
    """On Batch a short call costs its minute whatever it runs, so the least of the whole map is known."""
    side = tmp_path / "ran"
    n = 12
    cap = Pricing.of("batch", {}).job_overhead() + n // 3 * batch_call()
    with pytest.raises(fnmap.CostCapReached) as caught:
        fnmap.map(functools.partial(counted, side), range(n), backend=use_backend("batch"), chunksize=1, max_cost=cap)
    assert ran(side) == 0
    assert caught.value.calls_done == 0 and caught.value.calls_not_run == n
    assert caught.value.estimate["usd"] > cap
    record = fnmap.job(caught.value.id).record()
    assert record["cost_cap"]["refused"]["calls"] == n and record["summary"]["status"] == "capped"


def test_calls_that_waited_for_the_first_wave_go_to_batch_as_one_array_job(use_backend, platform_emulator, tmp_path):
    """A capped job sends its first wave (budget.FIRST_WAVE calls) before anything is priced; the
    calls that waited go together once one is, as one array job, not one Batch job each."""
    import boto3
    from conftest import aws_credentials_of

    from fnmap.cost.budget import FIRST_WAVE

    side = tmp_path / "ran"
    name = use_backend("batch")
    batch = boto3.client("batch", endpoint_url=platform_emulator.url, region_name="us-east-1",
                         **{k.lower(): v for k, v in aws_credentials_of(platform_emulator).items()
                            if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})

    def jobs() -> set:
        return {j["jobId"] for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED")
                for j in batch.list_jobs(jobQueue="fnmap", jobStatus=status)["jobSummaryList"]}

    before = jobs()
    n = FIRST_WAVE + 6
    assert fnmap.map(functools.partial(counted, side), range(n), backend=name, chunksize=1, max_cost=1.0) \
        == list(range(n))
    assert ran(side) == n
    assert len(jobs() - before) == 2  # the first wave, then the rest together
