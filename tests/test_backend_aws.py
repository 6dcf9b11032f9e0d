"""The whole ``aws`` path — real boto3 Lambda and S3 clients — against the emulator and moto on loopback.

boto3 is pointed with its standard settings only: ``AWS_ENDPOINT_URL_LAMBDA``
at the emulator's Lambda API, ``AWS_ENDPOINT_URL_S3`` at moto's S3 server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

import fnmap

pytestmark = pytest.mark.timeout(120)
#: The emulator runs Lambda calls under AWS's runtime interface client when it is installed.
needs_ric = pytest.mark.skipif(importlib.util.find_spec("awslambdaric") is None, reason="awslambdaric is not installed")


def square(x):
    return x * x


def nap_square(x):
    time.sleep(0.05)
    return x * x


def slow_square(x):
    time.sleep(0.3)
    return x * x


def size_of(blob):
    return len(blob)


class TwoArgError(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")
        self.a, self.b = a, b


def fail_on_three(x):
    if x == 3:
        raise TwoArgError("bad", x)
    return x


def crash_once(args):
    marker, x = args
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return x + 1


@pytest.fixture(scope="module")
def lambda_emulator(s3_server):
    """One emulator for the module, its workers pointed at moto's S3 (stopped after the last test)."""
    from conftest import EmulatorProcess

    emu = EmulatorProcess(workers=2, env={
        "AWS_ENDPOINT_URL_S3": s3_server, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    yield emu
    _close_aws_clients()
    emu.stop()


@pytest.fixture
def aws(lambda_emulator, s3_env, monkeypatch):
    """The aws backend pointed at the emulator, storage in a fresh moto bucket; ``stats()`` counts this test's."""
    emu = lambda_emulator
    bucket = s3_env(f"fnmap-aws-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", emu.url)
    monkeypatch.setenv("FNMAP_BACKEND", "aws")
    monkeypatch.setenv("FNMAP_STORAGE", f"s3://{bucket}/fnmap")
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    emu.bucket = bucket

    def counts() -> dict:
        return requests.get(emu.url + "/lambda/stats", timeout=5).json()

    before = counts()
    emu.stats = lambda: {k: v - before.get(k, 0) for k, v in counts().items() if isinstance(v, int)}
    yield emu
    _close_aws_clients()


def _close_aws_clients():
    """Close the clients' pooled connections, so the emulator stops at once rather than waiting on them."""
    from fnmap import client

    for c in list(client._clients.values()):
        if c.config.backend == "aws":
            c.close()


def test_request_response_results_ride_back(aws):
    assert fnmap.map(square, range(20), chunksize=2, lambda_invocation="RequestResponse",
                     speculation=False) == [
        x * x for x in range(20)
    ]
    stats = aws.stats()
    assert stats["RequestResponse"] == 10 and stats.get("Event", 0) == 0


def test_event_fan_out_gathers_results_from_s3(aws, s3_env):
    job = fnmap.map(square, range(30), chunksize=3, lambda_invocation="Event", return_job=True,
                    speculation=False)
    assert job.results() == [x * x for x in range(30)]
    assert aws.stats()["Event"] == 10
    listed = s3_env.client.list_objects_v2(Bucket=aws.bucket, Prefix=f"fnmap/jobs/{job.id}/out/")
    assert listed["KeyCount"] == 10


def test_auto_uses_both_invocation_types(aws):
    # 4 dispatch threads: 1 synchronous slot, fewer than the emulator's 2 environments run at once
    assert fnmap.map(nap_square, range(40), workers=4, speculation=False, chunksize=1) == [x * x for x in range(40)]
    stats = aws.stats()
    assert stats["RequestResponse"] >= 1 and stats["Event"] >= 1
    assert stats["RequestResponse"] + stats["Event"] - stats.get("spawners", 0) == 40  # a spawner is no call


def test_auto_goes_synchronous_where_the_platform_is_the_bound(aws):
    # 8 dispatch threads: 2 synchronous slots, as many as the emulator's 2 environments run at once:
    # an Event would only wait in the platform's queue, so every call is synchronous, none via storage
    assert fnmap.map(nap_square, range(40), workers=8, speculation=False, chunksize=1) == [x * x for x in range(40)]
    stats = aws.stats()
    assert stats["RequestResponse"] == 40 and not stats.get("Event") and not stats.get("spawners"), stats


def test_request_over_the_payload_limit_travels_by_reference(aws):
    blobs = [bytes(10_000 + i) for i in range(4)]
    assert fnmap.map(size_of, blobs, lambda_invocation="Event", lambda_async_limit=4096, chunksize=1,
                     speculation=False) == [
        10_000 + i for i in range(4)
    ]
    assert aws.stats()["by_reference"] == 4


def test_a_large_input_is_named_by_its_sha256_and_deleted_from_s3_by_the_lambda_that_commits(aws, s3_env):
    """A large input is named by its SHA-256, as on every backend (tests/test_call_inputs.py); the
    worker deletes each once its result is committed, in S3 as in a folder."""
    blobs = [os.urandom(300_000) for _ in range(3)]
    job = fnmap.map(size_of, blobs, chunksize=1, return_job=True)
    assert job.results() == [300_000] * 3
    names = [call.items_key.rsplit("-", 1)[1] for call in job.run.calls]
    assert all(len(name) == 64 and int(name, 16) >= 0 for name in names), names
    listed = s3_env.client.list_objects_v2(Bucket=aws.bucket, Prefix=f"fnmap/jobs/{job.id}/")
    stored = [o["Key"] for o in listed.get("Contents", [])]
    assert stored and not [key for key in stored if "/in/" in key], stored


def test_a_job_started_on_the_emulator_is_redriven_on_lambda_from_the_inputs_it_stored(aws, s3_env, tmp_path):
    """A stored input is named by its SHA-256 on every backend: a job started on the emulator is
    redriven on Lambda from its inputs as they are, and the Lambda that commits deletes them."""
    marker = str(tmp_path / "crashed")
    items = [(str(tmp_path / "never"), 7), (marker, int.from_bytes(os.urandom(300_000), "big"))]  # call 1 stored
    open(items[0][0], "w").close()  # the first item never crashes
    job = fnmap.map(crash_once, items, backend="emulator", chunksize=1, retries=0,
                    return_job=True)
    with pytest.raises(fnmap.PlatformError):
        job.results()
    stored = job.run.calls[1].items_key

    def inputs_left() -> list:
        listed = s3_env.client.list_objects_v2(Bucket=aws.bucket, Prefix=f"fnmap/jobs/{job.id}/in/")
        return [o["Key"].removeprefix("fnmap/") for o in listed.get("Contents", [])]

    assert inputs_left() == [stored] and len(stored.rsplit("-", 1)[1]) == 64, stored
    assert not aws.stats().get("Event") and not aws.stats().get("RequestResponse")
    redriven = fnmap.job(job.id).redrive()
    assert redriven.results() == [x + 1 for _, x in items]
    assert aws.stats().get("Event", 0) + aws.stats().get("RequestResponse", 0) >= 1  # it ran on Lambda
    assert redriven.run.calls[1].items_key == stored
    assert inputs_left() == []  # deleted by the Lambda that committed the call


def test_remote_exception_keeps_its_type(aws):
    with pytest.raises(TwoArgError) as info:
        fnmap.map(fail_on_three, range(5), lambda_invocation="RequestResponse")
    assert info.value.args == ("bad/3",) and info.value.b == 3
    assert any("item 3" in note for note in info.value.__notes__)


def test_crashed_runtime_is_retried(aws, tmp_path):
    """A worker that dies answers X-Amz-Function-Error (Runtime.ExitError): a fault the client retries."""
    job = fnmap.map(crash_once, [(str(tmp_path / "crashed"), 41)], lambda_invocation="RequestResponse",
                    return_job=True)
    assert job.results() == [42]
    assert job.summary()["retries"] >= 1


def test_throttled_calls_back_off_and_finish(aws):
    """Reserved concurrency 1: synchronous calls beyond it get 429 TooManyRequestsException."""
    lam = boto3.client("lambda", endpoint_url=aws.url)
    lam.put_function_concurrency(FunctionName="fnmap", ReservedConcurrentExecutions=1)
    try:
        assert lam.get_function_concurrency(FunctionName="fnmap")["ReservedConcurrentExecutions"] == 1
        items = range(5)
        # chunksize=1: five calls sent at once.  Automatic chunks would keep only as many calls out
        # as the reserved concurrency (a client made after the setting reads it): no 429 to see.
        assert fnmap.map(slow_square, items, lambda_invocation="RequestResponse", workers=5, chunksize=1,
                         retries=20) == [x * x for x in items]
        assert aws.stats()["throttled"] >= 1
    finally:
        lam.delete_function_concurrency(FunctionName="fnmap")


def where_it_runs(_):
    """The command lines of this process and its parents, and where fnmap was imported from."""
    import fnmap as worker_fnmap

    chain, pid = [], os.getpid()
    while pid > 1 and len(chain) < 6:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            chain.append([a.decode() for a in f.read().split(b"\0") if a])
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return {"chain": chain, "fnmap": worker_fnmap.__file__, "task_root": os.environ.get("LAMBDA_TASK_ROOT"),
            "path": list(sys.path)}


@needs_ric
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_calls_run_under_awslambdaric_from_the_deployment_package(aws):
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(fnmap.__file__)))
    for seen in fnmap.map(where_it_runs, range(4), lambda_invocation="RequestResponse"):
        assert any(cmd[-3:] == ["-m", "awslambdaric", "handlers.aws_lambda.handler"] for cmd in seen["chain"]), seen
        assert seen["fnmap"].startswith(seen["task_root"] + os.sep)  # the unpacked package, not the checkout
        assert not any(p == checkout or p.startswith(checkout + os.sep) for p in seen["path"]), seen["path"]


