"""Running it again: a named map killed at each stage of its start, then the same script run again;
a failed named job fixed and run again; ``fnmap redrive --failed``; a capped job redriven twice;
what a redrive keeps of the job's record; a notebook's named map after a kernel restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import until
from s3servers import *  # noqa: F403 -- the S3 server fixtures

import fnmap

#: A named map over ``N`` items of ``SIZE`` bytes (item i's bytes are all i), that SIGKILLs itself at
#: the stage ``KILL`` names: ``created`` (the job exists, no call is stored yet), ``mid-store`` (the
#: first calls, three at most, stored and sent and done, the rest never stored), or ``none`` (it runs
#: to its end and prints its results as JSON).  Each run of ``work`` appends its item to the file ``RUNS``.
CLIENT = """
import json, os, signal, sys, time
import fnmap, fnmap.client

RUNS, KILL, CHUNK, NAME = sys.argv[1], sys.argv[2], sys.argv[5], sys.argv[6]
N, SIZE = int(sys.argv[3]), int(sys.argv[4])

def work(item):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{item[0]}\\n".encode())
    os.close(fd)
    return item[0] * 10, len(item)

submit = fnmap.client.Client.submit

def killing_submit(self, job, states, sent=[]):
    if KILL == "mid-store" and not sent:  # the first batch only (a feed's next batch: killed at once)
        sent.append(job)
        submit(self, job, states[:3])  # a first batch of large inputs may hold fewer: those stored so far
        while fnmap.job(job.id).summary()["calls_done"] < len(states[:3]):
            time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)

if KILL != "none":
    fnmap.client.Client.submit = killing_submit
items = [bytes([i]) * SIZE for i in range(N)]
out = fnmap.map(work, items, job_name=NAME, chunksize=None if CHUNK == "auto" else int(CHUNK))
print(json.dumps(out))
"""


def _run(tmp_path, kill: str, n: int, size: int, chunk: str) -> subprocess.CompletedProcess:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    name = tmp_path.name  # one name per test, the same for each run of it
    return subprocess.run([sys.executable, str(script), str(tmp_path / "runs.txt"), kill, str(n), str(size), chunk,
                           name],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def _runs(tmp_path) -> list[int]:
    path = tmp_path / "runs.txt"
    return sorted(int(line) for line in path.read_text().split()) if path.exists() else []


@pytest.mark.parametrize(("kill", "n", "size", "chunk"), [
    ("created", 40, 1, "1"),  # the job exists, no call stored (chunksize: no items stored either)
    ("created", 40, 1, "auto"),  # the items stored at the start, no call
    ("mid-store", 40, 1, "1"),  # three calls stored and done, the rest never stored
    ("mid-store", 45, 400_000, "auto"),  # 18 MB of items: over the limit of what a map stores at its start
    ("mid-store", 45, 400_000, "1"),
])
def test_a_named_map_killed_at_each_stage_of_its_start_is_finished_by_running_it_again(
        tmp_path, use_emulator, kill, n, size, chunk):
    use_emulator()
    killed = _run(tmp_path, kill, n, size, chunk)
    assert killed.returncode == -9, killed.stderr
    ran = _runs(tmp_path)
    # Of the first three calls, those that ended before the kill (the first to end makes an
    # automatically chunked job's next batch, whose submit is the kill: the others may be out).
    assert len(set(ran)) == len(ran) and set(ran) <= set(range(3 if kill == "mid-store" else 0)), ran
    again = _run(tmp_path, "none", n, size, chunk)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == [[i * 10, size] for i in range(n)]
    assert _runs(tmp_path) == list(range(n))  # each item ran to its end exactly once
    assert _run(tmp_path, "none", n, size, chunk).stdout == again.stdout  # and never again
    assert _runs(tmp_path) == list(range(n))


#: A named map whose function fails on item 3 (``BUGGY``) or does not (the bug fixed), each run
#: appending its item to ``RUNS``.
FIXED = """
import os, sys, time, fnmap

