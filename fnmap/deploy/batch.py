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
import os
import re
import sys
import time

from ..runtime.container import COMMAND
from ..runtime.signing import SECRET_ENV, new_secret
from . import batch_iam
from .batch_iam import TAG, DeployError

SPEC_TAG = "fnmap:spec"
#: Seconds to wait for a compute environment or job queue to settle.
SETTLE_SECONDS = 600.0
#: Seconds to keep retrying a compute environment whose instance profile was made moments ago:
#: IAM is eventually consistent, and Batch may not see a new profile for a while.
PROFILE_WAIT_SECONDS = 120.0
_BAD_PROFILE = re.compile(r"instance ?profile|instanceRole", re.IGNORECASE)


def register(sub) -> None:
    p = sub.add_parser(
        "batch",
        help="AWS Batch: GPU compute environment, job queue and job definition (batch backend)",
        description="Create (idempotently) or destroy what the batch backend needs: a GPU compute "
        "environment, a job queue and a job definition running infra/Dockerfile.gpu's image, and, unless "
        "given, the instance role and profile, the job role (the storage prefix only) and the bucket.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    d = actions.add_parser(
        "deploy", help="create or update the compute environment, job queue and job definition"
    )
    _common(d)
    d.add_argument(
        "--image", required=True, help="container image built from infra/Dockerfile.gpu (ECR URI)"
    )
    d.add_argument(
        "--instance-types", default="g5", help="comma-separated EC2 types or families (default g5)"
    )
    d.add_argument(
        "--max-vcpus",
        type=int,
        default=64,
        help="most vCPUs the compute environment scales to (default 64)",
    )
    d.add_argument(
        "--spot",
        action="store_true",
        help="use Spot instances (Batch re-runs children whose host is reclaimed)",
    )
    d.add_argument(
        "--subnets",
        default="",
        help="comma-separated subnet ids (default: the default VPC's subnets)",
    )
    d.add_argument(
        "--security-groups",
        default="",
        help="comma-separated security group ids (default: the default VPC's 'default' group)",
    )
    d.add_argument(
        "--instance-role",
        default=None,
        help="instance profile (name or ARN) of the container instances (default: make NAME-batch-instance "
        "with AWS's AmazonEC2ContainerServiceforEC2Role policy)",
    )
    d.add_argument(
        "--service-role",
        default=None,
        help="Batch service role ARN (default: Batch's service-linked role AWSServiceRoleForBatch)",
    )
    d.add_argument(
        "--job-role",
        default=None,
        help="IAM role ARN the containers run as; it must read and write the storage prefix "
        "(default: make NAME-batch-job, allowed only s3://BUCKET/PREFIX/*)",
    )
    d.add_argument(
        "--gpu", type=int, default=1, help="GPUs per child unless a job asks otherwise (default 1)"
    )
    d.add_argument(
        "--memory",
        type=int,
        default=16000,
        help="memory per child in MiB unless a job asks otherwise (default 16000)",
    )
    d.add_argument("--vcpus", type=int, default=4, help="vCPUs per child (default 4)")
    d.add_argument(
        "--secret",
        default=None,
        help=f"shared secret (default: ${SECRET_ENV}, else the deployed one, else a new one)",
    )
    d.set_defaults(run=run_deploy)
    x = actions.add_parser(
        "destroy",
        help="delete the job definition revisions, job queue, compute environment, and the roles "
        "and bucket deploy made",
    )
    _common(x)
    x.set_defaults(run=run_destroy)


def _common(p) -> None:
    p.add_argument(
        "--name",
        default="fnmap",
        help="name of the compute environment, job queue and job definition (default fnmap)",
    )
    p.add_argument(
        "--region", default=None, help="AWS region (default: boto3's, e.g. AWS_DEFAULT_REGION)"
    )
    p.add_argument(
        "--bucket",
        default=None,
        help="S3 bucket of the job data, made if missing (default fnmap-ACCOUNT-REGION, as fnmap deploy aws)",
    )
    p.add_argument("--prefix", default="fnmap", help="key prefix of the job data in the bucket (default fnmap)")