@needs_ric
def test_a_broken_package_fails_the_job_with_lambdas_init_error(aws):
    """A package without fnmap (only handlers/): awslambdaric reports Runtime.ImportModuleError at init."""
    import io
    import zipfile

    import handlers

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name in ("__init__.py", "aws_lambda.py"):
            zf.write(os.path.join(os.path.dirname(handlers.__file__), name), f"handlers/{name}")
    lam = boto3.client("lambda", endpoint_url=aws.url)
    lam.create_function(FunctionName="no-fnmap", Role="arn:aws:iam::000000000000:role/x", Runtime="python3.11",
                        Handler="handlers.aws_lambda.handler", Code={"ZipFile": buffer.getvalue()})
    with pytest.raises(fnmap.PlatformError, match=(
            r"failed after 1 attempt.*Runtime.ImportModuleError: Unable to import module 'handlers.aws_lambda': "
            r"No module named 'fnmap'")):
        fnmap.map(square, [1], function_name="no-fnmap", lambda_invocation="RequestResponse")
    assert aws.stats()["init_errors"] == 1


def sleep_through_alarms(seconds):
    import signal

    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # the handler's own stop comes by SIGALRM: ignore it
    time.sleep(seconds)


@needs_ric
def test_lambdas_own_timeout_is_a_timeout_error(aws):
    """The function's timeout (2 s) passes: the emulator stops the environment, as Lambda does."""
    lam = boto3.client("lambda", endpoint_url=aws.url)
    lam.update_function_configuration(FunctionName="short", Timeout=2)
    with pytest.raises(fnmap.TimeoutError, match=r"Sandbox.Timedout: .*Task timed out after 2.00 seconds"):
        fnmap.map(sleep_through_alarms, [30], function_name="short", lambda_invocation="RequestResponse",
                  retries=0)
    assert aws.stats()["timeouts"] == 1


