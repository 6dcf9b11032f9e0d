"""GPUs offline (issue 24): each child of an emulated Batch job gets GPUs of its own, others wait
RUNNABLE until devices free up, and a request that can never fit is refused at once.

The machine's GPUs come from a fake ``nvidia-smi`` on PATH printing what ``nvidia-smi -L`` prints.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import aws_credentials_of

import fnmap
from fnmap.backends import batch as batch_backend
from fnmap.emulator import batch_api, batch_jobs

#: A child that records its devices and its start, waits until ``want`` children have started (or
#: ``cap`` seconds: on a machine with fewer free devices they never will), then records its end.
_CHILD = (
    "import glob, os, sys, time\n"
    "folder, want, cap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])\n"
    "index = os.environ['AWS_BATCH_JOB_ARRAY_INDEX']\n"
    "Path = os.path.join\n"
    "open(Path(folder, 'start-' + index), 'w').write(\n"
    "    str(time.time_ns()) + ' ' + os.environ['CUDA_VISIBLE_DEVICES'])\n"
    "deadline = time.monotonic() + cap\n"
    "while len(glob.glob(Path(folder, 'start-*'))) < want and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
    "open(Path(folder, 'end-' + index), 'w').write(str(time.time_ns()))\n"
)


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """``make(n)``: PATH finds an ``nvidia-smi`` that lists ``n`` GPUs; returns the environment."""

    def make(n: int) -> dict:
        folder = tmp_path / f"bin{n}"
        folder.mkdir()
        lines = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-fake-{i})\\n" for i in range(n))
        script = folder / "nvidia-smi"
        script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return dict(os.environ)

    return make


def _run_children(env: dict, folder: Path, *, gpus_per_child: int, children: int, want: int,
                  cap: float) -> list[tuple[int, int, set[str]]]:
    """Run one array job on a Batch emulator with 4 runner threads; ``(start, end, devices)`` per child."""
    emulator = batch_jobs.BatchEmulator(env, 4, batch_jobs.detect_gpus(env))
    try:
        emulator.register_definition({
            "jobDefinitionName": "probe", "type": "container",
            "containerProperties": {"image": "probe", "command": [
                "python", "-c", _CHILD, str(folder), str(want), str(cap)]},
        })
        job = emulator.submit({
            "jobName": "probe", "jobQueue": "q", "jobDefinition": "probe",
            "arrayProperties": {"size": children},
            "containerOverrides": {"resourceRequirements": [{"type": "GPU", "value": str(gpus_per_child)}]},
        })
        deadline = time.monotonic() + 120
        while job.status() not in batch_jobs.TERMINAL:
            assert time.monotonic() < deadline, "the children did not finish"
            time.sleep(0.05)
        assert job.status() == "SUCCEEDED", [c.reason for c in job.children]
    finally:
        emulator.close()
    out = []
    for i in range(children):
        started, devices = (folder / f"start-{i}").read_text().split(" ", 1)
        out.append((int(started), int((folder / f"end-{i}").read_text()), set(filter(None, devices.split(",")))))
    return out


def _overlapping(runs):
    return [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:] if a[0] < b[1] and b[0] < a[1]]


@pytest.mark.parametrize(("gpus", "per_child", "children"), [(1, 1, 3), (2, 1, 4), (4, 2, 2)])
def test_each_child_has_gpus_of_its_own(fake_nvidia_smi, tmp_path, gpus, per_child, children):
    env = fake_nvidia_smi(gpus)
    assert batch_jobs.detect_gpus(env) == [str(i) for i in range(gpus)]
    folder = tmp_path / "runs"
    folder.mkdir()
    # Each child waits (at most 3 s) for as many children as the devices allow at once.
    at_once = gpus // per_child
    runs = _run_children(env, folder, gpus_per_child=per_child, children=children, want=at_once, cap=3.0)
    assert all(len(devices) == per_child for _, _, devices in runs)
    for a, b in _overlapping(runs):
        assert not a[2] & b[2], f"two children ran at once on the same GPU: {a} {b}"
    if at_once > 1:  # they did run side by side (each waited for the other before ending)
        assert _overlapping(runs)


def test_a_request_that_can_never_fit_is_refused_at_submit(fake_nvidia_smi):
    env = fake_nvidia_smi(1)
    emulator = batch_jobs.BatchEmulator(env, 1, batch_jobs.detect_gpus(env))
    try:
        with pytest.raises(batch_jobs.BatchRequestError, match=r"asks for 2 GPUs per child but this "
                           r"machine has 1 \(nvidia-smi -L lists: 0\).*gpu=1 or fewer"):
            emulator.submit({
                "jobName": "big", "jobQueue": "q", "jobDefinition": "fnmap",
                "containerOverrides": {"resourceRequirements": [{"type": "GPU", "value": "2"}]},
            })
        assert not emulator.jobs  # nothing queued
    finally:
        emulator.close()


def _device(_x):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_map_asking_more_gpus_than_the_machine_has_fails_at_once(fake_nvidia_smi, emulator_process,
                                                                 monkeypatch):
    """Through fnmap.map: one clear error naming the machine's GPU count and the fix, no retries."""
    env = fake_nvidia_smi(1)
    emu = emulator_process(workers=1, env={"PATH": env["PATH"], batch_api.CONCURRENCY_ENV: "2"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", emu.url)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    for name, value in aws_credentials_of(emu).items():  # the keys its Batch API accepts
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(batch_backend.BatchBackend, "status_interval", 0.2)
    with pytest.raises(fnmap.PlatformError, match="asks for 2 GPUs per child but this machine has 1") as info:
        fnmap.map(_device, range(2), gpu=2, retries=2)
    assert "after 1 attempt(s)" in str(info.value)  # refused, not retried
    assert "fnmap deploy batch" not in str(info.value)  # the refusal's own fix, not a deploy hint
    assert fnmap.map(_device, range(2), gpu=1) == ["0", "0"]  # what fits runs, on the one GPU


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