RUNS = sys.argv[1]

def parse(x):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    if BUGGY and x == 3:
        # Fail once the other seven items ran (the job's first failure stops the calls not yet
        # started: on a loaded machine some would never run, and this test is about its history).
        deadline = time.monotonic() + 60
        while len(open(RUNS).read().split()) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        raise RuntimeError(f"bad item {x}")
    return x * 10

print(fnmap.map(parse, range(8), chunksize=1, job_name=sys.argv[2]))
"""


def _script(tmp_path, buggy: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "parse.py"
    script.write_text(f"BUGGY = {buggy}\n" + FIXED)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "runs.txt"), tmp_path.name],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()})


def _named_job(name: str):
    from fnmap.client import get_client
    from fnmap.config import resolve
    from fnmap.runtime import keys

    store = get_client(resolve()).store
    return fnmap.job(json.loads(store.get(keys.job_name_key(name)))["job_id"])


def test_a_failed_named_job_run_again_with_the_bug_fixed_runs_its_failed_item_and_keeps_its_history(
        tmp_path, use_emulator):
    use_emulator()
    first = _script(tmp_path, buggy=True)
    assert first.returncode == 1 and "RuntimeError: bad item 3" in first.stderr, first.stderr
    job = _named_job(tmp_path.name)
    assert job.status == "failed" and job.summary()["states"]["failed"] == 1
    assert job.summary()["states"]["succeeded"] == 7
    assert _runs(tmp_path) == list(range(8))
    fixed = _script(tmp_path, buggy=False)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip() == str([x * 10 for x in range(8)])
    assert _runs(tmp_path) == sorted([*range(8), 3])  # only the failed item ran again
    record = job.record()
    assert record["summary"]["status"] == "succeeded", record["summary"]
    assert record["summary"]["states"] == {"succeeded": 8, "failed": 0, "retried": 1, "cancelled": 0,
                                           "abandoned": 0, "running": 0}
    assert [c["status"] for c in record["calls"]] == ["ok"] * 3 + ["error"] + ["ok"] * 5  # call 3 as it ran
    assert "bad item 3" in record["calls"][3]["error"] and record["calls"][8]["first_item"] == 3
    assert job.results() == [x * 10 for x in range(8)]
    again = _script(tmp_path, buggy=False)  # the fixed function is this name's now: nothing runs again
    assert again.stdout == fixed.stdout and _runs(tmp_path) == sorted([*range(8), 3])


def test_a_changed_function_under_the_name_of_a_job_that_succeeded_is_refused(tmp_path, use_emulator):
    use_emulator()
    assert _script(tmp_path, buggy=False).returncode == 0
    refused = _script(tmp_path, buggy=True)
    assert "JobNameTaken" in refused.stderr and "function parse has changed" in refused.stderr, refused.stderr
    assert "a changed function is taken only to run again the items of a job that failed" in refused.stderr


def _flaky(x, gate=None):
    if x == 2 and not os.path.exists(gate):
        raise ValueError(f"item {x}: no {gate} yet")
    return x + 100


def test_fnmap_redrive_failed_runs_the_failed_items_again_and_plain_redrive_says_how(tmp_path, use_emulator):
    import functools

    use_emulator()
    gate = tmp_path / "gate"
    job = fnmap.map(functools.partial(_flaky, gate=str(gate)), range(5), chunksize=1, return_job=True)
    assert isinstance(job.results(return_exceptions=True)[2], ValueError)
    gate.touch()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    plain = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job.id[:10]], capture_output=True, text=True,
                           env=env, timeout=120)
    assert plain.returncode != 0 and f"`fnmap redrive {job.id[:12]} --failed` runs" in plain.stderr, plain.stderr
    shown = subprocess.run([sys.executable, "-m", "fnmap", "job", job.id], capture_output=True, text=True, env=env)
    assert fnmap.job(job.id).status == "failed", shown.stdout
    again = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job.id[:10], "--failed"], capture_output=True,
                           text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "succeeded" in again.stdout and "retried 1" in again.stdout.replace("   ", " "), again.stdout
    assert fnmap.job(job.id).results() == [100, 101, 102, 103, 104]
    with pytest.raises(fnmap.FnmapError, match="succeeded: every call has its result"):
        fnmap.job(job.id).redrive(failed=True)


def test_a_redrive_keeps_who_started_the_job_and_from_where(tmp_path, use_emulator):
    use_emulator()
    assert _run(tmp_path, "created", 6, 1, "1").returncode == -9
    job = _named_job(tmp_path.name)
    started = job.summary()
    assert started["origin"].endswith("client.py")
    shown = subprocess.run([sys.executable, "-m", "fnmap", "job", job.id], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert "abandoned" in shown.stdout and f"`fnmap redrive {job.id[:12]}` runs the 6 item(s) left" in shown.stdout
    out = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job.id], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=120)
    assert out.returncode != 0 and "with the same job_name" in out.stderr, out.stderr  # it stored no call
    assert _run(tmp_path, "none", 6, 1, "1").returncode == 0
    after = job.summary()
    assert after["status"] == "succeeded"
    assert after["origin"] == started["origin"] and after["started_by"] == started["client"]
    assert after["redriven"][0]["client"]["pid"] != started["client"]["pid"]


def test_a_capped_job_redriven_twice_ends_succeeded_with_every_result(tmp_path, use_emulator):
    """A first redrive under a small cap stops again; a second with room finishes: the job says
    ``succeeded`` and every call's state is what happened to it, not ``cancelled`` for a call whose
    result was committed by an earlier run."""
    from fnmap.cost.pricing import Pricing

    sys.path.insert(0, os.path.dirname(__file__))
    from test_cost_cap import _counted

    emu = use_emulator()
    pricing, sleep, memory, n = Pricing.of("emulator", {}), 0.2, 10240, 24
    per_call = pricing.attempt(sleep, memory_mb=memory, gets=3)
    with pytest.raises(fnmap.CostCapReached) as caught:
        fnmap.map(_counted(str(tmp_path), sleep), range(n), chunksize=1, memory=memory,
                  max_cost=pricing.job_overhead() + 6 * per_call)
    job_id = caught.value.id
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "FNMAP_SPECULATION": "false", "FNMAP_SECRET": emu.secret}
    job = fnmap.job(job_id)
    for calls in (2, n + 6):  # room for a few more calls, then for all of them
        before = {c["call"]: max([a["attempt"] for a in c["attempts"]], default=0) for c in job.record()["calls"]}
        cap = 2 * pricing.job_overhead() + calls * per_call
        done = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job_id, "--max-cost", str(cap)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert "redriving job" in done.stderr, done.stderr
        # Each attempt of a call has a number of its own: a stop the emulator remembers for an attempt
        # of the run before (stopped before it arrived) does not stop the redrive's.
        assert all(a["attempt"] > before[c["call"]] for c in job.record()["calls"] for a in c["attempts"])
        assert job.status == ("capped" if calls == 2 else "succeeded"), job.summary()["states"]
    assert job.results() == [x * 2 for x in range(n)]
    summary = job.summary()
    assert summary["status"] == "succeeded", json.dumps([c for c in job.record()["calls"] if c["status"] != "ok"])
    assert summary["states"]["succeeded"] == n and summary["states"]["cancelled"] == 0, summary["states"]
    shown = subprocess.run([sys.executable, "-m", "fnmap", "job", job_id], capture_output=True, text=True, env=env)
    assert "fnmap redrive" not in shown.stdout, shown.stdout  # no advice to finish a finished job


PRICED = """
import os, sys, time, fnmap