def test_unknown_invocation_type_is_named():
    with pytest.raises(fnmap.ConfigError, match="lambda_invocation='event'.*Event, RequestResponse"):
        fnmap.map(square, [1], backend="aws", lambda_invocation="event", secret="s" * 64)


_HANDLER_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from fnmap.runtime import keys, signing, wire
    from fnmap.runtime.lambda_event import encode_event
    from fnmap.runtime.serialization import dumps, pickle_function, runtime_info
    from fnmap.storage import open_store
    from handlers.aws_lambda import handler

    class Context:  # what the Lambda runtime passes: here 2 s left, of which a fifth is kept back
        def __init__(self):
            self.end = time.monotonic() + 2.0
        def get_remaining_time_in_millis(self):
            return int((self.end - time.monotonic()) * 1000)

    store_url, secret = sys.argv[1], sys.argv[2].encode()
    digest, data = pickle_function(time.sleep)
    open_store(store_url).put(keys.function_key(digest), data)
    open_store(store_url).put(keys.job_record_key("j" * 32), b"{}")  # the job has a record
    req = wire.CallRequest(job_id="j" * 32, call_id=0, func_key=keys.function_key(digest),
                           store_url=store_url, runtime=runtime_info())
    body = wire.encode(req, dumps(("one", [3])))
    signature = signing.sign(secret, body)
    started = time.monotonic()
    direct = handler(json.loads(encode_event(body, signature)), Context())
    took = time.monotonic() - started
    url = handler({"requestContext": {}, "headers": {"x-fnmap-signature": "0" * 64},
                   "body": "", "isBase64Encoded": True}, Context())
    print(json.dumps({"direct": direct, "took": took, "url_status": url["statusCode"]}))
