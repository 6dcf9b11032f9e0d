"""The IAM roles and the bucket ``fnmap deploy batch`` makes when it is not given them.

* ``NAME-batch-instance``: the container instances' role (AWS's managed policy for ECS container
  instances: registering with ECS, pulling from ECR, writing logs) and an instance profile of the
  same name holding it;
* ``NAME-batch-job``: the role the containers run as (trusted by ``ecs-tasks.amazonaws.com``),
  allowed only the objects under ``s3://BUCKET/PREFIX/``;
* the bucket, if it does not exist yet.

Each is tagged ``fnmap:batch-deployment=NAME``; a same-named resource without that tag is someone
else's: deploy refuses to use it and destroy keeps it.  Every ``ensure_*`` compares what is there
with what is wanted and writes only the difference, so a second deploy changes nothing.
Batch's service-linked role (``AWSServiceRoleForBatch``) belongs to the account: it is looked up,
never made or removed here.
"""

from __future__ import annotations

import json

from ..errors import FnmapError

TAG = "fnmap:batch-deployment"
CREATED_TAG = "fnmap:created-bucket"
ECS_INSTANCE_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
SERVICE_LINKED_ROLE = "AWSServiceRoleForBatch"
JOB_POLICY = "fnmap-storage"


class DeployError(FnmapError):
    """A deploy step failed; the message names the resource and the fix."""


def instance_role_name(name: str) -> str:
    return f"{name}-batch-instance"


def job_role_name(name: str) -> str:
    return f"{name}-batch-job"


