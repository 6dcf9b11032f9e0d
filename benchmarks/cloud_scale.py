"""The ``aws`` path at scale: ``python benchmarks/cloud_scale.py [--calls 10000] [--compare 2000]``.

One ``fnmap emulator`` serves AWS Lambda's API on loopback (``--lambda-runtime pool`` by
default: the emulator's worker pool runs the events; ``ric`` runs them under awslambdaric, much
slower per call).  Every measurement runs in a fresh client process pointed at it with boto3's
own settings (``AWS_ENDPOINT_URL_LAMBDA``, test credentials), storage a local folder:

* **compare**: ``--compare`` no-op calls, chunksize 1, through the ``aws`` backend and through
  the ``emulator`` backend on the same emulator, alternating, ``--reps`` times; the medians of
  client CPU per call (``time.process_time``, all threads) and their ratio (target: aws <= 2x).
* **scale**: ``--calls`` no-op calls through the ``aws`` backend: seconds until every call was
  invoked (the backend's last ``invoke`` returned), until every result was gathered (``map``
  returned), client CPU and RSS growth per call, and the client's storage requests per call,
  counted by a wrapper around its store's methods (the workers' own reads and writes happen in
  the emulator's processes and are not in this count).

``--register NAME=module:Class`` adds a backend (a module on ``PYTHONPATH``), e.g. a copy of an
older ``aws.py`` to measure before and after in one run: ``--backends aws,aws_before,emulator``.
``--scaling-rate`` and ``--max-concurrency`` pass Lambda's limits to the emulator; ``--fanout N``
sends whole jobs of N calls or more through spawner invocations (fan-out from inside the platform;
without it the aws backend still sends its ``Event`` calls through spawners, its default since
issue 25); ``--chunksize auto`` runs the scale runs with automatic chunking (the default of a map).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_RATIO = 2.0
_STORE_METHODS = ("put", "put_if_absent", "get", "get_range", "exists", "list", "list_details", "delete")


def noop(x):
    return x


def _instrument(backend_name: str, registered: dict, profilers: list | None) -> tuple[dict, collections.Counter]:
    """Record when the backend's last invocation returned, count the client's storage requests and,
    with ``profilers``, profile the backend's ``invoke`` in every dispatch thread (cProfile sees one thread)."""
    import importlib

    from fnmap.backends import BACKENDS
    from fnmap.storage.file import FileStore

    BACKENDS.update(registered)
    module, cls_name = BACKENDS[backend_name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    marks = {"last_invoked": 0.0, "invoke_cpu_s": 0.0}
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()
    local = threading.local()

    def timed(method):
        def wrapper(self, *args, **kwargs):
            profiler = None
            if profilers is not None and marks.get("profiling"):
                profiler = getattr(local, "profiler", None)
                if profiler is None:
                    import cProfile

                    profiler = local.profiler = cProfile.Profile(time.thread_time)  # CPU, not waits
                    with lock:
                        profilers.append(profiler)
                profiler.enable()
            started = time.thread_time()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent = time.thread_time() - started
                if profiler is not None:
                    profiler.disable()
                marks["last_invoked"] = time.perf_counter()
                with lock:
                    marks["invoke_cpu_s"] += spent
        return wrapper

    for name in ("invoke", "invoke_all"):
        if name in vars(cls) or name == "invoke":
            setattr(cls, name, timed(getattr(cls, name)))

    def counted(name, method):
        def wrapper(self, *args, **kwargs):
            with lock:
                counts[name] += 1
            return method(self, *args, **kwargs)
        return wrapper

    for name in _STORE_METHODS:
        if hasattr(FileStore, name):
            setattr(FileStore, name, counted(name, getattr(FileStore, name)))
    return marks, counts


def measure(backend: str, n: int, options: dict, registered: dict, profile: str | None, fanout: int | None,
            chunksize: int | None = 1) -> dict:
    import fnmap

    if fanout:
        from fnmap.backends.aws import AwsBackend

        AwsBackend.fanout_threshold = fanout

    profilers = [] if profile else None
    marks, counts = _instrument(backend, registered, profilers)
    fnmap.map(noop, range(20), backend=backend, progress=False, **options)  # client, connections, imports
    counts.clear()
    marks["invoke_cpu_s"] = 0.0
    from client_scale import _rss_kb  # this folder is on sys.path (see main)

    rss_before = _rss_kb()
    marks["profiling"] = True
    wall, cpu = time.perf_counter(), time.process_time()
    job = fnmap.map(noop, range(n), backend=backend, chunksize=chunksize, progress=False, return_job=True, **options)
    out = job.results()
    cpu, end = time.process_time() - cpu, time.perf_counter()
    if profilers:
        import pstats

        stats = pstats.Stats(profilers[0])
        for profiler in profilers[1:]:
            stats.add(profiler)
        stats.dump_stats(profile)
    assert out == list(range(n)), "wrong results"
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"backend": backend, "n": n, "cpu_s": cpu, "invoked_s": marks["last_invoked"] - wall,
            "gathered_s": end - wall, "invoke_cpu_s": marks["invoke_cpu_s"], "rss_growth_kb": maxrss_kb - rss_before,
            "storage": dict(counts), "calls": len(job.run.calls)}