""")


def test_handler_writes_a_timeout_before_lambdas_own_limit(tmp_path):
    """handlers/aws_lambda.py in a fresh process, as Lambda runs it: time.sleep(3) with 2 s left."""
    secret = "s" * 64
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    out = subprocess.run(
        [sys.executable, "-c", _HANDLER_SCRIPT, tmp_path.as_uri(), secret],
        env=dict(env, FNMAP_SECRET=secret), capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert 1.2 < report["took"] < 2.0
    assert report["url_status"] == 403  # a function URL request with a wrong signature is refused

    from fnmap.runtime.lambda_event import decode_result
    from fnmap.runtime.serialization import loads
    from fnmap.runtime.wire import decode_response

    status, body = decode_result(json.dumps(report["direct"]).encode())
    assert status == 200
    resp, payload = decode_response(body)
    assert resp.ok
    from fnmap.runtime import keys, signing

    key = keys.result_key(resp.job_id, resp.call_id)  # results are sealed (issue 26)
    outcomes = loads(signing.unseal(secret.encode(), key, payload)) if resp.inline else None
    assert outcomes is not None and outcomes[0][0] == "err"
    assert isinstance(loads(outcomes[0][1]), fnmap.TimeoutError)


def random_bytes(n):
    return os.urandom(n)


def test_result_over_the_response_limit_is_read_from_storage(aws):
    """A synchronous answer over 6 MiB is a Function.ResponseSizeTooLarge error; the result is in S3."""
    n = 5 * 2**20  # base64 makes it about 6.7 MB; random bytes do not compress
    [value] = fnmap.map(random_bytes, [n], inline_limit=8 * 2**20, lambda_invocation="RequestResponse")
    assert isinstance(value, bytes) and len(value) == n
    assert aws.stats()["response_too_large"] == 1


def test_emulator_enforces_lambdas_request_limits(aws):
    lam = boto3.client("lambda", endpoint_url=aws.url)
    with pytest.raises(lam.exceptions.RequestTooLargeException):
        lam.invoke(FunctionName="fnmap", InvocationType="Event", Payload=b"{" + b" " * 2**20 + b"}")
    blob = os.urandom(2 * 2**20)
    # By default an argument over inline_limit (256 KiB) is stored and the small request names it.
    assert fnmap.map(size_of, [blob], lambda_invocation="Event") == [len(blob)]
    assert aws.stats().get("by_reference", 0) == 0
    # Carried inline, a 2 MiB argument fits neither of Lambda's limits as an event: the whole signed
    # request goes by reference.
    assert fnmap.map(size_of, [blob], lambda_invocation="Event", inline_limit=4 << 20) == [len(blob)]
    assert aws.stats()["by_reference"] == 1


def test_emulator_names_the_lambda_operations_it_does_not_serve(aws):
    lam = boto3.client("lambda", endpoint_url=aws.url)
    with pytest.raises(ClientError, match=r"NotImplemented.*does not support the Lambda operation ListAliases") as info:
        lam.list_aliases(FunctionName="fnmap")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    assert lam.get_function_configuration(FunctionName="fnmap")["FunctionName"] == "fnmap"


@pytest.mark.parametrize("options, message", [
    ({"memory": 2048}, r"memory=2048 \(from keyword\) but Lambda function 'fnmap' has 1024 MB.*--memory 2048"),
    ({"gpu": 1}, r"has no GPUs; run GPU work with backend='batch'"),
    ({"timeout": 1200}, r"stops calls after 900 s"),
])
def test_options_the_function_cannot_honour_are_refused(aws, options, message):
    with pytest.raises(fnmap.PlatformError, match=message):
        fnmap.map(square, [1], **options)
    assert aws.stats().get("RequestResponse", 0) + aws.stats().get("Event", 0) == 0


def test_missing_region_is_named(monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(fnmap.ConfigError, match="needs the function's AWS region.*FNMAP_REGION"):
        fnmap.map(square, [1], backend="aws", secret="s" * 64)


def allocate_300mb(x):
    return len(b"x" * (300 << 20)) + x


@needs_ric
def test_out_of_memory_climbs_to_the_next_steps_function(aws):
    """A call killed for memory (Runtime.OutOfMemory) is sent again to the next step's own function."""
    lam = boto3.client("lambda", endpoint_url=aws.url)
    lam.update_function_configuration(FunctionName="memtest", MemorySize=256)
    with pytest.raises(fnmap.PlatformError, match=r"'memtest-2048mb' has 1024 MB: `fnmap deploy aws deploy "
                       r"--name memtest-2048mb --memory 2048`"):
        fnmap.map(allocate_300mb, [1], function_name="memtest", memory=[256, 2048])
    assert aws.stats().get("RequestResponse", 0) + aws.stats().get("Event", 0) == 0  # refused before sending
    job = fnmap.map(allocate_300mb, [1], function_name="memtest", memory=[256, 1024], return_job=True)
    assert job.results() == [(300 << 20) + 1]
    assert [(a[3], a[4]) for a in job.attempts_summary()[0]] == [("out_of_memory", 256), ("ok", 1024)]
    # memtest itself has 256 MB under the emulator's Lambda runtime: the retry ran on memtest-1024mb.
    with pytest.raises(fnmap.OutOfMemory, match="ran out of memory at 256 MB"):
        fnmap.map(allocate_300mb, [1], function_name="memtest", memory=256)