RUNS, NAME, CAP = sys.argv[1], sys.argv[2], float(sys.argv[3])

def slow(x):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    time.sleep(0.05)
    while os.path.exists(RUNS + ".hold"):  # the test looks at the job while its calls run
        time.sleep(0.01)
    return x * 3

if NAME == "-":  # a map of it measured: the maps after it are estimated before they start
    fnmap.map(slow, range(12), chunksize=1, memory=10240)
else:
    print(fnmap.map(slow, range(12), job_name=NAME, chunksize=1, memory=10240, max_cost=CAP))
"""


def _priced(tmp_path, name: str, cap: float, wait: bool = True):
    script = tmp_path / "priced.py"
    script.write_text(PRICED)
    client = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs.txt"), name, repr(cap)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    if not wait:
        return client
    out, err = client.communicate(timeout=300)
    return subprocess.CompletedProcess(client.args, client.returncode, out, err)


def test_a_named_map_its_estimate_refused_runs_under_its_name_with_a_larger_max_cost(tmp_path, use_emulator):
    """Refused at its start (nothing ran, nothing stored), the named map run again with a larger
    ``max_cost`` is started again under the job's id, its estimate checked against the new cap: not
    refused for ever as a job with nothing to redrive.  The same small cap is refused again."""
    from fnmap.cost.pricing import Pricing

    use_emulator()
    pricing = Pricing.of("emulator", {})
    per_call = pricing.attempt(0.05, memory_mb=10240, gets=3)
    small, large = pricing.job_overhead() + 3 * per_call, 3 * pricing.job_overhead() + 2000 * per_call
    assert _priced(tmp_path, "-", 0).returncode == 0
    for _ in range(2):
        refused = _priced(tmp_path, tmp_path.name, small)
        assert "CostCapReached" in refused.stderr and "refused before any call ran" in refused.stderr, refused.stderr
    assert _runs(tmp_path) == list(range(12))  # the measured map's items only
    job = _named_job(tmp_path.name)
    started = job.summary()
    hold = tmp_path / "runs.txt.hold"
    hold.touch()
    client = _priced(tmp_path, tmp_path.name, large, wait=False)
    try:
        until(lambda: len(_runs(tmp_path)) > 12 or client.poll() is not None, seconds=120)
        assert job.status == "running"  # not the refused run's final record, left standing
    finally:
        hold.unlink()
    out, err = client.communicate(timeout=300)
    assert client.returncode == 0, err
    assert out.strip() == str([x * 3 for x in range(12)])
    assert _runs(tmp_path) == sorted([*range(12)] * 2)  # each item once more
    after = job.summary()
    assert after["status"] == "succeeded" and job.results() == [x * 3 for x in range(12)]
    # Who started it first, kept by each run (the second refused one's summary says so already).
    assert after["started_by"] == started["started_by"] != started["client"]
    assert after["origin"] == started["origin"] and after["client"]["pid"] != started["client"]["pid"]


#: A named map of two calls whose item 1 holds while the file ``RUNS.hold`` exists.  Its first run
#: (``first``), once call 0 is committed by attempt 1, asks the emulator to stop attempt 2 of call 0,
#: as its scheduler does for a copy still out when another attempt decided the call (one not arrived
#: yet, or just ended: the emulator then stops it on arrival), and is SIGKILLed before it records it.
STOPPED = """
import json, os, signal, sys, threading, time
import fnmap
from fnmap.client import get_client
from fnmap.config import resolve
from fnmap.runtime import keys

