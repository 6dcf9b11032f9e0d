"""``fnmap deploy batch deploy|destroy``: what the ``batch`` backend needs in an AWS account.

``deploy`` creates, or brings up to date, three things named ``--name``
(default ``fnmap``): a managed EC2 compute environment of GPU instances
(scaling from 0 vCPUs, the ECS GPU AMI), a job queue on it, and a container
job definition whose command is ``python -m handlers.container Ref::store
Ref::prefix`` with the image built from ``infra/Dockerfile.gpu``.  On an empty
account it also makes what those need and were not given (``batch_iam``): the
container instances' role and instance profile, the containers' job role
(allowed only ``s3://BUCKET/PREFIX/``) and the bucket; Batch's own
service-linked role is used as its service role.  Running it again changes
nothing unless an option changed: the job definition carries a digest of its
specification in the ``fnmap:spec`` tag, and a new revision is registered only
when the digest differs.  Everything made is tagged
``fnmap:batch-deployment=NAME``; ``destroy`` deregisters every revision,
disables and deletes the queue and then the compute environment, and deletes
the roles and the bucket it made, and nothing without the tag.

The job definition names the job role (``jobRoleArn``) and no execution role:
on EC2 compute environments the ECS agent pulls the image and ships the logs
with the instance role, so an execution role would only matter on Fargate.

The deployment's secret travels in the job definition's environment
(``FNMAP_SECRET``): keep DescribeJobDefinitions to the people who may run code.
"""

from __future__ import annotations

import hashlib
import json
import re
import time

from ..runtime.container import COMMAND
from ..runtime.signing import SECRET_ENV
from . import batch_iam
from .batch_iam import TAG, DeployError

SPEC_TAG = "fnmap:spec"
#: Seconds to wait for a compute environment or job queue to settle.
SETTLE_SECONDS = 600.0
#: Seconds to keep retrying a compute environment whose instance profile was made moments ago:
#: IAM is eventually consistent, and Batch may not see a new profile for a while.
PROFILE_WAIT_SECONDS = 120.0
_BAD_PROFILE = re.compile(r"instance ?profile|instanceRole", re.IGNORECASE)


# -- the steps (plain functions over a boto3 Batch client) ---------------------------------------


def _default_network(ec2) -> tuple[list[str], str]:
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise DeployError("this region has no default VPC: pass --subnets and --security-groups")
    vpc = vpcs[0]["VpcId"]
    subnets = [
        s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    ]
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
    )["SecurityGroups"]
    if not subnets or not groups:
        raise DeployError(
            f"the default VPC {vpc} has no subnets or no 'default' security group: "
            "pass --subnets and --security-groups"
        )
    return subnets, groups[0]["GroupId"]


def ensure_compute_environment(
    batch,
    name: str,
    *,
    instance_types: list[str],
    max_vcpus: int,
    subnets: list[str],
    security_groups: list[str],
    instance_role: str,
    service_role: str | None = None,
    spot: bool = False,
    profile_wait: float = 0.0,
    sleep=time.sleep,
) -> str:
    """The compute environment's ARN, created if missing, enabled and resized if it exists.

    Without ``service_role`` the request names none, and Batch uses (or makes) its service-linked
    role.  ``profile_wait`` is how long to keep retrying when Batch does not know the instance
    profile yet (one made moments ago); ``sleep`` waits between tries."""
    found = _environments(batch, name)()
    if found:
        env = found[0]
        _check_ours(env, f"compute environment {name}", name)
        if env.get("status") == "INVALID":  # e.g. a deploy that stopped on an unseen instance profile
            _remove_compute_environment(batch, name)
            found = []
    if found:
        if (
            env.get("state") != "ENABLED"
            or env.get("computeResources", {}).get("maxvCpus") != max_vcpus
        ):
            batch.update_compute_environment(
                computeEnvironment=name, state="ENABLED", computeResources={"maxvCpus": max_vcpus}
            )
        return env["computeEnvironmentArn"]
    resources = {
        "type": "SPOT" if spot else "EC2",
        "allocationStrategy": "SPOT_CAPACITY_OPTIMIZED" if spot else "BEST_FIT_PROGRESSIVE",
        "minvCpus": 0,
        "maxvCpus": max_vcpus,
        "instanceTypes": instance_types,
        "subnets": subnets,
        "securityGroupIds": security_groups,
        "instanceRole": instance_role,
        "ec2Configuration": [{"imageType": "ECS_AL2_NVIDIA"}],
    }
    request = {
        "computeEnvironmentName": name,
        "type": "MANAGED",
        "state": "ENABLED",
        "computeResources": resources,
    }
    if service_role:
        request["serviceRole"] = service_role
    return _create_compute_environment(batch, request, instance_role, profile_wait, sleep)


