"""The emulated AWS control planes (Lambda API, Batch API) run nothing, change nothing and reveal no
configuration without a valid SigV4 signature made with credentials the emulator knows (issue 26).

Each attack is a raw ``requests`` post, as a local process or a web page would send it; each refusal is
checked against its effect (a marker file a command or an uploaded package would create, a concurrency
setting, the secret in an answer), and a signed request of the same kind shows the effect is real.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import zipfile
from unittest import mock

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from conftest import until

import fnmap

pytestmark = pytest.mark.timeout(180)


def _client(emu, service: str, key_id: str | None = None, secret: str | None = None):
    env = emu.aws_environment
    return boto3.client(service, endpoint_url=emu.url, region_name="us-east-1",
                        aws_access_key_id=key_id or env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=secret or env["AWS_SECRET_ACCESS_KEY"])


def _signed_headers(emu, service: str, path: str, body: bytes, when: datetime.datetime | None = None,
                    secret: str | None = None, extra: dict | None = None) -> dict:
    """The headers botocore's signer gives a POST of ``body`` to ``path`` (at ``when``, default now)."""
    env = emu.aws_environment
    request = AWSRequest("POST", emu.url + path, data=body, headers={"Content-Type": "application/json",
                                                                      **(extra or {})})
    signer = SigV4Auth(Credentials(env["AWS_ACCESS_KEY_ID"], secret or env["AWS_SECRET_ACCESS_KEY"]), service,
                       "us-east-1")
    if when is None:
        signer.add_auth(request)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=when):
            signer.add_auth(request)
    return dict(request.headers.items())


@pytest.fixture
def platform(emulator_process):
    """An emulator (Lambda under awslambdaric, Batch) and boto3 clients signing with its credentials."""
    emu = emulator_process("--lambda-runtime", "ric", workers=1)
    emu.lam, emu.batch = _client(emu, "lambda"), _client(emu, "batch")
    yield emu
    emu.lam.close()
    emu.batch.close()


def _submit_body(marker) -> dict:
    command = ["python", "-c", f"open({str(marker)!r}, 'w').close()"]
    return {"jobName": "probe", "jobQueue": "q", "jobDefinition": "fnmap", "containerOverrides": {"command": command}}


def _jobs(batch) -> set[str]:
    """The ids of every job of queue ``q`` (one moving between states while they are listed counts once)."""
    return {job["jobId"] for status in ("RUNNABLE", "RUNNING", "SUCCEEDED", "FAILED")
            for job in batch.list_jobs(jobQueue="q", jobStatus=status)["jobSummaryList"]}


#: The type boto3 sends, so that what refuses these requests is the missing signature.
JSON = {"Content-Type": "application/json"}


def test_an_unsigned_submitjob_runs_nothing(platform, tmp_path):
    body = json.dumps(_submit_body(tmp_path / "unsigned")).encode()
    plain = requests.post(platform.url + "/v1/submitjob", data=body, headers=JSON, timeout=10)
    # What a web page can send cross-origin without a preflight.
    browser = requests.post(platform.url + "/v1/submitjob", data=body, headers={"Content-Type": "text/plain"},
                            timeout=10)
    assert plain.status_code == 403, plain.text
    assert plain.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    assert browser.status_code in (403, 415), browser.text  # the front door refuses the type first
    # The same command, signed, runs: the marker of the unsigned one would have been made too.
    job = platform.batch.submit_job(**_submit_body(tmp_path / "signed"))["jobId"]
    until(lambda: (tmp_path / "signed").exists())
    assert _jobs(platform.batch) == {job}
    assert not (tmp_path / "unsigned").exists()


