"""The aws path by default (issues 23, 24, 25): the first wave sized to the platform's concurrency,
Event calls sent through spawners, and Lambda's asynchronous losses bounded by the function's event
invoke config, which the emulator's Lambda API honours (and under ``--drop-rate`` it loses events
silently, as Lambda may).  Real boto3 against the emulator on loopback.
"""

from __future__ import annotations

import importlib.util
import os
import time

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from conftest import lambda_stats

import fnmap
from fnmap.deploy.aws import Settings, role_policy

pytestmark = pytest.mark.timeout(150)
needs_ric = pytest.mark.skipif(importlib.util.find_spec("awslambdaric") is None, reason="awslambdaric is not installed")


def square(x):
    return x * x


def logged_square(args):
    """Square ``x`` and append it to ``path`` (O_APPEND: one line per execution)."""
    path, x = args
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{x}\n".encode())
    finally:
        os.close(fd)
    return x * x


def _lambda(emu, validate: bool = True):
    # A session of its own: boto3's default one keeps the credentials it resolved first (another emulator's).
    return boto3.session.Session().client("lambda", endpoint_url=emu.url, region_name="us-east-1",
                                          config=BotoConfig(parameter_validation=validate))


def test_the_first_wave_is_as_wide_as_the_platform_not_the_clients_threads(emulator_process, aws_backend_on,
                                                                            monkeypatch):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    assert _lambda(emu).get_account_settings()["AccountLimit"]["ConcurrentExecutions"] == 2
    job = fnmap.map(square, range(300), speculation=False, return_job=True)  # chunksize unset: automatic
    assert job.results() == [x * x for x in range(300)]
    sizes = [call.n_items for call in job.run.calls]
    # Two one-item calls measure the cost of a call, then chunks grow (the client's 64 dispatch
    # threads made 64 one-item calls before anything larger was measured).
    assert sizes[:2] == [1, 1] and max(sizes[2:4]) > 1, sizes

    # A function's reserved concurrency bounds it too (a name of its own: lookups are cached).
    monkeypatch.setenv("FNMAP_FUNCTION_NAME", "fnmap-reserved")
    _lambda(emu).put_function_concurrency(FunctionName="fnmap-reserved", ReservedConcurrentExecutions=1)
    job = fnmap.map(square, range(300), speculation=False, return_job=True)
    assert job.results() == [x * x for x in range(300)]
    assert [call.n_items for call in job.run.calls][:2][0] == 1 and job.run.calls[1].n_items > 1, \
        [c.n_items for c in job.run.calls]


def test_event_calls_go_out_through_spawners_by_default(emulator_process, aws_backend_on):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    items = range(40)
    assert fnmap.map(square, items, chunksize=1, lambda_invocation="Event", speculation=False) == [
        x * x for x in items]
    stats = lambda_stats(emu)
    # The client signed a few spawner requests; the calls were invoked from inside the platform.
    assert stats["spawners"] >= 1 and stats["spawned"] == stats["Event"] == len(items), stats
    assert stats["RequestResponse"] == stats["spawners"] < len(items) // 4, stats

    before = lambda_stats(emu)
    assert fnmap.map(square, items, chunksize=1, lambda_invocation="Event", speculation=False,
                     lambda_fanout=0) == [x * x for x in items]
    after = lambda_stats(emu)
    assert after["spawners"] == before["spawners"] and after["Event"] - before["Event"] == len(items), after


def test_the_emulator_keeps_the_event_invoke_config_as_lambda_does(emulator_process, aws_backend_on):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    lam = _lambda(emu)
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function_event_invoke_config(FunctionName="fnmap")
    lam.put_function_event_invoke_config(FunctionName="fnmap", MaximumRetryAttempts=0, MaximumEventAgeInSeconds=600)
    lam.update_function_event_invoke_config(FunctionName="fnmap", MaximumEventAgeInSeconds=900)
    config = lam.get_function_event_invoke_config(FunctionName="fnmap")
    assert (config["MaximumRetryAttempts"], config["MaximumEventAgeInSeconds"]) == (0, 900)
    with pytest.raises(ClientError, match="MaximumRetryAttempts=5"):
        _lambda(emu, validate=False).put_function_event_invoke_config(FunctionName="fnmap", MaximumRetryAttempts=5)
    lam.delete_function_event_invoke_config(FunctionName="fnmap")
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function_event_invoke_config(FunctionName="fnmap")

    # An event that waited in the queue longer than MaximumEventAgeInSeconds is dropped, never run.
    _lambda(emu, validate=False).put_function_event_invoke_config(FunctionName="held", MaximumEventAgeInSeconds=1)
    lam.put_function_concurrency(FunctionName="held", ReservedConcurrentExecutions=0)  # nothing starts
    for _ in range(3):
        lam.invoke(FunctionName="held", InvocationType="Event", Payload=b'{"not": "an fnmap event"}')
    time.sleep(1.5)
    lam.delete_function_concurrency(FunctionName="held")
    deadline = time.monotonic() + 30
    while lambda_stats(emu).get("events_done", 0) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lambda_stats(emu).get("events_expired") == 3, lambda_stats(emu)


