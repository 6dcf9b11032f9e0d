"""``fnmap deploy aws deploy|update|env|destroy``: the ``aws`` backend's function, bucket, role and URL.
``env`` (:mod:`.aws_env`) builds the packages the calls import into the function's layer.

``deploy`` is idempotent (a second run updates in place) and creates:

1. the S3 bucket (unless it exists; public access blocked) with a lifecycle
   rule expiring ``<prefix>/jobs/`` after ``--expire-days``;
2. an IAM role Lambda assumes, allowed only the objects under the bucket
   prefix and its own log group;
3. the log group ``/aws/lambda/<name>`` with a retention period;
4. the function from a zip of fnmap + handlers + cloudpickle (the client's own
   versions, so pickles load), plus a dependency layer built from
   ``--requirements`` (reused while unchanged); or from a container image (``--image``, built from
   ``infra/lambda.Dockerfile``);
5. reserved concurrency, asynchronous retries off (the client retries) and events dropped after
   ``--max-event-age``, and a function URL with ``AWS_IAM`` auth.

It prints the settings a client needs.  Every resource is tagged
``fnmap:deployment=<name>``; ``destroy`` removes exactly those (a bucket only
if deploy created it, otherwise just its lifecycle rule).  ``update`` replaces
code and configuration of an existing deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

from ..errors import ConfigError, FnmapError
from ..runtime.serialization import runtime_info
from ..runtime.signing import new_secret
from .aws_policies import role_policy, trust_policy
from .package import UNZIPPED_LIMIT, build_zip, code_sha256, unzipped_size

TAG = "fnmap:deployment"
CREATED_TAG = "fnmap:created-bucket"
LIFECYCLE_RULE_ID = "fnmap-expire-jobs"
HANDLER = "handlers.aws_lambda.handler"
_ROLE_RETRY_SECONDS = 90
_DESCRIPTION = (
    "Create, update or destroy fnmap on AWS Lambda: the S3 bucket for job data, the function's IAM "
    "role and log group, the function itself, its reserved concurrency and its function URL."
)


@dataclass
class Settings:
    name: str = "fnmap"
    region: str | None = None
    bucket: str | None = None
    prefix: str = "fnmap"
    memory: int = 1024
    timeout: int = 900
    concurrency: int = 50
    architecture: str = "x86_64"
    image: str | None = None
    requirements: str | None = None
    expire_days: int = 7
    log_retention_days: int = 14
    rotate_secret: bool = False
    max_event_age: int = 300  # Lambda's MaximumEventAgeInSeconds (retries off): backends/lambda_deployment.py


# -- deploy ------------------------------------------------------------------------


class Deployment:
    """The AWS resources of one deployment (named ``settings.name``) and the calls that manage them."""

    def __init__(self, settings: Settings, out=print):
        import boto3

        self.s = settings
        self.out = out
        session = boto3.session.Session(region_name=settings.region)
        self.region = session.region_name or "us-east-1"
        self.iam = session.client("iam")
        self.s3 = session.client("s3", region_name=self.region)
        self.logs = session.client("logs", region_name=self.region)
        self.lam = session.client("lambda", region_name=self.region)
        self.account = session.client("sts", region_name=self.region).get_caller_identity()["Account"]
        self.bucket = settings.bucket or f"fnmap-{self.account}-{self.region}"
        self.prefix = settings.prefix.strip("/")
        self.role_name = f"{settings.name}-lambda"
        self.log_group = f"/aws/lambda/{settings.name}"
        self.runtime = f"python{runtime_info()['python']}"

    # The steps, each create-or-update.

    def deploy(self, update_only: bool = False) -> dict:
        existing = self._function()
        if update_only and existing is None:
            raise ConfigError(
                f"there is no Lambda function {self.s.name!r} in {self.region} to update: run `deploy` first"
            )
        if existing is not None:
            self._check_ours("function", (existing.get("Tags") or {}))
            before = existing["Configuration"]
        else:
            before = self._served_without_deployment()
        self._bucket()
        role_arn = self._role()
        self._log_group()
        secret = self._secret(before)
        layers = self._layer()
        self._function_code_and_config(existing, before, role_arn, secret, layers)
        self._concurrency()
        self.lam.put_function_event_invoke_config(
            FunctionName=self.s.name, MaximumRetryAttempts=0, MaximumEventAgeInSeconds=self.s.max_event_age)
        url = self._url()
        result = {
            "FNMAP_BACKEND": "aws", "FNMAP_FUNCTION_NAME": self.s.name, "FNMAP_REGION": self.region,
            "FNMAP_STORAGE": f"s3://{self.bucket}/{self.prefix}", "FNMAP_SECRET": secret, "function_url": url,
        }
        self._print(result)
        self._note_storage(result["FNMAP_STORAGE"])
        return result

    def _function(self) -> dict | None:
        try:
            return self.lam.get_function(FunctionName=self.s.name)
        except self.lam.exceptions.ResourceNotFoundException:
            return None

    def _served_without_deployment(self) -> dict | None:
        """The configuration of a function the endpoint runs although nobody created it, else None.

        The fnmap emulator answers every name with its own package, secret and the layers ``fnmap
        deploy aws env`` attached (the offline rehearsal); AWS answers 404, as GetFunction did.
        Deploy creates the function over it keeping that secret and those layers, so the clients
        already using it go on working."""
        from botocore.exceptions import ClientError

        try:
            config = self.lam.get_function_configuration(FunctionName=self.s.name)
        except ClientError as e:  # ResourceNotFoundException, or no lambda:GetFunctionConfiguration
            if e.response.get("Error", {}).get("Code") in {"ResourceNotFoundException", *AUTH_ERROR_CODES}:
                return None
            raise
        self.out(f"function {self.s.name}: the endpoint runs it without a deployment (the fnmap emulator runs "
                 "every name with its own package); creating it keeps that function's secret and layers")
        return config

    def _check_ours(self, what: str, tags: dict) -> None:
        if tags.get(TAG) != self.s.name:
            raise ConfigError(
                f"the {what} of {self.s.name!r} exists but was not created by `fnmap deploy aws` (no tag "
                f"{TAG}={self.s.name}); choose another --name, or remove it yourself"
            )

    def _bucket(self) -> None:
        created = False
        try:
            self.s3.head_bucket(Bucket=self.bucket)
        except self.s3.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                raise ConfigError(f"bucket {self.bucket!r} exists but is not yours or not reachable: {e}") from e
            kwargs = {} if self.region == "us-east-1" else {
                "CreateBucketConfiguration": {"LocationConstraint": self.region}}
            self.s3.create_bucket(Bucket=self.bucket, **kwargs)
            self.s3.put_bucket_tagging(Bucket=self.bucket, Tagging={"TagSet": [
                {"Key": TAG, "Value": self.s.name}, {"Key": CREATED_TAG, "Value": "true"}]})
            created = True
        self.s3.put_public_access_block(Bucket=self.bucket, PublicAccessBlockConfiguration={
            "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True})
        rules = [r for r in self._lifecycle_rules() if r.get("ID") != LIFECYCLE_RULE_ID]
        rules.append({"ID": LIFECYCLE_RULE_ID, "Status": "Enabled",
                      "Filter": {"Prefix": f"{self.prefix}/jobs/"},
                      "Expiration": {"Days": self.s.expire_days},
                      "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}})
        self.s3.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration={"Rules": rules})
        self.out(f"bucket s3://{self.bucket} ({'created' if created else 'exists'}): "
                 f"{self.prefix}/jobs/ expires after {self.s.expire_days} days")

    def _lifecycle_rules(self) -> list[dict]:
        try:
            return self.s3.get_bucket_lifecycle_configuration(Bucket=self.bucket).get("Rules", [])
        except self.s3.exceptions.ClientError:  # NoSuchLifecycleConfiguration
            return []

    def _role(self) -> str:
        try:
            role = self.iam.get_role(RoleName=self.role_name)["Role"]
            self._check_ours("IAM role", {t["Key"]: t["Value"] for t in self.iam.list_role_tags(
                RoleName=self.role_name).get("Tags", [])})
            self.iam.update_assume_role_policy(RoleName=self.role_name, PolicyDocument=json.dumps(trust_policy()))
        except self.iam.exceptions.NoSuchEntityException:
            role = self.iam.create_role(
                RoleName=self.role_name, AssumeRolePolicyDocument=json.dumps(trust_policy()),
                Description=f"fnmap Lambda function {self.s.name}", Tags=[{"Key": TAG, "Value": self.s.name}],
            )["Role"]
        self.iam.put_role_policy(
            RoleName=self.role_name, PolicyName="fnmap",
            PolicyDocument=json.dumps(role_policy(self.bucket, self.prefix, self.region, self.account, self.s.name)),
        )
        self.out(f"IAM role {self.role_name}: s3://{self.bucket}/{self.prefix}/* and {self.log_group} only")
        return role["Arn"]

    def _log_group(self) -> None:
        try:
            self.logs.create_log_group(logGroupName=self.log_group, tags={TAG: self.s.name})
        except self.logs.exceptions.ResourceAlreadyExistsException:
            pass
        self.logs.put_retention_policy(logGroupName=self.log_group, retentionInDays=self.s.log_retention_days)

    def _secret(self, before: dict | None) -> str:
        """The function's secret as it was (``before``: its configuration), unless ``--rotate-secret``."""
        old = _variables(before).get("FNMAP_SECRET")
        if old and not self.s.rotate_secret:
            return old
        return new_secret()

    def _layer(self) -> list[str]:
        """The ``--requirements`` environment as a layer: reused when unchanged (``fnmap deploy aws env``)."""
        if not self.s.requirements or self.s.image:
            return []
        from .aws_env import Source, layer_for

        source = Source("requirements", self.s.requirements)
        return [layer_for(self.lam, self.s.name, source, self.runtime, self.s.architecture, self.out)]

    def _function_code_and_config(self, existing, before, role_arn: str, secret: str, layers: list[str]) -> None:
        """Create or update the function; ``before``: its configuration until now (an existing
        deployment's, or the one the endpoint runs without one), whose layers are kept unless
        ``--requirements`` or ``--image`` replaces them."""
        env = {"Variables": {"FNMAP_SECRET": secret, "FNMAP_RUNTIME": json.dumps(runtime_info())}}
        config = dict(Role=role_arn, Timeout=self.s.timeout, MemorySize=self.s.memory, Environment=env,
                      Description="fnmap worker (handlers/aws_lambda.py)")
        if not self.s.image:
            if not layers and not self.s.requirements:
                layers = [layer["Arn"] for layer in (before or {}).get("Layers", [])]
            config.update(Runtime=self.runtime, Handler=HANDLER, Layers=layers)
        for line in _changes(before, config, secret):
            self.out(f"function {self.s.name}: {line}")
        code = self._code()
        if existing is None:
            self._with_role_retry(lambda: self.lam.create_function(
                FunctionName=self.s.name, Code=code, PackageType="Image" if self.s.image else "Zip",
                Architectures=[self.s.architecture], Tags={TAG: self.s.name}, Publish=False, **config))
            self._wait("function_active_v2")
            self.out(f"Lambda function {self.s.name} created ({self.runtime}, {self.s.memory} MB, "
                     f"{self.s.timeout} s)")
            return
        if "ZipFile" not in code or existing["Configuration"].get("CodeSha256") != code_sha256(code["ZipFile"]):
            self.lam.update_function_code(FunctionName=self.s.name, Architectures=[self.s.architecture], **code)
            self._wait("function_updated_v2")
        self._with_role_retry(lambda: self.lam.update_function_configuration(FunctionName=self.s.name, **config))
        self._wait("function_updated_v2")
        self.out(f"Lambda function {self.s.name} updated")

    def _code(self) -> dict:
        if self.s.image:
            return {"ImageUri": self.s.image}
        with tempfile.TemporaryDirectory() as tmp:
            path = build_zip(os.path.join(tmp, "fnmap.zip"))
            size = unzipped_size(path)
            if size > UNZIPPED_LIMIT:
                raise FnmapError(f"the function's code is {size / 2**20:.0f} MiB unzipped, over Lambda's 250 MiB")
            with open(path, "rb") as f:
                return {"ZipFile": f.read()}

    def _with_role_retry(self, call):
        """A new role takes seconds to reach Lambda ("cannot be assumed"): retry that for a while."""
        deadline = time.monotonic() + _ROLE_RETRY_SECONDS
        while True:
            try:
                return call()
            except self.lam.exceptions.InvalidParameterValueException as e:
                if "assumed" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(3)

    def _wait(self, waiter: str) -> None:
        self.lam.get_waiter(waiter).wait(FunctionName=self.s.name, WaiterConfig={"Delay": 2, "MaxAttempts": 150})

    def _concurrency(self) -> None:
        if not self.s.concurrency:
            self.lam.delete_function_concurrency(FunctionName=self.s.name)
            return
        try:
            self.lam.put_function_concurrency(FunctionName=self.s.name,
                                              ReservedConcurrentExecutions=self.s.concurrency)
        except self.lam.exceptions.InvalidParameterValueException as e:
            raise ConfigError(
                f"--concurrency {self.s.concurrency} cannot be reserved ({e}); Lambda keeps 100 of the account's "
                "concurrency unreserved: pass a smaller --concurrency, --concurrency 0 for none, or ask AWS "
                "for a higher concurrency quota"
            ) from e

    def _url(self) -> str | None:
        from botocore.exceptions import ClientError

        try:
            try:
                url = self.lam.get_function_url_config(FunctionName=self.s.name)
                if url.get("AuthType") != "AWS_IAM":
                    url = self.lam.update_function_url_config(FunctionName=self.s.name, AuthType="AWS_IAM")
            except self.lam.exceptions.ResourceNotFoundException:
                url = self.lam.create_function_url_config(FunctionName=self.s.name, AuthType="AWS_IAM")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NotImplemented":
                raise
            self.out(f"no function URL: {e.response['Error'].get('Message')}")  # the emulator
            return None
        return url["FunctionUrl"]

    def _note_storage(self, storage: str) -> None:
        """Say so when this shell's ``FNMAP_STORAGE`` is not the deployment's (the offline rehearsal's
        bucket, another deployment's): the function's role allows only its own."""
        here = os.environ.get("FNMAP_STORAGE", "").rstrip("/")
        if here.startswith("s3://") and here != storage:
            self.out(f"note: FNMAP_STORAGE here is {here}, not this deployment's {storage} (the only storage its "
                     f"role may use): export the line above, or deploy with --bucket and --prefix naming yours")

    def _print(self, result: dict) -> None:
        self.out("")
        self.out("fnmap is deployed. Use it with (keep FNMAP_SECRET private):")
        for key, value in result.items():
            if key.startswith("FNMAP_"):
                self.out(f"  export {key}={value}")
        if result["function_url"]:
            self.out(f"function URL (AWS_IAM auth, SigV4-signed requests only): {result['function_url']}")

    # -- destroy -----------------------------------------------------------------

    def destroy(self) -> list[str]:
        """Remove what deploy created; return what was removed."""
        removed = []
        existing = self._function()
        if existing is not None:
            self._check_ours("function", existing.get("Tags") or {})
            self._delete_url()
            self.lam.delete_function(FunctionName=self.s.name)
            removed.append(f"function {self.s.name}")
        for version in self._layer_versions():
            self.lam.delete_layer_version(LayerName=f"{self.s.name}-deps", VersionNumber=version)
            removed.append(f"layer {self.s.name}-deps:{version}")
        try:
            groups = self.logs.describe_log_groups(logGroupNamePrefix=self.log_group)["logGroups"]
            if any(g["logGroupName"] == self.log_group for g in groups):
                self.logs.delete_log_group(logGroupName=self.log_group)
                removed.append(f"log group {self.log_group}")
        except self.logs.exceptions.ResourceNotFoundException:
            pass
        try:
            tags = {t["Key"]: t["Value"] for t in self.iam.list_role_tags(RoleName=self.role_name).get("Tags", [])}
            self._check_ours("IAM role", tags)
            for policy in self.iam.list_role_policies(RoleName=self.role_name)["PolicyNames"]:
                self.iam.delete_role_policy(RoleName=self.role_name, PolicyName=policy)
            self.iam.delete_role(RoleName=self.role_name)
            removed.append(f"IAM role {self.role_name}")
        except self.iam.exceptions.NoSuchEntityException:
            pass
        removed.extend(self._destroy_bucket())
        for line in removed or ["nothing: no deployment named " + repr(self.s.name)]:
            self.out(f"removed {line}")
        return removed

    def _delete_url(self) -> None:
        """Delete the function URL, if any: none when the endpoint serves no function URLs (the fnmap
        emulator; deploy then made none)."""
        from botocore.exceptions import ClientError

        try:
            self.lam.delete_function_url_config(FunctionName=self.s.name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("ResourceNotFoundException", "NotImplemented"):
                raise

    def _layer_versions(self) -> list[int]:
        try:
            pages = self.lam.get_paginator("list_layer_versions").paginate(LayerName=f"{self.s.name}-deps")
            return [v["Version"] for page in pages for v in page.get("LayerVersions", [])]
        except self.lam.exceptions.ResourceNotFoundException:
            return []

    def _destroy_bucket(self) -> list[str]:
        try:
            tags = {t["Key"]: t["Value"] for t in self.s3.get_bucket_tagging(Bucket=self.bucket)["TagSet"]}
        except self.s3.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("NoSuchBucket", "404"):
                return []
            tags = {}  # NoSuchTagSet: a bucket deploy did not create
        if tags.get(TAG) == self.s.name and tags.get(CREATED_TAG) == "true":
            paginator = self.s3.get_paginator("list_object_versions")
            for page in paginator.paginate(Bucket=self.bucket):
                objects = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                           for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
                if objects:
                    self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            self.s3.delete_bucket(Bucket=self.bucket)
            return [f"bucket s3://{self.bucket} (and its objects)"]
        rules = self._lifecycle_rules()
        kept = [r for r in rules if r.get("ID") != LIFECYCLE_RULE_ID]
        if len(kept) == len(rules):
            return []
        if kept:
            self.s3.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration={"Rules": kept})
        else:
            self.s3.delete_bucket_lifecycle(Bucket=self.bucket)
        return [f"lifecycle rule {LIFECYCLE_RULE_ID} of s3://{self.bucket} (the bucket was yours: kept)"]


