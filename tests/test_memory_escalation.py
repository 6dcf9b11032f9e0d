"""Memory escalation (issue 24): ``memory=[...]`` steps a call killed for memory climbs on its
retries, on the emulator (which enforces the limit) and on emulated Batch; other faults retry
at the same memory; the record says which memory each attempt had."""

from __future__ import annotations

import os

import pytest
from conftest import aws_credentials_of

import fnmap
from fnmap.backends import batch as batch_backend
from fnmap.cli.jobs import format_summary
from fnmap.config import resolve
from fnmap.emulator import batch_api


def _allocate(x):
    """Item 1 touches 300 MB (more than 128 MB, less than 1024 MB)."""
    if x == 1:
        return len(b"x" * (300 << 20))
    return x


def _crash_once(marker):
    """Dies (not for memory) on its first attempt only."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "ok"


def _memories(job, call):
    return [(a[3], a[4]) for a in job.attempts_summary()[call]]


def test_out_of_memory_climbs_to_the_next_step_on_the_emulator(use_emulator):
    use_emulator(workers=2)
    job = fnmap.map(_allocate, range(3), memory=[128, 1024], retries=0, return_job=True)
    assert job.results() == [0, 300 << 20, 2]
    assert _memories(job, 1) == [("out_of_memory", 128), ("ok", 1024)]
    assert _memories(job, 0) == [("ok", 128)]
    recorded = job.record()["calls"][1]["attempts"]
    assert [(a["outcome"], a["memory"]) for a in recorded] == [("out_of_memory", 128), ("ok", 1024)]
    assert "memory   call 1: 128 MB out_of_memory -> 1024 MB ok" in format_summary(job.record())


def test_out_of_memory_at_the_top_step_fails_with_the_fix(use_emulator):
    use_emulator(workers=1)
    with pytest.raises(fnmap.OutOfMemory, match=r"ran out of memory at 256 MB, the last step of "
                       r"memory=\[128, 256\]: add a larger step, e\.g\. memory=\[128, 256, 512\]") as info:
        fnmap.map(_allocate, [1], memory=[128, 256], retries=2)
    assert "after 2 attempt(s)" in str(info.value)  # one per step: the same memory is not retried
    assert isinstance(info.value, fnmap.WorkerCrashed)


def test_other_crashes_retry_at_the_same_memory(use_emulator, tmp_path):
    use_emulator(workers=1)
    job = fnmap.map(_crash_once, [str(tmp_path / "crashed")], memory=[128, 1024], retries=1,
                    return_job=True)
    assert job.results() == ["ok"]
    assert _memories(job, 0) == [("crashed", 128), ("ok", 128)]


def test_memory_steps_are_checked():
    assert resolve(memory=[1024, 4096]).memory_steps == (1024, 4096)
    assert resolve(memory=2048).memory_steps == (2048,)
    with pytest.raises(fnmap.ConfigError, match=r"memory=\(4096, 1024\) \(from keyword\) must rise"):
        resolve(memory=[4096, 1024])
    with pytest.raises(fnmap.ConfigError, match="must be an integer >= 128"):
        resolve(memory=[64, 1024])


def test_out_of_memory_climbs_on_emulated_batch(emulator_process, monkeypatch):
    """Each retried child goes in a new array job asking for the next MEMORY step."""
    emu = emulator_process(workers=1, env={batch_api.CONCURRENCY_ENV: "2"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", emu.url)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    for name, value in aws_credentials_of(emu).items():  # the keys its Batch API accepts
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(batch_backend.BatchBackend, "status_interval", 0.2)
    job = fnmap.map(_allocate, range(2), backend="batch", memory=[128, 1024], retries=0,
                    return_job=True)
    assert job.results() == [0, 300 << 20]
    assert _memories(job, 1) == [("out_of_memory", 128), ("ok", 1024)]


# -- the scheduler's rule, fed synchronously (as tests/test_scheduler.py does) ---------------------


def test_the_scheduler_climbs_only_on_out_of_memory_and_charges_no_retry(tmp_path):
    from concurrent.futures import Future

    from fnmap.backends.base import BaseBackend
    from fnmap.errors import PlatformFault
    from fnmap.jobs import Job
    from fnmap.run import CallRun
    from fnmap.scheduler import Scheduler
    from fnmap.storage import open_store

    class Unreachable(BaseBackend):
        name = "scripted"

    sched = Scheduler(Unreachable(), open_store(f"file://{tmp_path}"), b"secret")
    # This test plays every attempt itself: a retry the scheduler would send after its backoff is
    # recorded instead (sent, it would claim an attempt in the middle of the loop below).
    retried = []
    sched.monitor.after = lambda delay, action, job, state: retried.append(state.call_id)
    try:
        job = Job(sched, sched.store, resolve(backend="local", storage=sched.store.url, progress=False,
                                              retries=1, memory=[128, 512, 2048]))
        sched.add(job, CallRun(0, 0, 1, "functions/f", b"payload", None, Future(), True))
        sched.seal(job)
        call = job.run.calls[0]
        steps, charged = [], []
        for fault in ("crashed", "out_of_memory", "out_of_memory", "out_of_memory"):
            attempt = sched._begin(job, call)
            steps.append(sched.dispatch._invocation(job, call, attempt).memory)
            sched._decide(job, call, attempt, PlatformFault(fault, "killed"))
            charged.append(call.charged)
        assert steps == [128, 128, 512, 2048]  # a crash retries at the same memory
        assert charged == [1, 1, 1, 2]  # a climb uses up no retry (retries=1 would have ended it)
        assert retried == [0, 0, 0]  # after each fault but the last
        with pytest.raises(fnmap.OutOfMemory, match=r"at 2048 MB, the last step of memory=\[128, 512, 2048\]"):
            call.future.result(0)
    finally:
        sched.close()
