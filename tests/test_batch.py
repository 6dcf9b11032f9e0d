"""The ``batch`` backend (GPU container jobs): its plain decisions, the container entrypoint, the
emulated AWS Batch API end to end, and ``fnmap deploy batch`` against moto's server.

Everything runs on a CPU-only machine: the emulator then sets ``CUDA_VISIBLE_DEVICES=""``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import EmulatorProcess, until

import fnmap
from fnmap import dispatch
from fnmap.backends import batch as batch_backend
from fnmap.client import get_client
from fnmap.config import resolve
from fnmap.emulator import batch_api, batch_jobs
from fnmap.runtime import container, keys, outcome, signing
from fnmap.runtime.serialization import dumps, loads, pickle_function, runtime_info
from fnmap.runtime.wire import CallRequest, encode
from fnmap.storage import open_store

# -- plain decisions ------------------------------------------------------------------------------


def test_plan_arrays_splits_above_the_array_limit_into_even_parts():
    assert batch_backend.plan_arrays(1) == [(0, 1)]
    assert batch_backend.plan_arrays(10_000) == [(0, 10_000)]
    assert batch_backend.plan_arrays(10_001) == [(0, 5_001), (5_001, 5_000)]
    plan = batch_backend.plan_arrays(25_003)
    assert len(plan) == 3 and sum(size for _, size in plan) == 25_003
    assert all(2 <= size <= 10_000 for _, size in plan)
    assert [start for start, _ in plan] == [0, plan[0][1], plan[0][1] + plan[1][1]]
    assert batch_backend.plan_arrays(7, limit=3) == [(0, 3), (3, 2), (5, 2)]


def test_gpus_are_lent_one_child_at_a_time():
    devices = batch_jobs.Devices(["0", "1", "2"])
    first, second = devices.take(2, lambda: True), devices.take(1, lambda: True)
    assert (first, second) == (["0", "1"], ["2"])
    assert devices.take(1, lambda: False) is None  # none free: it would wait; no longer wanted
    devices.give_back(first)
    assert devices.take(2, lambda: True) == ["0", "1"]
    assert batch_jobs.Devices([]).take(1, lambda: True) == []  # a CPU machine: the child sees no GPU
    assert devices.take(0, lambda: True) == []  # a CPU job sees no GPU either
    assert "asks for 4 GPUs per child but this machine has 3" in devices.refusal(4)
    assert devices.refusal(3) is None and batch_jobs.Devices([]).refusal(2) is None
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-aa)\nGPU 1: NVIDIA H200 (UUID: GPU-bb)\n"
    assert batch_jobs.visible_gpus(listing) == ["0", "1"]
    assert batch_jobs.visible_gpus(listing, "1") == ["1"]  # the emulator's own CUDA_VISIBLE_DEVICES
    assert batch_jobs.visible_gpus(listing, "GPU-bb,0") == ["GPU-bb", "0"]
    assert batch_jobs.visible_gpus(listing, "") == []
    assert batch_jobs.visible_gpus("No devices were found\n") == []


def test_retry_strategy_rules_and_command():
    rules = batch_backend.retry_strategy(2)["evaluateOnExit"]
    assert batch_backend.retry_strategy(2)["attempts"] == 3
    assert batch_backend.retry_strategy(50)["attempts"] == 10
    assert batch_jobs.retry_action(rules, None, "Host EC2 (i-1) terminated.", "") == "RETRY"
    assert batch_jobs.retry_action(rules, 1, "Essential container in task exited", "boom") == "EXIT"
    assert batch_jobs.retry_action([], 1, "", "") == "RETRY"
    assert batch_jobs.retry_action([{"onExitCode": "7*", "action": "retry"}], 75, "", "") == "RETRY"
    command = batch_jobs.command_for(
        container.COMMAND, {"store": "file:///s", "prefix": "jobs/j/requests/a/"}
    )
    assert command == [
        sys.executable,
        "-m",
        "handlers.container",
        "file:///s",
        "jobs/j/requests/a/",
    ]


def test_resources_and_timeout_of_a_submission():
    config = resolve(gpu=2, memory=16000, timeout=30, backend="batch")
    assert batch_backend.container_overrides(config, 16000) == {
        "resourceRequirements": [
            {"type": "GPU", "value": "2"},
            {"type": "MEMORY", "value": "16000"},
        ]
    }
    assert batch_backend.job_timeout(30) == {"attemptDurationSeconds": 90}
    assert batch_backend.job_timeout(None) is None
    assert batch_backend.container_overrides(resolve(backend="batch")) == {}


def test_failed_child_faults():
    kind = lambda *a: batch_backend.fault_for("j:1", *a).kind  # noqa: E731
    assert kind("Essential container in task exited", container.EXIT_PLATFORM, None) == "server"
    assert kind("Essential container in task exited", container.EXIT_REJECTED, None) == "rejected"
    assert kind("Essential container in task exited", container.EXIT_RETRY, None) == "server"
    assert (
        kind("Essential container in task exited", 137, "OutOfMemoryError: Container killed")
        == "out_of_memory"
    )
    assert kind("Job attempt duration exceeded timeout", None, None) == "timeout"
    fault = batch_backend.fault_for("j:1", "Host EC2 terminated", None, None, "log/1")
    assert fault.kind == "crashed" and "j:1" in fault.message and "log/1" in fault.message


def test_gpu_routes_to_the_batch_backend(monkeypatch):
    config = resolve(gpu=1, memory=16000)
    assert config.backend == "batch"
    assert "gpu=1" in config.describe("backend")
    assert resolve(gpu=1, backend="local").backend == "local"  # an explicit backend wins
    assert resolve().backend == "emulator"
    monkeypatch.setenv("FNMAP_BACKEND", "emulator")
    assert resolve(gpu=1).backend == "emulator"


def test_batch_backend_without_aws_settings_says_how_to_run_offline(monkeypatch, tmp_path):
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(
        fnmap.FnmapError, match="AWS_ENDPOINT_URL_BATCH to a local `fnmap emulator`"
    ):
        batch_backend.BatchBackend(resolve(gpu=1, backend="batch"))  # gpu= alone runs offline (issue 12)


def test_batch_backend_on_aws_needs_s3_storage(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(fnmap.FnmapError, match="cannot read the local folder"):
        batch_backend.BatchBackend(resolve(backend="batch"))


# -- the container entrypoint ---------------------------------------------------------------------


def _square(x):
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * x


def _write_requests(store_url: str, secret: str, items: list) -> tuple[str, str]:
    """What the batch backend writes for an array job: one signed request per index."""
    store = open_store(store_url)
    digest, data = pickle_function(_square)
    store.put(keys.function_key(digest), data)
    job_id = keys.new_job_id()
    store.put(keys.job_record_key(job_id), b"{}")  # the worker serves calls of jobs with a record
    prefix = container.request_prefix(job_id, "a1")
    for index, item in enumerate(items):
        req = CallRequest(
            job_id=job_id,
            call_id=index,
            func_key=keys.function_key(digest),
            store_url=store_url,
            runtime=runtime_info(),
            first_index=index,
        )
        body = encode(req, dumps(("one", [item])))
        store.put(
            container.request_key(prefix, index),
            container.pack_request(signing.sign(secret.encode(), body), body),
        )
    return job_id, prefix


def _outcomes(store, job_id: str, call_id: int, secret: str) -> list:
    """A call's committed outcomes, one per item (either form), checked with the secret as the
    client checks them."""
    key = keys.result_key(job_id, call_id)
    return outcome.each(loads(signing.unseal(secret.encode(), key, store.get(key))))


def _run_entrypoint(store_url: str, prefix: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in container.INDEX_VARIABLES}
    return subprocess.run(
        [sys.executable, "-m", "handlers.container", store_url, prefix],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_container_entrypoint_runs_its_index_from_job_completion_index(storage_root):
    store_url = storage_root.as_uri()
    secret = signing.new_secret()
    job_id, prefix = _write_requests(store_url, secret, [3, 4, -1])
    done = _run_entrypoint(store_url, prefix, JOB_COMPLETION_INDEX="1", FNMAP_SECRET=secret)
    assert done.returncode == container.EXIT_OK, done.stderr
    store = open_store(store_url)
    assert _outcomes(store, job_id, 1, secret) == [("ok", 16)]
    assert not store.exists(keys.result_key(job_id, 0))  # only its own index ran
    # A user exception is a result, not a platform error: exit 0, the error committed.
    done = _run_entrypoint(store_url, prefix, AWS_BATCH_JOB_ARRAY_INDEX="2", FNMAP_SECRET=secret)
    assert done.returncode == container.EXIT_OK, done.stderr
    assert _outcomes(store, job_id, 2, secret)[0][0] == "err"


def test_container_entrypoint_exit_codes(storage_root):
    store_url = storage_root.as_uri()
    secret = signing.new_secret()
    job_id, prefix = _write_requests(store_url, secret, [5])
    wrong = _run_entrypoint(
        store_url, prefix, JOB_COMPLETION_INDEX="0", FNMAP_SECRET="not-the-secret"
    )
    assert wrong.returncode == container.EXIT_REJECTED and "403" in wrong.stderr
    missing = _run_entrypoint(store_url, prefix, JOB_COMPLETION_INDEX="7", FNMAP_SECRET=secret)
    assert (
        missing.returncode == container.EXIT_PLATFORM and "cannot read request 7" in missing.stderr
    )
    bad = _run_entrypoint(store_url, prefix, JOB_COMPLETION_INDEX="x", FNMAP_SECRET=secret)
    assert bad.returncode == container.EXIT_REJECTED and "JOB_COMPLETION_INDEX='x'" in bad.stderr
    single = _run_entrypoint(
        store_url, prefix, FNMAP_SECRET=secret
    )  # no index: a single job, index 0
    assert single.returncode == container.EXIT_OK, single.stderr
    assert _outcomes(open_store(store_url), job_id, 0, secret) == [("ok", 25)]


# -- end to end through the emulated AWS Batch API ------------------------------------------------


@pytest.fixture(scope="module")
def _module_batch_emulator():
    """One emulator speaking the Batch API for this module's tests (stopped after them): each test
    sees only the jobs it submitted (``_jobs``), so none depends on a fresh one."""
    import boto3

    emu = EmulatorProcess(workers=1, env={batch_api.CONCURRENCY_ENV: "2"})
    try:
        emu.batch = boto3.client(
            "batch",
            endpoint_url=emu.url,
            region_name="us-east-1",
            aws_access_key_id=emu.aws_environment["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=emu.aws_environment["AWS_SECRET_ACCESS_KEY"],
        )
        yield emu
        # Close the keep-alive connections to it, so that the emulator stops at once.
        emu.batch.close()
    finally:
        emu.stop()


@pytest.fixture
def batch_emulator(_module_batch_emulator, monkeypatch):
    """The module's emulator speaking the Batch API; boto3 pointed at it by ``AWS_ENDPOINT_URL_BATCH``."""
    emu = _module_batch_emulator
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", emu.url)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    for key, value in emu.aws_environment.items():  # fnmap's own Batch client signs with them
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(batch_backend.BatchBackend, "status_interval", 0.2)
    # The jobs of the module's earlier tests, in any status: _jobs leaves them out.
    emu.earlier = {j["jobId"] for status in _STATUSES
                   for j in emu.batch.list_jobs(jobQueue="fnmap", jobStatus=status)["jobSummaryList"]}
    yield emu
    get_client(resolve(backend="batch")).close()