def _variables(config: dict | None) -> dict:
    return ((config or {}).get("Environment") or {}).get("Variables") or {}


def _changes(before: dict | None, config: dict, secret: str) -> list[str]:
    """What deploying ``config`` changes in a function configured ``before`` (None: a new function):
    the secret its clients sign with, its layers, memory and time limit."""
    if before is None:
        return []
    lines = []
    old_secret = _variables(before).get("FNMAP_SECRET")
    if old_secret == secret:
        lines.append("secret kept (the clients' FNMAP_SECRET still works)")
    else:
        lines.append("NEW secret" + (" (--rotate-secret)" if old_secret else "") +
                     ": every client needs the FNMAP_SECRET printed below")
    old_layers = [layer["Arn"] for layer in before.get("Layers", [])]
    new_layers = config.get("Layers", [])
    if old_layers and old_layers == new_layers:
        lines.append(f"layers kept: {', '.join(old_layers)}")
    elif old_layers != new_layers:
        lines.append(f"layers {', '.join(old_layers) or 'none'} -> {', '.join(new_layers) or 'none'}")
    for key, unit in (("MemorySize", "MB"), ("Timeout", "s")):
        if before.get(key) is not None and before[key] != config[key]:
            lines.append(f"{key} {before[key]} -> {config[key]} {unit}")
    return lines


