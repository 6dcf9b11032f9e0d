"""fnmap side by side with its peers: ``python benchmarks/compare.py [--quick]``.

Every measurement runs in a fresh Python process (``--child``) that starts the
system, runs the workload once (the *cold* time: start included) and again (the
*warm* time: a second job in the same process), checks both results, and
reports the peak resident memory of its whole process tree (sampled every
20 ms from /proc, psutil elsewhere; shared pages count once per process).  The parent runs every
system on every workload in turn, rotating the order each repetition so that
background load falls on all systems alike, and prints medians with each
system's ratio to ``multiprocessing.Pool`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import systems  # noqa: E402
import workloads  # noqa: E402

SYSTEMS = ["fnmap-emulator", "fnmap-own", "fnmap-local", "pool", "ppe", "serial", "dask", "lithops", "ray"]
CHILD_TIMEOUT_S = 600
#: Settings a system's child runs with.
SYSTEM_ENV = {"fnmap-own": {"FNMAP_EMULATOR_IDLE": "0"}}


# -- child: one system, one workload -------------------------------------------------


def _process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, resident bytes)}`` of every process: from ``/proc/PID/stat`` on Linux
    (one small read each), else from psutil."""
    table = {}
    if os.path.isdir("/proc/self"):
        page = os.sysconf("SC_PAGE_SIZE")
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()  # after the command, which may hold spaces
            except OSError:
                continue  # ended meanwhile
            table[int(name)] = (int(fields[1]), int(fields[21]) * page)
        return table
    import psutil

    for proc in psutil.process_iter(["ppid", "memory_info"]):
        memory = proc.info["memory_info"]
        table[proc.pid] = (proc.info["ppid"], memory.rss if memory else 0)
    return table


class _PeakMemory:
    """Samples the RSS of this process and all its descendants; ``peak`` in bytes."""

    def __init__(self, interval: float = 0.02, also=()):
        self.peak = 0
        #: Processes outside this tree that serve it (the shared emulator), counted with their children.
        self.also = list(also)
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        roots = [os.getpid(), *self.also]
        while not self._stop.is_set():
            # One read of the process table per sample, whatever the number of roots, and from
            # /proc directly: psutil's ``children(recursive=True)`` scanned the whole table once
            # per root (3.6 ms of CPU each here, 50 times a second: 19 % of a core for one root),
            # so the row with the shared emulator as a second root paid twice the sampler's CPU of
            # every other row, on a 2-core machine (issue 25).
            table = _process_table()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _rss) in table.items():
                children.setdefault(ppid, []).append(pid)
            tree, stack = set(), list(roots)
            while stack:
                pid = stack.pop()
                if pid not in tree:
                    tree.add(pid)
                    stack.extend(children.get(pid, ()))
            self.peak = max(self.peak, sum(table[pid][1] for pid in tree if pid in table))
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def child(system_name: str, workload_name: str, n: int, spin_n: int) -> dict:
    wl = workloads.WORKLOADS[workload_name]
    items = wl.make_items(n, {"spin_n": spin_n})
    system = systems.create(system_name)
    have_psutil = systems.importlib.util.find_spec("psutil") is not None
    also = _shared_emulator_pids() if system_name == "fnmap-emulator" else []
    meter = _PeakMemory(also=also) if have_psutil else None
    if meter:
        meter.__enter__()
    try:
        t0 = time.perf_counter()
        system.start()
        t_started = time.perf_counter()
        first = system.map(wl.func, items)
        t1 = time.perf_counter()
        ok_cold = wl.check(items, list(first))
        del first
        items = wl.make_items(n, {"spin_n": spin_n})  # bigarg's are new bytes: nothing is stored already
        t2 = time.perf_counter()
        second = system.map(wl.func, items)
        t3 = time.perf_counter()
        ok_warm = wl.check(items, list(second))
    finally:
        if meter:
            meter.__exit__()
    system.close()
    return {
        "system": system_name, "workload": workload_name, "n": n,
        "start_s": t_started - t0, "cold_s": t1 - t0, "warm_s": t3 - t2,
        "ok": ok_cold and ok_warm, "peak_mb": meter.peak / 2**20 if meter else None,
    }


