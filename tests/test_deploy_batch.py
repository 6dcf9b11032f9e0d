"""``fnmap deploy batch`` on an empty AWS account: moto's server on loopback, a fresh account per test.

Each test gets an account of its own (moto switches accounts through STS AssumeRole), so nothing
another test made is there: only what AWS itself provides (the default VPC, AWS managed
policies, and where a test says so Batch's service-linked role).
"""

from __future__ import annotations

import json
import random
import uuid
from types import SimpleNamespace

import boto3
import botocore.handlers
import pytest
from botocore.exceptions import ClientError

from fnmap.cli import main as cli_main
from fnmap.deploy import batch as deploy_batch

pytestmark = pytest.mark.timeout(180)

ECS_INSTANCE_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/fnmap-gpu:1"


def _enter_new_account(s3_server: str, monkeypatch, managed_policies: bool) -> str:
    """Make boto3 (and so the CLI) act in a new, empty AWS account on the moto server; its id.
    ``managed_policies``: whether AWS managed policies exist there, as on AWS (the server runs in
    this process, so the setting reaches it)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true" if managed_policies else "false")
    account_id = str(random.randrange(10**11, 10**12))
    credentials = boto3.client("sts").assume_role(
        RoleArn=f"arn:aws:iam::{account_id}:role/tester", RoleSessionName="fnmap-test"
    )["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", credentials["SessionToken"])
    return account_id


@pytest.fixture
def account(s3_server, monkeypatch):
    """A new, empty AWS account on the moto server; boto3 (and so the CLI) acts in it."""
    account_id = _enter_new_account(s3_server, monkeypatch, managed_policies=True)
    session = boto3.Session(region_name="us-east-1")
    assert session.client("sts").get_caller_identity()["Account"] == account_id
    iam = session.client("iam")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()["InstanceProfiles"] == []
    return SimpleNamespace(
        id=account_id,
        iam=iam,
        batch=session.client("batch"),
        s3=session.client("s3"),
        ec2=session.client("ec2"),
        bucket=f"fnmap-{account_id}-us-east-1",
    )


def _trust(service: str) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


@pytest.fixture
def aws_calls(monkeypatch):
    """The names of the AWS operations every boto3 session makes from now on (a botocore handler
    that each new session registers; the calls themselves go to moto as usual)."""
    calls: list[str] = []

    def record(model, **_):
        calls.append(f"{model.service_model.service_name}:{model.name}")

    monkeypatch.setattr(botocore.handlers, "BUILTIN_HANDLERS", [*botocore.handlers.BUILTIN_HANDLERS,
                                                                ("before-call", record)])
    return calls


def _service_linked_role(account) -> str:
    """What AWS makes the first time anyone in the account uses Batch (moto's own
    create_service_linked_role would spell it AWSServiceRoleForbatch)."""
    return account.iam.create_role(
        RoleName="AWSServiceRoleForBatch", Path="/aws-service-role/batch.amazonaws.com/",
        AssumeRolePolicyDocument=json.dumps(_trust("batch.amazonaws.com")),
    )["Role"]["Arn"]


def _name() -> str:
    return f"fnb{uuid.uuid4().hex[:8]}"


def _roles(account) -> dict:
    return {r["RoleName"]: r for r in account.iam.list_roles()["Roles"]}


def _inline(account, role: str) -> dict:
    iam = account.iam
    return {p: iam.get_role_policy(RoleName=role, PolicyName=p)["PolicyDocument"]
            for p in iam.list_role_policies(RoleName=role)["PolicyNames"]}


def _snapshot(account, name: str) -> dict:
    """Everything deploy makes, as AWS describes it (minus what changes by itself)."""
    iam, batch = account.iam, account.batch
    roles = {}
    for role in (f"{name}-batch-instance", f"{name}-batch-job"):
        described = iam.get_role(RoleName=role)["Role"]
        roles[role] = {
            "arn": described["Arn"],
            "trust": described["AssumeRolePolicyDocument"],
            "inline": _inline(account, role),
            "attached": iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"],
            "tags": iam.list_role_tags(RoleName=role)["Tags"],
        }
    profile = iam.get_instance_profile(InstanceProfileName=f"{name}-batch-instance")["InstanceProfile"]
    environment = batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]
    queue = batch.describe_job_queues(jobQueues=[name])["jobQueues"]
    return {
        "roles": roles,
        "profile": (profile["Arn"], [r["Arn"] for r in profile["Roles"]]),
        "environment": [{k: v for k, v in e.items() if k != "ecsClusterArn"} for e in environment],
        "queue": queue,
        "definitions": batch.describe_job_definitions(jobDefinitionName=name)["jobDefinitions"],
        "bucket_tags": account.s3.get_bucket_tagging(Bucket=account.bucket)["TagSet"],
    }


def _unrelated(account) -> dict:
    """Someone else's role, bucket, instance profile, compute environment and job queue."""
    iam, batch = account.iam, account.batch
    trust = json.dumps(_trust("ec2.amazonaws.com"))
    role = iam.create_role(RoleName="someone-elses-role", AssumeRolePolicyDocument=trust)["Role"]
    iam.put_role_policy(RoleName="someone-elses-role", PolicyName="theirs",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}]}))
    iam.create_instance_profile(InstanceProfileName="someone-elses-profile")
    iam.add_role_to_instance_profile(InstanceProfileName="someone-elses-profile", RoleName=role["RoleName"])
    account.s3.create_bucket(Bucket=f"theirs-{account.id}")
    subnets, group = deploy_batch._default_network(account.ec2)
    environment = batch.create_compute_environment(
        computeEnvironmentName="someone-elses-env", type="MANAGED", state="ENABLED",
        serviceRole=_roles(account)["AWSServiceRoleForBatch"]["Arn"],
        computeResources={"type": "EC2", "minvCpus": 0, "maxvCpus": 4, "instanceTypes": ["c5"],
                          "subnets": subnets, "securityGroupIds": [group],
                          "instanceRole": "someone-elses-profile"},
    )["computeEnvironmentArn"]
    batch.create_job_queue(jobQueueName="someone-elses-queue", state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}])
    return {
        "role": iam.get_role(RoleName="someone-elses-role")["Role"]["Arn"],
        "policy": _inline(account, "someone-elses-role"),
        "environment": environment,
        "queue": batch.describe_job_queues(jobQueues=["someone-elses-queue"])["jobQueues"][0]["jobQueueArn"],
    }