# -- command line ----------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .aws_env import add_env_arguments

    d = Settings()
    p.add_argument("action", choices=["deploy", "update", "env", "destroy"],
                   help="deploy: create or update everything; update: code and configuration of an existing "
                        "deployment; env: build the packages your functions import into a layer and attach it "
                        "(see below); destroy: remove what deploy created")
    p.add_argument("--name", default=d.name, help=f"function name, and prefix of the role's (default {d.name})")
    p.add_argument("--region", default=None, help="AWS region (default: boto3's, e.g. AWS_DEFAULT_REGION)")
    p.add_argument("--bucket", default=None, help="S3 bucket for job data (default fnmap-<account>-<region>)")
    p.add_argument("--prefix", default=d.prefix, help=f"key prefix in the bucket (default {d.prefix})")
    p.add_argument("--memory", type=int, default=d.memory, help=f"MB per call; CPU grows with it (default {d.memory})")
    p.add_argument("--timeout", type=int, default=d.timeout,
                   help=f"seconds per call, at most 900 (default {d.timeout})")
    p.add_argument("--concurrency", type=int, default=d.concurrency,
                   help=f"reserved concurrency; 0 for none (default {d.concurrency})")
    p.add_argument("--max-event-age", type=int, default=d.max_event_age,
                   help="seconds Lambda may queue an Event call before dropping it, 60-21600; the client "
                        f"declares a call lost after this + --timeout (default {d.max_event_age})")
    p.add_argument("--architecture", choices=["x86_64", "arm64"], default=None,
                   help=f"the function's architecture (default: deploy {d.architecture}; env: the function's)")
    p.add_argument("--image", default=None, help="container image URI (built from infra/lambda.Dockerfile) "
                                                 "instead of the zip")
    p.add_argument("--requirements", default=None, metavar="FILE",
                   help="requirements.txt of what your functions import: manylinux wheels built into a layer")
    add_env_arguments(p)
    p.add_argument("--expire-days", type=int, default=d.expire_days, help="days job data is kept (default 7)")
    p.add_argument("--log-retention-days", type=int, default=d.log_retention_days)
    p.add_argument("--rotate-secret", action="store_true", help="make a new signing secret (clients need it)")


