"""``fnmap emulator --aws``: one command, and a shell that runs its exports reaches the AWS path offline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import boto3
import pytest


@pytest.fixture
def offline_aws(tmp_path):
    """``fnmap emulator --aws`` in a clean environment; yields its export lines; stopped after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    env_file = tmp_path / "offline.env"
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "emulator", "--aws", "--port", "0", "--workers", "2",
                             "--env-file", str(env_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        exports = []
        for line in proc.stdout:
            if line.startswith("export "):
                exports.append(line.strip())
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"the emulator did not start: {proc.stderr.read()}")
        yield exports, env, env_file
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_a_shell_that_runs_the_exports_maps_through_lambda_and_s3(offline_aws, tmp_path):
    exports, env, env_file = offline_aws
    names = {line.split()[1].split("=", 1)[0] for line in exports}
    assert {"FNMAP_BACKEND", "FNMAP_STORAGE", "FNMAP_SECRET", "AWS_ENDPOINT_URL_LAMBDA",
            "AWS_ENDPOINT_URL_S3"} <= names
    assert env_file.read_text().splitlines() == exports
    script = f"source {env_file}\npython -c 'import fnmap; print(fnmap.map(abs, [-1, -2, 3]))'\n"
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "[1, 2, 3]"
    settings = dict(line.split()[1].split("=", 1) for line in exports)
    s3 = boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                      aws_access_key_id="offline", aws_secret_access_key="offline")
    stored = s3.list_objects_v2(Bucket="fnmap-offline", Prefix="fnmap/jobs/").get("Contents", [])
    assert any("/out/" in obj["Key"] for obj in stored), "the results did not go through S3"