def test_wrong_stale_or_tampered_signatures_run_nothing(platform, tmp_path):
    body = json.dumps(_submit_body(tmp_path / "refused")).encode()
    other = json.dumps(_submit_body(tmp_path / "tampered")).encode()
    stale = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
    attempts = {
        "InvalidSignatureException": [
            _signed_headers(platform, "batch", "/v1/submitjob", body, secret="not-the-secret"),
            _signed_headers(platform, "batch", "/v1/submitjob", body, when=stale),
            _signed_headers(platform, "lambda", "/v1/submitjob", body),  # signed for another service
        ],
    }
    for code, headers_list in attempts.items():
        for headers in headers_list:
            answer = requests.post(platform.url + "/v1/submitjob", data=body, headers=headers, timeout=10)
            assert (answer.status_code, answer.headers["x-amzn-ErrorType"]) == (403, code), answer.text
    tampered = requests.post(platform.url + "/v1/submitjob", data=other, timeout=10,
                             headers=_signed_headers(platform, "batch", "/v1/submitjob", body))
    assert tampered.status_code == 403 and tampered.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
    # A signature that claims not to cover the body (S3's UNSIGNED-PAYLOAD) covers nothing here.
    unsigned_payload = _signed_headers(platform, "batch", "/v1/submitjob", body,
                                       extra={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    answer = requests.post(platform.url + "/v1/submitjob", data=other, headers=unsigned_payload, timeout=10)
    assert answer.status_code == 403 and answer.headers["x-amzn-ErrorType"] == "InvalidSignatureException"
    other_service = requests.post(platform.url + "/v1/submitjob", data=body, timeout=10,
                                  headers=_signed_headers(platform, "lambda", "/v1/submitjob", body))
    assert "Credential should be scoped to service 'batch'" in other_service.json()["message"]
    assert "Signature expired" in requests.post(
        platform.url + "/v1/submitjob", data=body, timeout=10,
        headers=_signed_headers(platform, "batch", "/v1/submitjob", body, when=stale)).json()["message"]
    with pytest.raises(ClientError, match="UnrecognizedClientException"):
        _client(platform, "batch", key_id="AKIANOTKNOWN00000000").submit_job(**_submit_body(tmp_path / "refused"))
    with pytest.raises(ClientError, match="InvalidSignatureException"):
        _client(platform, "batch", secret="wrong").submit_job(**_submit_body(tmp_path / "refused"))
    assert _jobs(platform.batch) == set()
    assert not (tmp_path / "refused").exists() and not (tmp_path / "tampered").exists()


def test_job_definitions_reference_the_secret_and_never_reveal_it(platform):
    unsigned = requests.post(platform.url + "/v1/describejobdefinitions", data=b"{}", headers=JSON, timeout=10)
    assert unsigned.status_code == 403 and platform.secret not in unsigned.text
    body = b"{}"
    signed = requests.post(platform.url + "/v1/describejobdefinitions", data=body, timeout=10,
                           headers=_signed_headers(platform, "batch", "/v1/describejobdefinitions", body))
    assert signed.status_code == 200, signed.text
    assert platform.secret not in signed.text
    (definition,) = signed.json()["jobDefinitions"]
    properties = definition["containerProperties"]
    assert properties["secrets"] == [{"name": "FNMAP_SECRET", "valueFrom": properties["secrets"][0]["valueFrom"]}]
    assert properties["secrets"][0]["valueFrom"].startswith("arn:aws:secretsmanager:")


def _package(marker) -> bytes:
    """A deployment package whose handler module creates ``marker`` when it is imported."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("handlers/__init__.py", "")
        zf.writestr("handlers/aws_lambda.py", f"open({str(marker)!r}, 'w').close()\n"
                                              "def handler(event, context):\n    return {'ran': True}\n")
    return buffer.getvalue()


def test_unsigned_lambda_api_requests_create_run_and_change_nothing(platform, tmp_path):
    import base64

    spec = {"FunctionName": "planted", "Runtime": "python3.11", "Role": "arn:aws:iam::000000000000:role/x",
            "Handler": "handlers.aws_lambda.handler",
            "Code": {"ZipFile": base64.b64encode(_package(tmp_path / "unsigned")).decode()}}
    url = platform.url
    refused = [
        requests.post(url + "/2015-03-31/functions", json=spec, timeout=10),
        requests.post(url + "/2015-03-31/functions", data=json.dumps(spec), headers={"Content-Type": "text/plain"},
                      timeout=10),
        requests.put(url + "/2015-03-31/functions/fnmap/code", json={"ZipFile": spec["Code"]["ZipFile"]}, timeout=10),
        requests.put(url + "/2015-03-31/functions/fnmap/configuration", json={"Timeout": 1}, timeout=10),
        requests.post(url + "/2018-10-31/layers/planted/versions", json={"Content": spec["Code"]}, timeout=10),
        requests.put(url + "/2017-10-31/functions/fnmap/concurrency", json={"ReservedConcurrentExecutions": 0},
                     timeout=10),
        requests.delete(url + "/2017-10-31/functions/fnmap/concurrency", timeout=10),
        requests.post(url + "/2015-03-31/functions/planted/invocations", data=b"{}", timeout=10),
        requests.get(url + "/2015-03-31/functions/fnmap/configuration", timeout=10),
        requests.get(url + "/2015-03-31/functions/fnmap", timeout=10),  # any Lambda path, routes added later too
    ]
    for answer in refused:
        assert platform.secret not in answer.text
        if answer.request.headers.get("Content-Type") == "text/plain":  # the front door refuses the type
            assert answer.status_code == 415, answer.text
            continue
        assert answer.status_code == 403, (answer.request.method, answer.request.url, answer.text)
        assert answer.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    lam = platform.lam
    assert "ReservedConcurrentExecutions" not in lam.get_function_concurrency(FunctionName="fnmap")
    assert lam.get_function_configuration(FunctionName="fnmap")["Timeout"] != 1
    with pytest.raises(ClientError, match="InvalidSignatureException"):
        _client(platform, "lambda", secret="wrong").put_function_concurrency(
            FunctionName="fnmap", ReservedConcurrentExecutions=0)
    assert "ReservedConcurrentExecutions" not in lam.get_function_concurrency(FunctionName="fnmap")
    assert not (tmp_path / "unsigned").exists()
    # Signed, the same package is created and runs: its marker is what the refusals prevented.
    lam.create_function(**{**spec, "Code": {"ZipFile": _package(tmp_path / "signed")}})
    assert json.loads(lam.invoke(FunctionName="planted", Payload=b"{}")["Payload"].read()) == {"ran": True}
    assert (tmp_path / "signed").exists() and not (tmp_path / "unsigned").exists()


def _ten_times(x):
    return x * 10


def test_the_emulator_fnmap_map_starts_for_gpu_jobs_signs_and_is_refused_unsigned(monkeypatch, tmp_path):
    """``gpu=`` with no cloud configuration: fnmap's Batch client signs with its embedded emulator's
    credentials, and that emulator refuses unsigned requests and keeps the secret."""
    from fnmap.client import get_client
    from fnmap.config import resolve

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fnmap.map(_ten_times, range(3), gpu=1) == [0, 10, 20]
    emu = get_client(resolve(gpu=1)).backend._emulator
    body = json.dumps(_submit_body(tmp_path / "unsigned")).encode()
    answer = requests.post(emu.url + "/v1/submitjob", data=body, headers={"Content-Type": "text/plain"}, timeout=10)
    assert answer.status_code in (403, 415)
    definitions = requests.post(emu.url + "/v1/describejobdefinitions", data=b"{}", headers=JSON, timeout=10)
    assert definitions.status_code == 403 and emu.secret not in definitions.text
    batch = _client(emu, "batch")
    try:
        assert emu.secret not in json.dumps(batch.describe_job_definitions(), default=str)
    finally:
        batch.close()
    assert not (tmp_path / "unsigned").exists()


_ROLE_PROBE = ("import os\n"
               "def handler(event, context):\n"
               "    return {k: os.environ.get(k) for k in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', "
               "'AWS_SESSION_TOKEN', 'AWS_ENDPOINT_URL_LAMBDA')}\n")


def test_the_execution_roles_credentials_may_invoke_and_nothing_else(emulator_process, monkeypatch):
    """A function's environment gets an execution role's credentials (its spawners invoke with them):
    they Invoke, and are refused every other Lambda and Batch operation."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the emulator starts with no credentials of its own
    emu = emulator_process("--lambda-runtime", "ric", workers=1)
    # Unsigned requests, first of all, do not choose the Lambda endpoint the environments call back.
    for path in ("/health", "/2015-03-31/functions/probe/invocations"):
        requests.post(emu.url + path, data=b"{}", headers={"Host": "attacker.example:1"}, timeout=10)
    lam = _client(emu, "lambda")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("handlers/__init__.py", "")
        zf.writestr("handlers/aws_lambda.py", _ROLE_PROBE)
    lam.create_function(FunctionName="probe", Runtime="python3.11", Role="arn:aws:iam::000000000000:role/x",
                        Handler="handlers.aws_lambda.handler", Code={"ZipFile": buffer.getvalue()})
    role = json.loads(lam.invoke(FunctionName="probe", Payload=b"{}")["Payload"].read())
    lam.close()
    assert role["AWS_ACCESS_KEY_ID"] not in (None, emu.aws_environment["AWS_ACCESS_KEY_ID"])
    assert role["AWS_ENDPOINT_URL_LAMBDA"] == emu.url
    as_role = {"endpoint_url": emu.url, "region_name": "us-east-1", "aws_access_key_id": role["AWS_ACCESS_KEY_ID"],
               "aws_secret_access_key": role["AWS_SECRET_ACCESS_KEY"], "aws_session_token": role["AWS_SESSION_TOKEN"]}
    role_lambda, role_batch = boto3.client("lambda", **as_role), boto3.client("batch", **as_role)
    try:
        assert role_lambda.invoke(FunctionName="probe", Payload=b"{}")["StatusCode"] == 200
        with pytest.raises(ClientError, match="AccessDeniedException"):
            role_lambda.put_function_concurrency(FunctionName="fnmap", ReservedConcurrentExecutions=0)
        with pytest.raises(ClientError, match="AccessDeniedException"):
            role_lambda.update_function_code(FunctionName="probe", ZipFile=buffer.getvalue())
        with pytest.raises(ClientError, match="AccessDeniedException"):
            role_batch.describe_job_definitions()
        forged = boto3.client("lambda", **{**as_role, "aws_session_token": "not-the-token"})
        with pytest.raises(ClientError, match="UnrecognizedClientException"):
            forged.invoke(FunctionName="probe", Payload=b"{}")
        forged.close()
    finally:
        role_lambda.close()
        role_batch.close()


def _emulator_credentials_seen(_):
    return [os.environ.get(name) for name in ("FNMAP_EMULATOR_ACCESS_KEY_ID", "FNMAP_EMULATOR_SECRET_ACCESS_KEY")]


def test_the_emulators_credentials_stay_out_of_its_workers(use_emulator):
    emu = use_emulator(workers=1)
    assert fnmap.map(_emulator_credentials_seen, [0]) == [[None, None]]
    assert emu.aws_environment["AWS_SECRET_ACCESS_KEY"] not in emu.output()


def test_an_emulator_given_no_credentials_prints_the_ones_it_accepts(tmp_path):
    import subprocess
    import sys
    from types import SimpleNamespace

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "emulator", "--port", "0", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
        printed = dict(word.split("=", 1) for line in lines if line.startswith("AWS_ACCESS_KEY_ID=")
                       for word in line.split("  ")[0].split())
        emu = SimpleNamespace(url=line.split("listening on ", 1)[1].split()[0], aws_environment=printed)
        assert sorted(printed) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"], lines
        batch = _client(emu, "batch")
        assert batch.describe_job_definitions()["jobDefinitions"]
        batch.close()
        with pytest.raises(ClientError, match="InvalidSignatureException"):
            _client(emu, "batch", secret="not-the-printed-one").describe_job_definitions()
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
