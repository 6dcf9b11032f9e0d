"""``fnmap deploy aws`` / ``python -m infra.aws`` against moto's server on loopback, and the built zip.

The control-plane calls (S3, IAM, CloudWatch Logs, Lambda, STS) go to moto
through boto3's ``AWS_ENDPOINT_URL``; nothing is mocked in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile

import boto3
import pytest

import fnmap
from fnmap.cli import main as cli_main
from fnmap.deploy.aws import LIFECYCLE_RULE_ID, TAG, Deployment, Settings
from fnmap.deploy.package import UNZIPPED_LIMIT, build_zip, unzipped_size
from fnmap.runtime.serialization import FNMAP_PROTOCOL

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def moto_aws(s3_server, monkeypatch):
    """Every AWS service of boto3 pointed at moto; returns a client factory."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return lambda service: boto3.client(service, region_name="us-east-1")


def _name() -> str:
    return f"fnmap-t{uuid.uuid4().hex[:8]}"


def test_deploy_is_idempotent_and_destroy_removes_it_all(moto_aws, capsys):
    name = _name()
    bucket = f"{name}-data"
    args = ["deploy", "aws", "deploy", "--name", name, "--bucket", bucket, "--concurrency", "5",
            "--memory", "512", "--timeout", "120"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    settings = dict(line.split("export ", 1)[1].split("=", 1) for line in printed.splitlines()
                    if "export FNMAP_" in line)
    assert settings["FNMAP_BACKEND"] == "aws" and settings["FNMAP_FUNCTION_NAME"] == name
    assert settings["FNMAP_STORAGE"] == f"s3://{bucket}/fnmap"
    assert "function URL (AWS_IAM auth" in printed

    lam, iam, s3, logs = (moto_aws(s) for s in ("lambda", "iam", "s3", "logs"))
    function = lam.get_function(FunctionName=name)
    config = function["Configuration"]
    assert config["Handler"] == "handlers.aws_lambda.handler"
    assert config["Runtime"] == f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert config["MemorySize"] == 512 and config["Timeout"] == 120
    assert config["Environment"]["Variables"]["FNMAP_SECRET"] == settings["FNMAP_SECRET"]
    assert function["Tags"][TAG] == name
    assert lam.get_function_concurrency(FunctionName=name)["ReservedConcurrentExecutions"] == 5
    assert lam.get_function_url_config(FunctionName=name)["AuthType"] == "AWS_IAM"
    events = lam.get_function_event_invoke_config(FunctionName=name)
    assert (events["MaximumRetryAttempts"], events["MaximumEventAgeInSeconds"]) == (0, 300)  # lost after 300 + 120 s

    policy = iam.get_role_policy(RoleName=f"{name}-lambda", PolicyName="fnmap")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    resources = {s["Sid"]: s["Resource"] for s in policy["Statement"]}
    assert resources["JobData"] == f"arn:aws:s3:::{bucket}/fnmap/*"
    assert resources["Logs"].endswith(f":log-group:/aws/lambda/{name}:*")
    assert resources["FanOut"].endswith(f":function:{name}")  # spawners invoke the function itself
    assert all("*" != r for r in resources.values())  # nothing account-wide

    rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [r["Filter"]["Prefix"] for r in rules if r["ID"] == LIFECYCLE_RULE_ID] == ["fnmap/jobs/"]
    groups = logs.describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{name}")["logGroups"]
    assert groups[0]["retentionInDays"] == 14

    # A second deploy updates in place and keeps the secret clients already use.
    assert cli_main(args[:-2] + ["--timeout", "300"]) == 0
    again = capsys.readouterr().out
    assert f"FNMAP_SECRET={settings['FNMAP_SECRET']}" in again and "updated" in again
    assert lam.get_function_configuration(FunctionName=name)["Timeout"] == 300
    # ... and says what it changed.
    assert f"function {name}: secret kept (the clients' FNMAP_SECRET still works)" in again, again
    assert f"function {name}: Timeout 120 -> 300 s" in again and "MemorySize" not in again, again
    assert cli_main(args + ["--rotate-secret"]) == 0
    rotated = capsys.readouterr().out
    assert f"function {name}: NEW secret (--rotate-secret): every client needs the FNMAP_SECRET" in rotated, rotated
    assert f"function {name}: Timeout 300 -> 120 s" in rotated and f"FNMAP_SECRET={settings['FNMAP_SECRET']}" \
        not in rotated, rotated

    assert cli_main(["deploy", "aws", "destroy", "--name", name, "--bucket", bucket]) == 0
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function(FunctionName=name)
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=f"{name}-lambda")
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert not logs.describe_log_groups(logGroupNamePrefix=f"/aws/lambda/{name}")["logGroups"]
    # Destroying again finds nothing and says so.
    assert cli_main(["deploy", "aws", "destroy", "--name", name, "--bucket", bucket]) == 0
    assert "removed nothing" in capsys.readouterr().out