@needs_ric
def test_events_lambda_drops_are_declared_lost_from_the_event_config_and_run_again(
        emulator_process, aws_backend_on, tmp_path, monkeypatch):
    """``--drop-rate`` loses Event calls silently, as Lambda may; with retries off and a short event
    age, the client declares each lost after that age + the function's timeout (not timeout + 120 s)
    and sends it again: every item runs exactly once."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the environments sign with the execution role's keys
    emu = aws_backend_on(emulator_process("--lambda-runtime", "ric", "--drop-rate", "0.3", "--seed", "5", workers=2))
    lam = _lambda(emu, validate=False)  # Lambda's own minimum age is 60 s; the emulator takes 1 s
    lam.update_function_configuration(FunctionName="fnmap", Timeout=2)
    lam.put_function_event_invoke_config(FunctionName="fnmap", MaximumRetryAttempts=0, MaximumEventAgeInSeconds=2)
    side = tmp_path / "ran.log"
    items = list(range(10))
    job = fnmap.map(logged_square, [(str(side), x) for x in items], chunksize=1, lambda_invocation="Event",
                    retries=8, speculation=False, return_job=True)
    assert job.results() == [x * x for x in items]
    assert sorted(int(line) for line in side.read_text().split()) == items  # each item ran once
    stats = lambda_stats(emu)
    assert stats["events_dropped"] >= 1, stats
    assert job.summary()["retries"] >= stats["events_dropped"], (job.summary(), stats)


def test_deploy_lets_the_function_invoke_itself_and_bounds_its_events():
    policy = role_policy("bucket", "fnmap", "eu-west-1", "123456789012", "fn")
    fan_out = {s["Sid"]: s for s in policy["Statement"]}["FanOut"]
    assert fan_out["Action"] == "lambda:InvokeFunction"
    assert fan_out["Resource"] == "arn:aws:lambda:eu-west-1:123456789012:function:fn"  # itself only
    assert 60 <= Settings().max_event_age <= 21600


@needs_ric
def test_a_function_that_may_not_invoke_itself_gets_its_calls_directly_with_one_warning(
        emulator_process, aws_backend_on, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    emu = aws_backend_on(emulator_process("--lambda-runtime", "ric", workers=2))
    # The function's own keys are unknown to the Lambda API: its spawners' Invokes are refused.
    _lambda(emu).update_function_configuration(FunctionName="fnmap", Environment={"Variables": {
        "AWS_ACCESS_KEY_ID": "AKIDNOTALLOWED", "AWS_SECRET_ACCESS_KEY": "not-allowed", "AWS_SESSION_TOKEN": "x"}})
    items = range(12)
    with pytest.warns(RuntimeWarning, match="may not invoke itself") as caught:
        job = fnmap.map(square, items, chunksize=1, lambda_invocation="Event", speculation=False, return_job=True)
        assert job.results() == [x * x for x in items]
        again = fnmap.map(square, items, chunksize=1, lambda_invocation="Event", speculation=False)
    assert again == [x * x for x in items]
    assert len([w for w in caught if "may not invoke itself" in str(w.message)]) == 1  # once per client
    stats = lambda_stats(emu)
    assert stats["spawners"] == 1 and stats["Event"] == 2 * len(items), stats  # then sent directly
    assert job.summary()["retries"] == 0, job.summary()  # the refused calls were not charged a retry


def test_a_cold_first_call_does_not_keep_the_chunks_at_one_item():
    from fnmap.policy import ChunkSizer

    sizer = ChunkSizer(1.5, 2)
    sizer.observe(1, 5.0)  # the first call met a cold start
    sizer.observe(1, 0.1)  # a warm one: the cost of a call
    assert sizer.next_size(2000) == 15  # grows at once (by target / the fastest call measured)
