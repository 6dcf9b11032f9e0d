"""Durable jobs (issue 23): the lease, redrive, named jobs, and abandoned at a client's exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

import fnmap
from fnmap import lease
from fnmap.emulator.launcher import EmulatorLauncher
from fnmap.named import JobNameTaken
from tests.conftest import until

SECRET = "durable-test-secret-0123456789abcdef"

#: A client on another machine (its host name faked) running a map whose calls 2..7 wait for a gate.
REMOTE_CLIENT = """
import os, socket, sys, time
socket.gethostname = lambda: "laptop-far-away"  # another machine: no pid of it to look for here
import fnmap

runs, gate = sys.argv[1], sys.argv[2]

def work(x):
    while x >= 2 and not os.path.exists(gate):
        time.sleep(0.05)
    fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one line per run that finished
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    return x * 10

job = fnmap.map(work, range(8), return_job=True, chunksize=1)
print(job.id, flush=True)
time.sleep(600)
"""


@pytest.fixture
def emulators():
    """``start()``: an emulator subprocess signing with ``SECRET`` (so a second one can take over a
    job of the first); each is stopped after the test."""
    started = []

    def start() -> EmulatorLauncher:
        emu = EmulatorLauncher(4, secret=SECRET, stderr=tempfile.TemporaryFile())
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop(timeout=20)


def _runs(path) -> list[int]:
    return sorted(int(line) for line in path.read_text().split()) if path.exists() else []


def test_a_killed_remote_client_s_job_is_abandoned_then_redriven_exactly_once(tmp_path, emulators, monkeypatch):
    runs, gate = tmp_path / "runs.txt", tmp_path / "gate"
    first = emulators()
    # Two calls in flight at once, on an emulator with room for more: calls 0 and 1 are sent first.
    env = {**os.environ, "FNMAP_EMULATOR_URL": first.url, "FNMAP_SECRET": SECRET, "FNMAP_LEASE": "2",
           "FNMAP_WORKERS": "2", "PYTHONPATH": os.getcwd()}
    script = tmp_path / "remote_client.py"
    script.write_text(REMOTE_CLIENT)
    client = subprocess.Popen([sys.executable, str(script), str(runs), str(gate)], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        job_id = client.stdout.readline().strip()
        assert job_id, "the client printed no job id"
        until(lambda: _runs(runs) == [0, 1])
        taken = lease.read(fnmap.job(job_id).store, job_id)
        until(lambda: lease.read(fnmap.job(job_id).store, job_id)["renewed"] > taken["renewed"])  # renewed
        assert fnmap.job(job_id).status == "running"
    finally:
        client.kill()
        client.wait()
    monkeypatch.setenv("FNMAP_SECRET", SECRET)
    job = fnmap.job(job_id)
    until(lambda: job.status == "abandoned")  # its lease expired: nothing here knows its host or pid
    assert job.wait() is True  # waiting on it ends
    assert "stopped renewing its lease" in job.summary()["abandoned"]
    listed = json.loads(subprocess.run([sys.executable, "-m", "fnmap", "jobs", "--json"], env={
        **os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True, check=True).stdout)
    assert [j["status"] for j in listed if j["job_id"] == job_id] == ["abandoned"]

    first.stop(timeout=20)  # its workers, with calls 2 and 3 in them, are gone; they ran to no end
    gate.touch()
    second = emulators()
    monkeypatch.setenv("FNMAP_EMULATOR_URL", second.url)
    redriven = job.redrive()
    assert redriven.results() == [x * 10 for x in range(8)]
    assert _runs(runs) == list(range(8))  # each item ran to its end exactly once
    assert fnmap.job(job_id).status == "succeeded"
    assert fnmap.job(job_id).results() == [x * 10 for x in range(8)]


def _counted(x, runs=None):
    fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{x}\n".encode())
    os.close(fd)
    return x + 100


def test_a_named_job_run_again_does_not_run_its_calls_again(tmp_path):
    import functools

    runs = tmp_path / "runs.txt"
    work = functools.partial(_counted, runs=str(runs))
    assert fnmap.map(work, range(6), job_name="nightly-2026-12-04") == list(range(100, 106))
    assert _runs(runs) == list(range(6))
    again = fnmap.map(work, range(6), job_name="nightly-2026-12-04", return_job=True)
    assert again.results() == list(range(100, 106))
    assert _runs(runs) == list(range(6))  # nothing ran twice
    assert again.id == fnmap.map(work, range(6), job_name="nightly-2026-12-04", return_job=True).id
    assert fnmap.starmap(pow, [(2, 3), (10, 2)], job_name="powers") == [8, 100]
    assert fnmap.starmap(pow, [(2, 3), (10, 2)], job_name="powers", return_job=True).status == "succeeded"


def test_a_named_job_refuses_another_function_or_other_items(tmp_path):
    import functools

    runs = str(tmp_path / "runs.txt")
    fnmap.map(functools.partial(_counted, runs=runs), range(3), job_name="weekly")
    with pytest.raises(JobNameTaken, match=r"job_name='weekly' names job \w+, which ran other work: the function "
                       r"is str, not partial.*choose another job_name \(e.g. 'weekly-2'\)"):
        fnmap.map(str, range(3), job_name="weekly")
    with pytest.raises(JobNameTaken, match="the items are 4, not 3"):
        fnmap.map(functools.partial(_counted, runs=runs), range(4), job_name="weekly")
    with pytest.raises(fnmap.FnmapError, match="is not a job name"):
        fnmap.map(str, range(3), job_name="no/slashes")


EXITING_CLIENT = """
import os, sys, time, fnmap

