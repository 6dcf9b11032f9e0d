"""Chaos: named maps re-run after SIGKILLs, checked for right results: ``python benchmarks/chaos.py --minutes 10``.

Named maps (``fnmap.map(f, items, job_name=...)``) run in real client processes on the emulator
shared by a user's processes (the default backend: started on demand, it outlives its clients),
while faults are injected at random moments:

* ``client@start``: SIGKILL of a client process in its start: in a job's first run, at one of the
  stages where a re-run has the most to recover (the job just made, in the storage's index, no
  call stored; or its first calls stored and not all of them), in a re-run within its first
  ``START_SECONDS``; ``client@run``: once one more of its calls has a result (and up to 0.5 s more);
* ``emulator``: SIGKILL of the shared emulator (its clients start or find another);
* ``worker``: SIGKILL of one of the emulator's worker processes (a call in it is retried).

Every run that did not complete (killed, hung, raised, stopped at its cost cap) is run again, as a
user would: the same script, ``job_name``, function and items (a capped job with a larger
``max_cost``), until it completes or ``max_runs`` runs were made.  The jobs are a mix (``SIZES``):
many small items chunked automatically, items over the 16 MiB a map stores at its start with
``chunksize=1``, a function that sleeps a little, and capped jobs: stopped midway at their
``max_cost``, or refused before they start by the cost an earlier job of their function measured.

Each job is then judged: **right** when its last run returned every item's value once, in input
order, and its record says ``succeeded`` with the same values read back by ``fnmap.job(ID)``;
**wrong** when a run completed with anything else; **hung** when a run passed its deadline
(``run_deadline`` seconds; it is killed and run again, and the job stays ``hung``); **stuck**
when ``max_runs`` runs never completed it.  After the last client, the emulator must count no
call in flight (a killed client's calls stop counting); the processes of the run still up once its
emulators were stopped (an emulator no state file names, a worker or fork server whose emulator was
killed) are counted, and killed.

Everything lives in a work folder of its own (storage, ``XDG_RUNTIME_DIR``, ``XDG_CONFIG_HOME``),
so the shared emulator is the run's own; it is stopped at the end.  ``tests/test_chaos.py``
runs a short one with a fixed number of faults of each kind; this script runs the long one and
prints its figures (``--markdown``: as a table for benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

#: The kinds of fault, in the order the figures list them.
FAULTS = ("client@start", "client@run", "emulator", "worker")
#: A re-run's ``client@start`` kill comes within this many seconds of its start; the emulator and
#: its workers are killed only while some client has run for half of it (it has calls out).
START_SECONDS = 1.0
#: Exit code of a run stopped at its ``max_cost`` (it is run again with a larger cap).
CAPPED = 3
#: Bytes of each item of the ``large`` jobs: 45 of them are over the 16 MiB a map stores at its start.
LARGE_ITEM = 400_000

#: MB and seconds of the ``priced`` jobs' calls: what they cost is then mostly their duration,
#: which the estimate before the first run does not know (it assumes the least, about a quarter
#: of it), so a cap of ``CAP_FIRST`` of their cost stops the first run early.
PRICED_MEMORY = 10240
PRICED_SECONDS = 0.2
#: The first run's cap, as a share of what the job's calls cost, and its growth on each run after:
#: the first run and the first redrive stop at their caps (the redrive's cap counts what it spends),
#: the second redrive finishes.
CAP_FIRST, CAP_GROWTH = 0.3, 1.5

#: One run of one job: ``python run.py KIND NAME N OUT [MAX_COST SALT]``.  The functions are the
#: same code on every run, so a re-run is the same function and items as the run before.
SCRIPT = r'''
import json, os, sys, time

import fnmap


def square(x):
    return x * x


def measure(item):
    i, blob = item
    return [i, len(blob), blob[0], blob[-1]]


def nap(x):
    time.sleep(0.05)
    return x + 1


#: The priced calls' pause: PRICED_SECONDS and SALT microseconds.  A job with a SALT of its own runs
#: a function (a pickle) that no earlier job measured, so its estimate is the least it can cost.
PAUSE = PRICED_SECONDS + (int(sys.argv[6]) if len(sys.argv) > 6 else 0) * 1e-6


def priced(x):
    time.sleep(PAUSE)
    return -x


def main():
    kind, name, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    options = {"chunksize": 1}
    if kind == "small":
        func, items, options = square, list(range(n)), {}
    elif kind == "large":
        func, items = measure, [(i, bytes([i % 256]) * LARGE_ITEM) for i in range(n)]
    elif kind == "sleep":
        func, items = nap, list(range(n))
    else:
        func, items = priced, list(range(n))
        options.update(max_cost=float(sys.argv[5]), memory=PRICED_MEMORY)  # priced, repriced
    try:
        results = fnmap.map(func, items, job_name=name, **options)
    except fnmap.CostCapReached as e:
        print(f"capped: {e}", file=sys.stderr)
        sys.exit(CAPPED)
    with open(out + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out + ".tmp", out)


main()
'''


def expected(kind: str, n: int) -> list:
    """What a job's results must be (as JSON gives them back)."""
    if kind == "small":
        return [x * x for x in range(n)]
    if kind == "large":
        return [[i, LARGE_ITEM, i % 256, i % 256] for i in range(n)]
    if kind == "sleep":
        return [x + 1 for x in range(n)]
    return [-x for x in range(n)]


