"""The Dask scheduler shim: real Dask collections on the embedded emulator, against ``sync``."""

from __future__ import annotations

import io
import os
import time

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from dask.utils_test import GetFunctionTestMixin, add, inc

import fnmap
import fnmap.dask
from fnmap.client import get_client
from fnmap.config import resolve
from fnmap.dask.plan import make_plan


@pytest.fixture(autouse=True)
def _two_workers(monkeypatch):
    # The machine is shared: one small emulator serves the whole file.
    monkeypatch.setenv("FNMAP_WORKERS", "2")


class TestGetConformance(GetFunctionTestMixin):
    """Dask's own tests for implementations of the scheduler ``get`` specification."""

    get = staticmethod(fnmap.dask.get)


# -- collections against the synchronous scheduler -------------------------------------


def test_array_reductions_and_matmul():
    x = da.random.default_rng(42).random((600, 400), chunks=(150, 100))
    exprs = [x.sum(), x.mean(axis=0), x.std(axis=1), (x @ x.T).sum(), (x.T @ x + 1).max()]
    expected = dask.compute(*exprs, scheduler="sync")
    with fnmap.dask.collect_stats() as runs:
        got = dask.compute(*exprs, scheduler=fnmap.dask.get)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e)
    (stats,) = runs
    # Intermediate blocks (60-120 KB) went through storage, the client fetched nothing big.
    assert stats.bytes_stored > 0
    assert stats.bytes_fetched == 0
    assert stats.calls < stats.tasks


def test_array_result_fetched_from_storage():
    x = da.arange(300_000, chunks=50_000) * 2
    with fnmap.dask.collect_stats() as runs:
        got = x.compute(scheduler="fnmap")
    np.testing.assert_array_equal(got, np.arange(300_000) * 2)
    assert runs[0].bytes_fetched >= got.nbytes  # requested chunks are the only downloads


def test_bag_foldby_and_word_count():
    words = db.from_sequence([f"w{i % 7} w{i % 3} w{i % 5}" for i in range(200)], npartitions=20)
    flat = words.str.split().flatten()
    folded = flat.foldby(lambda w: w, lambda total, _w: total + 1, 0, lambda a, b: a + b, 0)
    counts = flat.frequencies()
    expected = dask.compute(folded, counts, scheduler="sync")
    got = dask.compute(folded, counts, scheduler=fnmap.dask.get)
    assert sorted(got[0]) == sorted(expected[0])
    assert sorted(got[1]) == sorted(expected[1])


def test_dataframe_groupby():
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"k": rng.integers(0, 10, 2000), "v": rng.random(2000),
                        "w": rng.random(2000)})
    df = dd.from_pandas(pdf, npartitions=8)
    expr = df.groupby("k").agg({"v": "mean", "w": "sum"})
    expected = expr.compute(scheduler="sync")
    got = expr.compute(scheduler=fnmap.dask.get)
    pd.testing.assert_frame_equal(got.sort_index(), expected.sort_index())
    assert df.v.sum().compute(scheduler="fnmap") == pytest.approx(pdf.v.sum())


def test_delayed_diamond():
    @dask.delayed
    def source(n):
        return list(range(n))

    @dask.delayed
    def left(xs):
        return [x * 2 for x in xs]

    @dask.delayed
    def right(xs):
        return [x + 1 for x in xs]

    @dask.delayed
    def join(a, b):
        return sum(a) - sum(b)

    s = source(100)
    total = join(left(s), right(s))
    assert total.compute(scheduler=fnmap.dask.get) == total.compute(scheduler="sync")


def test_named_scheduler_and_config():
    x = da.ones(20, chunks=5).sum()
    with dask.config.set(scheduler=fnmap.dask.get):
        assert x.compute() == 20
    with dask.config.set(scheduler="fnmap"):
        assert x.compute() == 20


def test_executor_as_dask_scheduler():
    x = da.arange(40, chunks=10).sum()
    with fnmap.Executor() as ex:
        assert x.compute(scheduler=ex) == 780


# -- errors, retries, timeouts ---------------------------------------------------------


