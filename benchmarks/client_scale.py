"""fnmap's own client cost per call: ``python benchmarks/client_scale.py [--sizes 10000,100000]``.

The calls go to ``instant``, a backend defined here that answers every call at
once with a canned response (one ``None`` result), so what is measured is the
client alone: chunking, pickling, signing, dispatch threads, futures,
bookkeeping and gathering.  Each size runs in a fresh process: client CPU
seconds (all threads, ``time.process_time``), resident memory growth
(``ru_maxrss`` after minus RSS before) and, in a second run under tracemalloc,
the peak of Python allocations, each divided by the number of calls.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import time

from fnmap.backends.base import Answer, BaseBackend

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_CPU_US = 100
TARGET_BYTES = 3 * 1024


class InstantBackend(BaseBackend):
    """Completes every call immediately: the same answer the worker gives for a ``None`` result."""

    name = "instant"
    max_workers = 8

    def __init__(self, config):
        from fnmap.runtime.signing import new_secret
        from fnmap.runtime.wire import CallResponse, encode

        self.secret = new_secret().encode()
        self._answer = Answer(encode(CallResponse(job_id="", call_id=0, attempt=1, inline=True),
                                     pickle.dumps([("ok", None)], protocol=5)))

    def invoke(self, invocation) -> Answer:
        return self._answer


def noop(x):
    return x


def measure(n: int, trace: bool) -> dict:
    import fnmap
    from fnmap.backends import BACKENDS

    BACKENDS["instant"] = "client_scale:InstantBackend"
    fnmap.map(noop, range(10), backend="instant", progress=False)  # client, threads, imports
    rss_before = _rss_kb()
    if trace:
        import tracemalloc

        tracemalloc.start()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fnmap.map(noop, range(n), backend="instant", progress=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert len(out) == n and all(v is None for v in out), "wrong results"
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"n": n, "cpu_s": cpu, "wall_s": wall, "rss_growth_kb": maxrss_kb - rss_before,
            "traced_peak_bytes": peak}


def _rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_child(n: int, trace: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(n)] + (["--trace"] if trace else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"child failed ({p.returncode}): {p.stderr[-2000:]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    if args.child:
        print(json.dumps(measure(args.child, args.trace)), flush=True)
        return
    rows = []
    print("| calls | client CPU s | CPU µs/call | wall s | RSS growth KB/call | traced peak KB/call |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in (int(s) for s in args.sizes.split(",")):
        runs = sorted((run_child(n, False) for _ in range(args.reps)), key=lambda r: r["cpu_s"])
        mid = runs[len(runs) // 2]
        traced = run_child(n, True)
        row = dict(mid, traced_peak_bytes=traced["traced_peak_bytes"])
        rows.append(row)
        cpu_us = row["cpu_s"] / n * 1e6
        rss = row["rss_growth_kb"] / n
        peak = row["traced_peak_bytes"] / n / 1024
        print(f"| {n:,} | {row['cpu_s']:.2f} | {cpu_us:.0f} | {row['wall_s']:.2f} | {rss:.2f} | {peak:.2f} |",
              flush=True)
    last = rows[-1]
    n = last["n"]
    print(f"\nat {n:,} calls: {last['cpu_s'] / n * 1e6:.0f} µs CPU per call (target <= {TARGET_CPU_US}), "
          f"{last['rss_growth_kb'] * 1024 / n:.0f} B RSS per call (target <= {TARGET_BYTES})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
