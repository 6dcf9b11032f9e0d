"""The emulator's front door (issue 26): other origins are refused on every route, before anything runs.

Each test runs against a real ``fnmap emulator`` subprocess and against the emulator ``fnmap.map``
starts by itself.  A web page in the user's browser reaches either with a ``text/plain`` POST (no
CORS preflight) or, through DNS rebinding, with its own host name in ``Host``; a local process can
ask any unsigned route.  The Batch API's ``submitjob`` runs a command unsigned on main, so a marker
file it would create is the proof that nothing ran.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import boto3
import pytest
import requests

import fnmap
from fnmap.backends.emulator import embedded_emulator
from fnmap.config import endpoint_environment
from fnmap.runtime.signing import new_secret

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["cli", "cli-waitress", "embedded"])
def emulator(request, emulator_process, monkeypatch):
    """``fnmap emulator`` (``cli``; serving with waitress: ``cli-waitress``) or the emulator
    ``fnmap.map`` starts (``embedded``), with FNMAP_SECRET (and, for ``cli``, FNMAP_EMULATOR_URL)
    pointing fnmap's client at it."""
    if request.param.startswith("cli"):
        emu = emulator_process(*(["--wsgi-server", "waitress"] if request.param == "cli-waitress" else []),
                               workers=2)
        monkeypatch.setenv("FNMAP_EMULATOR_URL", emu.url)
    else:
        emu = embedded_emulator(None, "", endpoint_environment(), secret=new_secret())  # as fnmap.map asks
        request.addfinalizer(emu.stop)
    monkeypatch.setenv("FNMAP_SECRET", emu.secret)
    emu.address = emu.url.removeprefix("http://")
    return emu


