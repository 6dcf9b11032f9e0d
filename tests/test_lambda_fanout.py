"""Fan-out from inside the platform (issue 16): a big job's calls go out through a few spawner
invocations, each invoking a slice of the job's signed call events as ``Event`` calls of the same
function, under the emulator's fault injection; every result arrives exactly once.
"""

from __future__ import annotations

import json
import os
import types

import boto3
import pytest
from conftest import lambda_stats

import fnmap
from fnmap.backends.aws import AwsBackend
from fnmap.runtime import keys
from fnmap.runtime.lambda_event import encode_event, encode_spawn_event
from fnmap.storage import open_store

pytestmark = pytest.mark.timeout(120)


def square(x):
    return x * x


def test_a_fanned_out_job_gives_every_result_once_under_faults(emulator_process, aws_backend_on, monkeypatch):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", "--fail-rate", "0.15", "--kill-rate", "0.1",
                                      "--seed", "3", workers=4))
    monkeypatch.setenv("FNMAP_LAMBDA_FANOUT", "10")  # the user's setting: jobs of 10+ calls fan out
    monkeypatch.setattr(AwsBackend, "fanout_slice", 8)
    items = range(40)
    # timeout=2: an invoked call that never ran is declared lost 12 s after it was accepted.
    job = fnmap.map(square, items, chunksize=1, timeout=2, retries=5, speculation=False, return_job=True)
    assert job.results() == [x * x for x in items]
    stats = lambda_stats(emu)
    assert stats["spawners"] == 5 and stats["spawned"] == len(items), stats  # 40 calls, 8 per spawner
    summary = job.summary()
    assert summary["retries"] >= 1, summary  # the injected faults hit some calls; they were retried
    assert summary["attempts"]["ok"] == len(items), summary
    assert len(open_store(job.store.url).list(keys.results_prefix(job.id))) == len(items)


def test_a_small_job_is_not_fanned_out(emulator_process, aws_backend_on, monkeypatch):
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    assert fnmap.map(square, range(5), chunksize=1, speculation=False, lambda_fanout=10) == [x * x for x in range(5)]
    stats = lambda_stats(emu)
    assert stats.get("spawners", 0) == 0 and stats.get("RequestResponse", 0) + stats.get("Event", 0) == 5, stats


def test_the_handler_invokes_a_spawners_calls_as_events(emulator_process, aws_backend_on, monkeypatch):
    """``handlers/aws_lambda.py`` itself, with boto3 pointed at the emulator: each call becomes an Event."""
    emu = aws_backend_on(emulator_process("--lambda-runtime", "pool", workers=2))
    from handlers import aws_lambda

    # The handler's boto3.client() signs with the default session, which keeps the credentials it
    # resolved first (an earlier test's emulator's); a Lambda sandbox has one set for its life.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    calls = [encode_event(b"not a signed request", "0" * 64) for _ in range(5)]
    context = types.SimpleNamespace(invoked_function_arn="arn:aws:lambda:us-east-1:000000000000:function:fnmap")
    before = lambda_stats(emu).get("Event", 0)
    secret = emu.secret.encode()
    monkeypatch.setattr(aws_lambda, "_SECRET", secret)
    store = open_store(os.environ["FNMAP_STORAGE"])
    record = keys.job_index_key("job1", 0)
    store.put(record, b"{}")  # a spawner of a job with a record (issue 26)
    event = encode_spawn_event(calls, ["0" * 64] * 5, secret, "job1", "s1", store.url, record)
    answer = aws_lambda.handler(json.loads(event), context)
    assert answer["status"] == 200 and answer["body"] == "W10="  # base64 of [] : every call invoked
    assert lambda_stats(emu)["Event"] - before == len(calls)


def test_spawners_under_awslambdaric_invoke_their_calls_back_through_the_lambda_api(
        emulator_process, aws_backend_on, monkeypatch):
    """With the platform's own runtime client (``--lambda-runtime ric``) the spawner is the real
    handler in a real execution environment: it reaches the Lambda API the way it would on AWS
    (the endpoint and the execution role's credentials are in its environment), and every call it
    invokes runs, once."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the emulator starts with no credentials of its own
    emu = aws_backend_on(emulator_process("--lambda-runtime", "ric", workers=2))
    monkeypatch.setattr(AwsBackend, "fanout_slice", 4)
    items = range(12)
    job = fnmap.map(square, items, chunksize=1, lambda_fanout=10, speculation=False, timeout=30,
                    return_job=True)
    assert job.results() == [x * x for x in items]
    stats = lambda_stats(emu)
    # 3 spawners (RequestResponse), 12 Events sent by them; none fell back to the client.
    assert stats["spawners"] == 3 and stats.get("Event") == len(items), stats
    assert stats["RequestResponse"] == 3 and job.summary()["retries"] == 0, (stats, job.summary())
