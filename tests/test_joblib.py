"""The joblib backend on the embedded emulator: scikit-learn's searches give what n_jobs=1 gives."""

from __future__ import annotations

import multiprocessing
import os
import time

import joblib
import numpy as np
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.datasets import load_iris
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.svm import SVC

import fnmap.joblib
from fnmap.joblib import FnmapBackend

GRID = {"C": [0.1, 1.0], "gamma": [0.01, 0.1]}


@pytest.fixture(scope="module")
def iris():
    return load_iris(return_X_y=True)


def workers_of(job) -> set[str]:
    return {call["worker"] for call in job.record()["calls"] if call["worker"]}


def test_a_grid_search_matches_n_jobs_1_with_the_fits_run_elsewhere(iris):
    X, y = np.tile(iris[0], (10, 1)), np.tile(iris[1], 10)  # X 48 KB: the one argument over ref_nbytes
    local = GridSearchCV(SVC(), GRID, cv=3, n_jobs=1).fit(X, y)
    backend = FnmapBackend(ref_nbytes=20_000)
    with joblib.parallel_config(backend=backend, n_jobs=-1):
        remote = GridSearchCV(SVC(), GRID, cv=3).fit(X, y)
    assert remote.best_params_ == local.best_params_
    np.testing.assert_allclose(remote.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])
    job = backend.jobs[0]  # the search's Parallel run (the refit on the best parameters is local)
    assert job.summary()["calls"] >= 1 and job.summary()["failed_items"] == 0
    workers = workers_of(job)
    assert workers and not any(w.endswith(f":{os.getpid()}") for w in workers)
    # X went to storage once for the job's 12 fits, by content hash, and no call carried it itself.
    stored = backend._store.list(f"jobs/{job.id}/joblib/")
    assert len(stored) == 1, stored
    sent = [call["bytes_in"] for call in job.record()["calls"]]
    assert sent and max(sent) < X.nbytes, f"a call's input ({max(sent)} bytes) holds X ({X.nbytes} bytes)"


def test_cross_val_score_by_name_matches_n_jobs_1(iris):
    X, y = iris
    local = cross_val_score(SVC(C=1.0), X, y, cv=4, n_jobs=1)
    with joblib.parallel_config(backend="fnmap", n_jobs=2):
        remote = cross_val_score(SVC(C=1.0), X, y, cv=4)
    np.testing.assert_allclose(remote, local)


class FailingFit(ClassifierMixin, BaseEstimator):
    """An estimator whose fit raises, to compare the error with n_jobs=1's."""

    def __init__(self, c=1.0):
        self.c = c

    def fit(self, X, y):
        raise ArithmeticError(f"cannot fit with c={self.c}")


def test_an_estimator_that_raises_gives_the_same_exception_type(iris):
    X, y = iris
    search = GridSearchCV(FailingFit(), {"c": [1.0, 2.0]}, cv=2, error_score="raise")
    with pytest.raises(ArithmeticError) as local:
        search.fit(X, y)
    with joblib.parallel_config(backend="fnmap", n_jobs=2), pytest.raises(ArithmeticError) as remote:
        search.fit(X, y)
    assert type(remote.value) is type(local.value)
    assert "cannot fit with c=" in str(remote.value)
    assert isinstance(remote.value.__cause__, fnmap.errors.RemoteTraceback)


def fail_first(i):
    if i == 0:
        raise KeyError("task 0")
    time.sleep(1)
    return i


def sleepy(i):
    time.sleep(0.5)
    return i


def settled(job) -> list[dict]:
    """The job's calls once none runs any more (fails the test if one still does after 30 s)."""
    assert job.wait(30), "calls were left running"
    calls = job.record()["calls"]
    assert all(a["ended"] is not None for call in calls for a in call["attempts"]), "an attempt is still running"
    return calls


def test_an_aborted_run_cancels_what_has_not_started():
    """One call at a time and every task submitted at once: the first task's error aborts the run,
    and the tasks still waiting are cancelled rather than run for nothing."""
    backend = FnmapBackend(workers=1)
    with joblib.parallel_config(backend=backend, n_jobs=2), pytest.raises(KeyError, match="task 0"):
        joblib.Parallel(batch_size=1, pre_dispatch="all")(joblib.delayed(fail_first)(i) for i in range(12))
    calls = settled(backend.jobs[0])
    assert len(calls) == 12
    started = [c for c in calls if c["attempts"]]
    assert len(started) <= 3, f"{len(started)} of 12 tasks ran although the run had failed"
    assert sum(c["status"] == "cancelled" for c in calls) >= 9


