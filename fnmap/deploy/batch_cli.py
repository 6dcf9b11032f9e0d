"""The command line of ``fnmap deploy batch deploy|destroy`` (and ``python infra/batch.py``).

Its options are tables of ``(flags, argparse keywords)``; the steps they drive are in
:mod:`fnmap.deploy.batch`.  Imports nothing above ``fnmap.deploy``: ``main`` builds the same
parser ``fnmap deploy batch`` has and reports errors as the ``fnmap`` command does.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import FnmapError
from ..runtime.signing import SECRET_ENV, new_secret
from . import batch_iam
from .batch import (
    PROFILE_WAIT_SECONDS,
    DeployError,
    _default_network,
    deployed_secret,
    destroy,
    ensure_compute_environment,
    ensure_job_definition,
    ensure_job_queue,
    job_definition_spec,
)

HELP = "AWS Batch: GPU compute environment, job queue and job definition (batch backend)"
DESCRIPTION = (
    "Create (idempotently) or destroy what the batch backend needs: a GPU compute "
    "environment, a job queue and a job definition running infra/Dockerfile.gpu's image, and, unless "
    "given, the instance role and profile, the job role (the storage prefix only) and the bucket."
)

#: The options of both actions.
COMMON = [
    (("--name",), dict(default="fnmap",
                       help="name of the compute environment, job queue and job definition (default fnmap)")),
    (("--region",), dict(default=None, help="AWS region (default: boto3's, e.g. AWS_DEFAULT_REGION)")),
    (("--bucket",), dict(default=None, help="S3 bucket of the job data, made if missing (default "
                                            "fnmap-ACCOUNT-REGION, as fnmap deploy aws)")),
    (("--prefix",), dict(default="fnmap", help="key prefix of the job data in the bucket (default fnmap)")),
]
#: The options of ``deploy``.
DEPLOY = [
    (("--image",), dict(required=True, help="container image built from infra/Dockerfile.gpu (ECR URI)")),
    (("--instance-types",), dict(default="g5", help="comma-separated EC2 types or families (default g5)")),
    (("--max-vcpus",), dict(type=int, default=64, help="most vCPUs the compute environment scales to (default 64)")),
    (("--spot",), dict(action="store_true",
                       help="use Spot instances (Batch re-runs children whose host is reclaimed)")),
    (("--subnets",), dict(default="", help="comma-separated subnet ids (default: the default VPC's subnets)")),
    (("--security-groups",), dict(default="", help="comma-separated security group ids (default: the default "
                                                   "VPC's 'default' group)")),
    (("--instance-role",), dict(default=None, help="instance profile (name or ARN) of the container instances "
                                                   "(default: make NAME-batch-instance with AWS's "
                                                   "AmazonEC2ContainerServiceforEC2Role policy)")),
    (("--service-role",), dict(default=None, help="Batch service role ARN (default: Batch's service-linked role "
                                                  "AWSServiceRoleForBatch)")),
    (("--job-role",), dict(default=None, help="IAM role ARN the containers run as; it must read and write the "
                                              "storage prefix (default: make NAME-batch-job, allowed only "
                                              "s3://BUCKET/PREFIX/*)")),
    (("--gpu",), dict(type=int, default=1, help="GPUs per child unless a job asks otherwise (default 1)")),
    (("--memory",), dict(type=int, default=16000,
                         help="memory per child in MiB unless a job asks otherwise (default 16000)")),
    (("--vcpus",), dict(type=int, default=4, help="vCPUs per child (default 4)")),
    (("--secret",), dict(default=None,
                         help=f"shared secret (default: ${SECRET_ENV}, else the deployed one, else a new one)")),
]


def _add(parser, table) -> None:
    for flags, keywords in table:
        parser.add_argument(*flags, **keywords)


def add_arguments(p) -> None:
    """The actions of ``fnmap deploy batch`` and their options, on ``p``."""
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    d = actions.add_parser("deploy", help="create or update the compute environment, job queue and job definition")
    _add(d, COMMON)
    _add(d, DEPLOY)
    d.set_defaults(run=run_deploy)
    x = actions.add_parser(
        "destroy",
        help="delete the job definition revisions, job queue, compute environment, and the roles "
        "and bucket deploy made",
    )
    _add(x, COMMON)
    x.set_defaults(run=run_destroy)


def register(sub) -> None:
    add_arguments(sub.add_parser("batch", help=HELP, description=DESCRIPTION))


def main(argv: list[str] | None = None) -> int:
    """``python infra/batch.py deploy|destroy ...``: the same as ``fnmap deploy batch ...``."""
    p = argparse.ArgumentParser(prog="fnmap deploy batch", description=DESCRIPTION)
    add_arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        return 130
    except (FnmapError, OSError) as e:
        print(f"fnmap deploy: error: {e}", file=sys.stderr)
        return 1


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


def _network(ec2, args) -> tuple[list[str], list[str]]:
    """The subnets and security groups: those given, else the default VPC's."""
    subnets = [s for s in args.subnets.split(",") if s]
    groups = [g for g in args.security_groups.split(",") if g]
    if not subnets or not groups:
        default_subnets, default_group = _default_network(ec2)
        subnets, groups = subnets or default_subnets, groups or [default_group]
    return subnets, groups