def test_deploy_on_an_empty_account_makes_its_roles_changes_nothing_again_and_destroys_only_its_own(
    account, aws_calls, capsys
):
    slr = _service_linked_role(account)
    theirs = _unrelated(account)
    name = _name()
    deploy = ["deploy", "batch", "deploy", "--name", name, "--image", IMAGE]

    assert cli_main(deploy) == 0
    printed = capsys.readouterr().out
    assert "(new revision)" in printed
    assert f"FNMAP_STORAGE=s3://{account.bucket}/fnmap" in printed

    iam, batch = account.iam, account.batch
    roles = _roles(account)
    tag = [{"Key": "fnmap:batch-deployment", "Value": name}]
    # The container instances: a role with AWS's policy for ECS container instances, in a profile.
    instance = roles[f"{name}-batch-instance"]
    assert instance["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert [p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=instance["RoleName"])[
        "AttachedPolicies"]] == [ECS_INSTANCE_POLICY]
    assert _inline(account, instance["RoleName"]) == {}
    assert iam.list_role_tags(RoleName=instance["RoleName"])["Tags"] == tag
    profile = iam.get_instance_profile(InstanceProfileName=f"{name}-batch-instance")["InstanceProfile"]
    assert [r["Arn"] for r in profile["Roles"]] == [instance["Arn"]]
    # The containers' role: the objects under the storage prefix, and nothing else.
    job = roles[f"{name}-batch-job"]
    assert job["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    assert iam.list_attached_role_policies(RoleName=job["RoleName"])["AttachedPolicies"] == []
    assert iam.list_role_tags(RoleName=job["RoleName"])["Tags"] == tag
    (policy,) = _inline(account, job["RoleName"]).values()
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert set(statements) == {"JobData", "ListJobData"}
    assert sorted(statements["JobData"]["Action"]) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
    assert statements["JobData"]["Resource"] == f"arn:aws:s3:::{account.bucket}/fnmap/*"
    assert statements["ListJobData"]["Action"] == "s3:ListBucket"
    assert statements["ListJobData"]["Resource"] == f"arn:aws:s3:::{account.bucket}"
    assert statements["ListJobData"]["Condition"] == {"StringLike": {"s3:prefix": ["fnmap/*"]}}
    assert all(s["Effect"] == "Allow" for s in statements.values())
    # Batch's own service-linked role; the compute environment runs on the new instance profile.
    environment = batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"][0]
    assert environment["serviceRole"] == slr
    assert environment["computeResources"]["instanceRole"] in (profile["Arn"], profile["InstanceProfileName"])
    assert environment["tags"] == {"fnmap:batch-deployment": name}
    queue = batch.describe_job_queues(jobQueues=[name])["jobQueues"][0]
    assert queue["tags"] == {"fnmap:batch-deployment": name}
    (definition,) = batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
    assert definition["containerProperties"]["jobRoleArn"] == job["Arn"]
    assert "executionRoleArn" not in definition["containerProperties"]  # EC2: the instance role pulls
    assert definition["tags"]["fnmap:batch-deployment"] == name
    bucket_tags = {t["Key"]: t["Value"] for t in account.s3.get_bucket_tagging(Bucket=account.bucket)["TagSet"]}
    assert bucket_tags == {"fnmap:batch-deployment": name, "fnmap:created-bucket": "true"}

    # Again: every resource as it was, and no new job definition revision.
    before = _snapshot(account, name)
    aws_calls.clear()
    assert cli_main(deploy) == 0
    writes = [c for c in aws_calls if not c.split(":")[1].startswith(("Describe", "Get", "List", "Head"))]
    assert writes == [] and aws_calls
    assert "(unchanged)" in capsys.readouterr().out
    assert _snapshot(account, name) == before
    assert len(before["definitions"]) == 1

    aws_calls.clear()
    assert cli_main(["deploy", "batch", "destroy", "--name", name]) == 0
    done = capsys.readouterr().out
    # The queue is disabled and deleted before its compute environment, the roles after both.
    order = [c for c in aws_calls if c.split(":")[1].startswith(("Update", "Delete", "Deregister", "Remove"))]
    assert order.index("batch:UpdateJobQueue") < order.index("batch:DeleteJobQueue") < order.index(
        "batch:UpdateComputeEnvironment") < order.index("batch:DeleteComputeEnvironment") < order.index(
        "iam:RemoveRoleFromInstanceProfile") < order.index("iam:DeleteRole")
    assert not batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]
    assert not batch.describe_job_queues(jobQueues=[name])["jobQueues"]
    assert not batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
    assert set(_roles(account)) == {"AWSServiceRoleForBatch", "someone-elses-role"}
    assert [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]] == [
        "someone-elses-profile"]
    assert [b["Name"] for b in account.s3.list_buckets()["Buckets"]] == [f"theirs-{account.id}"]
    assert f"deleted IAM role {name}-batch-job" in done
    # Someone else's things are as they were.
    assert iam.get_role(RoleName="someone-elses-role")["Role"]["Arn"] == theirs["role"]
    assert _inline(account, "someone-elses-role") == theirs["policy"]
    assert batch.describe_compute_environments(computeEnvironments=["someone-elses-env"])[
        "computeEnvironments"][0]["computeEnvironmentArn"] == theirs["environment"]
    assert batch.describe_job_queues(jobQueues=["someone-elses-queue"])["jobQueues"][0]["state"] == "ENABLED"
    assert cli_main(["deploy", "batch", "destroy", "--name", name]) == 0
    assert f"nothing named {name} to destroy" in capsys.readouterr().out


