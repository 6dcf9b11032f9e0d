"""``s3://bucket/prefix`` storage through boto3.

One class serves AWS S3, MinIO, Ceph and moto: the endpoint comes from boto3's
own settings (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, profiles), or from
``FNMAP_S3_ENDPOINT_URL`` as an override.  Throttling (503 SlowDown) is left to
botocore's ``adaptive`` retry mode rather than a loop of our own.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from ..errors import UnknownStorage
from . import _check_key, _not_found

_MISSING = {"404", "NoSuchKey", "NotFound"}
_CONFLICT = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}


class S3Store:
    """Objects under ``s3://bucket/prefix/``."""

    def __init__(self, url: str):
        parsed = urlparse(url)
        if not parsed.netloc:
            raise UnknownStorage(f"storage URL {url!r} names no bucket: use s3://bucket/prefix")
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        if self.prefix:
            self.prefix += "/"
        self._client = make_s3_client()

    def _key(self, key: str) -> str:
        _check_key(key)
        return self.prefix + key

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as e:
            if _code(e) in _CONFLICT:
                return False
            raise

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as e:
            if _code(e) in _MISSING:
                raise _not_found(self.url, key) from None
            raise

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

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as e:
            if _code(e) in _MISSING:
                return False
            raise

    def list(self, prefix: str) -> list[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        keys = []
        cut = len(self.prefix)
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            keys.extend(obj["Key"][cut:] for obj in page.get("Contents", ()))
        keys.sort()
        return keys

    def delete(self, keys: list[str]) -> None:
        keys = list(keys)
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": self._key(k)} for k in keys[i : i + 1000]]
            self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})


def make_s3_client():
    """A boto3 S3 client honouring ``FNMAP_S3_ENDPOINT_URL`` over boto3's own endpoint settings."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "adaptive", "max_attempts": 10}, max_pool_connections=64)
    endpoint = os.environ.get("FNMAP_S3_ENDPOINT_URL") or None
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def _code(error) -> str:
    err = error.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code if code in _MISSING | _CONFLICT | {"416", "InvalidRange"} else status
