"""Calls coalesced on the wire: short calls queued for one backend travel several a request, and each
keeps its own attempts, retries, speculative copies, cost-cap admission, output and record; a worker
killed in the middle of such a request loses no call and runs none twice.  Against a real emulator
(``POST /invoke-many``), but the admission rule, fed synchronously to a real scheduler."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future, wait

import requests
from conftest import until

import fnmap
from fnmap.backends.base import BaseBackend
from fnmap.config import resolve
from fnmap.errors import PlatformFault
from fnmap.jobs import Job
from fnmap.run import CallRun
from fnmap.scheduler import Scheduler
from fnmap.storage import open_store

N = 600
#: The call that misbehaves once: far enough in that the job's calls travel together by then.
ODD = 300


def _calls(emu) -> list[dict]:
    """The emulator's log of attempts: call, attempt, outcome and ``together`` (calls in its request)."""
    return requests.get(emu.url + "/calls", timeout=10).json()


def _once(folder: str) -> bool:
    """True the first time it is asked in ``folder`` (a marker file), False after."""
    try:
        os.close(os.open(os.path.join(folder, "marker"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _ran(folder: str) -> list[int]:
    """The items whose function ran to its end, once per run."""
    with open(os.path.join(folder, "ran")) as f:
        return [int(x) for x in f.read().split()]


def _note(folder: str, x: int) -> None:
    with open(os.path.join(folder, "ran"), "a") as f:  # one short append: whole lines
        f.write(f"{x}\n")


def _raises_once(folder):
    def work(x):
        if x == ODD and _once(folder):
            raise ValueError("once")
        return x

    return work


def _killed_once(folder):
    def work(x):
        if x == ODD and _once(folder):
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies in the middle of its message
        _note(folder, x)
        return x

    return work


def _sleeps_once(folder):
    def work(x):
        if x == ODD and _once(folder):
            time.sleep(30)
        return x

    return work


def _prints(x):
    print(f"out-{x}")
    return x


def _first_attempt(emu, call: int) -> dict:
    """The emulator's log entry of the call's first attempt, once it has ended there (a straggler's is
    stopped after the map has returned with its copy's result, and logged then)."""
    return until(lambda: next((c for c in _calls(emu) if c["call_id"] == call and c["attempt"] == 1), None))


def test_a_retry_on_call_of_a_coalesced_request_is_retried_alone(use_emulator, tmp_path):
    emu = use_emulator(workers=2)
    job = fnmap.map(_raises_once(str(tmp_path)), range(N), chunksize=1, retry_on=(ValueError,), progress=False,
                    speculation=False, return_job=True)
    assert job.results() == list(range(N))
    assert _first_attempt(emu, ODD).get("together", 1) > 1, "the call did not travel with others: proves nothing"
    attempts = job.attempts_summary()
    assert [a[3] for a in attempts[ODD]] == ["retry_on", "ok"]
    assert all(len(attempts[c]) == 1 for c in attempts if c != ODD)  # its company ran once each
    assert job.summary()["retries"] == 1


def test_a_worker_killed_in_a_coalesced_request_loses_no_call_and_runs_none_twice(use_emulator, tmp_path):
    emu = use_emulator(workers=2)
    job = fnmap.map(_killed_once(str(tmp_path)), range(N), chunksize=1, progress=False, speculation=False,
                    return_job=True)
    assert job.results() == list(range(N))  # none lost
    ran = _ran(str(tmp_path))
    assert sorted(ran) == list(range(N)), [x for x in set(ran) if ran.count(x) > 1]  # each ran once
    killed = _first_attempt(emu, ODD)
    assert killed["outcome"] == "crashed" and killed.get("together", 1) > 1, killed
    attempts = job.attempts_summary()
    assert [a[3] for a in attempts[ODD]] == ["crashed", "ok"]
    assert all(len(attempts[c]) == 1 for c in attempts if c != ODD)


def test_a_straggler_of_a_coalesced_request_gets_its_own_copy(use_emulator, tmp_path):
    emu = use_emulator(workers=2)
    job = fnmap.map(_sleeps_once(str(tmp_path)), range(N), chunksize=1, progress=False, return_job=True)
    assert job.results() == list(range(N))
    assert _first_attempt(emu, ODD).get("together", 1) > 1
    original, copy = job.attempts_summary()[ODD]  # a map that waited for the straggler has one
    assert copy[3] == "ok" and original[3] in (None, "superseded"), (original, copy)
    assert job.run.calls[ODD].speculated


def test_each_coalesced_call_keeps_its_own_output_and_record(use_emulator):
    emu = use_emulator(workers=2)
    job = fnmap.map(_prints, range(200), chunksize=1, progress=False, output="none", return_job=True)
    assert job.results() == list(range(200))
    together = {c["call_id"] for c in _calls(emu) if c.get("together", 1) > 1}
    assert len(together) > 100, "few calls travelled together: proves nothing"
    for call in sorted(together)[::10]:
        lines = [line for line in job.logs(call).splitlines() if line.startswith("out-")]
        assert lines == [f"out-{call}"], (call, job.logs(call))
    record = job.record()
    entries = {entry["call"]: entry for entry in record["calls"]}
    assert sorted(entries) == list(range(200))
    for call in together:
        entry = entries[call]
        assert entry["status"] == "ok" and [a["attempt"] for a in entry["attempts"]] == [1], entry


class _Grouping(BaseBackend):
    """A platform that takes short calls in groups and refuses every one (``rejected``): what
    reaches it is what the test looks at."""

    name = "grouping"
    max_workers = 1
    group_limit = 32

    def __init__(self):
        self.groups: list[list[int]] = []

    def invoke(self, invocation):
        self.groups.append([invocation.request.call_id])
        raise PlatformFault("rejected", "scripted")

    def invoke_group(self, invocations):
        self.groups.append([invocation.request.call_id for invocation in invocations])
        return [PlatformFault("rejected", "scripted")] * len(invocations)


def test_calls_sent_together_are_each_admitted_under_max_cost(tmp_path):
    """A capped job's first wave (nothing priced yet) is all a coalesced request may carry: each
    call of a group is admitted by the budget as if sent alone, the others wait for room."""
    from fnmap.cost.budget import FIRST_WAVE

    backend = _Grouping()
    scheduler = Scheduler(backend, open_store(f"file://{tmp_path}"), b"secret")
    try:
        job = Job(scheduler, scheduler.store, resolve(backend="local", storage=scheduler.store.url, progress=False,
                                                      retries=0, max_cost=1.0))
        for i in range(10):
            scheduler.add(job, CallRun(i, i, 1, "functions/f", b"payload", None, Future(), True))
        scheduler.seal(job)
        states = list(job.run.calls)
        scheduler.dispatch._send_grouped(job, states)  # as a dispatch thread sends a group
        assert backend.groups[0] == list(range(FIRST_WAVE)), backend.groups
        wait([s.future for s in states], timeout=30)  # the rest, admitted as the first ones are priced
        sent = [call for group in backend.groups for call in group]
        assert sorted(sent) == list(range(10)), backend.groups  # each sent once
    finally:
        scheduler.close()


def test_executor_submits_travel_together(use_emulator):
    emu = use_emulator(workers=2)
    with fnmap.Executor(progress=False) as executor:
        futures = [executor.submit(abs, -i) for i in range(N)]
        assert [f.result() for f in futures] == list(range(N))
    together = [c.get("together", 1) for c in _calls(emu)]
    assert sorted(c["call_id"] for c in _calls(emu)) == list(range(N))
    assert sum(t > 1 for t in together) > N // 2, max(together)