#: Items per job of each kind: ``small`` is chunked automatically; ``large`` is over 16 MiB;
#: ``priced`` runs a function of its own with a cap that stops its first run midway, raised on
#: each re-run; ``repriced`` the same, but every such job runs the same function, so after the
#: first one the estimate measured from it refuses the first run before it starts.
SIZES = {"small": 2000, "large": 150, "sleep": 120, "priced": 40, "repriced": 40}
KINDS = tuple(SIZES)
#: The kinds whose runs have a ``max_cost``.
CAPPED_KINDS = ("priced", "repriced")


@dataclasses.dataclass
class Job:
    """One named map and what its runs did."""

    name: str
    kind: str
    n: int
    runs: int = 0
    killed: int = 0
    hung: int = 0
    capped: int = 0
    #: The last line of each run that raised (not killed by the harness).
    errors: list = dataclasses.field(default_factory=list)
    verdict: str = ""  # right, wrong, hung, stuck ("" while it runs)
    why: str = ""


@dataclasses.dataclass
class Run:
    """A client process running one job once."""

    job: Job
    proc: subprocess.Popen
    out: str
    started: float
    #: A client kill planned: its kind, the moment the run reaches (``stage``, when ``reached()``
    #: says so), then ``kill_delay`` seconds more, which set ``kill_at`` (a monotonic time).
    kill_kind: str = ""
    stage: str = ""
    reached: Callable[[], bool] | None = None
    kill_delay: float = 0.0
    kill_at: float | None = None
    killed: bool = False

    def kill_planned(self) -> bool:
        return self.reached is not None or self.kill_at is not None


