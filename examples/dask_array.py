"""Dask arrays on fnmap: a whole Dask graph runs on the embedded emulator (no cloud account needed).

    python examples/dask_array.py

``import fnmap.dask`` makes ``scheduler="fnmap"`` available; the same graph
runs on any fnmap backend (``backend="aws"``, ``storage="s3://..."``) by
passing fnmap options to ``compute``.
"""

import time

import dask
import dask.array as da
import numpy as np

import fnmap.dask


def main() -> None:
    rng = da.random.default_rng(0)
    x = rng.standard_normal((2000, 2000), chunks=(500, 500))
    gram = x @ x.T  # 16 blocks of 2 MB: they stay in storage, the client never downloads them
    exprs = {
        "trace of x @ x.T": da.trace(gram),
        "mean": x.mean(),
        "std of column means": x.mean(axis=0).std(),
        "largest |entry|": abs(x).max(),
    }
    start = time.perf_counter()
    with fnmap.dask.collect_stats() as runs:
        results = dask.compute(exprs, scheduler="fnmap")[0]
    elapsed = time.perf_counter() - start
    expected = dask.compute(exprs, scheduler="threads")[0]
    for name, value in results.items():
        assert np.allclose(value, expected[name]), f"{name}: {value} != {expected[name]}"
        print(f"  {name:<22} {float(value):14.4f}")
    (stats,) = runs
    print(f"fnmap dask: {stats.tasks} tasks in {stats.units} units, {stats.calls} calls, "
          f"{elapsed:.2f} s (emulator start included)")
    print(f"  storage: {stats.bytes_stored / 1e6:.1f} MB written by tasks, "
          f"{stats.bytes_loaded / 1e6:.1f} MB read back by tasks, "
          f"{stats.bytes_fetched / 1e6:.3f} MB downloaded by the client")


if __name__ == "__main__":
    main()
