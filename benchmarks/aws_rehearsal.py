"""The offline AWS rehearsal at ``chunksize=1`` beside the emulator backend: ``python benchmarks/aws_rehearsal.py``.

Does docs/deploy.md's "Rehearse the AWS path offline" steps (``fnmap emulator --aws --env-file``,
the exported settings, ``fnmap.map(abs, [-1, -2, 3])`` through boto3 -> Invoke -> awslambdaric ->
S3), then maps ``--calls`` no-op calls at ``chunksize=1`` on the ``aws`` backend, and the same
calls on the ``emulator`` backend (its own embedded emulator, the default path), each in a fresh
client process after a warm-up map.  Reports calls/s of both, their ratio, and the client's CPU
per call (``time.process_time()`` over the measured map) of both and their ratio.  Medians of
``--reps``, the two backends alternated so that load on a shared machine hits both alike.

``--baseline DIR`` runs another source tree as well (e.g. ``git worktree add /tmp/before <commit>``),
its own emulators and clients, alternated with this one, for a before/after in one run.
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

from chunking import offline_exports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CLIENT = """
import json, time
import fnmap

def noop(x):
    return x

if __name__ == "__main__":
    backend, n = {backend!r}, {n}
    if backend == "aws":
        assert fnmap.map(abs, [-1, -2, 3]) == [1, 2, 3]  # the rehearsal's own step
    fnmap.map(noop, range(20), chunksize=1, backend=backend, progress=False)  # warm: environments, clients
    c0, t0 = time.process_time(), time.perf_counter()
    out = fnmap.map(noop, range(n), chunksize=1, backend=backend, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert out == list(range(n)), "wrong results"
    print(json.dumps({{"calls_per_s": n / wall, "client_cpu_us": cpu / n * 1e6}}))
"""


def _run(code: str, env: dict, cwd: str) -> dict:
    # -P and cwd: the tree on PYTHONPATH is the one imported (--baseline), by the emulator too
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env,
                          timeout=900, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _clean_env(tree: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    return dict(env, PYTHONPATH=tree, FNMAP_PROGRESS="false")


def _offline_emulator(tree: str, workdir: str, workers: int) -> tuple[subprocess.Popen, dict]:
    """``fnmap emulator --aws --env-file`` from ``tree``, and a client environment that sourced the file."""
    env_file = os.path.join(workdir, ".fnmap", "offline.env")
    proc = subprocess.Popen([sys.executable, "-P", "-m", "fnmap", "emulator", "--aws", "--port", "0",
                             "--workers", str(workers), "--env-file", env_file],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_clean_env(tree), cwd=tree)
    settings = offline_exports(proc)
    return proc, dict(_clean_env(tree), **settings)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def measure(trees: dict, n: int, reps: int, workers: int) -> dict:
    runs = {(name, backend): [] for name in trees for backend in ("aws", "emulator")}
    with tempfile.TemporaryDirectory() as workdir:
        emulators = {name: _offline_emulator(tree, os.path.join(workdir, name), workers)
                     for name, tree in trees.items()}
        try:
            for _ in range(reps):
                for name, tree in trees.items():
                    for backend, env in (("aws", emulators[name][1]), ("emulator", _clean_env(tree))):
                        runs[name, backend].append(_run(_CLIENT.format(backend=backend, n=n), env, tree))
                        print(f"  {name} {backend}: {runs[name, backend][-1]}", file=sys.stderr, flush=True)
        finally:
            for proc, _env in emulators.values():
                _stop(proc)
    out = {}
    for name in trees:
        aws, emu = runs[name, "aws"], runs[name, "emulator"]
        row = {f"{backend}_{key}": statistics.median(r[key] for r in rs)
               for backend, rs in (("aws", aws), ("emulator", emu)) for key in ("calls_per_s", "client_cpu_us")}
        row["rate_ratio"] = row["aws_calls_per_s"] / row["emulator_calls_per_s"]
        row["cpu_ratio"] = row["aws_client_cpu_us"] / row["emulator_client_cpu_us"]
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="the offline emulator's --workers")
    ap.add_argument("--baseline", help="another fnmap source tree, measured alongside")
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline:
        trees = {"baseline": os.path.abspath(args.baseline), **trees}
    load = os.getloadavg()[0]
    rows = measure(trees, args.calls, args.reps, args.workers)
    print(f"\n{args.calls} no-op calls at chunksize=1, medians of {args.reps}, load average "
          f"{load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| tree | aws calls/s | emulator calls/s | aws / emulator rate | aws client µs/call | "
          "emulator client µs/call | aws / emulator CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['aws_calls_per_s']:.0f} | {r['emulator_calls_per_s']:.0f} | {r['rate_ratio']:.3f} | "
              f"{r['aws_client_cpu_us']:.0f} | {r['emulator_client_cpu_us']:.0f} | {r['cpu_ratio']:.2f} |")


if __name__ == "__main__":
    main()