def settings_from(args) -> Settings:
    d = Settings()
    s = Settings(name=args.name, region=args.region, bucket=args.bucket, prefix=args.prefix,
                 memory=args.memory, timeout=args.timeout, concurrency=args.concurrency,
                 architecture=args.architecture or d.architecture, image=args.image, requirements=args.requirements,
                 expire_days=args.expire_days, log_retention_days=args.log_retention_days,
                 rotate_secret=args.rotate_secret, max_event_age=args.max_event_age)
    if not 60 <= s.max_event_age <= 21600:
        raise ConfigError(f"--max-event-age {s.max_event_age} must be between 60 and 21600 seconds (Lambda's limits)")
    if not 1 <= s.timeout <= 900:
        raise ConfigError(f"--timeout {s.timeout} must be between 1 and 900 seconds (Lambda's limit)")
    if not 128 <= s.memory <= 10240:
        raise ConfigError(f"--memory {s.memory} must be between 128 and 10240 MB (Lambda's limits)")
    if s.concurrency < 0:
        raise ConfigError(f"--concurrency {s.concurrency} must be 0 (none reserved) or more")
    return s


#: Error codes that mean the credentials, or their permissions, are the problem.
AUTH_ERROR_CODES = {
    "AccessDenied", "AccessDeniedException", "AuthFailure", "ExpiredToken", "ExpiredTokenException",
    "IncompleteSignature", "InvalidAccessKeyId", "InvalidClientTokenId", "InvalidSignatureException",
    "MissingAuthenticationToken", "NotAuthorized", "SignatureDoesNotMatch", "UnauthorizedOperation",
    "UnrecognizedClientException",
}