def test_roles_and_bucket_given_are_used_and_never_destroyed(account, capsys):
    _service_linked_role(account)
    iam, batch = account.iam, account.batch
    job_role = iam.create_role(
        RoleName="my-job-role", AssumeRolePolicyDocument=json.dumps(_trust("ecs-tasks.amazonaws.com"))
    )["Role"]["Arn"]
    account.s3.create_bucket(Bucket="my-data")
    name = _name()
    assert cli_main(["deploy", "batch", "deploy", "--name", name, "--image", IMAGE, "--job-role", job_role,
                     "--bucket", "my-data", "--prefix", "runs/"]) == 0
    assert "FNMAP_STORAGE=s3://my-data/runs" in capsys.readouterr().out
    (definition,) = batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
    assert definition["containerProperties"]["jobRoleArn"] == job_role
    assert f"{name}-batch-job" not in _roles(account)  # not made when given
    assert cli_main(["deploy", "batch", "destroy", "--name", name, "--bucket", "my-data"]) == 0
    assert set(_roles(account)) == {"AWSServiceRoleForBatch", "my-job-role"}
    assert [b["Name"] for b in account.s3.list_buckets()["Buckets"]] == ["my-data"]


def test_a_same_named_role_deploy_did_not_make_is_refused_and_kept(account, capsys):
    _service_linked_role(account)
    name = _name()
    trust = json.dumps(_trust("ecs-tasks.amazonaws.com"))
    account.iam.create_role(RoleName=f"{name}-batch-job", AssumeRolePolicyDocument=trust)
    assert cli_main(["deploy", "batch", "deploy", "--name", name, "--image", IMAGE]) == 1
    err = capsys.readouterr().err
    assert f"IAM role {name}-batch-job exists but was not made by `fnmap deploy batch`" in err
    assert "--job-role" in err and "Traceback" not in err
    assert cli_main(["deploy", "batch", "destroy", "--name", name]) == 0
    assert f"kept IAM role {name}-batch-job" in capsys.readouterr().out
    assert account.iam.list_role_tags(RoleName=f"{name}-batch-job")["Tags"] == []  # still there, untouched


