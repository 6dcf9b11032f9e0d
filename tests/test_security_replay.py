"""Replays (issue 26): a captured signed request runs nothing a second time, on any route, later,
or after its job is removed; faults are injected only after authentication; by-reference events
are checked before anything is read; a spawner fans out once."""

from __future__ import annotations

import base64
import json
import os
import time

import requests

import fnmap
from fnmap.runtime import keys, lambda_event, signing
from fnmap.runtime.serialization import dumps, pickle_function, runtime_info
from fnmap.runtime.wire import CallRequest, encode
from fnmap.storage import open_store

INVOKE = "/2015-03-31/functions/fnmap/invocations"


def append_mark(path):
    with open(path, "a") as f:
        f.write("x")
    return path


def _call(store_url: str, marks: str, call_id: int = 0, job_id: str | None = None) -> tuple[CallRequest, bytes]:
    """A genuine request of a job with a record: running it appends one 'x' to ``marks``."""
    store = open_store(store_url)
    digest, data = pickle_function(append_mark)
    store.put(keys.function_key(digest), data)
    job_id = job_id or keys.new_job_id()
    record = keys.job_index_key(job_id, time.time())
    store.put(record, b"{}")
    req = CallRequest(job_id=job_id, call_id=call_id, func_key=keys.function_key(digest), store_url=store_url,
                      runtime=runtime_info(), job_record=record)
    return req, encode(req, dumps(("one", [marks])))


def _runs(path) -> int:
    return len(open(path).read()) if os.path.exists(path) else 0


def _post(url, path, body, signature):
    return requests.post(url + path, data=body, headers={signing.SIGNATURE_HEADER: signature}, timeout=60)