def _environments(batch, name: str):
    return lambda: batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]


def _create_compute_environment(batch, request: dict, instance_role: str, wait: float, sleep) -> str:
    """Create and settle; while ``wait`` lasts, try again when Batch does not know the instance
    profile yet, whether it says so at once (an error) or later (the environment goes INVALID)."""
    from botocore.exceptions import ClientError

    name = request["computeEnvironmentName"]
    deadline = time.monotonic() + wait
    delay = 2.0
    while True:
        try:
            arn = batch.create_compute_environment(**request, tags={TAG: name})["computeEnvironmentArn"]
            _settle(_environments(batch, name), f"compute environment {name}")
            return arn
        except ClientError as e:
            reason = e.response.get("Error", {}).get("Message") or str(e)
            if not _BAD_PROFILE.search(reason):
                raise
        except Invalid as e:
            reason = e.reason
            if not _BAD_PROFILE.search(reason):
                raise
            _remove_compute_environment(batch, name)
        if time.monotonic() + delay > deadline:
            raise DeployError(
                f"compute environment {name}: Batch does not accept the instance profile {instance_role} "
                f"({reason}): pass an existing instance profile's name or ARN with --instance-role, or leave "
                "it out to have one made"
            )
        sleep(delay)
        delay = min(15.0, delay * 2)


def _queues(batch, name: str):
    return lambda: batch.describe_job_queues(jobQueues=[name])["jobQueues"]


def _remove_job_queue(batch, name: str) -> None:
    """Disable, delete and wait until it is gone (an INVALID one too)."""
    found = _queues(batch, name)
    if found()[0].get("state") != "DISABLED":
        batch.update_job_queue(jobQueue=name, state="DISABLED")
    _settle(found, f"job queue {name}", invalid_ok=True)
    batch.delete_job_queue(jobQueue=name)
    _gone(found, f"job queue {name}")


def _remove_compute_environment(batch, name: str) -> None:
    """Disable, delete and wait until it is gone (an INVALID one too)."""
    found = _environments(batch, name)
    what = f"compute environment {name}"
    if found()[0].get("state") != "DISABLED":
        batch.update_compute_environment(computeEnvironment=name, state="DISABLED")
    _settle(found, what, invalid_ok=True)
    batch.delete_compute_environment(computeEnvironment=name)
    _gone(found, what)


def _check_ours(resource: dict, what: str, name: str) -> None:
    if (resource.get("tags") or {}).get(TAG) != name:
        raise DeployError(
            f"{what} exists but was not made by `fnmap deploy batch` (no tag {TAG}={name}): "
            "choose another --name, or delete it yourself"
        )


def _ours(resource: dict, name: str) -> bool:
    return (resource.get("tags") or {}).get(TAG) == name


def ensure_job_queue(batch, name: str, environment_arn: str) -> str:
    order = [{"order": 1, "computeEnvironment": environment_arn}]
    found = _queues(batch, name)()
    if found:
        queue = found[0]
        _check_ours(queue, f"job queue {name}", name)
        if queue.get("state") != "ENABLED" or queue.get("computeEnvironmentOrder") != order:
            batch.update_job_queue(jobQueue=name, state="ENABLED", computeEnvironmentOrder=order)
        return queue["jobQueueArn"]
    arn = batch.create_job_queue(
        jobQueueName=name, state="ENABLED", priority=1, computeEnvironmentOrder=order, tags={TAG: name}
    )["jobQueueArn"]
    _settle(_queues(batch, name), f"job queue {name}")
    return arn


def job_definition_spec(
    image: str, secret: str, *, vcpus: int, memory: int, gpu: int, job_role: str | None = None
) -> dict:
    """The job definition's specification (everything but its name and tags)."""
    resources = [{"type": "VCPU", "value": str(vcpus)}, {"type": "MEMORY", "value": str(memory)}]
    if gpu:
        resources.append({"type": "GPU", "value": str(gpu)})
    properties = {
        "image": image,
        "command": list(COMMAND),
        "resourceRequirements": resources,
        "environment": [{"name": SECRET_ENV, "value": secret}],
    }
    if job_role:
        properties["jobRoleArn"] = job_role
    return {
        "type": "container",
        "containerProperties": properties,
        # Batch re-runs a child only when its host went away; the client retries everything else.
        "retryStrategy": {
            "attempts": 3,
            "evaluateOnExit": [
                {"onStatusReason": "Host EC2*", "action": "RETRY"},
                {"onReason": "*", "action": "EXIT"},
            ],
        },
    }