def run_child(backend: str, n: int, env: dict, options: dict, registered: dict, profile: str | None = None,
              fanout: int | None = None, chunksize: int | None = 1) -> dict:
    spec = json.dumps({"backend": backend, "n": n, "options": options, "registered": registered,
                       "profile": profile, "fanout": fanout, "chunksize": chunksize})
    cmd = [sys.executable, os.path.abspath(__file__), "--child", spec]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"child failed ({p.returncode}): {p.stderr[-3000:]}")


def _emulator(args):
    from fnmap.emulator.launcher import EmulatorLauncher

    options = ["--lambda-runtime", args.lambda_runtime]
    if args.scaling_rate:
        options += ["--scaling-rate", str(args.scaling_rate)]
    if args.max_concurrency:
        options += ["--max-concurrency", str(args.max_concurrency)]
    return EmulatorLauncher(args.workers, options=options, stderr=subprocess.DEVNULL)


def _client_env(emu, storage: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    env.update(AWS_ENDPOINT_URL_LAMBDA=emu.url, **emu.aws_environment, AWS_DEFAULT_REGION="us-east-1",
               FNMAP_EMULATOR_URL=emu.url, FNMAP_SECRET=emu.secret,
               FNMAP_STORAGE=storage, PYTHONPATH=os.pathsep.join([HERE, env.get("PYTHONPATH", "")]))
    return env


def _row(r: dict) -> str:
    n = r["n"]
    per_call = sum(r["storage"].values()) / n
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["storage"].items()))
    return (f"| {r['backend']} | {n:,} | {r.get('calls', n):,} "
            f"| {r['invoked_s']:.2f} | {r['gathered_s']:.2f} | {r['cpu_s'] / n * 1e6:.0f} "
            f"| {r['invoke_cpu_s'] / n * 1e6:.0f} "
            f"| {r['rss_growth_kb'] / n:.2f} | {per_call:.3f} ({kinds}) |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--calls", default="10000", help="calls of the scale run(s), comma-separated (default 10000)")
    ap.add_argument("--compare", type=int, default=2000, help="calls of each compare run; 0 skips it (default 2000)")
    ap.add_argument("--reps", type=int, default=3, help="compare runs per backend, alternating (default 3)")
    ap.add_argument("--backends", default="aws,emulator", help="backends of the compare runs (default aws,emulator)")
    ap.add_argument("--scale-backend", default="aws", help="backend of the scale runs (default aws)")
    ap.add_argument("--register", action="append", default=[], metavar="NAME=module:Class",
                    help="add a backend for this run (the module on PYTHONPATH or beside this script)")
    ap.add_argument("--workers", type=int, default=4, help="the emulator's worker processes (default 4)")
    ap.add_argument("--client-workers", type=int, default=16,
                    help="calls each client keeps in flight, the same for every backend (default 16)")
    ap.add_argument("--invocation", default="auto", choices=("auto", "Event", "RequestResponse"),
                    help="lambda_invocation of the aws backend (default auto)")
    ap.add_argument("--lambda-runtime", default="pool", choices=("pool", "ric"),
                    help="how the emulator runs Lambda events (default pool)")
    ap.add_argument("--scaling-rate", type=int, default=0, help="the emulator's --scaling-rate (default off)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="the emulator's --max-concurrency (default off)")
    ap.add_argument("--chunksize", default="1",
                    help="chunksize of the scale runs: items per call, or auto (automatic chunking); default 1")
    ap.add_argument("--fanout", type=int, default=0, metavar="N",
                    help="the aws backend fans jobs of N calls or more out through spawner "
                         "invocations (AwsBackend.fanout_threshold; default off)")
    ap.add_argument("--profile", metavar="DIR",
                    help="write a cProfile of the backend's invoke (all dispatch threads) of each compare run here "
                         "(the profiler's own cost inflates that run's CPU figures)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        sys.path.insert(0, HERE)
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["backend"], spec["n"], spec["options"], spec["registered"],
                                 spec["profile"], spec.get("fanout"), spec.get("chunksize", 1))), flush=True)
        return
    registered = dict(r.split("=", 1) for r in args.register)
    options = {"workers": args.client_workers, "lambda_invocation": args.invocation, "speculation": False}
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    emu = _emulator(args)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="fnmap-cloud-scale-") as folder:
            env = _client_env(emu, "file://" + folder)
            print(f"emulator {emu.url}: {args.workers} workers, Lambda runtime {args.lambda_runtime}; "
                  f"{os.cpu_count()} CPUs; client workers {args.client_workers}", flush=True)
            header = ("| backend | items | calls | invoked s | gathered s | client CPU µs/item | in invoke "
                      "| RSS KB/item | client storage requests/item |\n" + "| --- " * 9 + "|")
            if args.compare:
                print(f"\ncompare, {args.compare:,} calls each, alternating, {args.reps} reps:\n{header}", flush=True)
                runs = collections.defaultdict(list)
                for rep in range(args.reps):
                    for backend in args.backends.split(","):
                        profile = (os.path.join(args.profile, f"{backend}-{rep}.prof") if args.profile else None)
                        r = run_child(backend, args.compare, env, options, registered, profile, args.fanout)
                        runs[backend].append(r)
                        rows.append(dict(r, kind="compare"))
                        print(_row(r), flush=True)
                medians = {b: statistics.median(r["cpu_s"] / r["n"] * 1e6 for r in rs) for b, rs in runs.items()}
                print("\nmedian client CPU µs/call: " + ", ".join(f"{b} {v:.0f}" for b, v in medians.items()))
                if "aws" in medians and "emulator" in medians:
                    ratio = medians["aws"] / medians["emulator"]
                    print(f"aws / emulator = {ratio:.2f} (target <= {TARGET_RATIO})", flush=True)
            sizes = [int(s) for s in args.calls.split(",") if s and int(s) > 0]
            if sizes:
                fanned = f", fan-out from {args.fanout} calls" if args.fanout else ""
                print(f"\nscale ({args.scale_backend}, lambda_invocation={args.invocation}{fanned}, "
                      f"chunksize {args.chunksize}):\n{header}",
                      flush=True)
            for n in sizes:
                r = run_child(args.scale_backend, n, env, options, registered, fanout=args.fanout,
                              chunksize=None if args.chunksize == "auto" else int(args.chunksize))
                rows.append(dict(r, kind="scale"))
                print(_row(r), flush=True)
    finally:
        emu.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