RUNS, NAME = sys.argv[1], sys.argv[2]

def work(x):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    while x == 1 and os.path.exists(RUNS + ".hold"):
        time.sleep(0.01)
    return x * 10

def stop_a_copy_then_die():
    client = get_client(resolve())
    while not client.store.exists(keys.job_name_key(NAME)):
        time.sleep(0.01)
    job_id = json.loads(client.store.get(keys.job_name_key(NAME)))["job_id"]
    while not client.store.list(keys.call_status_prefix(job_id, 0)):
        time.sleep(0.01)
    client.backend.stop_attempts(job_id, [(0, 2)], client.secret)
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[3] == "first":
    threading.Thread(target=stop_a_copy_then_die, daemon=True).start()
print(fnmap.map(work, range(2), chunksize=1, job_name=NAME))
"""


def test_an_attempt_a_killed_run_had_stopped_takes_the_call_result_when_the_named_map_runs_again(
        tmp_path, use_emulator):
    """The run again numbers call 0's attempts after the one its status record shows (1), so its
    first is 2, which the emulator remembers as stopped: that stop is the killed run's, not this
    one's, so a fresh attempt takes the committed result; the map does not raise."""
    use_emulator()
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED)
    hold = tmp_path / "runs.txt.hold"
    hold.touch()

    def run(which: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), str(tmp_path / "runs.txt"), tmp_path.name, which],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})

    killed = run("first")
    assert killed.returncode == -9, killed.stderr
    hold.unlink()  # the killed run's attempt of call 1 ends; its first commit is the result
    again = run("again")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "[0, 10]"
    assert _runs(tmp_path).count(0) == 1  # call 0's result taken from storage, not run again
    job = _named_job(tmp_path.name)
    assert job.status == "succeeded" and job.results() == [0, 10]
    assert [a["outcome"] for a in job.record()["calls"][0]["attempts"]][-2:] == ["cancelled", "ok"]