def spec_digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def _latest_definition(batch, name: str) -> dict | None:
    return max(_all_active(batch, name), key=lambda d: d["revision"], default=None)


def deployed_secret(batch, name: str) -> str | None:
    latest = _latest_definition(batch, name)
    for var in (latest or {}).get("containerProperties", {}).get("environment", []):
        if var["name"] == SECRET_ENV:
            return var["value"]
    return None


def ensure_job_definition(batch, name: str, spec: dict) -> tuple[str, bool]:
    """The ARN of a revision with this spec; registers a new one only when the spec changed."""
    digest = spec_digest(spec)
    latest = _latest_definition(batch, name)
    if latest is not None and (latest.get("tags") or {}).get(SPEC_TAG) == digest:
        return latest["jobDefinitionArn"], False
    answer = batch.register_job_definition(jobDefinitionName=name, tags={SPEC_TAG: digest, TAG: name}, **spec)
    return answer["jobDefinitionArn"], True


def destroy(batch, name: str, *, iam=None, s3=None, bucket: str | None = None) -> list[str]:
    """Remove what ``deploy`` made (tagged ``TAG=name``), skipping what is gone already; returns
    what was done.  The queue goes before the compute environment it runs on, and the roles only
    after the compute environment (Batch needs them to take its instances down)."""
    done = []
    for revision in _all_active(batch, name):
        # Revisions from before the deployment tag carry only the spec digest.
        if _ours(revision, name) or SPEC_TAG in (revision.get("tags") or {}):
            batch.deregister_job_definition(jobDefinition=revision["jobDefinitionArn"])
            done.append(f"deregistered job definition {revision['jobDefinitionArn']}")

    for what, found, remove in (
        (f"job queue {name}", _queues(batch, name), _remove_job_queue),
        (f"compute environment {name}", _environments(batch, name), _remove_compute_environment),
    ):
        resources = found()
        if not resources:
            continue
        if not _ours(resources[0], name):
            done.append(f"kept {what}: not made by fnmap deploy batch (no tag {TAG}={name})")
            continue
        remove(batch, name)
        done.append(f"deleted {what}")
    if iam is not None:
        done += batch_iam.destroy_roles(iam, name)
    if s3 is not None and bucket:
        done += batch_iam.destroy_bucket(s3, bucket, name)
    return done or [f"nothing named {name} to destroy"]


def _all_active(batch, name: str) -> list[dict]:
    out, token = [], None
    while True:
        page = batch.describe_job_definitions(
            jobDefinitionName=name, status="ACTIVE", **({"nextToken": token} if token else {})
        )
        out += page["jobDefinitions"]
        token = page.get("nextToken")
        if not token:
            return out


class Invalid(DeployError):
    """A compute environment or job queue went INVALID; ``reason`` is Batch's."""

    def __init__(self, what: str, reason: str):
        super().__init__(f"{what} is INVALID: {reason}")
        self.reason = reason


def _settle(describe, what: str, invalid_ok: bool = False) -> None:
    """Wait until the resource's status is VALID (or INVALID when ``invalid_ok``), no longer
    CREATING or UPDATING; INVALID is otherwise an error with Batch's reason."""
    deadline = time.monotonic() + SETTLE_SECONDS
    delay = 0.5
    while True:
        found = describe()
        status = found[0].get("status") if found else None
        if status == "VALID" or (status == "INVALID" and invalid_ok):
            return
        if status == "INVALID":
            raise Invalid(what, str(found[0].get("statusReason")))
        if time.monotonic() > deadline:
            raise DeployError(f"{what} is still {status} after {SETTLE_SECONDS:.0f} s")
        time.sleep(delay)
        delay = min(10.0, delay * 2)


def _gone(describe, what: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while describe():
        if time.monotonic() > deadline:
            raise DeployError(f"{what} was not deleted after {SETTLE_SECONDS:.0f} s")
        time.sleep(1.0)
