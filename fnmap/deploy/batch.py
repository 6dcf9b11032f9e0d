"""``fnmap deploy batch deploy|destroy``: what the ``batch`` backend needs in an AWS account.

``deploy`` creates, or brings up to date, three things named ``--name``
(default ``fnmap``): a managed EC2 compute environment of GPU instances
(scaling from 0 vCPUs, the ECS GPU AMI), a job queue on it, and a container
job definition whose command is ``python -m handlers.container Ref::store
Ref::prefix`` with the image built from ``infra/Dockerfile.gpu``.  Running it
again changes nothing unless an option changed: the job definition carries a
digest of its specification in the ``fnmap:spec`` tag, and a new revision is
registered only when the digest differs.  ``destroy`` deregisters every
revision, then disables and deletes the queue and the compute environment.

The deployment's secret travels in the job definition's environment
(``FNMAP_SECRET``): keep DescribeJobDefinitions to the people who may run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from ..container import COMMAND
from ..errors import FnmapError
from ..signing import SECRET_ENV, new_secret

SPEC_TAG = "fnmap:spec"
#: Seconds to wait for a compute environment or job queue to settle.
SETTLE_SECONDS = 600.0


class DeployError(FnmapError):
    """A deploy step failed; the message names the resource and the fix."""


def register(sub) -> None:
    p = sub.add_parser(
        "batch",
        help="AWS Batch: GPU compute environment, job queue and job definition (batch backend)",
        description="Create (idempotently) or destroy what the batch backend needs: a GPU compute "
        "environment, a job queue and a job definition running infra/Dockerfile.gpu's image.",
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
        default="ecsInstanceRole",
        help="instance profile of the container instances (default ecsInstanceRole)",
    )
    d.add_argument(
        "--service-role",
        default=None,
        help="Batch service role ARN (default: Batch's service-linked role)",
    )
    d.add_argument(
        "--job-role",
        default=None,
        help="IAM role ARN the containers run as; it must read and write the storage bucket",
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
        "destroy", help="delete the job definition revisions, job queue and compute environment"
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


def _clients(region: str | None):
    import boto3

    session = boto3.Session(region_name=region)
    if session.region_name is None:
        raise DeployError("no AWS region: pass --region or set AWS_DEFAULT_REGION")
    return session.client("batch"), session.client("ec2")


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
    batch, ec2 = _clients(args.region)
    subnets = [s for s in args.subnets.split(",") if s]
    groups = [g for g in args.security_groups.split(",") if g]
    if not subnets or not groups:
        default_subnets, default_group = _default_network(ec2)
        subnets, groups = subnets or default_subnets, groups or [default_group]
    environment = ensure_compute_environment(
        batch,
        args.name,
        instance_types=[t for t in args.instance_types.split(",") if t],
        max_vcpus=args.max_vcpus,
        subnets=subnets,
        security_groups=groups,
        instance_role=args.instance_role,
        service_role=args.service_role,
        spot=args.spot,
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
            job_role=args.job_role,
        ),
    )
    print(f"compute environment  {environment}")
    print(f"job queue            {queue}")
    print(f"job definition       {definition}{' (new revision)' if changed else ' (unchanged)'}")
    print("use it with:")
    print(
        f"  export FNMAP_BACKEND=batch FNMAP_JOB_QUEUE={args.name} "
        f"FNMAP_JOB_DEFINITION={args.name} "
        f"{SECRET_ENV}={secret} FNMAP_STORAGE=s3://BUCKET/fnmap"
    )
    return 0


@_aws_errors
def run_destroy(args) -> int:
    batch, _ = _clients(args.region)
    for line in destroy(batch, args.name):
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
) -> str:
    """The compute environment's ARN, created if missing, enabled and resized if it exists."""
    found = batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]
    if found:
        env = found[0]
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
    arn = batch.create_compute_environment(**request)["computeEnvironmentArn"]
    _settle(
        lambda: batch.describe_compute_environments(computeEnvironments=[name])[
            "computeEnvironments"
        ],
        f"compute environment {name}",
    )
    return arn


def ensure_job_queue(batch, name: str, environment_arn: str) -> str:
    order = [{"order": 1, "computeEnvironment": environment_arn}]
    found = batch.describe_job_queues(jobQueues=[name])["jobQueues"]
    if found:
        queue = found[0]
        if queue.get("state") != "ENABLED" or queue.get("computeEnvironmentOrder") != order:
            batch.update_job_queue(jobQueue=name, state="ENABLED", computeEnvironmentOrder=order)
        return queue["jobQueueArn"]
    arn = batch.create_job_queue(
        jobQueueName=name, state="ENABLED", priority=1, computeEnvironmentOrder=order
    )["jobQueueArn"]
    _settle(lambda: batch.describe_job_queues(jobQueues=[name])["jobQueues"], f"job queue {name}")
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
    answer = batch.register_job_definition(jobDefinitionName=name, tags={SPEC_TAG: digest}, **spec)
    return answer["jobDefinitionArn"], True


def destroy(batch, name: str) -> list[str]:
    """Remove everything ``deploy`` made, skipping what is gone already; returns what was done."""
    done = []
    for revision in _all_active(batch, name):
        batch.deregister_job_definition(jobDefinition=revision["jobDefinitionArn"])
        done.append(f"deregistered job definition {revision['jobDefinitionArn']}")
    if batch.describe_job_queues(jobQueues=[name])["jobQueues"]:
        batch.update_job_queue(jobQueue=name, state="DISABLED")
        _settle(
            lambda: batch.describe_job_queues(jobQueues=[name])["jobQueues"], f"job queue {name}"
        )
        batch.delete_job_queue(jobQueue=name)
        _gone(lambda: batch.describe_job_queues(jobQueues=[name])["jobQueues"], f"job queue {name}")
        done.append(f"deleted job queue {name}")
    if batch.describe_compute_environments(computeEnvironments=[name])["computeEnvironments"]:
        batch.update_compute_environment(computeEnvironment=name, state="DISABLED")
        _settle(
            lambda: batch.describe_compute_environments(computeEnvironments=[name])[
                "computeEnvironments"
            ],
            f"compute environment {name}",
        )
        batch.delete_compute_environment(computeEnvironment=name)
        _gone(
            lambda: batch.describe_compute_environments(computeEnvironments=[name])[
                "computeEnvironments"
            ],
            f"compute environment {name}",
        )
        done.append(f"deleted compute environment {name}")
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


def _settle(describe, what: str) -> None:
    """Wait until the resource's status is VALID (INVALID is an error with Batch's reason)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    delay = 0.5
    while True:
        found = describe()
        status = found[0].get("status") if found else None
        if status == "VALID":
            return
        if status == "INVALID":
            raise DeployError(f"{what} is INVALID: {found[0].get('statusReason')}")
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
