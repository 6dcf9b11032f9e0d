"""What the result cache saves and what keying costs the client.

    python benchmarks/cache.py [--items 10000] [--rounds 3] [--backend emulator] [--work 0.001]

1. A ``--items`` map (each item sleeps ``--work`` seconds) in fresh processes: without the cache,
   with ``cache=True`` the first time (computes and writes every entry), and with ``cache=True``
   again (every item a hit).  Prints the median wall seconds of each and the invocations (attempts
   sent) each made.
2. The client's cost of keying one item (:func:`fnmap.cache.key.item_digest`), in microseconds:
   ints, 1 MB numpy arrays, small DataFrames (3 columns x 20 rows), and dicts holding sets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

_RUN = """
import json, sys, time
import fnmap

def work(x):
    time.sleep({work})
    return x * 2

started = time.perf_counter()
cache = sys.argv[1] == "cache"
job = fnmap.map(work, range({items}), backend="{backend}", cache=cache, storage=sys.argv[2], return_job=True)
assert job.results() == [2 * x for x in range({items})]
wall = time.perf_counter() - started
print(json.dumps({{"wall": wall, "invocations": sum(job.summary()["attempts"].values())}}))
"""


def _run(code: str, mode: str, storage: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, mode, storage], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def map_rounds(items: int, rounds: int, backend: str, work: float) -> dict:
    code = _RUN.format(items=items, backend=backend, work=work)
    out: dict[str, list] = {"uncached": [], "first cached run": [], "fully cached": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as folder:
            storage = f"file://{folder}"
            out["uncached"].append(_run(code, "plain", storage))
            out["first cached run"].append(_run(code, "cache", storage))
            out["fully cached"].append(_run(code, "cache", storage))
    return out


def keying() -> dict:
    import numpy as np
    import pandas as pd

    from fnmap.cache.key import item_digest

    samples = {
        "int": (list(range(100_000)), 100_000),
        "1 MB numpy array": ([np.random.default_rng(i).random(131072) for i in range(50)], 50),
        "small DataFrame (3x20)": ([pd.DataFrame({"a": range(i, i + 20), "b": [f"s{j}" for j in range(20)],
                                                  "c": np.linspace(0, 1, 20)}) for i in range(500)], 500),
        "dict with a set": ([{"id": i, "tags": {"a", "b", f"t{i}"}} for i in range(20_000)], 20_000),
    }
    out = {}
    for name, (values, n) in samples.items():
        started = time.perf_counter()
        for value in values:
            item_digest(((value,), {}))
        out[name] = (time.perf_counter() - started) / n * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--work", type=float, default=0.001, help="seconds each item sleeps")
    args = parser.parse_args()
    for name, runs in map_rounds(args.items, args.rounds, args.backend, args.work).items():
        walls = [r["wall"] for r in runs]
        print(f"{args.items} items on {args.backend}, {name:16}: {statistics.median(walls):7.3f} s "
              f"(min {min(walls):.3f}, max {max(walls):.3f}), invocations {[r['invocations'] for r in runs]}")
    for name, micros in keying().items():
        print(f"keying one item, {name:24}: {micros:9.1f} us")


if __name__ == "__main__":
    main()