#: A named map over ``N`` items by two racing clients (``race``), after a first run that left the
#: job at ``STAGE``: refused by its estimate (``refused``), killed before any call was stored
#: (``created``) or after three (``mid-store``), killed once it had claimed the job's start and
#: before it started it (``claimed``), or failed on its last item (``failed``: the function then
#: raises there; run again, it does not).  Every run of ``work`` appends its item to
#: ``runs.txt``.  The racers' hooks make the race the same every time: each touches ``looked.<pid>``
#: once it has read the job as it stands (or found none), and no client starts the job (``new_job``)
#: until ``LOOKERS`` clients have read it, so both decide on the same stored state; the last item
#: runs until it has run twice or a racer has read the other's run (a summary that counts one run
#: more than when it looked: ``attached``), so two starts of it are both seen running, and a racer
#: that follows the other's run reads it while it runs.  The racers write no lease (as a run is before its first
#: lease is written): a reader judges the run by its record and by the lease a killed client left.
RACE = """
import json, os, signal, sys, time
import fnmap, fnmap.attach, fnmap.client, fnmap.lease
from fnmap.observe.records import JobNotFound

DIR, STAGE, NAME, LOOKERS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
RUNS, N = os.path.join(DIR, "runs.txt"), 6
BUGGY = STAGE == "failed"

def work(x):
    if BUGGY and x == N - 1:
        raise RuntimeError(f"bad item {x}")
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    deadline = time.monotonic() + 120
    while x == N - 1 and time.monotonic() < deadline and not os.path.exists(os.path.join(DIR, "attached")):
        if open(RUNS).read().split().count(str(x)) >= 2:
            break
        time.sleep(0.02)
    return x * 10

def mark(name):
    open(os.path.join(DIR, name), "w").close()

def wait_for_lookers():
    deadline = time.monotonic() + 120
    while sum(f.startswith("looked.") for f in os.listdir(DIR)) < LOOKERS and time.monotonic() < deadline:
        time.sleep(0.02)

looked = []  # how many runs the job had when this client first read it

def watched_summary(self, summary=fnmap.attach.AttachedJob.summary):
    out = summary(self)
    runs = 1 + len(out.get("redriven") or ())
    if not looked:
        mark(f"looked.{os.getpid()}")
        looked.append(runs)
    elif runs > looked[0]:
        mark("attached")
    return out

def watched_init(self, *args, init=fnmap.attach.AttachedJob.__init__, **kwargs):
    try:
        init(self, *args, **kwargs)
    except JobNotFound:
        if not looked:
            mark(f"looked.{os.getpid()}")
            looked.append(0)
        raise

def gated_new_job(self, *args, new_job=fnmap.client.Client.new_job, **kwargs):
    wait_for_lookers()
    return new_job(self, *args, **kwargs)

def killing_submit(self, job, states, submit=fnmap.client.Client.submit):
    if STAGE == "mid-store":
        submit(self, job, states[:3])
        while fnmap.job(job.id).summary()["calls_done"] < 3:
            time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)

if STAGE == "race":
    fnmap.attach.AttachedJob.summary, fnmap.attach.AttachedJob.__init__ = watched_summary, watched_init
    fnmap.client.Client.new_job = gated_new_job
    fnmap.lease.hold = lambda job: None
elif STAGE == "claimed":
    fnmap.client.Client.new_job = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
elif STAGE in ("created", "mid-store"):
    fnmap.client.Client.submit = killing_submit
cap = 1e-9 if STAGE == "refused" else 100.0
print(json.dumps(fnmap.map(work, range(N), job_name=NAME, chunksize=1, max_cost=cap)))
"""