def trust_policy(service: str) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def job_policy(bucket: str, prefix: str) -> dict:
    """Least privilege for the containers: read, write and delete under the prefix, list only it."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "JobData", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*"},
        {"Sid": "ListJobData", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}},
    ]}


def _tags(items) -> dict:
    return {t["Key"]: t["Value"] for t in items or []}


def _not_ours(what: str, name: str, option: str) -> DeployError:
    return DeployError(
        f"{what} exists but was not made by `fnmap deploy batch` (no tag {TAG}={name}): pass your own "
        f"with {option}, choose another --name, or delete it yourself"
    )


# -- the service-linked role ----------------------------------------------------------------------


def service_linked_role(iam) -> str | None:
    """ARN of Batch's service-linked role, or None when the account has none yet.

    Naming it is the same as leaving ``serviceRole`` out, which AWS documents as "that role is used
    by default"; when it does not exist, leaving it out lets Batch create it."""
    try:
        return iam.get_role(RoleName=SERVICE_LINKED_ROLE)["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        return None


# -- roles and the instance profile ---------------------------------------------------------------


def ensure_role(iam, role_name: str, name: str, service: str, option: str) -> tuple[str, bool]:
    """(ARN, made now) of our role trusted by ``service``; its trust policy corrected if it drifted."""
    wanted = trust_policy(service)
    try:
        role = iam.get_role(RoleName=role_name)["Role"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(
            RoleName=role_name, AssumeRolePolicyDocument=json.dumps(wanted),
            Description=f"fnmap deploy batch {name}", Tags=[{"Key": TAG, "Value": name}],
        )["Role"]
        return role["Arn"], True
    if _tags(iam.list_role_tags(RoleName=role_name).get("Tags")).get(TAG) != name:
        raise _not_ours(f"IAM role {role_name}", name, option)
    if role.get("AssumeRolePolicyDocument") != wanted:
        iam.update_assume_role_policy(RoleName=role_name, PolicyDocument=json.dumps(wanted))
    return role["Arn"], False


def ensure_inline_policy(iam, role_name: str, policy_name: str, document: dict) -> None:
    try:
        current = iam.get_role_policy(RoleName=role_name, PolicyName=policy_name)["PolicyDocument"]
    except iam.exceptions.NoSuchEntityException:
        current = None
    if current != document:
        iam.put_role_policy(RoleName=role_name, PolicyName=policy_name, PolicyDocument=json.dumps(document))


def ensure_managed_policy(iam, role_name: str, policy_arn: str) -> None:
    pages = iam.get_paginator("list_attached_role_policies").paginate(RoleName=role_name)
    if policy_arn not in {p["PolicyArn"] for page in pages for p in page["AttachedPolicies"]}:
        try:
            iam.attach_role_policy(RoleName=role_name, PolicyArn=policy_arn)
        except iam.exceptions.NoSuchEntityException as e:
            raise DeployError(
                f"the AWS managed policy {policy_arn} does not exist at this IAM endpoint "
                f"({iam.meta.endpoint_url}), which every AWS account has: an IAM that is not AWS's? moto has "
                "them with MOTO_IAM_LOAD_MANAGED_POLICIES=true set where its server runs; or pass --instance-role "
                f"PROFILE, an instance profile of your own ({e})"
            ) from e


def ensure_instance_profile(iam, profile_name: str, role_name: str, name: str) -> tuple[str, bool]:
    """(ARN, made now) of our instance profile holding exactly ``role_name``."""
    made = False
    try:
        profile = iam.get_instance_profile(InstanceProfileName=profile_name)["InstanceProfile"]
        if _tags(profile.get("Tags")).get(TAG) != name:
            raise _not_ours(f"instance profile {profile_name}", name, "--instance-role")
    except iam.exceptions.NoSuchEntityException:
        profile = iam.create_instance_profile(
            InstanceProfileName=profile_name, Tags=[{"Key": TAG, "Value": name}]
        )["InstanceProfile"]
        made = True
    held = [r["RoleName"] for r in profile.get("Roles", [])]
    for other in held:
        if other != role_name:
            iam.remove_role_from_instance_profile(InstanceProfileName=profile_name, RoleName=other)
    if role_name not in held:
        iam.add_role_to_instance_profile(InstanceProfileName=profile_name, RoleName=role_name)
        made = True  # Batch may not see the profile with its role for a few seconds
    return profile["Arn"], made


def ensure_instance_role(iam, name: str) -> tuple[str, bool]:
    """(instance profile ARN, made now) for the container instances."""
    role = instance_role_name(name)
    ensure_role(iam, role, name, "ec2.amazonaws.com", "--instance-role")
    ensure_managed_policy(iam, role, ECS_INSTANCE_POLICY)
    return ensure_instance_profile(iam, role, role, name)


def ensure_job_role(iam, name: str, bucket: str, prefix: str) -> str:
    role = job_role_name(name)
    arn, _ = ensure_role(iam, role, name, "ecs-tasks.amazonaws.com", "--job-role")
    ensure_inline_policy(iam, role, JOB_POLICY, job_policy(bucket, prefix))
    return arn


def destroy_roles(iam, name: str) -> list[str]:
    """Delete our instance profile and roles (after the compute environment is gone)."""
    done = []
    profile_name = instance_role_name(name)
    try:
        profile = iam.get_instance_profile(InstanceProfileName=profile_name)["InstanceProfile"]
    except iam.exceptions.NoSuchEntityException:
        profile = None
    if profile is not None and _tags(profile.get("Tags")).get(TAG) != name:
        done.append(f"kept instance profile {profile_name}: not made by fnmap deploy batch (no tag {TAG}={name})")
    elif profile is not None:
        for role in profile.get("Roles", []):
            iam.remove_role_from_instance_profile(InstanceProfileName=profile_name, RoleName=role["RoleName"])
        iam.delete_instance_profile(InstanceProfileName=profile_name)
        done.append(f"deleted instance profile {profile_name}")
    for role in (instance_role_name(name), job_role_name(name)):
        try:
            tags = _tags(iam.list_role_tags(RoleName=role).get("Tags"))
        except iam.exceptions.NoSuchEntityException:
            continue
        if tags.get(TAG) != name:
            done.append(f"kept IAM role {role}: not made by fnmap deploy batch (no tag {TAG}={name})")
            continue
        for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=role):
            for policy in page["AttachedPolicies"]:
                iam.detach_role_policy(RoleName=role, PolicyArn=policy["PolicyArn"])
        for policy in iam.list_role_policies(RoleName=role)["PolicyNames"]:
            iam.delete_role_policy(RoleName=role, PolicyName=policy)
        for other in iam.list_instance_profiles_for_role(RoleName=role)["InstanceProfiles"]:
            iam.remove_role_from_instance_profile(InstanceProfileName=other["InstanceProfileName"], RoleName=role)
        iam.delete_role(RoleName=role)
        done.append(f"deleted IAM role {role}")
    return done


# -- the bucket ----------------------------------------------------------------------------------


def ensure_bucket(s3, bucket: str, region: str, name: str) -> bool:
    """Make the bucket (private, tagged) unless it exists; True when made now."""
    try:
        s3.head_bucket(Bucket=bucket)
        return False
    except s3.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise DeployError(
                f"bucket {bucket!r} exists but is not yours or not reachable ({e}): pass another --bucket"
            ) from e
    kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    s3.create_bucket(Bucket=bucket, **kwargs)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [
        {"Key": TAG, "Value": name}, {"Key": CREATED_TAG, "Value": "true"}]})
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    return True


def destroy_bucket(s3, bucket: str, name: str) -> list[str]:
    """Delete the bucket and its objects only if this deployment made it."""
    try:
        tags = _tags(s3.get_bucket_tagging(Bucket=bucket)["TagSet"])
    except s3.exceptions.ClientError:  # no such bucket, or no tags: not ours
        return []
    if tags.get(TAG) != name or tags.get(CREATED_TAG) != "true":
        return []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        objects = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                   for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if objects:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
    s3.delete_bucket(Bucket=bucket)
    return [f"deleted bucket s3://{bucket} (and its objects)"]
