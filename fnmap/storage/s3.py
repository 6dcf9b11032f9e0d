"""``s3://bucket/prefix`` storage through boto3.

One class serves AWS S3, MinIO, Ceph and moto: the endpoint comes from boto3's
own settings (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, profiles), or from
``FNMAP_S3_ENDPOINT_URL`` as an override.  Throttling (503 SlowDown) is left to
botocore's ``adaptive`` retry mode rather than a loop of our own.

Large objects go up in parts: one PutObject takes at most 5 GiB, and AWS advises
multipart uploads from about 100 MB.  ``put_if_absent`` is a conditional write
(``If-None-Match: *`` on PutObject, or on CompleteMultipartUpload for a large
object): S3 answers 412 when the key exists, and 409 ConditionalRequestConflict
when a conflicting operation (a delete, another upload) ran during ours, for
which AWS's documentation says to upload again; botocore does not retry 409s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from ..errors import MissingBucket, StorageError, UnknownStorage
from . import _check_key, _not_found, is_unreachable, storage_failure

_MISSING = {"404", "NoSuchKey", "NotFound"}
_EXISTS = {"412", "PreconditionFailed"}
_RACED = {"409", "ConditionalRequestConflict"}

#: Objects larger than this are uploaded in parts.
MULTIPART_THRESHOLD = 64 * 1024 * 1024
#: Size of each part but the last (S3: at least 5 MiB, at most 10,000 parts).
PART_SIZE = 16 * 1024 * 1024
_MAX_PARTS = 10_000
_PART_THREADS = 8
#: Conditional writes answered 409 are sent again this many times in all.
_CONFLICT_ATTEMPTS = 6


def _storage_errors(method):
    """A botocore failure of a store method becomes one :class:`StorageError` naming the storage, the
    setting it came from and the fix (a missing bucket is never taken for a missing key)."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            if not type(e).__module__.startswith("botocore"):
                raise
            error = self._failure(e)
            # Its message says what botocore said and the fix: botocore's own traceback (some 40
            # lines of its internals) is kept only for a failure fnmap does not know.
            raise error from (e if getattr(error, "reason", None) == "failed" else None)

    return checked


#: S3 error codes of a request the storage refused for its credentials or policy.
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AllAccessDisabled",
            "InvalidToken", "ExpiredToken"}


