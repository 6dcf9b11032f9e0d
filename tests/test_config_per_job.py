"""Configuration is read per job: a changed S3 endpoint between two jobs of one process is used by
the next job, in the client and in the embedded emulator's workers alike."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import boto3
import pytest
from s3servers import CREDENTIALS, MotoServer

import fnmap


def where_am_i(x):
    import os

    return os.environ.get("FNMAP_S3_ENDPOINT_URL"), x


class MotoProcess:
    """moto's server in a process of its own (two servers in one process would share their data)."""

    def __init__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def two_s3_servers():
    first = MotoServer()
    second = MotoProcess()
    try:
        for server in (first, second):
            boto3.client("s3", endpoint_url=server.url, **CREDENTIALS).create_bucket(Bucket="per-job")
        yield first.url, second.url
    finally:
        first.stop()
        second.stop()


def keys_in(endpoint: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)
    return [o["Key"] for o in s3.list_objects_v2(Bucket="per-job").get("Contents", [])]


@pytest.mark.parametrize("variable", ["FNMAP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_a_changed_s3_endpoint_is_used_by_the_next_job(two_s3_servers, monkeypatch, variable):
    first, second = two_s3_servers
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv({"region_name": "AWS_DEFAULT_REGION"}.get(name, name.upper()), value)
    storage = "s3://per-job/runs"

    monkeypatch.setenv(variable, first)
    job1 = fnmap.map(where_am_i, range(3), storage=storage, return_job=True)
    assert [x for _, x in job1.results()] == [0, 1, 2]
    monkeypatch.setenv(variable, second)
    job2 = fnmap.map(where_am_i, range(3), storage=storage, return_job=True)
    results = job2.results()
    assert [x for _, x in results] == [0, 1, 2]
    if variable == "FNMAP_S3_ENDPOINT_URL":  # the workers see the value of now, not of the first job
        assert {endpoint for endpoint, _ in results} == {second}

    first_keys, second_keys = keys_in(first), keys_in(second)
    assert any(job1.id in k for k in first_keys) and not any(job1.id in k for k in second_keys)
    assert any(job2.id in k for k in second_keys) and not any(job2.id in k for k in first_keys)