def _race(tmp_path, stage: str, lookers: int = 2) -> subprocess.Popen:
    script = tmp_path / "race.py"
    script.write_text(RACE)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path), stage, tmp_path.name, str(lookers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd(), "FNMAP_SPECULATION": "false"})


@pytest.mark.parametrize("stage", ["fresh", "refused", "created", "mid-store", "claimed", "failed"])
def test_two_clients_running_one_named_job_at_the_same_moment_start_it_once(tmp_path, use_emulator, stage):
    """Two processes run the same named map at once, on a job left at ``stage`` (or none yet: both
    then read the job before either starts it): one starts (or redrives) it, the other re-attaches
    and waits for it; no item runs twice, and both return every result, in order.  A client killed
    after it claimed the start (``claimed``) holds neither up."""
    use_emulator()
    _race_twice(tmp_path, stage)


@pytest.mark.parametrize("stage", ["fresh", "mid-store"])
def test_two_clients_racing_on_s3_storage_start_a_named_job_once(tmp_path, use_emulator, s3_env, monkeypatch,
                                                                  stage):
    """The same race with the job's storage in S3 (moto's and SeaweedFS's servers), whose
    conditional write claims the start."""
    monkeypatch.setenv("FNMAP_STORAGE", f"s3://{s3_env('fnmap-race')}/{tmp_path.name}")
    use_emulator()
    _race_twice(tmp_path, stage)


def _race_twice(tmp_path, stage: str) -> None:
    if stage != "fresh":
        first = _race(tmp_path, stage)
        first.communicate(timeout=120)
        assert first.returncode == {"refused": 1, "failed": 1}.get(stage, -9), first.stderr
    before = _runs(tmp_path)
    racers = [_race(tmp_path, "race", lookers=1 if stage == "fresh" else 2) for _ in range(2)]
    try:
        outs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
    for racer, (out, err) in zip(racers, outs, strict=True):
        assert racer.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == [x * 10 for x in range(6)]
    ran = _runs(tmp_path)
    again = [x for x in set(ran) if ran.count(x) > before.count(x) + 1]
    assert not again, f"items {again} ran twice in the race: {ran} (before it: {before})"
    assert set(ran) == set(range(6))