class Chaos:
    """A chaos run in ``work`` (a folder of its own): :meth:`run` runs jobs while faults happen.

    ``faults``: how many of each kind to inject (the short test), or None: at random for as long
    as jobs run (the long run; client kills on ``client_rate`` of runs, an emulator kill every
    ``emulator_every`` seconds and a worker kill every ``worker_every`` on average).
    """

    def __init__(self, work: str, seed: int = 1, concurrency: int = 2, max_runs: int = 8, max_jobs: int = 12,
                 run_deadline: float = 90.0, faults: dict | None = None, client_rate: float = 0.4,
                 emulator_every: float = 30.0, worker_every: float = 10.0, log=None):
        self.work, self.random = work, random.Random(seed)
        self.seed, self.concurrency, self.max_runs, self.run_deadline = seed, concurrency, max_runs, run_deadline
        self.max_jobs = max_jobs
        self.planned = dict(faults) if faults is not None else None
        self.client_rate, self.emulator_every, self.worker_every = client_rate, emulator_every, worker_every
        self.log = log or (lambda line: None)
        self.storage = os.path.join(work, "storage")
        self.runtime = os.path.join(work, "runtime")
        self.config = os.path.join(work, "config")
        os.makedirs(self.runtime, mode=0o700, exist_ok=True)
        self.script = os.path.join(work, "run.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT.replace("LARGE_ITEM", str(LARGE_ITEM)).replace("CAPPED", str(CAPPED))
                    .replace("PRICED_MEMORY", str(PRICED_MEMORY)).replace("PRICED_SECONDS", str(PRICED_SECONDS)))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_ENDPOINT_URL"))}
        self.env.update(FNMAP_STORAGE="file://" + self.storage, XDG_RUNTIME_DIR=self.runtime,
                        XDG_CONFIG_HOME=self.config, FNMAP_PROGRESS="false", FNMAP_EMULATOR_IDLE="120")
        self.faults = dict.fromkeys(FAULTS, 0)
        self.jobs: list[Job] = []
        self.running: list[Run] = []
        self.in_flight_left = 0
        #: The most emulator processes of this run up at once (looked at each second): 1 when right.
        self.emulators_at_once = 0
        self._look_at = 0.0
        self.leftover_processes = 0
        self._next = {"emulator": 0.0, "worker": 0.0}
        self._cap_base = None
        self._starts = 0  # client kills in a job's first start so far (they alternate their stage)

    # -- jobs and runs ---------------------------------------------------------------------------

    def add_job(self, kind: str, n: int | None = None) -> Job:
        job = Job(f"chaos-{self.seed}-{len(self.jobs)}-{kind}", kind, n or SIZES[kind])
        self.jobs.append(job)
        return job

    def _start_run(self, job: Job) -> None:
        out = os.path.join(self.work, f"{job.name}.{job.runs}.json")
        args = [sys.executable, self.script, job.kind, job.name, str(job.n), out]
        if job.kind in CAPPED_KINDS:
            salt = self.jobs.index(job) + 1 if job.kind == "priced" else 0
            args += [repr(self.cap(job)), str(salt)]
        log = open(os.path.join(self.work, f"{job.name}.{job.runs}.log"), "wb")
        with log:
            proc = subprocess.Popen(args, cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        job.runs += 1
        run = Run(job, proc, out, time.monotonic())
        self._plan_client_kill(run)
        self.running.append(run)

    def cap(self, job: Job) -> float:
        """The ``max_cost`` of a capped job's next run: ``CAP_FIRST`` of what its calls cost (above
        its least cost, so a function no job measured is not refused before it starts: it stops
        early), ``CAP_GROWTH`` times more on each run after, so that a later run finishes."""
        if self._cap_base is None:
            self._cap_base = _call_cost() * job.n * CAP_FIRST
        return self._cap_base * CAP_GROWTH ** job.runs

    def _plan_client_kill(self, run: Run) -> None:
        if run.job.runs >= self.max_runs - 1:
            return  # the last runs of a job run in peace: a stuck job is the library's, not the plan's
        if self.planned is None:
            if self.random.random() >= self.client_rate:
                return
            kind = self.random.choice(("client@start", "client@run"))
        else:
            due = [k for k in ("client@start", "client@run") if self.planned.get(k, 0) > 0]
            if not due:
                return
            kind = due[0]
            self.planned[kind] -= 1
        run.kill_kind, job = kind, run.job
        if kind == "client@run":  # once one more call has its result than when the run started
            before = self._stored(job, "out")
            run.stage, run.reached = "calls ran", lambda: self._stored(job, "out") > before
            run.kill_delay = self.random.uniform(0.0, 0.5)
        elif self._job_id(job) is not None:  # a re-run's start: the name is claimed already
            run.stage, run.kill_at = "re-run", run.started + self.random.uniform(0.3, START_SECONDS)
        elif self._starts % 2 == 0:  # the job was just made (it is in the index); no call is stored yet
            self._starts += 1
            run.stage, run.reached = "job made", lambda: self._indexed(job)
        else:  # the first of its calls are stored, not all of them (large items: not yet sent)
            self._starts += 1
            run.stage, run.reached = "calls being stored", lambda: self._indexed(job) and self._stored(job, "calls")

    def _job_id(self, job: Job) -> str | None:
        """The id of the job its name stands for, or None before the name is claimed."""
        try:
            with open(os.path.join(self.storage, "names", job.name + ".json")) as f:
                return json.load(f)["job_id"]
        except (OSError, ValueError, KeyError):
            return None

    def _indexed(self, job: Job) -> bool:
        """Whether the job is in its storage's index of jobs (it is, from its start on)."""
        job_id = self._job_id(job)
        try:
            return job_id is not None and any(e.endswith(job_id + ".json")
                                              for e in os.listdir(os.path.join(self.storage, "index", "jobs")))
        except OSError:
            return False

    def _stored(self, job: Job, folder: str) -> int:
        """How many objects the job has in its storage's ``folder`` (``out``: calls with a result;
        ``calls``: batches of calls whose inputs are stored)."""
        try:
            return len(os.listdir(os.path.join(self.storage, "jobs", self._job_id(job) or "-", folder)))
        except OSError:
            return 0

    def _finish(self, run: Run, now: float) -> None:
        """Judge a run that ended: done (right or wrong), or its job is to run again."""
        job, code = run.job, run.proc.returncode
        if run.kill_planned() and self.planned is not None:
            self.planned[run.kill_kind] += 1  # it ended before its planned kill: the next run gets it
        if run.killed:
            job.killed += 1
        elif code == 0:
            self._judge(job, run.out)
            return
        elif code == CAPPED:
            job.capped += 1
        else:
            job.errors.append(_error_line(run.out[:-len(".json")] + ".log") or f"exit code {code}")
        if job.runs >= self.max_runs:
            job.verdict = job.verdict or "stuck"
            job.why = job.why or (f"not complete after {job.runs} runs; last error: "
                                  f"{job.errors[-1] if job.errors else 'none (killed or capped)'}")
            self.log(f"{job.name}: {job.verdict}: {job.why}")
        else:
            self._start_run(job)

    def _judge(self, job: Job, out: str) -> None:
        with open(out) as f:
            results = json.load(f)
        want = expected(job.kind, job.n)
        wrong = _difference(results, want, "the run returned")
        if not wrong:
            wrong = self._check_record(job, want)
        if wrong:
            job.verdict, job.why = "wrong", wrong
        elif not job.verdict:  # a job that hung before stays hung
            job.verdict = "right"
        self.log(f"{job.name}: {job.verdict} after {job.runs} runs {job.why}")

    def _check_record(self, job: Job, want: list) -> str:
        """'' if the job's record says ``succeeded`` and its stored results are ``want``; else what differs."""
        from fnmap.attach import AttachedJob
        from fnmap.runtime import keys
        from fnmap.storage import open_store

        store = open_store("file://" + self.storage, create=False)
        job_id = json.loads(store.get(keys.job_name_key(job.name)))["job_id"]
        attached = AttachedJob(store, job_id, secret=self._secret())
        if not attached.wait(timeout=30):
            return f"its record says {attached.status!r} 30 s after its run returned"
        status = attached.status
        if status != "succeeded":
            summary = attached.summary()
            counts = {k: summary[k] for k in ("succeeded", "failed", "cancelled") if k in summary}
            return f"its record says {status!r}, not 'succeeded' ({counts}; job {job_id})"
        stored = json.loads(json.dumps(attached.results(return_exceptions=True), default=repr))
        return _difference(stored, want, f"fnmap.job({job_id[:12]}).results() gave")

    def _secret(self) -> str:
        with open(os.path.join(self.config, "fnmap", "secret")) as f:
            return f.read().strip()

    # -- faults ----------------------------------------------------------------------------------

    def _emulators(self) -> list[dict]:
        from fnmap.emulator.shared import read_state

        return [s for s in (read_state(os.path.dirname(p)) for p in
                            glob.glob(os.path.join(self.runtime, "fnmap", "*", "emulator.json"))) if s]

    def _emulator_pids(self) -> list[int]:
        """Every emulator process of this run, named by a state file or not."""
        return [pid for pid in _processes_with(self.runtime) if " -m fnmap emulator " in _command(pid)]

    def _due(self, kind: str, now: float) -> bool:
        if self.planned is not None:
            if self.planned.get(kind, 0) <= 0 or now < self._next[kind]:
                return False
            self._next[kind] = now + self.random.uniform(0.5, 2.0)
            return True
        every = self.emulator_every if kind == "emulator" else self.worker_every
        if not self._next[kind]:
            self._next[kind] = now + self.random.uniform(0.3, 1.7) * every
            return False
        if now < self._next[kind]:
            return False
        self._next[kind] = now + self.random.uniform(0.3, 1.7) * every
        return True

    def _inject(self, now: float) -> None:
        for run in self.running:
            if run.reached is not None and run.reached():
                run.kill_at, run.reached = now + run.kill_delay, None
            if run.kill_at is not None and now >= run.kill_at and run.proc.poll() is None:
                _kill(run.proc.pid)
                run.killed, run.kill_at = True, None
                self.faults[run.kill_kind] += 1
                self.log(f"{run.job.name} run {run.job.runs}: SIGKILL {run.kill_kind} ({run.stage}) "
                         f"{now - run.started:.2f} s in")
        if not any(now - r.started > START_SECONDS / 2 for r in self.running if r.proc.poll() is None):
            return  # no client has calls out yet: nothing for the emulator and its workers to lose
        for kind in ("emulator", "worker"):
            if self._due(kind, now):
                pid = self._victim(kind)
                if pid is None:
                    self._next[kind] = now + 0.5  # none found now: look again soon
                    continue
                up = f" (emulators up: {self._emulator_pids()})" if kind == "emulator" else ""
                _kill(pid)
                self.faults[kind] += 1
                if self.planned is not None:
                    self.planned[kind] -= 1
                self.log(f"SIGKILL {kind} pid {pid}{up}")

    def _victim(self, kind: str) -> int | None:
        emulators = self._emulators()
        if not emulators:
            return None
        if kind == "emulator":
            return self.random.choice(emulators)["pid"]
        from fnmap.emulator.shared import status

        workers = [pid for emu in emulators for s in status(emu).get("sessions", ()) for pid in s.get("workers", ())]
        return self.random.choice(workers) if workers else None

    # -- the run ---------------------------------------------------------------------------------

    def run(self, minutes: float | None = None, kinds=KINDS) -> dict:
        """Run the jobs added (or, with ``minutes``, new jobs of ``kinds`` in turn until that time
        has passed) while faults are injected; wait for every job's verdict; return the figures."""
        start = time.monotonic()
        until = start + minutes * 60 if minutes else None
        pending = [j for j in self.jobs if not j.verdict]
        try:
            while True:
                now = time.monotonic()
                self._reap(now)
                while len(self.running) < self.concurrency:
                    if not pending and self._more(now, until):
                        pending.append(self.add_job(kinds[len(self.jobs) % len(kinds)]))
                    if not pending:
                        break
                    self._start_run(pending.pop(0))
                if not self.running:
                    break
                if self.planned is None and until is not None and now >= until:
                    self.client_rate = 0.0  # time is up: no more faults; the jobs out finish
                    self.emulator_every = self.worker_every = float("inf")
                else:
                    self._inject(now)
                if now >= self._look_at:
                    self._look_at = now + 1.0
                    self.emulators_at_once = max(self.emulators_at_once, len(self._emulator_pids()))
                time.sleep(0.05)
            self.in_flight_left = self._in_flight_after()
        finally:
            for run in self.running:
                _kill(run.proc.pid)
                run.proc.wait()
            self.leftover_processes = self.stop()
        return self.figures(time.monotonic() - start)

    def _more(self, now: float, until: float | None) -> bool:
        """Whether to start another job: until ``until``; or, with faults planned, while some are
        still to be injected (at most ``max_jobs`` jobs)."""
        if self.planned is not None:
            return len(self.jobs) < self.max_jobs and any(v > 0 for v in self.planned.values())
        return until is not None and now < until

    def _reap(self, now: float) -> None:
        for run in list(self.running):
            if run.proc.poll() is None and now - run.started > self.run_deadline:
                run.job.hung += 1
                run.job.verdict = "hung"
                run.job.why = f"run {run.job.runs} passed its {self.run_deadline:g} s deadline"
                self.log(f"{run.job.name}: {run.job.why}; killed")
                _kill(run.proc.pid)
                run.killed = True
                run.proc.wait()
                run.job.killed -= 1  # the harness's deadline, not a fault
            if run.proc.poll() is not None:
                self.running.remove(run)
                self._finish(run, now)

    def _in_flight_after(self, wait: float = 10.0) -> int:
        """Calls the emulator still counts in flight once every client ended (0 when it is right),
        after ``wait`` seconds for the sessions of the last clients to end."""
        from fnmap.emulator.shared import status

        deadline = time.monotonic() + wait
        while True:
            answers = [status(emu) for emu in self._emulators()]
            left = sum(answer.get("in_flight", 0) for answer in answers)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for answer in answers:
            if answer.get("in_flight"):
                sessions = [(s.get("pid"), s.get("in_flight"), s.get("jobs")) for s in answer.get("sessions", ())]
                self.log(f"emulator pid {answer['pid']}: {answer['in_flight']} calls in flight, sessions "
                         f"(pid, in flight, jobs): {sessions}")
        return left

    def stop(self) -> int:
        """Stop the run's emulators, then SIGKILL any process left that carries this run's folder in
        its environment (a worker or fork server an emulator killed left behind); how many were left."""
        for emu in self._emulators():
            with contextlib.suppress(OSError):
                os.kill(emu["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self._emulators() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # workers end after their emulator
        left = _processes_with(self.runtime)
        for pid in left:
            self.log(f"left: pid {pid} {_command(pid)}")
            _kill(pid)
        return len(left)

    def figures(self, seconds: float) -> dict:
        verdicts = {v: sum(j.verdict == v for j in self.jobs) for v in ("right", "wrong", "stuck", "hung")}
        runs = sum(j.runs for j in self.jobs)
        return {
            "seed": self.seed, "seconds": round(seconds, 1), "jobs": len(self.jobs),
            "jobs_by_kind": {k: sum(j.kind == k for j in self.jobs) for k in KINDS},
            "faults": dict(self.faults), "runs": runs, "reruns": runs - len(self.jobs),
            "runs_killed": sum(j.killed for j in self.jobs), "runs_hung": sum(j.hung for j in self.jobs),
            "runs_capped": sum(j.capped for j in self.jobs),
            "runs_raised": sum(len(j.errors) for j in self.jobs), **verdicts,
            "in_flight_left": self.in_flight_left, "leftover_processes": self.leftover_processes,
            "emulators_at_once": self.emulators_at_once,
            "errors": _count(e for j in self.jobs for e in j.errors),
            "bad": _count(f"{j.verdict} ({j.kind}): {j.why}" for j in self.jobs if j.verdict != "right"),
        }


def _call_cost() -> float:
    """What one call of the priced job (``PRICED_SECONDS`` at ``PRICED_MEMORY``) costs as fnmap prices it."""
    from fnmap.config import resolve
    from fnmap.cost.pricing import pricing_of

    return pricing_of(resolve(backend="emulator", memory=PRICED_MEMORY)).attempt(PRICED_SECONDS)


def _count(lines) -> dict:
    """How often each kind of line occurs, most often first: the ids, numbers and paths in a line
    made alike (``ID``, ``N``, ``PATH``), so one cause is one entry."""
    counts: dict = {}
    for line in lines:
        line = re.sub(r"\b[0-9a-f]{12,}\b", "ID", line)
        line = re.sub(r"(?<![\w/])/[^\s,;)]+", "PATH", line)
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        counts[line] = counts.get(line, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _difference(got, want: list, what: str) -> str:
    """'' if ``got`` is ``want``; else the first difference, said plainly."""
    if not isinstance(got, list) or len(got) != len(want):
        return f"{what} {len(got) if isinstance(got, list) else type(got).__name__} results for {len(want)} items"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            return f"{what} {a!r} for item {i}, not {b!r}"
    return ""


def _error_line(path: str) -> str:
    """The exception a run's output ends with (``Type: message``), else its last line."""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        lines = [line.rstrip() for line in f if line.strip()]
        raised = [line for line in lines if re.match(r"[A-Za-z_][\w.]*: ", line) and not line.startswith("fnmap: ")]
        return (raised or lines or [""])[-1][:300]
    return ""


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _processes_with(marker: str) -> list[int]:
    """Processes of this user whose environment holds ``marker`` (the run's own folder)."""
    found, needle = [], marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _command(pid: int) -> str:
    """Process ``pid``'s command line and parent, for the log."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        parent = stat[stat.rindex(b")") + 2:].split()[1].decode()
    except (OSError, ValueError, IndexError):
        return "(gone)"
    return f"{command[:160]} (parent {parent})"


def report(figures: dict) -> str:
    """The figures as lines for a terminal."""
    f = figures
    faults = ", ".join(f"{k} {v}" for k, v in f["faults"].items())
    kinds = ", ".join(f"{k} {v}" for k, v in f["jobs_by_kind"].items())
    lines = [
        f"chaos run, seed {f['seed']}: {f['seconds']} s, {f['jobs']} jobs ({kinds})",
        f"  faults: {faults} (total {sum(f['faults'].values())})",
        f"  runs: {f['runs']} ({f['reruns']} re-runs; {f['runs_killed']} killed, {f['runs_capped']} capped, "
        f"{f['runs_raised']} raised, {f['runs_hung']} hung)",
        f"  jobs: {f['right']} right, {f['wrong']} wrong, {f['stuck']} stuck, {f['hung']} hung",
        f"  after the last client: {f['in_flight_left']} calls in flight on the emulator, "
        f"{f['leftover_processes']} processes left; at most {f['emulators_at_once']} emulators up at once",
    ]
    lines += [f"  raised {n} times: {e}" for e, n in f["errors"].items()]
    lines += [f"  {n} jobs {b}" for b, n in f["bad"].items()]
    return "\n".join(lines)


def markdown(figures: dict, command: str = "python benchmarks/chaos.py") -> str:
    """The figures as a section of benchmarks/RESULTS.md: a heading, the conditions, a table of the
    figures and a table of what the runs raised and why jobs were not right, by cause."""
    f = figures
    head = [f"## {time.strftime('%Y-%m-%d')}, chaos: `{command}` (commit {_commit()})", "",
            f"Seed {f['seed']}, {f['seconds']} s, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} at the end; jobs by kind: "
            + ", ".join(f"{k} {v}" for k, v in f["jobs_by_kind"].items()) + ".", ""]
    rows = [(f"faults: {k}", v) for k, v in f["faults"].items()]
    rows += [("runs", f["runs"]), ("re-runs", f["reruns"]), ("runs killed", f["runs_killed"]),
             ("runs stopped at the cost cap", f["runs_capped"]), ("runs that raised", f["runs_raised"]),
             ("jobs", f["jobs"]), ("jobs right", f["right"]), ("jobs wrong", f["wrong"]),
             ("jobs stuck", f["stuck"]), ("jobs hung", f["hung"]),
             ("calls in flight after the last client", f["in_flight_left"]),
             ("processes left", f["leftover_processes"]), ("most emulators up at once", f["emulators_at_once"])]
    lines = head + ["| figure | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)]
    causes = [("raised", e, n) for e, n in f["errors"].items()] + [("job", b, n) for b, n in f["bad"].items()]
    if causes:
        lines += ["", "| what | times |", "| --- | --- |"]
        lines += [f"| {what}: {text.replace('|', '/')} | {n} |" for what, text, n in causes]
    return "\n".join(lines)


def _commit() -> str:
    """The checkout's commit (short), or ``?``."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long new jobs start (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=2, help="clients at once (default 2)")
    p.add_argument("--max-runs", type=int, default=10, help="runs of a job before it is stuck (default 10)")
    p.add_argument("--deadline", type=float, default=180.0, help="seconds a run may take before it is hung")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"jobs to run, in turn (default {','.join(KINDS)})")
    p.add_argument("--markdown", action="store_true", help="print a table for benchmarks/RESULTS.md too")
    p.add_argument("--json", metavar="FILE", help="write the figures to FILE")
    p.add_argument("-v", "--verbose", action="store_true", help="say each fault and verdict as it happens")
    args = p.parse_args(argv)
    log = (lambda line: print(line, flush=True)) if args.verbose else None
    with tempfile.TemporaryDirectory(prefix="fnmap-chaos-") as work:
        chaos = Chaos(work, seed=args.seed, concurrency=args.concurrency, max_runs=args.max_runs,
                      run_deadline=args.deadline, log=log)
        kinds = tuple(k for k in args.kinds.split(",") if k)
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            p.error(f"--kinds: unknown {', '.join(unknown)}; choose from {', '.join(KINDS)}")
        figures = chaos.run(minutes=args.minutes, kinds=kinds)
    print(report(figures))
    if args.markdown:
        print()
        given = argv if argv is not None else sys.argv[1:]
        print(markdown(figures, " ".join(["python benchmarks/chaos.py", *given])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if figures["right"] == figures["jobs"] and not figures["in_flight_left"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
