"""``initializer=`` / ``initargs=``: run once per warm worker process, on every backend, before
its calls; what it sets is what the function sees; a failing one fails that worker's calls, named."""

from __future__ import annotations

import collections
import os

import pytest
from conftest import ALL_BACKENDS

import fnmap

MODEL = None


def load_model(counter: str, tag: str) -> None:
    """The test's initializer: one line per run in ``counter`` (O_APPEND: whole lines, any process)."""
    global MODEL
    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    MODEL = tag


def predict(x):
    return x, MODEL, os.getpid()


def predict_pair(x, y):
    return x + y, MODEL


def broken_setup(counter: str) -> None:
    load_model(counter, "never used")
    raise OSError("model file missing")


def runs_of(counter) -> collections.Counter:
    """How often the initializer ran, per process id."""
    return collections.Counter(int(line) for line in counter.read_text().split()) if counter.exists() else {}


def check_once_per_worker(results, counter, tag: str) -> None:
    assert [x for x, _tag, _pid in results] == list(range(len(results)))
    assert {t for _x, t, _pid in results} == {tag}
    runs = runs_of(counter)
    assert set(runs.values()) == {1}, runs  # at most once per worker process
    assert {pid for _x, _t, pid in results} <= set(runs), runs  # and in each one that ran calls


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_the_initializer_runs_once_per_worker_and_sets_what_the_function_reads(backend, use_backend, tmp_path):
    use_backend(backend)
    counter = tmp_path / "runs"
    results = fnmap.map(predict, range(24), chunksize=2, initializer=load_model,
                        initargs=(str(counter), "model-a"))
    check_once_per_worker(results, counter, "model-a")
    # Another job's initializer (other initargs) runs too, even on the same warm workers.
    other = tmp_path / "other-runs"
    results = fnmap.map(predict, range(6), chunksize=2, initializer=load_model, initargs=(str(other), "model-b"))
    check_once_per_worker(results, other, "model-b")


def test_every_front_end_takes_an_initializer(tmp_path):
    counter = str(tmp_path / "runs")
    options = {"initializer": load_model, "initargs": (counter, "m")}
    with fnmap.Executor(**options) as ex:
        assert ex.submit(predict, 5).result()[:2] == (5, "m")
        assert [r[1] for r in ex.map(predict, range(3))] == ["m"] * 3
    assert fnmap.starmap(predict_pair, [(1, 2), (3, 4)], **options) == [(3, "m"), (7, "m")]
    assert [r[1] for r in fnmap.imap(predict, range(3), **options)] == ["m"] * 3
    assert fnmap.map_reduce(predict, range(4), lambda outs: sorted({o[1] for o in outs}), **options) == ["m"]


def test_a_failing_initializer_fails_that_workers_calls_once_each_with_its_name(tmp_path, use_backend):
    use_backend("emulator")
    counter = tmp_path / "runs"
    job = fnmap.map(predict, range(8), chunksize=1, initializer=broken_setup, initargs=(str(counter),),
                    retries=2, return_job=True)
    errors = job.results(return_exceptions=True)
    assert all(isinstance(e, fnmap.InitializerError) for e in errors), errors
    message = str(errors[0])
    assert "the initializer broken_setup(" in message and "OSError: model file missing" in message
    assert "model file missing" in "\n".join(errors[0].__notes__)  # the worker's traceback
    assert set(runs_of(counter).values()) == {1}  # not run again for each call, nor retried
    assert job.summary()["retries"] == 0


def test_bad_initializer_options_are_named_with_the_fix():
    with pytest.raises(fnmap.ConfigError, match="initializer='load' .* is not callable"):
        fnmap.map(abs, [1], initializer="load")
    with pytest.raises(fnmap.ConfigError, match="initargs=.*without initializer="):
        fnmap.map(abs, [1], initargs=(1,))
    with pytest.raises(fnmap.ConfigError, match=r"initargs='model.pt' .* must be a tuple"):
        fnmap.map(abs, [1], initializer=load_model, initargs="model.pt")


def test_on_lambda_environments_under_awslambdaric_it_runs_once_per_environment(
        emulator_process, aws_backend_on, tmp_path):
    """The platform's own runtime client: each execution environment is one warm process."""
    pytest.importorskip("awslambdaric")
    aws_backend_on(emulator_process("--lambda-runtime", "ric", workers=2))
    counter = tmp_path / "runs"
    results = fnmap.map(predict, range(12), chunksize=1, initializer=load_model,
                        initargs=(str(counter), "model-ric"), speculation=False)
    check_once_per_worker(results, counter, "model-ric")


def test_an_installed_initializer_runs_once_per_process_per_initargs(tmp_path):
    """An installed module's function keeps its module as namespace across jobs: other initargs run
    it again, the same ones do not (``os.makedirs`` would raise on a second run with the same path)."""
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second, first):
        assert fnmap.map(abs, [-1, -2], backend="local", initializer=os.makedirs,
                         initargs=(str(folder),)) == [1, 2]
        assert folder.is_dir()


def _loaded_slowly():
    import time

    time.sleep(0.3)  # widens the window in which the local backend's threads load the function
    return "slow"


class SlowToLoad:
    def __reduce__(self):
        return _loaded_slowly, ()


SLOW = SlowToLoad()


def predict_slowly_loaded(x):
    return x, (MODEL, SLOW), os.getpid()


def test_threads_of_the_local_backend_share_one_load_and_one_run(tmp_path):
    counter = tmp_path / "runs"
    results = fnmap.map(predict_slowly_loaded, range(8), backend="local", workers=4, chunksize=1,
                        initializer=load_model, initargs=(str(counter), "m"))
    check_once_per_worker(results, counter, ("m", "slow"))
