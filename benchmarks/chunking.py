"""Automatic chunking beside ``multiprocessing.Pool`` and hand-picked chunksizes (issue 24).

``python benchmarks/chunking.py [--items 100000] [--aws-items 2000] [--reps 3]``

* **tiny items**: ``map(ident, range(--items))`` with ``multiprocessing.Pool(2).map`` and with
  ``fnmap.map`` on the embedded emulator, chunksize unset (automatic), over the range and over a
  generator of the same items.  *cold* is a fresh process
  that starts the pool or the emulator (start included); *warm* is a second map in that process
  (the median of ``--warm-maps`` maps after the first); *warm CPU* the CPU seconds of the process
  and its children (pool workers; the emulator and its workers) in a warm map, with psutil, a
  figure that load on a shared machine changes less than wall time.  Target: fnmap within 3x of
  Pool.
* **aws path**: ``--aws-items`` items through the ``aws`` backend on ``fnmap emulator --aws``
  (the offline AWS emulator: Lambda API + moto S3), chunksize 1, 5, 10, 20, 50, 100 and
  automatic, one map in a fresh client process each (client start included, alike for all).
  Target: automatic within 2x of the best.

Every result is checked; medians of ``--reps``; calls per job are printed too.  ``--baseline DIR``
runs fnmap from another source tree too (e.g. ``git archive`` of an older commit), alternated with
this one and Pool in the same run, for a before/after on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: CPU seconds of this process and its children (the pool's workers; the emulator and its workers).
_TREE_CPU = """
def tree_cpu():
    try:
        import psutil
    except ImportError:
        return float("nan")
    me, total = psutil.Process(), 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
"""

_POOL = """
import json, multiprocessing, statistics, time
{tree_cpu}
def ident(x): return x
if __name__ == "__main__":
    n = {n}
    t0 = time.perf_counter()
    with multiprocessing.Pool(2) as pool:
        assert pool.map(ident, range(n)) == list(range(n))
        t1 = time.perf_counter()
        warm, cpu = [], []
        for _ in range({warm_maps}):
            c0, t2 = tree_cpu(), time.perf_counter()
            assert pool.map(ident, range(n)) == list(range(n))
            warm.append(time.perf_counter() - t2)
            cpu.append(tree_cpu() - c0)
    print(json.dumps({{"cold": t1 - t0, "warm": statistics.median(warm), "cpu": statistics.median(cpu)}}))
"""

_FNMAP = """
import json, statistics, time
t0 = time.perf_counter()
import fnmap
{tree_cpu}
def ident(x): return x
if __name__ == "__main__":
    n, chunksize = {n}, {chunksize}
    items = (lambda: (i for i in range(n))) if {generator} else (lambda: range(n))
    job = fnmap.map(ident, items(), chunksize=chunksize, return_job=True)
    assert job.results() == list(range(n))
    t1 = time.perf_counter()
    warm, cpu, calls = [], [], []
    for _ in range({warm_maps}):
        c0, t2 = tree_cpu(), time.perf_counter()
        job2 = fnmap.map(ident, items(), chunksize=chunksize, return_job=True)
        assert job2.results() == list(range(n))
        warm.append(time.perf_counter() - t2)
        cpu.append(tree_cpu() - c0)
        calls.append(len(job2.run.calls))
    print(json.dumps({{"cold": t1 - t0, "warm": statistics.median(warm), "cpu": statistics.median(cpu),
                      "calls": len(job.run.calls), "calls_warm": statistics.median(calls)}}))
"""


_FNMAP_ONCE = """
import json, time
import fnmap
def ident(x): return x
if __name__ == "__main__":
    n, chunksize = {n}, {chunksize}
    t0 = time.perf_counter()
    job = fnmap.map(ident, range(n), chunksize=chunksize, return_job=True)
    assert job.results() == list(range(n))
    print(json.dumps({{"seconds": time.perf_counter() - t0, "calls": len(job.run.calls)}}))
