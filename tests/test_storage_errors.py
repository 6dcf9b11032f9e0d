"""A read-only or full storage folder: one clear error naming the storage, the setting and the fix,
and no retries (a full disk does not empty itself between attempts).

Each case runs a script inside a user and mount namespace (``unshare -rm``) where the storage
folder is a small tmpfs, read-only or nearly full: no root needed, nothing left mounted after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback

import pytest

import fnmap

SCRIPT = r"""
import sys, fnmap
def big(x):
    import os
    return os.urandom(400_000)  # does not compress
try:
    fnmap.map({func}, range(3), retries=2, return_job=False)
except fnmap.StorageError as e:
    print("STORAGE-ERROR", e)
    sys.exit(3)
except Exception as e:
    print("OTHER", type(e).__name__, e)
    sys.exit(4)
print("NO-ERROR")
"""


def run_on_tmpfs(tmp_path, mount_options: str, func: str, prepare: str = "",
                 storage_folder: str = "store") -> subprocess.CompletedProcess:
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("user namespaces are not available here (unshare -rm)")
    store = tmp_path / "store"
    store.mkdir()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(func=func))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env["FNMAP_STORAGE"] = (tmp_path / storage_folder).as_uri()
    shell = (f"{prepare}mount -t tmpfs -o {mount_options} tmpfs {store} && "
             f"exec {sys.executable} {script}")
    return subprocess.run(["unshare", "-rm", "sh", "-c", shell], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_a_read_only_storage_folder_names_the_setting_and_the_fix(tmp_path):
    done = run_on_tmpfs(tmp_path, "ro", "abs")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "STORAGE-ERROR storage file://" in done.stdout and "cannot write to the folder" in done.stdout
    assert "FNMAP_STORAGE=" in done.stdout and "(from the environment)" in done.stdout
    assert "Warning" not in done.stderr, done.stderr  # one error, no warning about the job's record first
    assert "Read-only file system" in done.stdout and "point storage= / FNMAP_STORAGE at a writable" in done.stdout


def test_a_full_storage_fails_the_call_once_with_the_fix(tmp_path):
    done = run_on_tmpfs(tmp_path, "size=600k", "big")  # room for the function, not for three results
    assert done.returncode == 3, done.stdout + done.stderr
    assert "No space left on device" in done.stdout
    assert "the storage is full" in done.stdout and "fnmap gc" in done.stdout
    assert "failed after 1 attempt(s)" in done.stdout  # not retried


def test_a_worker_that_cannot_reach_storage_fails_the_job_at_once_with_the_fix(s3_env):
    """The offline rehearsal's classic slip: the emulator was started without the S3 endpoint."""
    from conftest import EmulatorProcess

    bucket = s3_env("unreachable")
    emulator = EmulatorProcess(env={"FNMAP_S3_ENDPOINT_URL": "http://127.0.0.1:9"})  # nothing listens there
    try:
        with pytest.raises(fnmap.StorageError) as info:
            fnmap.map(abs, [-1, -2], storage=f"s3://{bucket}/p", emulator_url=emulator.url,
                      secret=emulator.secret, retries=2)
    finally:
        emulator.stop()
    message = str(info.value)
    assert f"the worker cannot reach storage s3://{bucket}/p" in message
    assert "AWS_ENDPOINT_URL_S3" in message and "failed after 1 attempt(s)" in message


def test_a_storage_folder_that_cannot_be_created_names_the_setting_and_the_fix(tmp_path):
    """The folder to create lies on a read-only file system: once a raw ``OSError``."""
    done = run_on_tmpfs(tmp_path, "ro", "abs", storage_folder="store/sub")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "STORAGE-ERROR storage file://" in done.stdout and "cannot create the folder" in done.stdout
    assert "(FNMAP_STORAGE=" in done.stdout and "(from the environment)" in done.stdout
    assert "Read-only file system" in done.stdout and "point storage= / FNMAP_STORAGE at a writable" in done.stdout


def _no_aws_credentials(monkeypatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_s3_without_credentials_is_a_storage_error_with_the_fix(s3_env, monkeypatch, tmp_path):
    url = f"s3://{s3_env('no-credentials')}/p"
    _no_aws_credentials(monkeypatch, tmp_path)
    with pytest.raises(fnmap.StorageError) as info:
        fnmap.map(abs, [-1], backend="local", storage=url)
    message = str(info.value)
    assert info.value.reason == "credentials"
    assert f"storage {url} (storage='{url}' (from keyword)): no AWS credentials" in message
    assert "AWS_ACCESS_KEY_ID" in message and "aws configure" in message
    # One error: botocore's NoCredentialsError, which the message quotes, is not printed above it.
    shown = "".join(traceback.format_exception(info.value))
    assert "botocore" not in shown and shown.count("Traceback (most recent call last)") == 1, shown


def test_an_unreachable_s3_endpoint_is_a_storage_error_with_the_fix(s3_env, monkeypatch):
    url = f"s3://{s3_env('unreachable-endpoint')}/p"
    monkeypatch.setenv("FNMAP_S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("FNMAP_STORAGE", url)
    with pytest.raises(fnmap.StorageError) as info:
        fnmap.map(abs, [-1], backend="local")
    message = str(info.value)
    assert info.value.reason == "unreachable"
    assert f"(FNMAP_STORAGE='{url}' (from the environment)): cannot reach the S3 endpoint http://127.0.0.1:9" in message
    assert "FNMAP_S3_ENDPOINT_URL; now http://127.0.0.1:9" in message


def test_a_missing_bucket_is_a_storage_error_and_still_an_unknown_storage(s3_env):
    import warnings

    s3_env("some-bucket")  # the server runs; this bucket does not
    with pytest.raises(fnmap.StorageError) as info, warnings.catch_warnings():
        warnings.simplefilter("error")  # the job's first write fails with the error, not a warning before it
        fnmap.map(abs, [-1], backend="local", storage="s3://never-made-bucket/p")
    assert isinstance(info.value, fnmap.UnknownStorage) and info.value.reason == "bucket"
    message = str(info.value)
    assert "bucket 'never-made-bucket' does not exist" in message and "aws s3 mb s3://never-made-bucket" in message
    assert "(storage='s3://never-made-bucket/p' (from keyword))" in message


def test_reading_a_job_from_a_folder_that_does_not_exist_creates_nothing(tmp_path):
    missing = tmp_path / "typo" / "dir"
    with pytest.raises(fnmap.StorageError, match=r"the folder .*typo/dir does not exist") as info:
        fnmap.job("0123abcd", storage=missing.as_uri())
    assert info.value.reason == "missing" and "(from keyword)" in str(info.value)
    assert not (tmp_path / "typo").exists()
