"""fnmap.Executor against the standard library's executor contract (ported from CPython's tests)."""

from __future__ import annotations

import threading
import time
import weakref
from concurrent import futures

import pytest
from conftest import ALL_BACKENDS

import fnmap


@pytest.fixture(params=ALL_BACKENDS)
def executor(request, use_backend):
    ex = fnmap.Executor(backend=use_backend(request.param))
    yield ex
    ex.shutdown(wait=True)


def mul(x, y):
    return x * y


def sleep_and_return(t, value):
    time.sleep(t)
    return value


def raise_value_error(msg):
    raise ValueError(msg)


def test_is_a_real_executor(executor):
    assert isinstance(executor, futures.Executor)
    assert executor._max_workers >= 1


def test_submit(executor):
    f = executor.submit(pow, 2, 8)
    assert isinstance(f, futures.Future)
    assert f.result() == 256


def test_submit_keyword(executor):
    f = executor.submit(mul, 2, y=8)
    assert f.result() == 16


def test_submit_exception(executor):
    f = executor.submit(raise_value_error, "boom")
    with pytest.raises(ValueError, match="boom"):
        f.result()
    assert isinstance(f.exception(), ValueError)


def test_map(executor):
    assert list(executor.map(pow, range(10), range(10))) == list(map(pow, range(10), range(10)))


def test_map_chunksize(executor):
    assert list(executor.map(pow, range(40), range(40), chunksize=6)) == [pow(i, i) for i in range(40)]


def test_map_chunksize_invalid(executor):
    with pytest.raises(ValueError):
        executor.map(pow, range(3), chunksize=0)


def test_map_exception(executor):
    i = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5])
    assert next(i) == (0, 1)
    assert next(i) == (0, 1)
    with pytest.raises(ZeroDivisionError):
        next(i)


def test_map_exception_chunked(executor):
    i = executor.map(divmod, [1, 1, 1, 1], [2, 3, 0, 5], chunksize=2)
    assert next(i) == (0, 1)
    assert next(i) == (0, 1)
    with pytest.raises(ZeroDivisionError):
        next(i)


def test_map_timeout(executor):
    results = []
    with pytest.raises(futures.TimeoutError):
        for r in executor.map(sleep_and_return, [0, 0, 4], [1, 2, 3], timeout=2):
            results.append(r)
    assert results == [1, 2]


def test_map_buffersize(executor):
    assert list(executor.map(mul, range(20), range(20), buffersize=3)) == [i * i for i in range(20)]
    with pytest.raises(ValueError):
        executor.map(mul, [1], [1], buffersize=0)


def test_wait_and_as_completed(executor):
    fast = executor.submit(sleep_and_return, 0, "fast")
    slow = executor.submit(sleep_and_return, 1.5, "slow")
    done, not_done = futures.wait([fast, slow], return_when=futures.FIRST_COMPLETED)
    assert fast in done
    assert {f.result() for f in futures.as_completed([fast, slow], timeout=30)} == {"fast", "slow"}


def test_wait_first_exception(executor):
    bad = executor.submit(raise_value_error, "x")
    slow = executor.submit(sleep_and_return, 2, 1)
    done, not_done = futures.wait([bad, slow], return_when=futures.FIRST_EXCEPTION, timeout=30)
    assert bad in done


def test_done_callback(executor):
    seen = []
    event = threading.Event()

    def callback(f):
        seen.append(f.result())
        event.set()

    f = executor.submit(mul, 3, 4)
    f.add_done_callback(callback)
    assert event.wait(30)
    assert seen == [12]


def test_done_callback_already_done(executor):
    f = executor.submit(mul, 1, 2)
    f.result()
    seen = []
    f.add_done_callback(lambda fut: seen.append(fut.result()))
    assert seen == [2]


def test_submit_after_shutdown_raises(executor):
    executor.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        executor.submit(pow, 2, 5)