def _shared_emulator_pids() -> list[int]:
    """The pids of the user's shared emulators that are up: the one a fnmap-emulator child attaches
    to serves it, so its memory is counted as the child's (one it starts is its child anyway).
    Read from their state files (fnmap.emulator.shared's folder) without importing fnmap, whose
    imports are part of the timed first map."""
    import glob

    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        folder = os.path.join(runtime, "fnmap")
    else:
        folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fnmap", "run")
    pids = []
    for path in glob.glob(os.path.join(folder, "*", "emulator.json")):
        try:
            with open(path) as f:
                pids.append(int(json.load(f)["pid"]))
        except (OSError, ValueError, KeyError):
            pass
    return pids


# -- parent ----------------------------------------------------------------------------


def run_one(system_name: str, workload_name: str, n: int, spin_n: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", system_name, workload_name,
           str(n), str(spin_n)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env.update(SYSTEM_ENV.get(system_name, {}))
    # Every child gets the same environment: the shared emulator is keyed by it.  Lithops'
    # localhost backend runs `python` from PATH: this interpreter's.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"system": system_name, "workload": workload_name, "n": n,
                "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:]  # the exception, not the traceback
    return {"system": system_name, "workload": workload_name, "n": n,
            "error": f"exit {p.returncode}: {' '.join(tail)}"}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        import psutil

        mem = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    versions = {}
    for mod in ("fnmap", "numpy", "distributed", "lithops", "ray"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    return {"cpu": cpu, "cores": systems.cores(), "memory_gb": mem, "os": platform.platform(),
            "python": platform.python_version(), "versions": versions,
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}


def size_for(system_name: str, wl: workloads.Workload, quick: bool) -> int:
    n = wl.quick_size if quick else wl.size
    if system_name == "lithops":
        n = min(n, systems.LITHOPS_MAX_ITEMS // (2 if quick else 1))
    return n


def summarize(runs: list[dict], systems_run: list[str], workload_names: list[str]) -> list[dict]:
    rows = []
    for wname in workload_names:
        per = {}
        for sname in systems_run:
            mine = [r for r in runs if r["system"] == sname and r["workload"] == wname]
            good = [r for r in mine if "error" not in r]
            if not good:
                per[sname] = {"system": sname, "workload": wname,
                              "error": mine[-1]["error"] if mine else "not run"}
                continue
            n = good[0]["n"]
            cold = statistics.median(r["cold_s"] for r in good)
            warm = statistics.median(r["warm_s"] for r in good)
            peaks = [r["peak_mb"] for r in good if r["peak_mb"] is not None]
            per[sname] = {
                "system": sname, "workload": wname, "n": n, "reps": len(good),
                "start_s": statistics.median(r["start_s"] for r in good),
                "cold_s": cold, "warm_s": warm, "cold_per_s": n / cold, "warm_per_s": n / warm,
                "peak_mb": max(peaks) if peaks else None,
                "ok": all(r["ok"] for r in good),
            }
        pool = per.get("pool", {})
        for row in per.values():
            if "error" not in row and "error" not in pool and pool:
                row["ratio_warm"] = row["warm_per_s"] / pool["warm_per_s"]
                row["ratio_cold"] = row["cold_per_s"] / pool["cold_per_s"]
        rows.extend(per.values())
    return rows


def table(rows: list[dict]) -> str:
    head = ("| workload | system | n | cold s (start incl.) | cold calls/s | warm s | warm calls/s "
            "| peak MB | × Pool warm | × Pool cold | ok |")
    out = [head, "|" + " --- |" * 11]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['workload']} | {r['system']} | | | | | | | | | {r['error']} |")
            continue
        peak = f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "?"
        out.append(
            f"| {r['workload']} | {r['system']} | {r['n']} | {r['cold_s']:.2f} | {r['cold_per_s']:,.0f} "
            f"| {r['warm_s']:.3f} | {r['warm_per_s']:,.0f} | {peak} | {r.get('ratio_warm', 0):.2f} "
            f"| {r.get('ratio_cold', 0):.2f} | {'yes' if r['ok'] else 'WRONG'} |"
        )
    return "\n".join(out)


def chart(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    # A plain loop on noop and bigarg moves nothing between processes: off the chart's scale.
    good = [r for r in rows if "error" not in r
            and not (r["system"] == "serial" and r["workload"] in ("noop", "bigarg"))]
    wnames = list(dict.fromkeys(r["workload"] for r in good))
    snames = list(dict.fromkeys(r["system"] for r in good))
    fig, axes = plt.subplots(1, len(wnames), figsize=(3.2 * len(wnames), 4.2), squeeze=False)
    for ax, wname in zip(axes[0], wnames, strict=True):
        mine = {r["system"]: r for r in good if r["workload"] == wname}
        names = [s for s in snames if s in mine]
        warm = [mine[s]["warm_per_s"] for s in names]
        cold = [mine[s]["cold_per_s"] for s in names]
        y = range(len(names))
        ax.barh([i + 0.2 for i in y], warm, height=0.4, label="warm", color="tab:blue")
        ax.barh([i - 0.2 for i in y], cold, height=0.4, label="cold (start incl.)", color="tab:orange")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{wname} (calls/s, log)", fontsize=9)
        ax.invert_yaxis()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper right", ncol=2)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)


def _compile_fnmap() -> None:
    """Byte-compile fnmap's sources once, as ``pip install`` does for the peers' packages: an editable
    install under ``PYTHONDONTWRITEBYTECODE`` otherwise compiles about 30 modules in every fresh
    process (the client, the emulator, its fork server), some 60 ms each, inside fnmap's cold time."""
    import compileall

    import fnmap

    root = os.path.dirname(os.path.dirname(os.path.abspath(fnmap.__file__)))
    for folder in ("fnmap", "handlers"):
        if os.path.isdir(os.path.join(root, folder)):
            compileall.compile_dir(os.path.join(root, folder), quiet=1)


def _stop_shared_emulators() -> None:
    subprocess.run([sys.executable, "-m", "fnmap", "emulator", "stop"], capture_output=True, timeout=60)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repetition")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 1)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default=",".join(workloads.WORKLOADS))
    ap.add_argument("--json", help="write the raw runs and the summary here")
    ap.add_argument("--chart", help="write a PNG chart of calls/s here")
    ap.add_argument("--child", nargs=4, metavar=("SYSTEM", "WORKLOAD", "N", "SPIN_N"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        s, w, n, spin_n = args.child
        print(json.dumps(child(s, w, int(n), int(spin_n))), flush=True)
        return

    reps = args.reps or (1 if args.quick else 3)
    wanted = [s for s in args.systems.split(",") if s]
    workload_names = [w for w in args.workloads.split(",") if w]
    mach = machine()
    print(f"machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gb']} GB, "
          f"Python {mach['python']}, load {mach['loadavg']}", flush=True)
    runnable = []
    for s in wanted:
        why = systems.available(s)
        if why:
            print(f"skipping {s}: {why}", flush=True)
        else:
            runnable.append(s)
    _compile_fnmap()
    _stop_shared_emulators()  # the first fnmap-emulator run starts the one the later runs share
    spin_n = workloads.calibrate_spin()
    print(f"cpu workload: {spin_n:,} loop iterations per item (about 50 ms here)", flush=True)
    runs = []
    for rep in range(reps):
        for wname in workload_names:
            wl = workloads.WORKLOADS[wname]
            shift = rep % len(runnable)
            for sname in runnable[shift:] + runnable[:shift]:  # rotate: alternate who goes first
                r = run_one(sname, wname, size_for(sname, wl, args.quick), spin_n)
                runs.append(r)
                shown = r.get("error") or f"cold {r['cold_s']:.2f} s, warm {r['warm_s']:.3f} s" + (
                    "" if r["ok"] else " WRONG RESULTS")
                print(f"  rep {rep + 1}/{reps} {wname:6} {sname:15} {shown}", flush=True)
    _stop_shared_emulators()
    rows = summarize(runs, runnable, workload_names)
    mach["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": mach, "reps": reps, "quick": args.quick, "spin_n": spin_n,
                       "runs": runs, "summary": rows}, f, indent=1)
    if args.chart:
        chart(rows, args.chart)
        print(f"chart written to {args.chart}")


if __name__ == "__main__":
    main()