class S3Store:
    """Objects under ``s3://bucket/prefix/``."""

    def __init__(self, url: str, setting: str | None = None, create: bool = True):
        parsed = urlparse(url)
        if not parsed.netloc:
            raise UnknownStorage(f"storage URL {url!r} names no bucket: use s3://bucket/prefix")
        self.url = url
        self.setting = setting  # where the URL came from, for error messages
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        if self.prefix:
            self.prefix += "/"
        self._client = make_s3_client()

    def _failure(self, e: Exception) -> StorageError:
        """The :class:`StorageError` a botocore exception ``e`` stands for."""
        endpoint = self._client.meta.endpoint_url
        name = type(e).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
            return storage_failure(self.url, self.setting, f"no AWS credentials to sign requests to {endpoint} "
                                   f"({e})", "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or "
                                   "run `aws configure`); offline, the keys of the local S3 server", "credentials")
        if is_unreachable(e):
            setting = os.environ.get("FNMAP_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
            return storage_failure(self.url, self.setting, f"cannot reach the S3 endpoint {endpoint} ({e})",
                                   "start the S3 server, or point AWS_ENDPOINT_URL_S3 (or FNMAP_S3_ENDPOINT_URL; now "
                                   f"{setting or 'unset'}) at one that runs", "unreachable")
        code = _code(e) if hasattr(e, "response") else ""
        if code == "NoSuchBucket":
            error = MissingBucket(
                f"storage URL {self.url!r}: bucket {self.bucket!r} does not exist at {endpoint}"
                + (f" ({self.setting})" if self.setting else "")
                + f"; create it first (aws s3 mb s3://{self.bucket}) or name a bucket that exists")
            return error
        if code in _REFUSED:
            return storage_failure(self.url, self.setting, f"S3 at {endpoint} refused access ({code}: {e})",
                                   "check the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's "
                                   "policy", "access")
        return storage_failure(self.url, self.setting, f"the S3 request failed ({name}: {e})",
                               f"check that the storage at {endpoint} works", "failed")

    def _key(self, key: str) -> str:
        _check_key(key)
        return self.prefix + key

    @_storage_errors
    def put(self, key: str, data: bytes | list) -> None:
        self._write(self._key(key), data)

    @_storage_errors
    def put_if_absent(self, key: str, data: bytes | list) -> bool:
        from botocore.exceptions import ClientError

        full_key = self._key(key)
        attempts = 0
        while True:
            try:
                self._write(full_key, data, IfNoneMatch="*")
                return True
            except ClientError as e:
                code = _code(e)
                if code in _EXISTS:
                    return False
                attempts += 1
                if code not in _RACED or attempts == _CONFLICT_ATTEMPTS:
                    raise
            # 409: no write is known to have won (a delete may have raced ours); wait a moment, write again.
            time.sleep(random.uniform(0, 0.05 * 2**attempts))

    def _write(self, full_key: str, data: bytes | list, **conditions) -> None:
        """One PutObject, or a multipart upload for a large object; ``conditions`` go on the request
        that makes the object visible."""
        if isinstance(data, list):  # botocore wants one body; the join costs little beside the upload
            data = b"".join(data)
        if len(data) <= MULTIPART_THRESHOLD:
            self._client.put_object(Bucket=self.bucket, Key=full_key, Body=data, **conditions)
        else:
            self._write_in_parts(full_key, data, **conditions)

    def _write_in_parts(self, full_key: str, data: bytes, **conditions) -> None:
        part_size = max(PART_SIZE, -(-len(data) // _MAX_PARTS))
        starts = range(0, len(data), part_size)
        upload = self._client.create_multipart_upload(Bucket=self.bucket, Key=full_key)
        upload_id = upload["UploadId"]
        completed_part_fields = self._client.meta.service_model.shape_for("CompletedPart").members

        def send(number_and_start: tuple[int, int]) -> dict:
            number, start = number_and_start
            resp = self._client.upload_part(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number,
                Body=data[start : start + part_size],
            )  # fmt: skip
            # A checksum botocore sent with the part must be repeated when completing the upload.
            return {name: resp[name] for name in completed_part_fields if name in resp} | {"PartNumber": number}

        try:
            with ThreadPoolExecutor(min(_PART_THREADS, len(starts))) as pool:
                parts = list(pool.map(send, enumerate(starts, 1)))
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts},
                **conditions,
            )  # fmt: skip
        except BaseException:
            # Uploaded parts are kept (and billed) until the upload is completed or aborted.
            with contextlib.suppress(Exception):  # the first error is the one to report
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
            raise

    @_storage_errors
    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as e:
            if _code(e) in _MISSING:
                raise _not_found(self.url, key) from None
            raise

    @_storage_errors
    def reader(self, key: str):
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except ClientError as e:
            if _code(e) in _MISSING:
                raise _not_found(self.url, key) from None
            raise

    @_storage_errors
    def get_range(self, key: str, start: int, end: int) -> bytes:
        from botocore.exceptions import ClientError

        if end <= start:
            return b""
        try:
            resp = self._client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}"
            )
            return resp["Body"].read()
        except ClientError as e:
            if _code(e) in _MISSING:
                raise _not_found(self.url, key) from None
            if _code(e) in {"416", "InvalidRange"}:
                return b""
            raise

    @_storage_errors
    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if _code(e) in _MISSING:
                return False
            raise

    @_storage_errors
    def list(self, prefix: str) -> list[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        keys = []
        cut = len(self.prefix)
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            keys.extend(obj["Key"][cut:] for obj in page.get("Contents", ()))
        keys.sort()
        return keys

    @_storage_errors
    def list_details(self, prefix: str) -> list[tuple[str, int, float]]:
        paginator = self._client.get_paginator("list_objects_v2")
        cut = len(self.prefix)
        found = [(obj["Key"][cut:], obj["Size"], obj["LastModified"].timestamp())
                 for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
                 for obj in page.get("Contents", ())]
        found.sort()
        return found

    @_storage_errors
    def delete(self, keys: list[str]) -> None:
        keys = list(keys)
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})


def make_s3_client():
    """A boto3 S3 client honouring ``FNMAP_S3_ENDPOINT_URL`` over boto3's own endpoint settings."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "adaptive", "max_attempts": 10}, max_pool_connections=64,
                    connect_timeout=CONNECT_TIMEOUT)
    endpoint = os.environ.get("FNMAP_S3_ENDPOINT_URL") or None
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
    client.meta.events.register_first("needs-retry.s3", _give_up_on_an_unreachable_endpoint)
    return client


#: Attempts at an endpoint that refuses connections, has no address or never answers before giving
#: up; the ten attempts kept for throttling would wait minutes for a storage that is not there.
UNREACHABLE_ATTEMPTS = 3
#: Seconds to wait for a TCP connection to S3 (botocore's default is 60): a network that drops the
#: packets (a function in a VPC with no route to S3) fails in UNREACHABLE_ATTEMPTS x this, not 10 minutes.
CONNECT_TIMEOUT = 10


def _give_up_on_an_unreachable_endpoint(attempts, caught_exception=None, **_kwargs):
    """botocore's retry hook: re-raise a connection failure after a few attempts; otherwise no opinion
    (None), so botocore's own retry mode decides."""
    if is_unreachable(caught_exception) and attempts >= UNREACHABLE_ATTEMPTS:
        raise caught_exception
    return None


def _code(error) -> str:
    err = error.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    known = _MISSING | _EXISTS | _RACED | _REFUSED | {"416", "InvalidRange", "NoSuchBucket"}
    return code if code in known else status
