"""``@fnmap.function``: options on the function, the plain function is what runs and travels."""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import typing

import pytest
from conftest import lambda_stats
from test_gpu_rules import fake_nvidia_smi  # noqa: F401 - a fixture

import fnmap
from fnmap.runtime import serialization

pytestmark = pytest.mark.timeout(240)


@fnmap.function
def fact(n: int) -> int:
    """n factorial, by recursion through the decorated name."""
    return 1 if n <= 1 else n * fact(n - 1)


def undecorated_fact(n: int) -> int:
    return 1 if n <= 1 else n * undecorated_fact(n - 1)


@fnmap.function
def my_pid() -> int:
    return os.getpid()


def what_fact_is_here(_):
    return type(fact).__name__


@fnmap.function(retries=0, retry_on=(ValueError,), speculation=False)
def fails_the_first_time(path: str) -> str:
    if not os.path.exists(path):
        open(path, "w").close()
        raise ValueError("first time")
    return "second time"


@fnmap.function(memory=[256, 512], chunksize=1)
def where(_):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_calling_it_runs_the_plain_function_here_with_its_name_doc_signature_and_hints():
    assert fact(6) == undecorated_fact(6) == 720
    assert fact.local(5) == 120
    assert my_pid() == os.getpid() != my_pid.call()  # here, not as a call (of any backend)
    assert fact.__name__ == "fact" and fact.__doc__.startswith("n factorial")
    assert fact.__wrapped__.__name__ == "fact" and inspect.isfunction(fact.__wrapped__)
    assert inspect.signature(fact) == inspect.signature(undecorated_fact)
    assert list(inspect.signature(fact).parameters) == ["n"]
    assert typing.get_type_hints(fact) == {"n": int, "return": int}


def test_it_pickles_as_the_modules_name_and_travels_as_the_plain_function():
    assert pickle.loads(pickle.dumps(fact)) is fact
    travelled = serialization.loads(serialization.dumps(fact))
    assert inspect.isfunction(travelled) and travelled(5) == 120
    assert travelled.__globals__["fact"] is travelled  # its recursive call is the plain function too


def test_a_recursive_function_maps_with_one_remote_call_per_item_on_the_emulator():
    job = fact.map(range(1, 8), chunksize=1, return_job=True)
    assert job.results() == [undecorated_fact(n) for n in range(1, 8)]
    summary = job.summary()
    assert summary["calls"] == 7 and summary["attempts"]["ok"] == 7, summary
    assert fnmap.map(what_fact_is_here, [0]) == ["function"]  # in the worker, the name is the plain function


def test_a_recursive_function_maps_with_one_remote_call_per_item_on_aws(emulator_process, aws_backend_on):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    before = lambda_stats(emu)
    assert fact.map(range(1, 8), chunksize=1, speculation=False) == [undecorated_fact(n) for n in range(1, 8)]
    after = lambda_stats(emu)
    invoked = sum(after.get(k, 0) - before.get(k, 0) for k in ("RequestResponse", "Event"))
    assert invoked == 7, (before, after)


def test_options_apply_and_per_call_keywords_and_with_options_override(tmp_path):
    with pytest.raises(ValueError, match="first time"):
        fails_the_first_time.call(str(tmp_path / "a"))  # retries=0: the first failure is final
    patient = fails_the_first_time.with_options(retries=1)
    assert patient.call(str(tmp_path / "b")) == "second time"  # retry_on=(ValueError,) with one retry
    assert fails_the_first_time.options["retries"] == 0 and patient.options["retries"] == 1  # unchanged
    assert fails_the_first_time.map([str(tmp_path / "c")], retries=1) == ["second time"]  # per call
    job = where.map(range(3), return_job=True)
    job.results()
    memories = [a[4] for attempts in job.attempts_summary().values() for a in attempts]
    assert memories == [256, 256, 256]  # the first memory step
    assert job.summary()["calls"] == 3
    assert where.map(range(4), chunksize=2, return_job=True).summary()["calls"] == 2


def test_gpu_option_runs_on_the_offline_batch_gpus(fake_nvidia_smi, emulator_process, monkeypatch):  # noqa: F811
    from conftest import aws_credentials_of

    from fnmap.backends import batch as batch_backend
    from fnmap.emulator import batch_api

    env = fake_nvidia_smi(1)
    emu = emulator_process(workers=1, env={"PATH": env["PATH"], batch_api.CONCURRENCY_ENV: "2"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", emu.url)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    for name, value in aws_credentials_of(emu).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(batch_backend.BatchBackend, "status_interval", 0.2)
    on_gpu = where.with_options(gpu=1, memory=None)
    job = on_gpu.map(range(2), return_job=True)
    assert job.results() == ["0", "0"] and job.config.backend == "batch"  # gpu= chose Batch


def test_a_misspelt_or_bad_option_fails_at_decoration():
    with pytest.raises(fnmap.ConfigError, match="did you mean 'retries'"):
        fnmap.function(retires=3)(undecorated_fact)
    with pytest.raises(fnmap.ConfigError, match="memory=64"):
        @fnmap.function(memory=64)
        def small(x):
            return x
    with pytest.raises(fnmap.ConfigError, match="did you mean 'timeout'"):
        fact.with_options(timout=3)


def test_every_front_end_and_its_aio_twin(tmp_path):
    assert fact.starmap([(3,), (4,)]) == [6, 24]
    assert list(fact.imap([1, 2, 3])) == [1, 2, 6] and sorted(fact.imap_unordered([1, 2, 3])) == [1, 2, 6]
    assert fact.map_reduce([2, 3], sum) == 8
    assert fact.call(5) == 120 and fact.submit(4).result() == 24

    async def main():
        return (await fact.map.aio([3, 4]), await fact.starmap.aio([(2,)]), await fact.call.aio(5),
                await fact.submit.aio(3), [x async for x in fact.imap.aio([1, 2])],
                sorted([x async for x in fact.imap_unordered.aio([1, 2])]), await fact.map_reduce.aio([2, 3], sum))

    assert asyncio.run(main()) == ([6, 24], [2], 120, 6, [1, 2], [1, 2], 8)