def explain_failure(action: str, name: str, e: Exception, region: str | None = None) -> str:
    """What stopped ``action``, with advice that fits the error: credentials only for auth errors,
    and the region too when none is set either (``region``: the one given or configured, or None)."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    stopped = f"{action} of {name!r} stopped: {e}."
    again = "then run it again: every step is safe to repeat"
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)) and not region:
        return (f"{stopped} No AWS region is set either. Set the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and a region (--region, or AWS_DEFAULT_REGION); "
                f"`aws configure` sets both (docs/deploy.md, Run on AWS), {again}")
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)) or (
            isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") in AUTH_ERROR_CODES):
        return f"{stopped} Check the credentials and their permissions (docs/deploy.md, Run on AWS), {again}"
    if isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") == "NotImplemented":
        return (f"{stopped} The endpoint does not serve that operation (AWS_ENDPOINT_URL_LAMBDA or "
                f"AWS_ENDPOINT_URL points elsewhere than AWS); use AWS itself for it")
    return f"{stopped} Fix what it names, {again}"


def run(args) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    settings = settings_from(args)
    env_only = [flag for flag, value in (("--lock", args.lock), ("--from-imports", args.from_imports),
                                         ("--current", args.current)) if value]
    if env_only and args.action != "env":
        raise ConfigError(f"{', '.join(env_only)} go with `fnmap deploy aws env`, not {args.action}")
    try:
        if args.action == "env":
            from .aws_env import run_env

            run_env(args)
            return 0
        deployment = Deployment(settings)
        if args.action == "destroy":
            deployment.destroy()
        else:
            deployment.deploy(update_only=args.action == "update")
    except (BotoCoreError, ClientError) as e:
        import boto3

        region = settings.region or boto3.session.Session().region_name
        raise FnmapError(explain_failure(args.action, settings.name, e, region)) from e
    return 0


def register(targets) -> None:
    p = targets.add_parser("aws", help="AWS Lambda + S3 + function URL (the aws backend)",
                           description=_DESCRIPTION)
    add_arguments(p)
    p.set_defaults(run=run)


def main(argv: list[str] | None = None) -> int:
    """Entry of ``python -m infra.aws``."""
    p = argparse.ArgumentParser(prog="python -m infra.aws", description=_DESCRIPTION)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except FnmapError as e:
        print(f"infra.aws {args.action}: error: {e}", file=sys.stderr)
        return 1
