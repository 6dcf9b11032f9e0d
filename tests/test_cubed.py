"""The Cubed executor on the embedded emulator: array results equal NumPy's, tasks run elsewhere."""

from __future__ import annotations

import os
import pathlib
import time

import cubed
import cubed.array_api as xp
import numpy as np
import pytest
from cubed.runtime.types import Callback

from fnmap.cubed import FnmapExecutor


class TaskCounter(Callback):
    """Counts Cubed's task-end events, as its progress bars and timing reports receive them."""

    def __init__(self):
        self.ended = 0
        self.operations = []

    def on_operation_start(self, event):
        self.operations.append(event.name)

    def on_task_end(self, event):
        assert event.function_end_tstamp is not None  # stats measured on the worker
        self.ended += 1


@pytest.fixture
def spec_for(tmp_path):
    def make(executor):
        return cubed.Spec(work_dir=str(tmp_path / "work"), allowed_mem="200MB", executor=executor)

    return make


def workers(executor) -> set[str]:
    return {c["worker"] for job in executor.jobs.values() for c in job.record()["calls"] if c["worker"]}


def test_array_expressions_equal_numpys_with_every_task_run_elsewhere(spec_for):
    executor = FnmapExecutor()
    spec = spec_for(executor)
    data = np.arange(144.0).reshape(12, 12)
    a = xp.asarray(data, chunks=(4, 4), spec=spec)
    checks = [
        (xp.add(a, 1) * 2, (data + 1) * 2),  # elementwise
        (xp.sum(a, axis=0), data.sum(axis=0)),  # a reduction
        (xp.max(a), data.max()),
        (xp.matmul(a, a.T), data @ data.T),
        (a.rechunk((6, 3)), data),
    ]
    seen: set[str] = set()
    for expression, expected in checks:
        counter = TaskCounter()
        np.testing.assert_allclose(expression.compute(callbacks=[counter]), expected)
        assert executor.jobs, "no fnmap job ran"
        assert counter.ended == sum(len(job.run.calls) for job in executor.jobs.values())
        assert counter.operations == list(executor.jobs)
        seen |= workers(executor)
    assert seen and not any(w.endswith(f":{os.getpid()}") for w in seen)


def fails_once_per_block(block, folder=None, block_id=None):
    marker = pathlib.Path(folder, "-".join(map(str, block_id)))
    if not marker.exists():
        marker.write_text("failed once")
        raise OSError(f"transient failure of block {block_id}")
    return block * 10


def test_a_failing_task_is_retried(spec_for, tmp_path):
    executor = FnmapExecutor()
    a = xp.asarray(np.arange(16.0).reshape(4, 4), chunks=(2, 2), spec=spec_for(executor))
    b = cubed.map_blocks(fails_once_per_block, a, dtype=a.dtype, folder=str(tmp_path))
    np.testing.assert_allclose(b.compute(), np.arange(16.0).reshape(4, 4) * 10)
    assert len(list(tmp_path.glob("*-*"))) == 4  # every block failed once...
    retried = sum(job.summary()["calls_retried"] for job in executor.jobs.values())
    assert retried == 4  # ...and ran again


def test_without_retries_the_failure_is_raised(spec_for, tmp_path):
    executor = FnmapExecutor(retries=0)
    a = xp.asarray(np.arange(4.0).reshape(2, 2), chunks=(1, 2), spec=spec_for(executor))
    b = cubed.map_blocks(fails_once_per_block, a, dtype=a.dtype, folder=str(tmp_path))
    with pytest.raises(OSError, match="transient failure of block"):
        b.compute()


def test_a_memory_below_the_specs_allowed_mem_is_refused_up_front(spec_for):
    a = xp.ones((4, 4), chunks=(2, 2), spec=spec_for(FnmapExecutor(memory=128)))
    with pytest.raises(ValueError, match="memory=128 MB is less than the Cubed spec's allowed_mem"):
        a.compute()


def slow_once(block, folder=None, block_id=None):
    """Block (0, 0) hangs on its first attempt only; every other attempt and block is quick."""
    marker = pathlib.Path(folder, "slow")
    if block_id == (0, 0) and not marker.exists():
        marker.write_text("first attempt")
        time.sleep(6)
    return block + 1


def test_a_straggling_task_gets_a_speculative_copy(spec_for, tmp_path):
    executor = FnmapExecutor()
    a = xp.asarray(np.arange(20.0).reshape(10, 2), chunks=(1, 2), spec=spec_for(executor))
    b = cubed.map_blocks(slow_once, a, dtype=a.dtype, folder=str(tmp_path))
    np.testing.assert_allclose(b.compute(), np.arange(20.0).reshape(10, 2) + 1)
    summary = list(executor.jobs.values())[-1].summary()  # the map_blocks operation
    assert summary["speculative_copies"] >= 1
    assert summary["wall_seconds"] < 5, "the operation waited for its straggler instead of the copy"