class TwoArgError(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def explode(x):
    raise TwoArgError(7, f"bad {x}")


def test_failing_task_raises_its_own_exception_with_the_key():
    dsk = {"a": 1, "b": (inc, "a"), "boom": (explode, "b"), "c": (add, "boom", "b")}
    with pytest.raises(TwoArgError) as info:
        fnmap.dask.get(dsk, "c")
    assert info.value.code == 7
    assert any("'boom'" in note for note in info.value.__notes__)


def bad_block(block):
    if block[0] == 5:
        raise ZeroDivisionError("block starting at 5")
    return block


def test_failing_task_in_a_collection():
    x = da.arange(10, chunks=5).map_blocks(bad_block)
    with pytest.raises(ZeroDivisionError, match="block starting at 5") as info:
        x.sum().compute(scheduler="fnmap")
    assert any("Dask task" in note for note in info.value.__notes__)


def crash_once(marker, x):
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os._exit(1)  # the worker process dies: a platform fault, retried
    return x + 1


def flaky_once(marker, x):
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        raise ConnectionError("first attempt fails")
    return x * 10


def test_retries_apply_to_graph_tasks(tmp_path):
    dsk = {"a": 1, "b": (crash_once, str(tmp_path / "crash"), "a"), "c": (inc, "b")}
    assert fnmap.dask.get(dsk, "c", retries=2) == 3
    dsk = {"a": 1, "b": (flaky_once, str(tmp_path / "flaky"), "a")}
    assert fnmap.dask.get(dsk, "b", retry_on=(ConnectionError,)) == 10


def test_timeout_applies_to_graph_tasks():
    dsk = {"a": (time.sleep, 30), "b": (inc, 1)}
    with pytest.raises(fnmap.TimeoutError) as info:
        fnmap.dask.get(dsk, ["a", "b"], timeout=1, retries=0)
    assert any("Dask task" in note for note in info.value.__notes__)


def _slow_inc(x):
    import time

    time.sleep(0.05)
    return x + 1


def test_stragglers_in_a_graph_get_speculative_copies(use_emulator, monkeypatch):
    """Graph tasks get backup copies too: the emulator makes some calls 50 x slower."""
    # Room in flight beside the stragglers (each holds a dispatch thread while it waits).
    monkeypatch.setenv("FNMAP_WORKERS", "6")
    # Seed 5 makes call 0 (always sent: the first unit goes alone) a straggler and its copy not.
    use_emulator("--straggler-rate", "0.15", "--straggler-factor", "50", "--latency-ms", "20",
                 "--seed", "5", workers=2)
    parts = [dask.delayed(_slow_inc)(i) for i in range(40)]
    total = dask.delayed(sum)(parts)
    with fnmap.dask.collect_stats() as runs:
        assert total.compute(scheduler=fnmap.dask.get) == sum(range(1, 41))
    assert runs[0].attempts > runs[0].calls  # some calls ran twice; each result counted once


def test_unknown_keyword_is_refused():
    with pytest.raises(TypeError, match="unknown keyword.*'colour'"):
        fnmap.dask.get({"a": 1}, "a", colour="red")
    with pytest.raises(ValueError, match="inline_bytes=-1"):
        fnmap.dask.get({"a": 1}, "a", inline_bytes=-1)


def test_unpicklable_task_is_named():
    import threading

    dsk = {"a": 1, "locked": (lambda _lock, a: a, threading.Lock(), "a")}
    with pytest.raises(fnmap.SerializationError, match="'locked'"):
        fnmap.dask.get(dsk, "locked")


def test_local_backend_and_cache():
    x = da.random.default_rng(3).random((300, 300), chunks=100)
    expected = (x @ x.T).sum().compute(scheduler="sync")
    got = (x @ x.T).sum().compute(scheduler="fnmap", backend="local", inline_bytes=0)
    np.testing.assert_allclose(got, expected)
    assert fnmap.dask.get({"b": (inc, "a")}, "b", cache={"a": 41}) == 42


# -- diagnostics and what moves --------------------------------------------------------


def test_dask_callbacks_and_progress_bar():
    from dask.callbacks import Callback
    from dask.diagnostics import ProgressBar

    seen = {"pre": [], "post": []}
    cb = Callback(pretask=lambda key, dsk, state: seen["pre"].append(key),
                  posttask=lambda key, result, dsk, state, worker: seen["post"].append(key))
    out = io.StringIO()
    x = da.ones((40, 40), chunks=10).sum()
    with cb, ProgressBar(out=out, dt=0.01):
        assert x.compute(scheduler="fnmap") == 1600
    assert sorted(map(str, seen["pre"])) == sorted(map(str, seen["post"]))
    assert len(seen["pre"]) >= 16
    assert "100%" in out.getvalue()


def big(seed):
    return np.full(50_000, float(seed))  # 400 KB: stored, not inline


def test_intermediate_values_are_released_early_and_deleted():
    from dask.callbacks import Callback

    # Each big value feeds two tasks (no fusion); it is released once both are done.
    dsk = {"v0": (big, 0)}
    for i in range(3):
        dsk[f"a{i}"] = (np.sum, f"v{i}")
        dsk[f"b{i}"] = (np.max, f"v{i}")
        dsk[f"v{i + 1}"] = (big, (add, f"a{i}", f"b{i}"))
    dsk["out"] = (np.sum, "v3")
    released_before_out = []
    cb = Callback(pretask=lambda key, d, state: key == "out" and released_before_out.extend(
        sorted(state["released"])))
    with fnmap.dask.collect_stats() as runs, cb:
        assert fnmap.dask.get(dsk, "out") == dsk_value(dsk)
    assert {"v0", "v1", "v2"} <= set(released_before_out)
    assert "v3" not in released_before_out
    (stats,) = runs
    assert stats.bytes_stored >= 3 * 400_000  # v3 is fused with "out": never stored
    assert get_client(resolve()).store.list(f"jobs/{stats.job_id}/blobs/") == []


def dsk_value(dsk):
    return dask.get(dsk, "out")


def block(i):
    return np.full(10_000, float(i))  # 80 KB: stored when it leaves a worker, not inline


def add_blocks(blocks):
    return np.sum(blocks, axis=0)


def test_partial_products_stay_in_the_worker():
    """32 blocks, each pair summed, the sums summed: with four call slots, the pairs ready while
    other work keeps the slots busy travel with their sum in one call, and are never stored.  All
    leaves are ready at the start, so which pairs travel does not depend on the machine's speed."""
    dsk = {("a", i): (block, i) for i in range(32)}
    dsk |= {("s", j): (add_blocks, [("a", 2 * j), ("a", 2 * j + 1)]) for j in range(16)}
    dsk["total"] = (add_blocks, [("s", j) for j in range(16)])
    with fnmap.dask.collect_stats() as runs:
        got = fnmap.dask.get(dsk, "total", num_workers=4)
    np.testing.assert_array_equal(got, np.full(10_000, float(sum(range(32)))))
    # Storing every block and sum would take 48 x 80 KB; only the last pairs, sent when fewer
    # units than slots were left, and the 16 sums (each read by "total") are stored.
    assert runs[0].bytes_stored < 24 * 80_100


def test_matrix_products_compute_on_fnmap():
    x = da.random.default_rng(5).random((400, 400), chunks=100)
    got = (x @ x.T).sum().compute(scheduler="fnmap")
    np.testing.assert_allclose(got, (x @ x.T).sum().compute(scheduler="sync"))


def test_many_tiny_tasks_are_batched():
    b = db.from_sequence(range(400), npartitions=100).map(inc).filter(lambda v: v % 2)
    with fnmap.dask.collect_stats() as runs:
        assert b.sum().compute(scheduler="fnmap") == sum(v for v in range(1, 401) if v % 2)
    (stats,) = runs
    assert stats.calls < stats.units / 2


# -- planning (no server) --------------------------------------------------------------


def test_plan_fuses_linear_chains_only():
    dsk = {"a": 1, "b": (inc, "a"), "c": (inc, "b"), "d": (inc, "c"),
           "e": (inc, "d"), "f": (add, "d", "e")}
    plan = make_plan(dsk, ["f"])
    chains = sorted([n.key for n in u.nodes] for u in plan.units.values())
    # b-c-d is a chain; d feeds two tasks, so e and f stay separate units.
    assert chains == [["b", "c", "d"], ["e"], ["f"]]
    assert plan.data == {"a": 1}


def test_plan_does_not_fuse_into_a_task_waiting_on_another():
    dsk = {"x": (inc, 1), "y": (inc, 2), "z": (add, "x", "y")}
    plan = make_plan(dsk, ["z"])
    assert len(plan.units) == 3


def test_plan_missing_key():
    with pytest.raises(KeyError, match="nope"):
        make_plan({"a": 1}, ["nope"])