def test_a_bucket_deploy_did_not_create_is_kept(moto_aws):
    name = _name()
    s3 = moto_aws("s3")
    bucket = f"{name}-mine"
    s3.create_bucket(Bucket=bucket)
    mine = {"ID": "my-rule", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [mine]})
    s3.put_object(Bucket=bucket, Key="keep/me", Body=b"1")
    out = []
    deployment = Deployment(Settings(name=name, bucket=bucket, concurrency=0), out=out.append)
    deployment.deploy()
    assert {r["ID"] for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]} == {
        "my-rule", LIFECYCLE_RULE_ID}
    removed = deployment.destroy()
    assert any("lifecycle rule" in r for r in removed)
    assert [r["ID"] for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]] == ["my-rule"]
    assert s3.get_object(Bucket=bucket, Key="keep/me")["Body"].read() == b"1"


def test_update_without_a_deployment_says_what_to_do(moto_aws):
    deployment = Deployment(Settings(name=_name()), out=lambda line: None)
    with pytest.raises(fnmap.ConfigError, match="to update: run `deploy` first"):
        deployment.deploy(update_only=True)


def test_a_function_deploy_did_not_create_is_left_alone(moto_aws):
    name = _name()
    iam, lam = moto_aws("iam"), moto_aws("lambda")
    role = iam.create_role(RoleName=f"{name}-other", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lam.create_function(FunctionName=name, Runtime="python3.11", Role=role, Handler="x.y",
                        Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18})
    with pytest.raises(fnmap.ConfigError, match="not created by `fnmap deploy aws`"):
        Deployment(Settings(name=name), out=lambda line: None).destroy()
    assert lam.get_function(FunctionName=name)


def test_client_finds_a_version_mismatch_before_sending(moto_aws, monkeypatch):
    name = _name()
    deployment = Deployment(Settings(name=name, concurrency=0), out=lambda line: None)
    result = deployment.deploy()
    lam = moto_aws("lambda")
    env = lam.get_function_configuration(FunctionName=name)["Environment"]["Variables"]
    env["FNMAP_RUNTIME"] = json.dumps({"protocol": FNMAP_PROTOCOL, "python": "3.9", "cloudpickle": "2.2.1"})
    lam.update_function_configuration(FunctionName=name, Environment={"Variables": env})
    with pytest.raises(fnmap.VersionMismatch, match="Python 3.9") as info:
        fnmap.map(abs, [1], backend="aws", function_name=name, storage=result["FNMAP_STORAGE"],
                  secret=result["FNMAP_SECRET"])
    assert "cloudpickle" in str(info.value) and name in str(info.value)
    deployment.destroy()


def test_client_names_a_missing_function(moto_aws):
    with pytest.raises(fnmap.ConfigError, match="does not exist.*fnmap deploy aws deploy --name no-such-fn"):
        fnmap.map(abs, [1], backend="aws", function_name="no-such-fn", secret="x" * 64,
                  storage="s3://unused-bucket/p")


def test_zip_holds_what_the_handler_imports_and_fits_lambda(tmp_path):
    path = build_zip(str(tmp_path / "fnmap.zip"))
    names = set(zipfile.ZipFile(path).namelist())
    assert {"handlers/aws_lambda.py", "fnmap/runtime/worker.py", "fnmap/runtime/lambda_event.py",
            "cloudpickle/__init__.py"} <= names
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    size = unzipped_size(path)
    assert size < UNZIPPED_LIMIT and size < 5 * 2**20, size
    # Reproducible: the same sources give the same bytes (so an unchanged redeploy uploads nothing).
    with open(path, "rb") as a, open(build_zip(str(tmp_path / "again.zip")), "rb") as b:
        assert a.read() == b.read()
    # The handler imports from the zip alone: no site-packages, no PYTHONPATH (-I -S), as on Lambda.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import handlers.aws_lambda as h, fnmap.runtime.worker;"
            "print(h.__file__); print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "('flask', 'requests', 'boto3', 'dask', 'tqdm')))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, path], capture_output=True, text=True,
                         env={"FNMAP_SECRET": "s", "PATH": os.environ.get("PATH", "")}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(path) and lines[1] == "[]"


def test_deploy_without_credentials_fails_in_one_line(s3_server, monkeypatch, tmp_path, capsys):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    assert cli_main(["deploy", "aws", "deploy", "--region", "us-east-1"]) == 1
    err = capsys.readouterr().err
    assert "deploy of 'fnmap' stopped" in err and "credentials" in err and "Traceback" not in err