def test_context_manager_waits():
    with fnmap.Executor(backend="local") as ex:
        fs = [ex.submit(sleep_and_return, 0.2, i) for i in range(4)]
    assert all(f.done() for f in fs)
    assert [f.result() for f in fs] == [0, 1, 2, 3]


def test_shutdown_no_wait_then_results_arrive():
    ex = fnmap.Executor(backend="local")
    f = ex.submit(sleep_and_return, 0.3, "late")
    ex.shutdown(wait=False)
    assert f.result(timeout=30) == "late"


def test_a_call_sent_after_its_client_closed_fails_instead_of_hanging():
    ex = fnmap.Executor(backend="local", workers=1)
    try:
        ex._client.close()  # e.g. at interpreter exit, or a test closing pooled connections
        f = ex.submit(pow, 2, 5)
        with pytest.raises(fnmap.PlatformError, match="client was closed"):
            f.result(timeout=10)
    finally:
        ex.shutdown(wait=False)


def test_cancel_futures_on_shutdown():
    ex = fnmap.Executor(backend="local", workers=1)
    fs = [ex.submit(sleep_and_return, 0.5, i) for i in range(6)]
    ex.shutdown(wait=True, cancel_futures=True)
    cancelled = [f for f in fs if f.cancelled()]
    assert cancelled, "pending futures should have been cancelled"
    assert all(f.done() for f in fs)
    for f in fs:
        if not f.cancelled():
            assert f.result() in range(6)


def test_cancel_pending_future():
    ex = fnmap.Executor(backend="local", workers=1)
    try:
        blocker = ex.submit(sleep_and_return, 1, "x")
        pending = [ex.submit(sleep_and_return, 1, i) for i in range(3)]
        assert pending[-1].cancel()
        assert pending[-1].cancelled()
        assert blocker.result() == "x"
    finally:
        ex.shutdown(wait=True)


def test_no_stale_references(executor):
    class Obj:
        pass

    my_object = Obj()
    collected = threading.Event()
    ref = weakref.ref(my_object, lambda r: collected.set())
    f = executor.submit(lambda o: 1, my_object)
    assert f.result() == 1
    del my_object
    import gc

    gc.collect()
    assert collected.wait(5) or ref() is None


def test_dask_can_use_the_executor():
    import dask

    x = dask.delayed(mul)(3, 4)
    y = dask.delayed(mul)(x, 2)
    with fnmap.Executor() as ex:
        assert dask.compute(y, scheduler=ex)[0] == 24


def test_leaving_map_early_cancels_the_chunks_not_started():
    """Closing ``Executor.map``'s iterator (a ``break``, an exception in the loop) cancels what has
    not started, as the standard library's executors do: nothing runs for results nobody reads."""
    ex = fnmap.Executor(backend="local", workers=1)
    try:
        results = ex.map(sleep_and_return, [0.2] * 8, range(8))
        assert next(results) == 0
        results.close()
        ex.shutdown(wait=True)
        states = ex.job.run.calls
        assert sum(s.future.cancelled() for s in states) >= 5, [s.future for s in states]
        assert ex.job.summary()["attempts"].get("ok", 0) <= 3
    finally:
        ex.shutdown(wait=True)


def test_shutdown_cancelling_right_after_submits_lets_the_first_calls_run():
    """As with the standard executors, a submitted call is taken at once: submits then
    ``shutdown(cancel_futures=True)`` cancel what no thread took, never every call (CPython's
    ``test_cancel_futures``: 'at least one finished').  Before, a loop of submits ran within one GIL
    switch interval and about a third of such executors had every call cancelled."""
    with fnmap.Executor(backend="local") as warm:  # the client and its threads exist already
        warm.submit(abs, 1).result()
    for _ in range(20):
        ex = fnmap.Executor(backend="local")
        fs = [ex.submit(time.sleep, 0.01) for _ in range(10)]
        ex.shutdown(cancel_futures=True)
        ran = [f for f in fs if not f.cancelled()]
        assert ran and all(f.done() and f.exception() is None for f in ran)
