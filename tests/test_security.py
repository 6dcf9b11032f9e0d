"""Signed requests: unsigned, forged and altered requests are refused and run nothing (issue 3)."""

from __future__ import annotations

import os
import pickle

import pytest
import requests

import fnmap
from fnmap.cli import build_parser
from fnmap.emulator.server import _warn_if_exposed
from fnmap.runtime import keys, signing, worker
from fnmap.runtime.serialization import dumps, pickle_function, runtime_info
from fnmap.runtime.wire import CallRequest, encode
from fnmap.storage import open_store


class _TouchOnUnpickle:
    """Unpickling this creates ``path``: proof that a payload was (or was not) unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def touch(path):
    with open(path, "w") as f:
        f.write("ran")
    return path


def _request(store_url: str, payload: bytes) -> tuple[CallRequest, bytes]:
    store = open_store(store_url)
    digest, data = pickle_function(touch)
    func_key = keys.function_key(digest)
    store.put(func_key, data)
    job_id = keys.new_job_id()
    store.put(keys.job_record_key(job_id), b"{}")  # a job the worker serves has a record
    req = CallRequest(
        job_id=job_id,
        call_id=0,
        func_key=func_key,
        store_url=store_url,
        runtime=runtime_info(),
    )
    return req, encode(req, payload)


def _post(url, body, signature=None):
    headers = {signing.SIGNATURE_HEADER: signature} if signature is not None else {}
    return requests.post(url + "/invoke", data=body, headers=headers, timeout=30)


def test_forged_altered_and_unsigned_requests_run_nothing(use_emulator, tmp_path, storage_root):
    emu = use_emulator(workers=2)
    secret = emu.secret.encode()
    store_url = storage_root.as_uri()
    unpickled = str(tmp_path / "payload-was-unpickled")
    ran = str(tmp_path / "function-ran")
    # A genuine request runs touch(ran); a forger's payload would create `unpickled` when loaded.
    req, body = _request(store_url, dumps(("one", [ran])))
    _, evil_body = _request(store_url, pickle.dumps(("one", [_TouchOnUnpickle(unpickled)])))

    assert _post(emu.url, body).status_code == 401  # unsigned
    assert _post(emu.url, body, "").status_code == 401  # empty signature
    assert _post(emu.url, body, signing.sign(b"not-the-secret", body)).status_code == 403  # forged
    assert _post(emu.url, evil_body, signing.sign(b"guessed", evil_body)).status_code == 403
    altered = body.replace(b'"call_id": 0', b'"call_id": 1')
    assert altered != body
    assert _post(emu.url, altered, signing.sign(secret, body)).status_code == 403  # altered header
    assert _post(emu.url, body + b"x", signing.sign(secret, body)).status_code == 403  # appended
    r = _post(emu.url, body, signing.sign(secret, body).upper())
    assert r.status_code == 403 and b"nothing was run" in r.content

    # Nothing ran, nothing was unpickled, nothing was written under the job's prefix.
    assert not os.path.exists(ran) and not os.path.exists(unpickled)
    assert open_store(store_url).list(keys.job_prefix(req.job_id)) == [keys.job_record_key(req.job_id)]

    # The same request, correctly signed, does run: the refusals above were the signature's doing.
    assert _post(emu.url, body, signing.sign(secret, body)).status_code == 200
    assert os.path.exists(ran)
    assert open_store(store_url).list(keys.results_prefix(req.job_id))


def test_a_client_with_the_wrong_secret_is_refused(use_emulator, monkeypatch, tmp_path):
    use_emulator(workers=2)
    monkeypatch.setenv("FNMAP_SECRET", "a-secret-that-is-not-the-emulators")
    ran = str(tmp_path / "ran")
    with pytest.raises(fnmap.SignatureError, match=r"403.*FNMAP_SECRET"):
        fnmap.map(touch, [ran])
    assert not os.path.exists(ran)


def test_a_handler_without_a_secret_runs_nothing():
    status, body = worker.handle(b"anything", "0" * 64, None)
    assert status == 500 and b"FNMAP_SECRET" in body
    status, body = worker.handle(b"anything", None, b"secret")
    assert status == 401


def test_signatures_cover_the_whole_body():
    secret = signing.new_secret().encode()
    body = b"\x00\x00\x00\x02{}payload"
    sig = signing.sign(secret, body)
    assert signing.verify(secret, body, sig)
    assert not signing.verify(secret, body[:-1], sig)
    assert not signing.verify(secret, body + b"!", sig)
    assert not signing.verify(secret, body, None)
    assert not signing.verify(b"other", body, sig)


def test_secrets_and_job_ids_are_random_and_long():
    assert len({signing.new_secret() for _ in range(100)}) == 100
    assert len(signing.new_secret()) == 64  # 256 bits, hex
    ids = {keys.new_job_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_every_key_of_a_job_lives_under_its_own_prefix():
    job_id = keys.new_job_id()
    prefix = keys.job_prefix(job_id)
    for key in (
        keys.input_key(job_id, 3, "0" * 64),
        keys.result_key(job_id, 3),
        keys.status_key(job_id, 3, 1),
        keys.log_key(job_id, 3, 1),
        keys.job_record_key(job_id),
        keys.blob_key(job_id, "x"),
    ):
        assert key.startswith(prefix)
    assert keys.results_prefix(job_id).startswith(prefix)


def test_emulator_binds_loopback_by_default():
    args = build_parser().parse_args(["emulator"])
    assert args.host == "127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org", ""])
def test_emulator_warns_loudly_when_exposed(host, capsys):
    _warn_if_exposed(host)
    err = capsys.readouterr().err
    assert "WARNING" in err and "reachable from other machines" in err and "127.0.0.1" in err


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_emulator_is_quiet_on_loopback(host, capsys):
    _warn_if_exposed(host)
    assert capsys.readouterr().err == ""
