"""The aws backend's own Invoke path (:mod:`fnmap.backends.lambda_invoke`, issue 16) against the emulator.

Credentials come from boto3's chain on every request: here from a ``credential_process`` whose
credentials expire within a minute, so botocore refreshes them (each time the other of the two
keys the emulator accepts), and the emulator reports how many access keys signed the Invokes it served.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import requests

import fnmap

pytestmark = pytest.mark.timeout(120)


def square(x):
    return x * x


#: The two credentials the emulator accepts: its own, and those of its environment.
KEYS = [("AKIDFNMAPTEST0001", "secret-one"), ("AKIDFNMAPTEST0002", "secret-two")]


@pytest.fixture
def lambda_pool(emulator_process, monkeypatch):
    emu = emulator_process("--lambda-runtime", "pool", workers=2, aws_credentials=KEYS[0],
                           env={"AWS_ACCESS_KEY_ID": KEYS[1][0], "AWS_SECRET_ACCESS_KEY": KEYS[1][1]})
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", emu.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FNMAP_BACKEND", "aws")
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    yield emu
    from fnmap import client

    for c in list(client._clients.values()):  # their keep-alive connections would hold the emulator up
        if c.config.backend == "aws":
            c.close()


def test_each_invoke_is_signed_with_the_chains_current_credentials(lambda_pool, tmp_path, monkeypatch):
    counter = tmp_path / "issued"
    script = tmp_path / "credentials.py"
    script.write_text(textwrap.dedent(f"""
        import datetime, json, pathlib
        counter = pathlib.Path({str(counter)!r})
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=60)
        key, secret = {KEYS!r}[n % 2]
        print(json.dumps({{"Version": 1, "AccessKeyId": key, "SecretAccessKey": secret,
                           "Expiration": expires.isoformat()}}))
    """))
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))

    def keys_seen() -> int:  # how many access key ids signed Invokes (the unsigned route tells no ids)
        return requests.get(lambda_pool.url + "/lambda/stats", timeout=5).json()["access_keys"]

    before = keys_seen()
    assert fnmap.map(square, range(3), workers=1, lambda_invocation="RequestResponse") == [0, 1, 4]
    issued = int(counter.read_text())
    # Credentials that expire within botocore's refresh window are refreshed when a request takes them;
    # the chain alternates between the emulator's two keys, so both have now signed Invokes.
    assert issued >= 3 and keys_seen() == 2, (issued, keys_seen(), before)
