"""``fnmap emulator --aws``: one command, and a shell that runs its exports reaches the AWS path offline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import boto3
import pytest


@pytest.fixture
def offline_aws(tmp_path):
    """``fnmap emulator --aws`` in a clean environment; yields its export lines; stopped after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    env_file = tmp_path / "offline.env"
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "emulator", "--aws", "--port", "0", "--workers", "2",
                             "--env-file", str(env_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        exports = []
        for line in proc.stdout:
            if line.startswith("export "):
                exports.append(line.strip())
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"the emulator did not start: {proc.stderr.read()}")
        yield exports, env, env_file
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_a_shell_that_runs_the_exports_maps_through_lambda_and_s3(offline_aws, tmp_path):
    exports, env, env_file = offline_aws
    names = {line.split()[1].split("=", 1)[0] for line in exports}
    assert {"FNMAP_BACKEND", "FNMAP_STORAGE", "FNMAP_SECRET", "AWS_ENDPOINT_URL_LAMBDA",
            "AWS_ENDPOINT_URL_S3"} <= names
    assert env_file.read_text().splitlines() == exports
    script = f"source {env_file}\npython -c 'import fnmap; print(fnmap.map(abs, [-1, -2, 3]))'\n"
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "[1, 2, 3]"
    settings = dict(line.split()[1].split("=", 1) for line in exports)
    s3 = boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                      aws_access_key_id="offline", aws_secret_access_key="offline")
    stored = s3.list_objects_v2(Bucket="fnmap-offline", Prefix="fnmap/jobs/").get("Contents", [])
    assert any("/out/" in obj["Key"] for obj in stored), "the results did not go through S3"


def test_an_aws_job_whose_worker_cannot_reach_s3_fails_at_once_naming_the_storage(s3_env, monkeypatch):
    """The emulator's Lambda environments were given no working S3 endpoint (the slip ``--aws`` prevents):
    the client reaches S3 but the worker cannot, and the job fails on its first attempt, not after minutes."""
    from conftest import EmulatorProcess

    import fnmap

    bucket = s3_env("fnmap-worker-cannot-reach")
    emulator = EmulatorProcess(env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
                                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", emulator.url)
    started = time.monotonic()
    try:
        with pytest.raises(fnmap.StorageError) as info:
            fnmap.map(abs, [-1, -2], backend="aws", storage=f"s3://{bucket}/p", secret=emulator.secret, retries=2)
    finally:
        from fnmap import client

        for c in list(client._clients.values()):
            if c.config.backend == "aws":
                c.close()
        emulator.stop()
    took = time.monotonic() - started
    message = str(info.value)
    assert f"the worker cannot reach storage s3://{bucket}/p" in message, message
    assert "AWS_ENDPOINT_URL_S3" in message and "failed after 1 attempt(s)" in message, message
    assert took < 30, f"the job took {took:.0f} s to fail"


@pytest.mark.parametrize("error", ["EndpointConnectionError", "ConnectTimeoutError"])
def test_the_s3_client_gives_up_on_an_endpoint_it_cannot_connect_to_after_a_few_attempts(error, monkeypatch):
    """Refused, unresolvable, or silently dropped (a function with no route to S3): a few attempts of at most
    10 s each, not botocore's ten adaptive attempts of 60 s, so the worker reports the storage URL in time."""
    import botocore.exceptions

    from fnmap.storage.s3 import UNREACHABLE_ATTEMPTS, make_s3_client

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = make_s3_client()
    assert client.meta.config.connect_timeout <= 10
    caught = getattr(botocore.exceptions, error)(endpoint_url="http://10.255.255.1:9000/b/k")

    def retry_asked(attempts: int):
        return client.meta.events.emit("needs-retry.s3.GetObject", response=None, endpoint=None,
                                       operation=client.meta.service_model.operation_model("GetObject"),
                                       attempts=attempts, caught_exception=caught, request_dict={"context": {}})

    retry_asked(1)  # botocore's own retry mode decides the first attempts
    with pytest.raises(type(caught)):
        retry_asked(UNREACHABLE_ATTEMPTS)


def test_without_moto_the_error_names_the_extra_to_install(tmp_path):
    fake = tmp_path / "site" / "moto"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("No module named moto")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    env["PYTHONPATH"] = str(fake.parent)
    done = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "--aws", "--port", "0"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode != 0 and done.stdout == ""
    assert "pip install 'fnmap[aws-offline]'" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_offline_s3_takes_a_put_over_the_emulators_body_limit_and_serves_the_other_services_too():
    from fnmap.emulator.offline_aws import MotoServer

    server = MotoServer()
    try:
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1",
                "endpoint_url": server.url}
        s3 = boto3.client("s3", **keys)
        bucket = f"fnmap-big-{os.getpid()}-{time.monotonic_ns()}"
        s3.create_bucket(Bucket=bucket)
        data = bytes(65 << 20) + b"end"  # over the 64 MiB the emulator's own API takes; one PutObject takes 5 GiB
        s3.put_object(Bucket=bucket, Key="big", Body=data)
        assert s3.head_object(Bucket=bucket, Key="big")["ContentLength"] == len(data)
        # IAM and STS (fnmap deploy aws) go through moto's dispatcher, not its S3 application
        iam = boto3.client("iam", **keys)
        role = f"fnmap-offline-{os.getpid()}-{time.monotonic_ns()}"
        iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")
        assert iam.get_role(RoleName=role)["Role"]["RoleName"] == role
        assert boto3.client("sts", **keys).get_caller_identity()["Account"]
    finally:
        server.close()