def _session(region: str | None):
    import boto3

    session = boto3.Session(region_name=region)
    if session.region_name is None:
        raise DeployError("no AWS region: pass --region or set AWS_DEFAULT_REGION")
    return session


def _storage(session, args) -> tuple[str, str]:
    """(bucket, prefix) of the job data."""
    prefix = args.prefix.strip("/")
    if not prefix:
        raise DeployError(f"--prefix {args.prefix!r} is empty: give the key prefix of the job data, e.g. fnmap")
    if args.bucket:
        return args.bucket, prefix
    account = session.client("sts").get_caller_identity()["Account"]
    return f"fnmap-{account}-{session.region_name}", prefix


def _aws_errors(action):
    """Turn a refused AWS call into a one-line error naming the call (the CLI prints it)."""

    def run(args) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return action(args)
        except (ClientError, BotoCoreError) as e:
            raise DeployError(f"fnmap deploy batch {args.action} --name {args.name}: {e}") from e

    return run


@_aws_errors
def run_deploy(args) -> int:
    session = _session(args.region)
    batch, ec2, iam = session.client("batch"), session.client("ec2"), session.client("iam")
    bucket, prefix = _storage(session, args)
    subnets = [s for s in args.subnets.split(",") if s]
    groups = [g for g in args.security_groups.split(",") if g]
    if not subnets or not groups:
        default_subnets, default_group = _default_network(ec2)
        subnets, groups = subnets or default_subnets, groups or [default_group]
    if batch_iam.ensure_bucket(session.client("s3"), bucket, session.region_name, args.name):
        print(f"bucket               s3://{bucket} (made)")
    instance_role, profile_made = args.instance_role, False
    if not instance_role:
        instance_role, profile_made = batch_iam.ensure_instance_role(iam, args.name)
        print(f"instance profile     {instance_role}")
    job_role = args.job_role
    if not job_role:
        job_role = batch_iam.ensure_job_role(iam, args.name, bucket, prefix)
        print(f"job role             {job_role} (s3://{bucket}/{prefix}/* only)")
    environment = ensure_compute_environment(
        batch,
        args.name,
        instance_types=[t for t in args.instance_types.split(",") if t],
        max_vcpus=args.max_vcpus,
        subnets=subnets,
        security_groups=groups,
        instance_role=instance_role,
        service_role=args.service_role or batch_iam.service_linked_role(iam),
        spot=args.spot,
        profile_wait=PROFILE_WAIT_SECONDS if profile_made else 0.0,
    )
    queue = ensure_job_queue(batch, args.name, environment)
    secret = (
        args.secret
        or os.environ.get(SECRET_ENV)
        or deployed_secret(batch, args.name)
        or new_secret()
    )
    definition, changed = ensure_job_definition(
        batch,
        args.name,
        job_definition_spec(
            args.image,
            secret,
            vcpus=args.vcpus,
            memory=args.memory,
            gpu=args.gpu,
            job_role=job_role,
        ),
    )
    print(f"compute environment  {environment}")
    print(f"job queue            {queue}")
    print(f"job definition       {definition}{' (new revision)' if changed else ' (unchanged)'}")
    print("use it with:")
    print(
        f"  export FNMAP_BACKEND=batch FNMAP_JOB_QUEUE={args.name} "
        f"FNMAP_JOB_DEFINITION={args.name} "
        f"{SECRET_ENV}={secret} FNMAP_STORAGE=s3://{bucket}/{prefix}"
    )
    return 0


@_aws_errors
def run_destroy(args) -> int:
    session = _session(args.region)
    bucket, _ = _storage(session, args)
    for line in destroy(session.client("batch"), args.name, iam=session.client("iam"),
                        s3=session.client("s3"), bucket=bucket):
        print(line)
    return 0


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


def main(argv: list[str] | None = None) -> int:
    """``python infra/batch.py deploy|destroy ...``: the same as ``fnmap deploy batch ...``."""
    from ..cli import main as cli_main

    return cli_main(["deploy", "batch", *(sys.argv[1:] if argv is None else argv)])
