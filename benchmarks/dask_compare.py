"""The Dask shim beside Dask's own schedulers: ``python benchmarks/dask_compare.py [--quick]``.

Workloads (issue 4):

* ``matmul``:   ``(x @ x.T).sum()``, x a 4,000 x 4,000 random array in 1,000 x 1,000 chunks;
* ``wordcount``: a bag word count over 200 text partitions (generated in the tasks);
* ``groupby``:  a dataframe groupby-mean over 20 partitions (generated in the tasks).

Systems: ``fnmap.dask.get`` on the embedded emulator (the shim), Dask's own loop
over ``fnmap.Executor()`` on the same emulator (the path the shim must beat),
Dask's threaded scheduler (the baseline of the ratios), and
``distributed.LocalCluster`` (processes, one thread each).  The emulator and the
cluster get the same number of worker processes (``--workers``, default the
number of cores).  Each system runs each workload once to warm up (imports in
the workers, cluster start), then ``--repeat`` times, the systems taking turns in
a rotating order so that background load falls on all alike; the median wall time is
reported with its ratio to the threaded scheduler, the number of invocations
(fnmap calls; tasks for Dask's schedulers) and the bytes moved through storage
(fnmap only: values written and read back, and the calls' own records).
Every result is checked against the threaded scheduler's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd

import fnmap
import fnmap.dask

VOCABULARY = 2000


def make_text(i: int, words: int) -> str:
    rng = np.random.default_rng(i)
    ids = rng.zipf(1.3, words) % VOCABULARY
    return " ".join(f"w{j}" for j in ids)


def make_partition(i: int, rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(1000 + i)
    return pd.DataFrame({"k": rng.integers(0, 1000, rows), "v": rng.random(rows)})


def workloads(quick: bool) -> dict:
    n, chunk = (2000, 500) if quick else (4000, 1000)
    words, rows = (2000, 50_000) if quick else (20_000, 500_000)
    x = da.random.default_rng(7).random((n, n), chunks=chunk)
    text = db.from_sequence(range(200), npartitions=200).map(make_text, words)
    meta = pd.DataFrame({"k": pd.Series(dtype="int64"), "v": pd.Series(dtype="float64")})
    df = dd.from_map(make_partition, range(20), rows=rows, meta=meta)
    return {
        "matmul": (x @ x.T).sum(),
        "wordcount": text.str.split().flatten().frequencies(),
        "groupby": df.groupby("k").v.mean(),
    }


def same(a, b) -> bool:
    if isinstance(a, pd.Series):
        return np.allclose(a.sort_index().to_numpy(), b.sort_index().to_numpy())
    if isinstance(a, list):
        return sorted(a) == sorted(b)
    return bool(np.allclose(a, b))


def n_tasks(expr) -> int:
    """Tasks Dask runs for ``expr`` once optimized (counted by a callback on a threaded run)."""
    from dask.callbacks import Callback

    keys = []
    with Callback(pretask=lambda key, dsk, state: keys.append(key)):
        expr.compute(scheduler="threads")
    return len(keys)


class Shim:
    name = "fnmap shim"

    def __init__(self, workers: int):
        self.options = {"workers": workers}

    def run(self, expr):
        with fnmap.dask.collect_stats() as runs:
            value = expr.compute(scheduler=fnmap.dask.get, **self.options)
        (s,) = runs
        return value, s.calls, s.storage_bytes


class ExecutorPath:
    name = "Dask over fnmap.Executor"

    def __init__(self, workers: int):
        self.options = {"workers": workers}

    def run(self, expr):
        with fnmap.Executor(**self.options) as ex:
            value = expr.compute(scheduler=ex)
        store = ex._client.store
        moved = 0
        for call in ex.job.run.calls:
            moved += (call.stats or {}).get("bytes_out", 0)
            if call.items_key:
                moved += len(store.get(call.items_key))
        return value, len(ex.job.run.calls), moved


class Threads:
    name = "Dask threads"

    def run(self, expr):
        return expr.compute(scheduler="threads"), None, None


class LocalCluster:
    name = "distributed.LocalCluster"

    def __init__(self, workers: int):
        try:
            from distributed import Client, LocalCluster
        except ImportError as e:
            raise SystemExit("this benchmark needs distributed: pip install 'fnmap[bench]'") from e

        self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                    dashboard_address=None)
        self.client = Client(self.cluster, set_as_default=False)

    def run(self, expr):
        return self.client.compute(expr).result(), None, None

    def close(self):
        self.client.close()
        self.cluster.close()


def run_once(system, expr, expected) -> tuple[float, int | None, int | None]:
    start = time.perf_counter()
    value, calls, moved = system.run(expr)
    seconds = time.perf_counter() - start
    if not same(value, expected):
        raise AssertionError(f"{system.name} computed a different result")
    return seconds, calls, moved


def measure(systems: list, expr, expected, repeat: int) -> list[dict]:
    """Warm every system up, then time them in turn, rotating the order so load falls alike."""
    for system in systems:
        run_once(system, expr, expected)
    times: list[list[float]] = [[] for _ in systems]
    last: list = [None] * len(systems)
    for r in range(repeat):
        for i in [(r + j) % len(systems) for j in range(len(systems))]:
            seconds, calls, moved = run_once(systems[i], expr, expected)
            times[i].append(seconds)
            last[i] = (calls, moved)
    return [{"seconds": statistics.median(t), "calls": c, "bytes": m}
            for t, (c, m) in zip(times, last, strict=True)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs (2,000 x 2,000 array)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="worker processes for the emulator and the cluster (default: cores)")
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    args = parser.parse_args(argv)
    exprs = workloads(args.quick)
    if args.only:
        exprs = {k: v for k, v in exprs.items() if k in args.only}
    workers = args.workers
    systems = [Threads(), Shim(workers), ExecutorPath(workers), LocalCluster(workers)]
    try:
        for wname, expr in exprs.items():
            expected = expr.compute(scheduler="threads")
            tasks = n_tasks(expr)
            results = measure(systems, expr, expected, args.repeat)
            base = results[0]["seconds"]  # the threaded scheduler
            for system, r in zip(systems, results, strict=True):
                if r["calls"] is None:  # Dask's schedulers: one task per invocation
                    r["calls"] = tasks
                print(f"{wname:<10} {system.name:<26} {r['seconds']:8.2f} s"
                      f"  x{r['seconds'] / base:5.2f}  calls {r['calls']:5d}  storage "
                      + ("-" if r["bytes"] is None else f"{r['bytes'] / 1e6:8.1f} MB"), flush=True)
    finally:
        systems[-1].close()
    print(f"\n{'quick' if args.quick else 'full'} sizes, {args.workers} workers, "
          f"{os.cpu_count()} cores, median of {args.repeat}, "
          f"Python {sys.version.split()[0]}, dask {dask.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