"""


def _run(code: str, env: dict | None = None, cwd: str | None = None) -> dict:
    # -P and cwd: the fnmap tree on PYTHONPATH is the one imported (--baseline), by the emulator too
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env, timeout=900,
                          cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def tiny_items(n: int, reps: int, baseline: str | None = None, warm_maps: int = 1) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT, FNMAP_PROGRESS="false")
    trees = {"fnmap.map (emulator, automatic)": env}
    if baseline:
        trees[f"fnmap.map (emulator, automatic), {baseline}"] = dict(env, PYTHONPATH=os.path.abspath(baseline))
    pool: list = []
    # each tree over a list (a range) and over a generator of the same items (its length unknown)
    auto: dict = {(name, gen): [] for name in trees for gen in (False, True)}
    for _ in range(reps):  # alternate, so load on a shared machine hits both alike
        pool.append(_run(_POOL.format(n=n, warm_maps=warm_maps, tree_cpu=_TREE_CPU), env))
        for (name, gen), runs in auto.items():
            tree_env = trees[name]
            runs.append(_run(_FNMAP.format(n=n, chunksize=None, warm_maps=warm_maps, tree_cpu=_TREE_CPU,
                                           generator=gen), tree_env, cwd=tree_env["PYTHONPATH"]))
    rows = [{"system": "multiprocessing.Pool(2).map", "cold_s": _median(pool, "cold"),
             "warm_s": _median(pool, "warm"), "warm_cpu_s": _median(pool, "cpu"), "calls": None}]
    rows += [{"system": name + (", generator" if gen else ""), "cold_s": _median(runs, "cold"),
              "warm_s": _median(runs, "warm"), "warm_cpu_s": _median(runs, "cpu"), "calls": _median(runs, "calls_warm")}
             for (name, gen), runs in auto.items()]
    for row in rows:
        row["cold_x_pool"] = row["cold_s"] / rows[0]["cold_s"]
        row["warm_x_pool"] = row["warm_s"] / rows[0]["warm_s"]
        row["warm_cpu_x_pool"] = row["warm_cpu_s"] / rows[0]["warm_cpu_s"] if rows[0]["warm_cpu_s"] else None
    return rows


def offline_exports(proc: subprocess.Popen) -> dict:
    """The ``export NAME=value`` lines ``fnmap emulator --aws --env-file`` prints until it listens: the
    settings a client sources to reach it."""
    settings = {}
    for line in proc.stdout:
        if line.startswith("export "):
            name, _, value = line.split(None, 1)[1].strip().partition("=")
            settings[name] = value.strip("'\"")
        if "listening on" in line:
            break
    else:
        raise RuntimeError("the offline AWS emulator did not start")
    return settings


def _offline_aws(workdir: str) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    env["PYTHONPATH"] = ROOT
    env_file = os.path.join(workdir, "offline.env")
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "emulator", "--aws", "--port", "0", "--workers", "2",
                             "--env-file", env_file], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=workdir)
    settings = offline_exports(proc)
    client_env = dict(env, **settings, FNMAP_PROGRESS="false")
    return proc, client_env


def aws_path(n: int, reps: int, chunksizes: list) -> list[dict]:
    with tempfile.TemporaryDirectory() as workdir:
        proc, env = _offline_aws(workdir)
        try:
            runs: dict = {c: [] for c in chunksizes}
            # Warm the emulator's Lambda environments first: the first run would pay their cold starts.
            _run(_FNMAP_ONCE.format(n=20, chunksize=1), env)
            for _ in range(reps):
                for chunksize in chunksizes:
                    runs[chunksize].append(_run(_FNMAP_ONCE.format(n=n, chunksize=chunksize), env))
                    print(f"  aws chunksize={chunksize}: {runs[chunksize][-1]}", file=sys.stderr, flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = [{"chunksize": c if c is not None else "auto", "seconds": _median(r, "seconds"),
             "calls": _median(r, "calls")} for c, r in runs.items()]
    best = min(r["seconds"] for r in rows if r["chunksize"] != "auto")
    for row in rows:
        row["x_best"] = row["seconds"] / best
    return rows


def _table(rows: list[dict]) -> str:
    heads = list(rows[0])
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for row in rows:
        lines.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--aws-items", type=int, default=2_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--aws-reps", type=int, default=1)
    parser.add_argument("--chunksizes", default="1,5,10,20,50,100")
    parser.add_argument("--skip-aws", action="store_true")
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--baseline", help="another fnmap source tree to run beside this one (tiny items)")
    parser.add_argument("--warm-maps", type=int, default=1,
                        help="warm maps per process (their median; default 1: the second map of the process)")
    args = parser.parse_args()
    if not args.skip_tiny:
        print(f"## {args.items} tiny items, emulator vs Pool (medians of {args.reps})\n")
        print(_table(tiny_items(args.items, args.reps, args.baseline, args.warm_maps)), flush=True)
    if not args.skip_aws:
        sizes = [None] + [int(c) for c in args.chunksizes.split(",")]
        print(f"\n## {args.aws_items} items on the offline aws path (medians of {args.aws_reps})\n")
        print(_table(aws_path(args.aws_items, args.aws_reps, sizes)))


if __name__ == "__main__":
    main()
