"""Where a call's CPU goes on the emulator path: ``python benchmarks/emulator_cpu.py``.

Runs warm noop and bigarg (1 MB) jobs, and a loop of noop ``Executor.submit`` calls (``--submit``), on the
auto-started emulator and splits
the CPU seconds they cost (psutil) between the client process, the emulator's
server process (its HTTP server + the WSGI app) and its worker processes, per call.  CPU time
is far less sensitive than wall time to other load on a shared machine, so this
is the figure to compare before and after a change to the per-call path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def noop(x):
    return x


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _submits(items: list) -> list:
    """A loop of ``Executor.submit``, one call per item, in a new executor; the results."""
    import fnmap

    with fnmap.Executor(progress=False) as executor:
        futures = [executor.submit(noop, x) for x in items]
        return [f.result() for f in futures]


def measure(kind: str, n: int, reps: int, chunksize: int | None = 1) -> dict:
    import os

    import psutil

    import fnmap

    os.environ["FNMAP_EMULATOR_IDLE"] = "0"  # an emulator of this process's own: its child, measured
    fnmap.map(noop, range(20), progress=False)  # start the emulator and warm its workers
    me = psutil.Process()
    emulator = next(c for c in me.children() if "emulator" in " ".join(c.cmdline()))
    func = noop if kind == "noop" else len
    rows = []
    for _ in range(reps):
        # New bytes each repetition (a random head), so that no input is found stored already.
        items = list(range(n)) if kind in ("noop", "submit") else [os.urandom(16) + bytes([i % 256]) * ((1 << 20) - 16)
                                                      for i in range(n)]
        workers = emulator.children(recursive=True)  # forked from a fork server
        c0, s0, w0 = _cpu(me), _cpu(emulator), sum(_cpu(w) for w in workers)
        t0 = time.perf_counter()
        out = _submits(items) if kind == "submit" else fnmap.map(func, items, chunksize=chunksize, progress=False)
        wall = time.perf_counter() - t0
        c1, s1, w1 = _cpu(me), _cpu(emulator), sum(_cpu(w) for w in workers)
        assert out == ([len(b) for b in items] if kind == "bigarg" else items), "wrong results"
        rows.append({"calls_per_s": n / wall, "client_us": (c1 - c0) / n * 1e6,
                     "server_us": (s1 - s0) / n * 1e6, "workers_us": (w1 - w0) / n * 1e6})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noop", type=int, default=3000, help="calls of the noop job (0: skip it)")
    ap.add_argument("--bigarg", type=int, default=300, help="calls of the 1 MB job (0: skip it)")
    ap.add_argument("--submit", type=int, default=0, help="calls of the Executor.submit loop (0: skip it)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunksize", type=int, default=1,
                    help="items per call (default 1: one call per item, as compare.py's fnmap rows; 0: automatic)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    chunksize = args.chunksize or None
    result = {kind: measure(kind, n, args.reps, chunksize)
              for kind, n in (("noop", args.noop), ("bigarg", args.bigarg), ("submit", args.submit)) if n > 0}
    print("| job | calls/s | client µs/call | server µs/call | workers µs/call | total µs/call |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, r in result.items():
        total = r["client_us"] + r["server_us"] + r["workers_us"]
        print(f"| {kind} | {r['calls_per_s']:,.0f} | {r['client_us']:,.0f} | {r['server_us']:,.0f} "
              f"| {r['workers_us']:,.0f} | {total:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