def _lambda(emu, event: dict):
    """Lambda Invoke of ``event``, signed (SigV4) as boto3 signs with the emulator's credentials."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    keys = emu.aws_environment
    request = AWSRequest(method="POST", url=emu.url + INVOKE, data=json.dumps(event).encode(),
                         headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]), "lambda",
              "us-east-1").add_auth(request)
    r = requests.post(request.url, data=request.body, headers=dict(request.headers), timeout=60)
    return json.loads(r.content)


def test_a_captured_call_runs_once_on_invoke_root_and_as_a_lambda_event(emulator_process, storage_root, tmp_path):
    emu = emulator_process("--lambda-runtime", "pool", workers=2)
    secret, marks = emu.secret.encode(), str(tmp_path / "marks")
    req, body = _call(storage_root.as_uri(), marks)
    signature = signing.sign(secret, body)
    assert _post(emu.url, "/invoke", body, signature).status_code == 200
    assert _runs(marks) == 1
    for path in ("/invoke", "/"):  # the same bytes again: answered from the committed result
        r = _post(emu.url, path, body, signature)
        assert r.status_code == 200 and b'"committed": false' in r.content
    answer = _lambda(emu, json.loads(lambda_event.encode_event(body, signature)))
    assert answer["status"] == 200
    assert _runs(marks) == 1  # ran once in all


def test_a_replay_after_the_job_is_removed_recreates_nothing(emulator_process, storage_root, tmp_path):
    emu = emulator_process(workers=2)
    store, marks = open_store(storage_root.as_uri()), str(tmp_path / "marks")
    req, body = _call(store.url, marks)
    signature = signing.sign(emu.secret.encode(), body)
    store.delete([req.job_record])  # what `fnmap gc` removes with the job's objects
    r = _post(emu.url, "/invoke", body, signature)
    assert r.status_code == 200 and b"fnmap gc" in r.content and b'"ok": false' in r.content
    assert _runs(marks) == 0 and store.list(keys.job_prefix(req.job_id)) == []


def test_a_signature_outside_its_window_or_for_another_call_is_refused(emulator_process, storage_root, tmp_path):
    emu = emulator_process(workers=2)
    secret, marks = emu.secret.encode(), str(tmp_path / "marks")
    req, body = _call(storage_root.as_uri(), marks)
    stale = signing.sign(secret, body, now=time.time() - 1000)  # captured 1000 s ago, valid 300 s
    r = _post(emu.url, "/invoke", body, stale)
    assert r.status_code == 403 and r.content == signing.REFUSED
    other = signing.sign_request(secret, signing.ROUTE_CALL, req.job_id, 1, 1, body)  # call 1's
    assert _post(emu.url, "/invoke", body, other).status_code == 403
    cancel = signing.sign_request(secret, signing.ROUTE_CANCEL, req.job_id, 0, 1, body)  # another route's
    assert _post(emu.url, "/invoke", body, cancel).status_code == 403
    assert _runs(marks) == 0
    assert _post(emu.url, "/invoke", body, signing.sign(secret, body)).status_code == 200  # fresh: runs
    assert _runs(marks) == 1


def test_faults_are_injected_only_after_authentication(emulator_process, storage_root, tmp_path):
    emu = emulator_process("--kill-rate", "1", workers=2)
    req, body = _call(storage_root.as_uri(), str(tmp_path / "marks"))
    for signature in ("", signing.sign(b"forged", body)):
        r = _post(emu.url, "/invoke", body, signature)
        assert r.status_code in (401, 403) and r.content == signing.REFUSED
    assert emu.health()["injected"] == {}


def test_a_by_reference_event_is_checked_before_anything_is_read(emulator_process, storage_root, tmp_path):
    emu = emulator_process("--lambda-runtime", "pool", workers=2)
    big = tmp_path / "big"
    big.write_bytes(b"\0" * (4 << 20))
    answers = []
    for key in ("big", "missing"):  # an existing file and a missing one: the same generic answer
        event = {"fnmap": 1, "store": tmp_path.as_uri(), "key": key, "size": 4 << 20, "sha256": "0" * 64,
                 "job_id": "j", "call_id": 0, "attempt": 1, "reference_signature": "v2.1.2.00",
                 "signature": "x"}
        answers.append(_lambda(emu, event))
    assert answers[0] == answers[1] and answers[0]["status"] == 403
    assert base64.b64decode(answers[0]["body"]) == signing.REFUSED
    # A genuine reference to a stored request runs it.
    secret, marks = emu.secret.encode(), str(tmp_path / "marks")
    req, body = _call(storage_root.as_uri(), marks)
    key = keys.blob_key(req.job_id, "request-0-1")
    open_store(req.store_url).put(key, body)
    event = lambda_event.encode_reference_event(req.store_url, key, body, signing.sign(secret, body), secret,
                                                (req.job_id, 0, 1))
    assert _lambda(emu, json.loads(event))["status"] == 200 and _runs(marks) == 1


def test_a_captured_spawner_fans_out_once(emulator_process, storage_root, tmp_path):
    emu = emulator_process("--lambda-runtime", "pool", workers=2)
    secret, marks = emu.secret.encode(), str(tmp_path / "marks")
    req, _ = _call(storage_root.as_uri(), marks)
    bodies = [_call(req.store_url, marks, call_id=i, job_id=req.job_id)[1] for i in range(3)]
    signatures = [signing.sign(secret, b) for b in bodies]
    payloads = [lambda_event.encode_event(b, s) for b, s in zip(bodies, signatures, strict=True)]
    event = json.loads(lambda_event.encode_spawn_event(payloads, signatures, secret, req.job_id, "s1",
                                                       req.store_url, req.job_record))
    assert _lambda(emu, event)["status"] == 200
    again = _lambda(emu, event)
    assert again["status"] == 409
    forged = dict(event, spawn_id="s2")  # a fresh spawn id needs a fresh signature
    assert _lambda(emu, forged)["status"] == 403
    stats = requests.get(emu.url + "/lambda/stats", timeout=5).json()
    assert stats["spawned"] == 3


def _serving(emulators):
    for emu in emulators:
        try:
            if requests.get(emu.url + "/health", timeout=5).ok:
                return emu
        except requests.RequestException:
            continue
    raise AssertionError("no embedded emulator serves")


def test_the_emulator_fnmap_map_starts_refuses_a_replayed_call_of_a_finished_job(tmp_path, storage_root):
    marks = str(tmp_path / "marks")
    assert fnmap.map(append_mark, [marks], backend="emulator") == [marks]
    from fnmap.backends import emulator as embedded

    emu = _serving([*embedded._embedded.values()][::-1])  # the newest that serves (earlier tests' may be gone)
    store = open_store(storage_root.as_uri())
    index = store.list(keys.job_index_prefix())[-1]
    job_id = index.rsplit("-", 1)[1].removesuffix(".json")
    digest, _ = pickle_function(append_mark)
    req = CallRequest(job_id=job_id, call_id=0, func_key=keys.function_key(digest), store_url=store.url,
                      runtime=runtime_info(), job_record=index)
    body = encode(req, dumps(("one", [marks])))
    r = _post(emu.url, "/invoke", body, signing.sign(emu.secret.encode(), body))
    assert r.status_code == 200 and b'"committed": false' in r.content
    assert _post(emu.url, "/invoke", body, signing.sign(b"guess", body)).content == signing.REFUSED
    assert _runs(marks) == 1
