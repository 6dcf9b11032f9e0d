"""The joblib backend on the embedded emulator: scikit-learn's searches give what n_jobs=1 gives."""

from __future__ import annotations

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
    X, y = iris
    local = GridSearchCV(SVC(), GRID, cv=3, n_jobs=1).fit(X, y)
    backend = FnmapBackend(ref_nbytes=1000)
    with joblib.parallel_config(backend=backend, n_jobs=-1):
        remote = GridSearchCV(SVC(), GRID, cv=3).fit(X, y)
    assert remote.best_params_ == local.best_params_
    np.testing.assert_allclose(remote.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])
    job = backend.jobs[0]  # the search's Parallel run (the refit on the best parameters is local)
    assert job.summary()["calls"] >= 1 and job.summary()["failed_items"] == 0
    workers = workers_of(job)
    assert workers and not any(w.endswith(f":{os.getpid()}") for w in workers)
    # X and y (over ref_nbytes) went to storage once for the job's 12 fits, by content hash.
    stored = backend._store.list(f"jobs/{job.id}/joblib/")
    assert len(stored) == 2, stored


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


def test_an_aborted_run_cancels_what_has_not_started():
    """One call at a time and every task submitted at once: the first task's error aborts the run,
    and the tasks still waiting are cancelled rather than run for nothing."""
    backend = FnmapBackend(workers=1)
    with joblib.parallel_config(backend=backend, n_jobs=2), pytest.raises(KeyError, match="task 0"):
        joblib.Parallel(batch_size=1, pre_dispatch="all")(joblib.delayed(fail_first)(i) for i in range(12))
    job = backend.jobs[0]
    assert len(job.calls) == 12
    assert job.wait(30), "calls were left running"
    started = [s for s in job.calls if s.attempts]
    assert len(started) <= 3, f"{len(started)} of 12 tasks ran although the run had failed"
    assert sum(s.future.cancelled() for s in job.calls) >= 9