#: A cached map over ``range(8)``, one item a call, named ``NAME`` unless ``MODE`` is ``plain``,
#: after a plain cached map warmed the cache for the items ``WARM`` names.  ``MODE`` ``kill``:
#: SIGKILL the client once its calls are sent and two of those sent have committed (the items
#: ``HELD`` names wait while the file ``RUNS.hold`` is there: in flight), having printed the items
#: whose results it has; else run to the end and print the results.  Each item ``work`` runs to its end appends
#: it to ``RUNS``.
CACHED = """
import json, os, signal, sys, time
import fnmap, fnmap.client

RUNS, NAME, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
WARM, HELD = json.loads(sys.argv[4]), json.loads(sys.argv[5])

def work(x):
    deadline = time.monotonic() + 120
    while x in HELD and os.path.exists(RUNS + ".hold") and time.monotonic() < deadline:
        time.sleep(0.02)
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    return x * x

submit = fnmap.client.Client.submit

def killing_submit(self, job, states):
    submit(self, job, states)
    if job.kind == "map" and job.id == NAMED[0]:
        while sum(1 for s in job.run.calls if s.done and s.cached is None) < 2:
            time.sleep(0.02)
        done = [s.first_index + i for s in job.run.calls if s.done and s.cached is None for i in range(s.n_items)]
        print(json.dumps(done), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

NAMED = [None]
if WARM:
    fnmap.map(work, WARM, cache=True)
if MODE == "kill":
    open(RUNS + ".hold", "w").close()
    from fnmap import named
    claim = named.claim
    def noting_claim(*args, **kwargs):
        found = claim(*args, **kwargs)
        NAMED[0] = found.job_id
        return found
    named.claim = noting_claim
    fnmap.client.Client.submit = killing_submit
print(json.dumps(fnmap.map(work, range(8), cache=True, chunksize=1, job_name=None if MODE == "plain" else NAME)))
"""


def _cached(tmp_path, mode: str, warm: list, held: list) -> subprocess.CompletedProcess:
    script = tmp_path / "cached.py"
    script.write_text(CACHED)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "runs.txt"), tmp_path.name, mode,
                           json.dumps(warm), json.dumps(held)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


@pytest.mark.parametrize(("warm", "held"), [([0, 1, 4, 5], [6, 7]),  # hits between calls sent
                                           ([6, 7], [4, 5])])  # hits as the last call
def test_a_named_cached_map_killed_after_cache_hits_is_finished_by_running_it_again(tmp_path, use_emulator, warm,
                                                                                     held):
    """The calls the cache answered are recorded with the items they cover, so running the map
    again finishes it: each result in its place, no committed or cached item run again, and the
    items it runs cached."""
    use_emulator(workers=6)  # a worker for each call sent: none waits behind a held one
    killed = _cached(tmp_path, "kill", warm, held)
    assert killed.returncode == -9, killed.stderr
    committed = json.loads(killed.stdout.splitlines()[-1])
    (tmp_path / "runs.txt.hold").unlink()
    again = _cached(tmp_path, "none", [], held)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == [x * x for x in range(8)]
    runs = _runs(tmp_path)
    assert set(runs) == set(range(8)), runs
    assert all(runs.count(x) == 1 for x in [*warm, *committed]), (runs, committed)  # never run again
    assert all(runs.count(x) <= 2 for x in range(8)), runs  # in flight when killed: once more at most
    assert _cached(tmp_path, "none", [], held).stdout == again.stdout and _runs(tmp_path) == runs  # and never again
    plain = _cached(tmp_path, "plain", [], held)  # every item's value is cached now: the redrive's too
    assert plain.stdout == again.stdout and _runs(tmp_path) == runs, (plain.stderr, _runs(tmp_path))


def test_a_named_cached_map_whose_cache_hit_was_not_recorded_is_refused_not_misaligned(tmp_path, use_emulator):
    """A call the cache answered whose record the storage lost (refused) has its result committed
    under its id: running the map again says so, and never gives that id to other items."""
    from fnmap.client import get_client
    from fnmap.config import resolve
    from fnmap.runtime import keys

    use_emulator(workers=6)
    killed = _cached(tmp_path, "kill", [6, 7], [4, 5])
    assert killed.returncode == -9, killed.stderr
    (tmp_path / "runs.txt.hold").unlink()
    job_id = _named_job(tmp_path.name).id
    get_client(resolve()).store.delete([keys.call_inputs_key(job_id, 6)])  # call 6: items 6 and 7, from the cache
    again = _cached(tmp_path, "none", [], [4, 5])
    assert again.returncode == 1 and f"calls [6] of job {job_id} have no stored inputs" in again.stderr, \
        (again.stdout, again.stderr)