@pytest.mark.filterwarnings("ignore:.*tasks which were still being processed:UserWarning")  # joblib saying so
def test_abandoning_the_results_cancels_what_has_not_started():
    """Leaving a ``return_as="generator"`` loop early (as ``break`` or Ctrl-C does) aborts the run."""
    backend = FnmapBackend(workers=1)
    with joblib.parallel_config(backend=backend, n_jobs=2):
        results = joblib.Parallel(batch_size=1, pre_dispatch="all", return_as="generator")(
            joblib.delayed(sleepy)(i) for i in range(12))
        assert next(results) == 0
        results.close()
    calls = settled(backend.jobs[0])
    ran = [c for c in calls if c["status"] == "ok"]
    assert len(ran) <= 4, f"{len(ran)} of 12 tasks ran although their results were abandoned"
    assert sum(c["status"] == "cancelled" for c in calls) >= 8


def test_a_managed_parallel_serves_every_call_of_its_block():
    """``with Parallel(...) as p:`` once served its first call only: the second raised "cannot
    schedule new futures after shutdown" (scikit-learn's HalvingGridSearchCV calls it so)."""
    backend = FnmapBackend()
    with joblib.parallel_config(backend=backend), joblib.Parallel(n_jobs=2) as parallel:
        first = parallel(joblib.delayed(abs)(-i) for i in range(4))
        second = parallel(joblib.delayed(pow)(i, 2) for i in range(4))
    assert (first, second) == ([0, 1, 2, 3], [0, 1, 4, 9])
    assert len(backend.jobs) == 2  # one fnmap job per run


def test_halving_grid_search_runs_on_fnmap(iris):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import HalvingGridSearchCV

    X, y = iris
    local = HalvingGridSearchCV(SVC(), GRID, cv=3, n_jobs=1, random_state=0).fit(X, y)
    with joblib.parallel_config(backend="fnmap", n_jobs=2):
        remote = HalvingGridSearchCV(SVC(), GRID, cv=3, random_state=0).fit(X, y)
    assert remote.best_params_ == local.best_params_


def _wait_for(path, seconds: float = 60) -> bool:
    """Whether ``path`` appears within ``seconds`` (a bound for a broken run, not a measurement)."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def sibling_or_failure(i, folder):
    """Task 0 fails once task 1 runs; task 1 would run for minutes, then leave a marker."""
    if i == 0:
        assert _wait_for(os.path.join(folder, "sibling-started"))
        raise KeyError("task 0")
    open(os.path.join(folder, "sibling-started"), "w").close()
    time.sleep(120)
    open(os.path.join(folder, "sibling-finished"), "w").close()
    return i


def long_task(i, folder):
    """Runs for minutes, each task for another length (ending together, they would free both
    workers at once for the next run)."""
    open(os.path.join(folder, f"long-{i}-started"), "w").close()
    time.sleep(100 + 100 * i)
    open(os.path.join(folder, f"long-{i}-finished"), "w").close()
    return i


def meet(i, folder):
    """Both tasks of the next run must run at once: each waits for the other to arrive."""
    open(os.path.join(folder, f"arrived-{i}"), "w").close()
    if not _wait_for(os.path.join(folder, f"arrived-{1 - i}"), 30):
        raise TimeoutError(f"task {i} ran alone: a worker was still busy with the previous run")
    return i


@pytest.mark.parametrize("ending", ["abort", "timeout"])
def test_the_next_run_starts_on_free_workers_after_an_abort_or_a_timeout(ending, use_emulator, tmp_path):
    """Calls still running when a run aborts (a task failed) or times out are stopped: the next run
    meets both workers free (its two tasks wait for each other; behind a task of the old run, one
    would wait alone until its bound and fail)."""
    use_emulator(workers=2)
    folder = str(tmp_path)
    with joblib.parallel_config(backend="fnmap", n_jobs=2):
        if ending == "abort":
            with pytest.raises(KeyError, match="task 0"):
                joblib.Parallel(batch_size=1)(joblib.delayed(sibling_or_failure)(i, folder) for i in range(2))
        else:
            with pytest.raises(multiprocessing.TimeoutError):  # what joblib raises
                joblib.Parallel(batch_size=1, timeout=3)(joblib.delayed(long_task)(i, folder) for i in range(2))
        assert joblib.Parallel(batch_size=1)(joblib.delayed(meet)(i, folder) for i in range(2)) == [0, 1]
