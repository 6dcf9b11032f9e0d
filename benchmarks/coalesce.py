"""Warm calls one item each, side by side with the standard pools: ``python benchmarks/coalesce.py``.

In one process, after a warm-up of each system, every repetition runs in turn (medians printed):

- ``fnmap.map(noop, range(N), chunksize=1)`` on an emulator of this process's own (its workers:
  the cores), ``multiprocessing.Pool(2).map(noop, ..., chunksize=1)`` and
  ``ProcessPoolExecutor(2).map(noop, ...)``;
- ``N`` calls of ``fnmap.Executor().submit(noop, i)`` (a new executor each loop, as ``with
  fnmap.Executor() as ex:`` makes, on the warm emulator) and of a warm ``ProcessPoolExecutor(2)``'s
  ``submit``, each loop then waiting for every future.

Each fnmap figure is printed as a ratio to its peer measured in the same repetition.  The machine's
load average is printed at the start and the end: the ratios, not the rates, are what compares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, wait


def noop(x):
    return x


def _timed(action) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def _submits(executor, n: int) -> None:
    futures = [executor.submit(noop, i) for i in range(n)]
    wait(futures)
    assert [f.result() for f in futures] == list(range(n)), "wrong results"


def _fnmap_submits(n: int) -> None:
    import fnmap

    with fnmap.Executor() as executor:
        _submits(executor, n)


def measure(n_map: int, n_submit: list[int], reps: int) -> dict:
    import multiprocessing

    import fnmap

    os.environ["FNMAP_EMULATOR_IDLE"] = "0"  # an emulator of this process's own
    items = list(range(n_map))
    pool = multiprocessing.Pool(2)
    ppe = ProcessPoolExecutor(2)
    systems = {
        "fnmap_map": lambda: fnmap.map(noop, items, chunksize=1, progress=False) == items or 1 / 0,
        "pool_map_c1": lambda: pool.map(noop, items, chunksize=1) == items or 1 / 0,
        "ppe_map": lambda: list(ppe.map(noop, items)) == items or 1 / 0,
    }
    for n in n_submit:
        systems[f"fnmap_submit_{n}"] = lambda n=n: _fnmap_submits(n)
        systems[f"ppe_submit_{n}"] = lambda n=n: _submits(ppe, n)
    for action in systems.values():  # warm-up: workers started, code imported
        action()
    rows = {name: [] for name in systems}
    for _ in range(reps):
        for name, action in systems.items():
            rows[name].append(_timed(action))
    ppe.shutdown()
    pool.close()
    pool.join()
    sizes = {name: (n_map if name.endswith("map") or name.endswith("_c1") else int(name.rsplit("_", 1)[1]))
             for name in systems}
    rates = {name: sizes[name] / statistics.median(times) for name, times in rows.items()}
    ratios = {
        "map / Pool(2).map(chunksize=1)": rates["fnmap_map"] / rates["pool_map_c1"],
        "map / ProcessPoolExecutor(2).map": rates["fnmap_map"] / rates["ppe_map"],
    }
    for n in n_submit:
        ratios[f"{n} Executor.submit / ProcessPoolExecutor(2).submit"] = (
            rates[f"fnmap_submit_{n}"] / rates[f"ppe_submit_{n}"])
    return {"calls_per_s": rates, "ratios": ratios}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--map", type=int, default=1000, help="items of the map (one call each)")
    ap.add_argument("--submit", default="2000,10000", help="sizes of the submit loops, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    out = measure(args.map, [int(s) for s in args.submit.split(",") if s], args.reps)
    out["loadavg"] = {"start": load0, "end": os.getloadavg()}
    for name, rate in out["calls_per_s"].items():
        print(f"{name:24} {rate:10,.0f} calls/s")
    for name, ratio in out["ratios"].items():
        print(f"{name:52} {ratio:6.2f} x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