GATE, RUNS = sys.argv[1], sys.argv[2]  # globals: the function carries their values to the workers

def nap(x):
    while x > 0 and not os.path.exists(GATE):
        time.sleep(0.05)
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one line per run that finished
    os.write(fd, f"{x}\\n".encode())
    os.close(fd)
    return x

if sys.argv[3] == "auto-unstored":  # as if the items were over the limit of what is stored for a redrive
    import fnmap.recorder
    fnmap.recorder.ITEMS_STORE_LIMIT = 0
chunksize = None if sys.argv[3].startswith("auto") else int(sys.argv[3])
job = fnmap.map(nap, range(12), return_job=True, chunksize=chunksize, workers=2)
while job.summary()["done"] < 1:
    time.sleep(0.05)
print(job.id, flush=True)
# the script ends here, its job still running
"""


@pytest.mark.parametrize("chunksize", ["1", "auto"])  # auto: items in no call yet come from the stored items
def test_a_script_that_exits_mid_job_leaves_it_abandoned_not_failed_and_fnmap_redrive_ends_it(tmp_path, chunksize):
    script, gate, runs = tmp_path / "exiting_client.py", tmp_path / "gate", tmp_path / "runs.txt"
    script.write_text(EXITING_CLIENT)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "FNMAP_SECRET": SECRET}
    done = subprocess.run([sys.executable, str(script), str(gate), str(runs), chunksize], capture_output=True,
                          text=True, env=env, timeout=120)
    job_id = done.stdout.strip()
    assert job_id, done.stderr
    job = fnmap.job(job_id)
    assert job.status == "abandoned", job.summary()
    assert "exited before the job finished" in job.summary()["abandoned"]
    record = job.record()
    unfinished = [c for c in record["calls"] if c["status"] != "ok"]
    assert unfinished and all(c["status"] == "cancelled" and (c["error"] or "the job was abandoned").startswith(
        "the job was abandoned") for c in unfinished), unfinished  # not failed with the emulator's errors
    assert record["summary"]["retries"] == 0
    assert _runs(runs) == [0]

    gate.touch()
    redrive = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job_id[:8]], capture_output=True,
                             text=True, env=env, timeout=300)
    assert redrive.returncode == 0, redrive.stdout + redrive.stderr
    assert "succeeded" in redrive.stdout
    assert fnmap.job(job_id, secret=SECRET).results() == list(range(12))
    assert _runs(runs) == list(range(12))  # each item ran to its end exactly once


def test_a_redrive_refuses_items_that_were_in_no_call_and_not_stored(tmp_path):
    """Items over the store limit are not stored a second time; a redrive then says what it cannot run."""
    script, gate, runs = tmp_path / "exiting_client.py", tmp_path / "gate", tmp_path / "runs.txt"
    script.write_text(EXITING_CLIENT)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "FNMAP_SECRET": SECRET}
    done = subprocess.run([sys.executable, str(script), str(gate), str(runs), "auto-unstored"], capture_output=True,
                          text=True, env=env, timeout=120)
    job_id = done.stdout.strip()
    assert job_id, done.stderr
    gate.touch()
    redrive = subprocess.run([sys.executable, "-m", "fnmap", "redrive", job_id], capture_output=True,
                             text=True, env=env, timeout=300)
    assert redrive.returncode != 0
    assert re.search(r"has 12 items but \d+ of them are in no stored call: .*run the map again with the same "
                     "job_name", redrive.stderr), redrive.stderr


def _fails_on_two(x):
    if x == 2:
        raise ValueError(x)
    return x


def test_the_kind_table_says_which_jobs_record_their_calls_and_can_be_redriven():
    """A map records its calls before it sends them (one record per batch) and can be redriven; an
    Executor's job records nothing, and its redrive is refused for its kind (``fnmap.kinds``)."""
    from fnmap.redrive import RedriveError, stored_calls
    from fnmap.runtime import keys

    mapped = fnmap.map(_fails_on_two, range(4), chunksize=1, return_exceptions=True, return_job=True, secret=SECRET)
    assert mapped.results(return_exceptions=True)[3] == 3
    calls = stored_calls(mapped.store, mapped.id, SECRET.encode())
    assert [(c.call_id, c.first_index, c.n_items) for c in calls.values()] == [(i, i, 1) for i in range(4)]
    with fnmap.Executor(secret=SECRET) as ex:
        futures = [ex.submit(_fails_on_two, x) for x in range(4)]
    assert isinstance(futures[2].exception(), ValueError)
    job = ex.job
    assert job.recorder is None and not list(job.store.list(keys.call_inputs_prefix(job.id)))
    assert fnmap.job(job.id).status == "failed"
    with pytest.raises(RedriveError, match=r"is an 'executor' job, whose calls are not stored for a redrive"):
        fnmap.job(job.id, secret=SECRET).redrive()
    assert fnmap.job(mapped.id, secret=SECRET).redrive(failed=True).results(return_exceptions=True)[3] == 3