def _roles(iam, args, bucket: str, prefix: str) -> tuple[str, bool, str]:
    """(instance role, whether it was made now, job role): those given, else made."""
    instance_role, profile_made = args.instance_role, False
    if not instance_role:
        instance_role, profile_made = batch_iam.ensure_instance_role(iam, args.name)
        print(f"instance profile     {instance_role}")
    job_role = args.job_role
    if not job_role:
        job_role = batch_iam.ensure_job_role(iam, args.name, bucket, prefix)
        print(f"job role             {job_role} (s3://{bucket}/{prefix}/* only)")
    return instance_role, profile_made, job_role


def _check_endpoint(batch, args) -> None:
    """Refuse, before anything is made, a Batch endpoint that serves jobs but not compute environments:
    the fnmap emulator (``AWS_ENDPOINT_URL_BATCH`` of the offline rehearsal), which needs no deploy."""
    from botocore.exceptions import ClientError

    try:
        batch.describe_compute_environments(computeEnvironments=[args.name])
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "NotImplemented":
            raise
        raise DeployError(
            f"fnmap deploy batch {args.action}: the Batch endpoint {batch.meta.endpoint_url} serves no compute "
            "environments or job queues: it is the fnmap emulator (AWS_ENDPOINT_URL_BATCH), whose Batch runs "
            "jobs with its built-in job definition fnmap and any job queue name, so there is nothing to "
            f"{args.action} there: run the jobs as they are (FNMAP_BACKEND=batch, this shell's FNMAP_SECRET and "
            "FNMAP_STORAGE); deploy to an AWS account with AWS_ENDPOINT_URL_BATCH unset"
        ) from e


@_aws_errors
def run_deploy(args) -> int:
    session = _session(args.region)
    batch, ec2, iam = session.client("batch"), session.client("ec2"), session.client("iam")
    bucket, prefix = _storage(session, args)
    _check_endpoint(batch, args)
    subnets, groups = _network(ec2, args)
    if batch_iam.ensure_bucket(session.client("s3"), bucket, session.region_name, args.name):
        print(f"bucket               s3://{bucket} (made)")
    instance_role, profile_made, job_role = _roles(iam, args, bucket, prefix)
    environment = ensure_compute_environment(
        batch, args.name, instance_types=[t for t in args.instance_types.split(",") if t],
        max_vcpus=args.max_vcpus, subnets=subnets, security_groups=groups, instance_role=instance_role,
        service_role=args.service_role or batch_iam.service_linked_role(iam), spot=args.spot,
        profile_wait=PROFILE_WAIT_SECONDS if profile_made else 0.0,
    )
    queue = ensure_job_queue(batch, args.name, environment)
    secret = args.secret or os.environ.get(SECRET_ENV) or deployed_secret(batch, args.name) or new_secret()
    definition, changed = ensure_job_definition(batch, args.name, job_definition_spec(
        args.image, secret, vcpus=args.vcpus, memory=args.memory, gpu=args.gpu, job_role=job_role,
    ))
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
    _check_endpoint(session.client("batch"), args)
    for line in destroy(session.client("batch"), args.name, iam=session.client("iam"),
                        s3=session.client("s3"), bucket=bucket):
        print(line)
    return 0