_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


def _jobs(emu, status: str, count: int) -> list[dict]:
    """The queue's jobs in ``status`` submitted by this test, once there are ``count`` of them (a
    child process may still be exiting after the result it wrote came back)."""
    deadline = time.monotonic() + 20
    while True:
        jobs = [j for j in emu.batch.list_jobs(jobQueue="fnmap", jobStatus=status)["jobSummaryList"]
                if j["jobId"] not in emu.earlier]
        if len(jobs) >= count or time.monotonic() > deadline:
            return jobs
        time.sleep(0.1)


def _where(x):
    return (
        x * 10,
        os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX"),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def test_gpu_map_runs_as_one_array_job_through_the_emulator(batch_emulator):
    results = fnmap.map(_where, range(6), gpu=1, memory=4000)
    assert [value for value, _, _ in results] == [0, 10, 20, 30, 40, 50]
    assert sorted(int(index) for _, index, _ in results) == list(range(6))
    gpus = batch_jobs.detect_gpus()
    assert all(devices == ("" if not gpus else devices) for _, _, devices in results)
    jobs = _jobs(batch_emulator, "SUCCEEDED", 1)
    assert len(jobs) == 1 and jobs[0]["arrayProperties"]["size"] == 6  # one array job per fnmap job
    detail = batch_emulator.batch.describe_jobs(jobs=[jobs[0]["jobId"]])["jobs"][0]
    assert detail["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 6
    assert {"type": "GPU", "value": "1"} in detail["container"]["resourceRequirements"]
    children = batch_emulator.batch.list_jobs(arrayJobId=jobs[0]["jobId"], jobStatus="SUCCEEDED")
    assert sorted(c["arrayProperties"]["index"] for c in children["jobSummaryList"]) == list(
        range(6)
    )


def _crash_on_one(x):
    if x == 1:
        os.kill(os.getpid(), 9)  # the container dies, as when it runs out of memory
    if x == 2:
        raise KeyError("two")
    return x


def test_failed_children_are_retried_then_reported(batch_emulator):
    out = fnmap.map(_crash_on_one, range(3), backend="batch", retries=1, return_exceptions=True)
    assert out[0] == 0
    assert isinstance(out[1], fnmap.WorkerCrashed) and "exit code 137" in str(out[1])
    assert isinstance(out[2], KeyError)  # a user exception is a result, not a platform failure
    failed = _jobs(batch_emulator, "FAILED", 2)
    # The array job, then one single job re-running call 1 (retries=1).
    assert sorted(j.get("arrayProperties", {}).get("size", 1) for j in failed) == [1, 3]


def _fail_first(x):
    if x == 0:
        raise ValueError("item 0 is bad")
    time.sleep(120)
    return x


def test_an_abandoned_map_terminates_its_array_job(batch_emulator):
    """When a map raises its first failure, the containers still queued or running are stopped."""
    job = fnmap.map(_fail_first, range(4), backend="batch", retries=0, return_job=True)
    with pytest.raises(ValueError, match="item 0 is bad"):
        job.results()
    assert job.wait(60)  # every call accounted for: the stopped ones failed, none left waiting
    b = batch_emulator.batch
    array = _jobs(batch_emulator, "FAILED", 1)[0]["jobId"]
    children = [b.describe_jobs(jobs=[f"{array}:{i}"])["jobs"][0] for i in range(4)]
    # Child 0 wrote its error result; it may still have been exiting when the array was stopped.
    assert [c["status"] for c in children[1:]] == ["FAILED"] * 3
    assert all(c["statusReason"].startswith("cancelled by the fnmap client") for c in children[1:]), \
        [c["statusReason"] for c in children]
    assert job.summary()["done"] == 4


def test_executor_submits_in_a_loop_become_one_array_job(batch_emulator, monkeypatch):
    monkeypatch.setattr(dispatch, "COALESCE_SECONDS", 1.0)  # a loaded machine's pauses stay inside
    with fnmap.Executor(backend="batch") as ex:
        # The first submit sets up the client and stores the function (a second or more on a
        # loaded machine): done first, so the loop's submits come within the coalescing window.
        assert ex.submit(_square, 12).result(timeout=120) == 144
        futures = [ex.submit(_square, i) for i in range(12)]
        assert [f.result(timeout=120) for f in futures] == [i * i for i in range(12)]
    jobs = _jobs(batch_emulator, "SUCCEEDED", 2)
    assert len(jobs) == 2
    assert sorted(j.get("arrayProperties", {}).get("size", 1) for j in jobs) == [1, 12]


def test_submits_that_keep_coming_slowly_are_still_one_array_job(batch_emulator, monkeypatch):
    """The calls wait until no submit has come for a moment, not a fixed time from the first one:
    a loop that takes a while per submit (pickling big arguments, say) still makes one array job.

    The window is widened here (1 s quiet, 20 s at most) so that a loaded machine's pauses between
    submits stay well inside it, while the loop as a whole (8 x 0.3 s) is longer than one window: a
    window counted from the first submit splits it."""
    monkeypatch.setattr(dispatch, "COALESCE_SECONDS", 1.0)
    monkeypatch.setattr(dispatch, "COALESCE_MAX_SECONDS", 20.0)
    with fnmap.Executor(backend="batch") as ex:
        # The first submit sets up the client and stores the function: done before the loop.
        assert ex.submit(_square, 12).result(timeout=120) == 144
        futures = []
        for i in range(8):
            futures.append(ex.submit(_square, i))
            time.sleep(0.3)
        assert [f.result(timeout=120) for f in futures] == [i * i for i in range(8)]
    jobs = _jobs(batch_emulator, "SUCCEEDED", 2)
    assert sorted(j.get("arrayProperties", {}).get("size", 1) for j in jobs) == [1, 8]


def test_unknown_job_definition_is_a_clear_error(batch_emulator):
    try:
        with pytest.raises(
            fnmap.PlatformError, match="Job definition nope does not exist.*fnmap deploy batch"
        ):
            fnmap.map(_square, [1, 2], backend="batch", job_definition="nope", retries=0)
    finally:
        get_client(resolve(backend="batch", job_definition="nope")).close()


_PROBE = (
    "import os, sys, time\n"
    "index = int(os.environ['AWS_BATCH_JOB_ARRAY_INDEX'])\n"
    "gpus = repr(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    "print('attempt', os.environ['AWS_BATCH_JOB_ATTEMPT'], 'gpus', gpus)\n"
    "time.sleep(float(sys.argv[1]) if index == 2 else 0)\n"
    "sys.exit(3 if index == 1 else 0)\n"
)


def test_emulated_batch_api_retries_and_terminates_children(batch_emulator):
    from botocore.exceptions import ClientError

    b = batch_emulator.batch
    definition = b.register_job_definition(
        jobDefinitionName="probe",
        type="container",
        parameters={"sleep": "0"},
        containerProperties={"image": "probe", "command": ["python", "-c", _PROBE, "Ref::sleep"]},
    )
    assert definition["revision"] == 1
    job_id = b.submit_job(
        jobName="probe",
        jobQueue="anything",
        jobDefinition="probe:1",
        arrayProperties={"size": 3},
        parameters={"sleep": "60"},
        retryStrategy={
            "attempts": 2,
            "evaluateOnExit": [
                {"onExitCode": "3", "action": "RETRY"},
                {"onReason": "*", "action": "EXIT"},
            ],
        },
    )["jobId"]

    def child(index):
        return b.describe_jobs(jobs=[f"{job_id}:{index}"])["jobs"][0]

    failed = until(lambda: child(1)["status"] == "FAILED" and child(1))
    assert len(failed["attempts"]) == 2 and failed["container"]["exitCode"] == 3
    assert failed["container"]["reason"] == "attempt 2 gpus ''"  # the last line of its output
    until(lambda: child(2)["status"] == "RUNNING")
    b.terminate_job(jobId=job_id, reason="enough")
    stopped = until(lambda: child(2)["status"] == "FAILED" and child(2))
    assert stopped["statusReason"] == "enough"
    parent = until(
        lambda: (j := b.describe_jobs(jobs=[job_id])["jobs"][0])["status"] == "FAILED" and j
    )
    summary = parent["arrayProperties"]["statusSummary"]
    assert (summary["SUCCEEDED"], summary["FAILED"]) == (1, 2)
    with pytest.raises(ClientError, match="array size 1 must be between 2 and 10000"):
        b.submit_job(jobName="x", jobQueue="q", jobDefinition="probe", arrayProperties={"size": 1})


# -- fnmap deploy batch against moto's server ------------------------------------------------------


def test_deploy_batch_is_idempotent_and_destroys(s3_server, monkeypatch, capsys):
    import boto3

    from fnmap.cli import main as cli

    for service in ("BATCH", "EC2", "IAM", "S3", "STS"):
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service}", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    iam = boto3.client("iam")
    trust = '{"Version": "2012-10-17", "Statement": []}'
    # Names of our own: the moto server is shared by the whole test session.
    role = iam.create_role(RoleName="fnmap-test-batch-service", AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName="fnmap-test-batch-instance")
    batch = boto3.client("batch")
    deploy = [
        "deploy",
        "batch",
        "deploy",
        "--name",
        "gpu-test",
        "--image",
        "123.dkr.ecr/fnmap-gpu:1",
        "--service-role",
        role["Role"]["Arn"],
        "--instance-role",
        "fnmap-test-batch-instance",
        "--secret",
        "s3cret",
    ]

    assert cli(deploy) == 0
    assert "(new revision)" in capsys.readouterr().out
    environment = batch.describe_compute_environments(computeEnvironments=["gpu-test"])[
        "computeEnvironments"
    ][0]
    assert environment["computeResources"]["instanceTypes"] == ["g5"]
    assert environment["computeResources"]["minvCpus"] == 0
    queue = batch.describe_job_queues(jobQueues=["gpu-test"])["jobQueues"][0]
    assert (
        queue["computeEnvironmentOrder"][0]["computeEnvironment"]
        == environment["computeEnvironmentArn"]
    )
    (definition,) = batch.describe_job_definitions(jobDefinitionName="gpu-test", status="ACTIVE")[
        "jobDefinitions"
    ]
    properties = definition["containerProperties"]
    assert properties["command"] == container.COMMAND
    assert {"type": "GPU", "value": "1"} in properties["resourceRequirements"]
    assert {"name": "FNMAP_SECRET", "value": "s3cret"} in properties["environment"]

    assert cli(deploy) == 0  # again: nothing changes
    assert "(unchanged)" in capsys.readouterr().out
    assert len(batch.describe_job_definitions(jobDefinitionName="gpu-test")["jobDefinitions"]) == 1

    assert cli([*deploy[:-2], "--memory", "32000"]) == 0  # the secret is kept, the memory changes
    assert "(new revision)" in capsys.readouterr().out
    revisions = batch.describe_job_definitions(jobDefinitionName="gpu-test", status="ACTIVE")[
        "jobDefinitions"
    ]
    latest = max(revisions, key=lambda d: d["revision"])
    assert {"type": "MEMORY", "value": "32000"} in latest["containerProperties"][
        "resourceRequirements"
    ]
    assert {"name": "FNMAP_SECRET", "value": "s3cret"} in latest["containerProperties"][
        "environment"
    ]

    assert cli(["deploy", "batch", "destroy", "--name", "gpu-test"]) == 0
    assert not batch.describe_job_queues(jobQueues=["gpu-test"])["jobQueues"]
    assert not batch.describe_compute_environments(computeEnvironments=["gpu-test"])[
        "computeEnvironments"
    ]
    assert not batch.describe_job_definitions(jobDefinitionName="gpu-test", status="ACTIVE")[
        "jobDefinitions"
    ]
    assert cli(["deploy", "batch", "destroy", "--name", "gpu-test"]) == 0
    assert "nothing named gpu-test" in capsys.readouterr().out


def _definition_view(x):
    return x + 1, os.environ.get("FNMAP_SECRET") is not None, os.environ.get("AWS_BATCH_JOB_ID")


def test_children_run_the_job_definition_that_deploy_registers(batch_emulator):
    """The emulated Batch API runs each child with the command and environment of the registered job
    definition: the spec `fnmap deploy batch` builds, registered by its own code, not a fixed entrypoint."""
    from fnmap.deploy.batch import ensure_job_definition, job_definition_spec

    spec = job_definition_spec("fnmap-gpu:test", batch_emulator.secret, vcpus=1, memory=2048, gpu=0)
    ensure_job_definition(batch_emulator.batch, "deployed", spec)
    out = fnmap.map(_definition_view, range(3), backend="batch", job_definition="deployed")
    assert [value for value, _, _ in out] == [1, 2, 3]
    assert all(has_secret and job_id for _, has_secret, job_id in out)

    # The same definition without the secret: the children cannot verify a call, as on AWS.
    broken = dict(spec, containerProperties=dict(spec["containerProperties"], environment=[]))
    batch_emulator.batch.register_job_definition(jobDefinitionName="no-secret", **broken)
    with pytest.raises(fnmap.FnmapError):
        fnmap.map(_definition_view, range(2), backend="batch", job_definition="no-secret", retries=0)
    # A wrong command fails too.
    wrong = dict(spec, containerProperties=dict(spec["containerProperties"],
                                                command=["python", "-m", "handlers.no_such_entrypoint"]))
    batch_emulator.batch.register_job_definition(jobDefinitionName="wrong-command", **wrong)
    with pytest.raises(fnmap.FnmapError):
        fnmap.map(_definition_view, range(2), backend="batch", job_definition="wrong-command", retries=0)
