"""A call's stored input: stored for that call alone, named by its SHA-256 on every backend,
checked before unpickling, and deleted by the worker that commits the call's result, so storage
holds a map's inputs only while their calls run (they took 27 GB of one user's cache, every map's
inputs kept until `fnmap gc`)."""

from __future__ import annotations

import hashlib
import os

import pytest

import fnmap
from fnmap.runtime import compression, keys, signing, wire, worker
from fnmap.runtime.serialization import dump_parts, dumps, loads, pickle_function, runtime_info
from fnmap.storage import open_store

#: Inputs larger than this go through storage.
SMALL = 64 * 1024
SECRET = b"call-inputs-test-secret-0123456789"


def first_byte(blob: bytes) -> int:
    return blob[0]


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_a_maps_inputs_are_deleted_as_their_calls_commit_and_its_results_stay(backend, tmp_path):
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    items = [os.urandom(SMALL + 1) for _ in range(6)]
    job = fnmap.map(first_byte, items, storage=url, inline_limit=SMALL, chunksize=1, return_job=True,
                    backend=backend)
    assert job.results() == [b[0] for b in items]
    named = [call.items_key for call in job.run.calls]
    # Each named by a SHA-256 (is_input_of), which the worker found its bytes to have.
    assert all(keys.is_input_of(key, job.id, call.call_id) for key, call in zip(named, job.run.calls, strict=True))
    assert store.list(f"{keys.job_prefix(job.id)}in/") == []
    assert fnmap.job(job.id, storage=url).results() == [b[0] for b in items]  # a re-attach reads them still


def _crash_once(path_and_blob):
    marker, blob = path_and_blob
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)  # the worker dies: nothing is committed for this call
    return blob[0]


def test_a_call_that_committed_nothing_keeps_its_input_and_a_redrive_runs_it(tmp_path):
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    marker = str(tmp_path / "crashed")
    items = [(str(tmp_path / "never"), os.urandom(SMALL + 1)), (marker, os.urandom(SMALL + 1))]
    open(items[0][0], "w").close()  # the first item never crashes
    job = fnmap.map(_crash_once, items, storage=url, inline_limit=SMALL, chunksize=1, retries=0,
                    return_job=True)
    with pytest.raises(fnmap.PlatformError):
        job.results()
    assert store.list(f"{keys.job_prefix(job.id)}in/") == [job.run.calls[1].items_key]  # the crashed call's only
    assert fnmap.job(job.id, storage=url).redrive().results() == [blob[0] for _, blob in items]
    assert store.list(f"{keys.job_prefix(job.id)}in/") == []


# -- the worker, called directly ----------------------------------------------------------------


class _TouchOnUnpickle:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _sha256(parts: list) -> str:
    """The name a stored input's key ends with: the SHA-256 of its bytes."""
    return hashlib.sha256(b"".join(bytes(p) for p in parts)).hexdigest()


def _call(store, func, chunk_parts: list):
    """A signed request for call 0 of a new job whose chunk is stored under the call's own input key."""
    digest, data = pickle_function(func)
    store.put(keys.function_key(digest), data)
    job_id = keys.new_job_id()
    store.put(keys.job_record_key(job_id), b"{}")  # the worker serves calls of jobs with a record
    items_key = keys.input_key(job_id, 0, _sha256(chunk_parts))
    store.put(items_key, chunk_parts)
    req = wire.CallRequest(job_id=job_id, call_id=0, func_key=keys.function_key(digest), store_url=store.url,
                           runtime=runtime_info(), items_key=items_key)
    return req, wire.encode(req, b"")


def _answer(body: bytes):
    status, answer = worker.handle(body, signing.sign(SECRET, body), SECRET)
    assert status == 200, answer[:300]
    return wire.decode_response(answer)


def _value(store, job_id: str):
    key = keys.result_key(job_id, 0)
    return loads(compression.unpack(signing.unseal(SECRET, key, store.get(key))))


def test_a_planted_input_is_refused_before_unpickling_and_kept(tmp_path):
    store = open_store(tmp_path.as_uri())
    marker = str(tmp_path / "unpickled")
    req, body = _call(store, len, dump_parts(("one", [os.urandom(SMALL)])))
    assert _answer(body)[0].ok  # the genuine input passes its check
    req, body = _call(store, len, dump_parts(("one", [os.urandom(SMALL)])))
    store.put(req.items_key, dumps(("one", [_TouchOnUnpickle(marker)])))  # swapped after it was named
    resp, _ = _answer(body)
    assert not resp.ok and resp.error_kind == "rejected", resp
    assert f"input object {req.items_key!r}" in resp.error and "refused, not unpickled" in resp.error
    assert not os.path.exists(marker)
    assert store.exists(req.items_key)  # nothing committed: not the worker's to delete


class _CommitsWhileLoading:
    """A function whose loading, in the worker, plays another attempt of the same call committing
    and deleting the input: between this attempt's check for a result and its read of the input."""

    def __init__(self, store_url, job_id, items_key):
        self.args = (store_url, job_id, items_key)

    def __reduce__(self):
        return (_another_attempt_commits, self.args)


def _another_attempt_commits(store_url, job_id, items_key):
    store = open_store(store_url)
    key = keys.result_key(job_id, 0)
    store.put_if_absent(key, signing.seal(SECRET, key, compression.pack(dumps(("values", ["theirs"])))))
    store.delete([items_key])
    return len


def test_an_attempt_whose_input_went_with_another_attempts_commit_is_answered_from_that_result(tmp_path):
    store = open_store(tmp_path.as_uri())
    parts = dump_parts(("one", [os.urandom(SMALL)]))
    job_id = keys.new_job_id()
    store.put(keys.job_record_key(job_id), b"{}")
    items_key = keys.input_key(job_id, 0, _sha256(parts))
    store.put(items_key, parts)
    func = _CommitsWhileLoading(store.url, job_id, items_key)
    digest, data = pickle_function(func)
    store.put(keys.function_key(digest), data)
    req = wire.CallRequest(job_id=job_id, call_id=0, func_key=keys.function_key(digest), store_url=store.url,
                           runtime=runtime_info(), items_key=items_key)
    resp, _ = _answer(wire.encode(req, b""))
    assert resp.error is None and not resp.committed, resp  # answered as final, not failed
    assert resp.result_key == keys.result_key(job_id, 0)
    assert _value(store, job_id) == ("values", ["theirs"])


def test_a_late_copy_of_a_committed_call_runs_nothing_though_its_input_is_gone(tmp_path):
    store = open_store(tmp_path.as_uri())
    req, body = _call(store, len, dump_parts(("one", [os.urandom(SMALL)])))
    first, _ = _answer(body)
    assert first.ok and first.committed and not store.exists(req.items_key)
    late, _ = _answer(body)
    assert late.error is None and not late.committed and late.stats.get("already_final"), late


def test_a_request_naming_an_object_that_is_no_input_is_refused(tmp_path):
    store = open_store(tmp_path.as_uri())
    req, _ = _call(store, len, dump_parts(("one", [os.urandom(SMALL)])))
    req.items_key = keys.blob_key(req.job_id, "x")  # no name to check it by
    store.put(req.items_key, dumps(("one", [b"abc"])))
    resp, _ = _answer(wire.encode(req, b""))
    assert not resp.ok and resp.error_kind == "rejected" and "refused, not unpickled" in resp.error, resp