def test_without_batchs_service_linked_role_the_compute_environment_names_no_service_role(account, capsys):
    # On AWS, Batch then makes its service-linked role itself; moto instead insists on a serviceRole,
    # which shows that none was sent.  Destroy cleans up what the stopped deploy had made.
    name = _name()
    assert cli_main(["deploy", "batch", "deploy", "--name", name, "--image", IMAGE]) == 1
    assert "ServiceRole is required" in capsys.readouterr().err
    assert cli_main(["deploy", "batch", "destroy", "--name", name]) == 0
    assert _roles(account) == {}
    assert account.iam.list_instance_profiles()["InstanceProfiles"] == []


def test_a_new_instance_profile_is_retried_until_batch_sees_it(account):
    """IAM is eventually consistent: Batch may not see a profile made a moment ago.  The wait is
    driven by the given ``sleep``, which here makes the profile (no real sleeping)."""
    slr = _service_linked_role(account)
    subnets, group = deploy_batch._default_network(account.ec2)
    name = _name()
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 2:
            account.iam.create_instance_profile(InstanceProfileName=f"{name}-late")

    common = dict(instance_types=["g5"], max_vcpus=8, subnets=subnets, security_groups=[group],
                  instance_role=f"{name}-late", service_role=slr)
    arn = deploy_batch.ensure_compute_environment(account.batch, name, profile_wait=60, sleep=sleep, **common)
    assert len(waits) == 2 and all(0 < w <= 60 for w in waits)
    assert account.batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"][0][
        "computeEnvironmentArn"] == arn
    # A profile that was not just made is not waited for: the error says what to pass.
    with pytest.raises(deploy_batch.DeployError, match=f"instance profile {name}-none.*--instance-role"):
        deploy_batch.ensure_compute_environment(
            account.batch, f"{name}x", **{**common, "instance_role": f"{name}-none"}, sleep=sleep
        )
    assert len(waits) == 2
    with pytest.raises(ClientError):  # other refusals are not retried either
        deploy_batch.ensure_compute_environment(
            account.batch, f"{name}y", **{**common, "max_vcpus": -1}, profile_wait=60, sleep=sleep
        )
    assert len(waits) == 2


def test_an_empty_prefix_is_refused_before_anything_is_made(monkeypatch, capsys):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert cli_main(["deploy", "batch", "deploy", "--image", IMAGE, "--bucket", "b", "--prefix", "/"]) == 1
    assert "--prefix '/' is empty: give the key prefix of the job data" in capsys.readouterr().err


def test_an_iam_without_aws_managed_policies_is_named_with_the_fix(s3_server, monkeypatch, capsys):
    """An IAM that is not AWS's (moto by default) has no AWS managed policies: the error names the policy,
    the endpoint and the fixes, instead of moto's bare NoSuchEntity."""
    _enter_new_account(s3_server, monkeypatch, managed_policies=False)
    assert cli_main(["deploy", "batch", "deploy", "--image", IMAGE]) == 1
    err = capsys.readouterr().err
    assert f"the AWS managed policy {ECS_INSTANCE_POLICY} does not exist at this IAM endpoint ({s3_server})" in err, err
    assert "MOTO_IAM_LOAD_MANAGED_POLICIES=true" in err and "--instance-role PROFILE" in err, err