def _exchange(emu, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send one raw request (``head`` without its blank line) and read the whole answer."""
    host, port = emu.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def _submit_body(marker) -> bytes:
    """A Batch SubmitJob that creates ``marker`` when its command runs."""
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]
    return json.dumps({"jobName": "probe", "jobQueue": "q", "jobDefinition": "fnmap",
                       "containerOverrides": {"command": command}}).encode()


def _batch(emu):
    return boto3.client("batch", endpoint_url=emu.url, region_name="us-east-1", **_signing_keys(emu))


def _signing_keys(emu) -> dict:
    """boto3's keyword arguments for the credentials the emulator accepts (its SigV4 pair)."""
    env = emu.aws_environment
    return {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"]}


def _assert_never_ran(emu, marker, control) -> None:
    """A job boto3 submits after the refused ones runs (``control`` appears); ``marker`` does not."""
    client = _batch(emu)
    try:
        job = client.submit_job(**json.loads(_submit_body(control)))["jobId"]
        deadline = time.monotonic() + 60
        while not control.exists():
            assert time.monotonic() < deadline, client.describe_jobs(jobs=[job])
            time.sleep(0.1)
        finished = client.describe_jobs(jobs=[job])["jobs"][0]
        assert finished["status"] in ("RUNNING", "SUCCEEDED"), finished
    finally:
        client.close()
    assert not marker.exists(), "a refused request ran its command"


def test_foreign_host_is_refused_on_every_route_and_runs_nothing(emulator, tmp_path):
    """DNS rebinding: a page at attacker.example whose name now resolves to 127.0.0.1."""
    marker = tmp_path / "rebound-submit-ran"
    port = emulator.address.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", f"127.0.0.1.nip.io:{port}"):
        for head in ("GET /health HTTP/1.1", "GET /calls HTTP/1.1", "GET /lambda/stats HTTP/1.1"):
            status, text = _exchange(emulator, f"{head}\r\nHost: {host}")
            assert status == 403 and b"DNS rebinding" in text, (host, head, text)
        status, text = _exchange(emulator, f"POST /v1/submitjob HTTP/1.1\r\nHost: {host}\r\n"
                                           "Content-Type: application/json", _submit_body(marker))
        assert status == 403, text
    for host in (emulator.address, f"localhost:{port}", f"[::1]:{port}", "127.0.0.1", "localhost"):
        assert _exchange(emulator, f"GET /health HTTP/1.1\r\nHost: {host}")[0] == 200, host
    _assert_never_ran(emulator, marker, tmp_path / "control-ran")


def test_cross_origin_posts_are_refused_and_run_nothing(emulator, tmp_path):
    """What a page on another site can send without a CORS preflight, and what the browser marks."""
    marker = tmp_path / "cross-origin-submit-ran"
    body = _submit_body(marker)
    host = f"Host: {emulator.address}"
    refused = {
        "text/plain, no Origin": (415, f"{host}\r\nContent-Type: text/plain;charset=UTF-8"),
        "text/plain from a page": (403, f"{host}\r\nContent-Type: text/plain\r\nOrigin: http://attacker.example"),
        "form from a page": (403, f"{host}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                                  "Origin: null"),
        "no type": (415, host),
        "json, cross-site fetch": (403, f"{host}\r\nContent-Type: application/json\r\nSec-Fetch-Site: cross-site"),
        "json, same-site fetch": (403, f"{host}\r\nContent-Type: application/json\r\nSec-Fetch-Site: same-site"),
        "json from another port": (403, f"{host}\r\nContent-Type: application/json\r\n"
                                        "Origin: http://127.0.0.1:1"),
    }
    for case, (status, headers) in refused.items():
        got, text = _exchange(emulator, f"POST /v1/submitjob HTTP/1.1\r\n{headers}", body)
        assert got == status, (case, text)
    # The same on the other routes that take bodies: Lambda's Invoke and management API, /invoke, /cancel.
    for path in ("/2015-03-31/functions/fnmap/invocations", "/2015-03-31/functions", "/invoke", "/", "/cancel",
                 "/2017-10-31/functions/fnmap/concurrency"):
        got, text = _exchange(emulator, f"POST {path} HTTP/1.1\r\n{host}\r\nContent-Type: text/plain", b"{}")
        assert got == 415 and b"text/plain" in text, (path, text)
        got, text = _exchange(emulator, f"POST {path} HTTP/1.1\r\n{host}\r\nContent-Type: application/json\r\n"
                                        "Origin: http://attacker.example", b"{}")
        assert got == 403, (path, text)
    # Lambda's concurrency route: a page could have stalled every aws-path job by setting it to 0.
    got, _ = _exchange(emulator, f"PUT /2017-10-31/functions/fnmap/concurrency HTTP/1.1\r\n{host}\r\n"
                                 "Content-Type: text/plain", b'{"ReservedConcurrentExecutions": 0}')
    assert got == 415
    assert b"ReservedConcurrentExecutions" not in _exchange(
        emulator, f"GET /2019-09-30/functions/fnmap/concurrency HTTP/1.1\r\n{host}")[1]
    _assert_never_ran(emulator, marker, tmp_path / "control-ran")


def test_same_origin_and_typed_requests_still_pass(emulator):
    """A browser at the emulator's own address, and the types fnmap's and AWS's clients send."""
    host = f"Host: {emulator.address}"
    for extra in (f"Origin: http://{emulator.address}", "Sec-Fetch-Site: same-origin", "Sec-Fetch-Site: none"):
        assert _exchange(emulator, f"GET /health HTTP/1.1\r\n{host}\r\n{extra}")[0] == 200, extra
    # /cancel in JSON (as fnmap's client sends) reaches the route: 401 for want of a signature.
    assert _exchange(emulator, f"POST /cancel HTTP/1.1\r\n{host}\r\nContent-Type: application/json", b"{}")[0] == 401
    # Lambda's Invoke takes the bytes boto3 sends with no type; fnmap's /invoke takes octet-stream.
    lam = boto3.client("lambda", endpoint_url=emulator.url, region_name="us-east-1", **_signing_keys(emulator))
    try:
        assert lam.invoke(FunctionName="fnmap", InvocationType="DryRun", Payload=b"x")["StatusCode"] == 204
        assert lam.get_function_concurrency(FunctionName="fnmap")["ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        lam.close()
    client = _batch(emulator)
    try:
        assert client.describe_jobs(jobs=[])["jobs"] == []
    finally:
        client.close()
    assert fnmap.map(abs, [-1, -2, -3]) == [1, 2, 3]


def test_unsigned_routes_reveal_no_files_job_ids_keys_or_secret(emulator, tmp_path, monkeypatch):
    job = fnmap.map(abs, range(-5, 0), return_job=True)
    assert job.results() == [5, 4, 3, 2, 1]
    calls = requests.get(emulator.url + "/calls", timeout=10)
    assert len(calls.json()) >= 1 and all(c["outcome"] == "ok" for c in calls.json())
    assert job.id not in calls.text and "job_id" not in calls.text
    # Flask's static route served files from the emulator's working folder: gone.
    for path in ("/static/README.md", "/static/pyproject.toml", "/static/../README.md"):
        assert requests.get(emulator.url + path, timeout=10).status_code == 404, path
    # /lambda/stats counts the access keys that signed Invokes, and names none.
    lam = boto3.client("lambda", endpoint_url=emulator.url, region_name="us-east-1", **_signing_keys(emulator))
    try:
        lam.invoke(FunctionName="fnmap", InvocationType="DryRun", Payload=b"{}")
    finally:
        lam.close()
    stats = requests.get(emulator.url + "/lambda/stats", timeout=10)
    key_id = _signing_keys(emulator)["aws_access_key_id"]
    assert key_id not in stats.text and stats.json()["access_keys"] >= 1
    health = requests.get(emulator.url + "/health", timeout=10).text
    for secret in (emulator.secret, str(tmp_path), "/work", job.id):
        assert secret not in health


def test_static_route_serves_no_file_of_the_working_folder(emulator_process, tmp_path, monkeypatch):
    """Flask's default ``/static`` route served ``./static/*`` of the folder the emulator started in."""
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "private.txt").write_text("contents-7f3a")
    monkeypatch.chdir(tmp_path)
    emu = emulator_process(workers=1)
    r = requests.get(emu.url + "/static/private.txt", timeout=10)
    assert r.status_code == 404 and "contents-7f3a" not in r.text


def test_allow_host_adds_a_name(emulator_process):
    emu = emulator_process("--allow-host", "fnmap.internal", workers=1)
    port = emu.url.rsplit(":", 1)[1]
    emu.address = emu.url.removeprefix("http://")
    assert _exchange(emu, f"GET /health HTTP/1.1\r\nHost: fnmap.internal:{port}")[0] == 200
    assert _exchange(emu, f"GET /health HTTP/1.1\r\nHost: other.internal:{port}")[0] == 403


def test_wildcard_bind_takes_address_literals_but_no_foreign_name(emulator_process):
    """Bound to every address, any IP literal with the port is the emulator's own (no name is
    rebound to it); names other than this machine's are refused."""
    from fnmap.emulator.launcher import EmulatorLauncher

    emu = EmulatorLauncher(1, host="0.0.0.0", stderr=open("/dev/null", "w"))  # noqa: SIM115 - closed by exit
    try:
        port = emu.url.rsplit(":", 1)[1]
        emu.address = f"127.0.0.1:{port}"
        assert _exchange(emu, f"GET /health HTTP/1.1\r\nHost: 127.0.0.2:{port}")[0] == 200
        assert _exchange(emu, f"GET /health HTTP/1.1\r\nHost: {socket.gethostname()}:{port}")[0] == 200
        assert _exchange(emu, f"GET /health HTTP/1.1\r\nHost: attacker.example:{port}")[0] == 403
    finally:
        emu.stop()


def test_lambda_runtime_api_refuses_other_hosts_and_web_pages():
    """Each Lambda execution environment's Runtime API (its own loopback port): a rebound page could
    otherwise take the environment's next event (a signed request) or answer it."""
    import http.client

    from fnmap.emulator.lambda_environment import _RuntimeApiHandler, _RuntimeApiServer

    server = _RuntimeApiServer(("127.0.0.1", 0), _RuntimeApiHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        for method, headers in (("GET", {"Host": f"attacker.example:{port}"}),
                                ("POST", {"Host": f"127.0.0.1:{port}", "Origin": "http://attacker.example"}),
                                ("GET", {"Host": f"127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"})):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                conn.request(method, "/2018-06-01/runtime/invocation/next" if method == "GET" else
                             "/2018-06-01/runtime/invocation/x/response", body=b"{}" if method == "POST" else None,
                             headers={**headers, "Content-Type": "text/plain"})
                assert conn.getresponse().status == 403, headers
            finally:
                conn.close()
    finally:
        server.shutdown()
        server.server_close()


def test_exposed_warning_says_what_is_reachable_and_what_is_signed(capsys):
    from fnmap.emulator.server import _warn_if_exposed

    _warn_if_exposed("0.0.0.0")
    err = capsys.readouterr().err
    for claim in ("reachable from other machines", "/health, /calls and /lambda/stats", "no job ids or keys",
                  "signed with its secret", "SigV4", "plain HTTP", "bind 127.0.0.1"):
        assert claim in err, claim
    assert "only signed pickles" not in err
