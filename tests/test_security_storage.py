"""Authenticated storage (issue 26): what a worker or the client unpickles from storage is checked
with the secret first; a planted or altered object is refused with its key named, never unpickled."""

from __future__ import annotations

import os
import pickle

import pytest
from test_security import _TouchOnUnpickle

import fnmap
from fnmap.runtime import compression, keys, signing
from fnmap.runtime.serialization import pickle_function
from fnmap.storage import open_store


def double(x):
    return 2 * x


def test_a_planted_function_object_is_refused_by_the_worker(use_emulator, storage_root, tmp_path):
    use_emulator(workers=1)
    assert fnmap.map(double, [1, 2]) == [2, 4]
    marker = str(tmp_path / "unpickled")
    digest, _ = pickle_function(double)
    key = keys.function_key(digest)
    open_store(storage_root.as_uri()).put(key, pickle.dumps(_TouchOnUnpickle(marker)))
    use_emulator(workers=1)  # a fresh worker, with no function cached: the same script again
    with pytest.raises(fnmap.PlatformError, match=rf"function object {key!r}.*refused, not unpickled"):
        fnmap.map(double, [1, 2], retries=0)
    assert not os.path.exists(marker)


def triple(x):
    return 3 * x


def test_a_planted_result_is_refused_by_job_results(use_emulator, storage_root, tmp_path):
    use_emulator(workers=1)
    assert fnmap.map(triple, [1, 2, 3], chunksize=1) == [3, 6, 9]
    store = open_store(storage_root.as_uri())
    job_id = store.list(keys.job_index_prefix())[-1].rsplit("-", 1)[1].removesuffix(".json")
    assert fnmap.job(job_id).results() == [3, 6, 9]  # the genuine results pass the check
    marker = str(tmp_path / "unpickled")
    key = keys.result_key(job_id, 1)
    planted = compression.pack(pickle.dumps([("ok", _TouchOnUnpickle(marker))]))
    for data in (planted, signing.seal(b"another-secret", key, planted),
                 signing.seal(os.environ["FNMAP_SECRET"].encode(), keys.result_key(job_id, 0), planted)):
        store.put(key, data)
        with pytest.raises(signing.UnauthenticatedObject, match=key):
            fnmap.job(job_id).results()
    assert not os.path.exists(marker)


def test_sealed_objects_are_bound_to_their_key_and_secret():
    data = b"payload"
    sealed = signing.seal(b"s", "jobs/a/out/0/0", data)
    assert bytes(signing.unseal(b"s", "jobs/a/out/0/0", sealed)) == data
    for secret, key, blob in ((b"t", "jobs/a/out/0/0", sealed), (b"s", "jobs/a/out/1/1", sealed),
                              (b"s", "jobs/a/out/0/0", sealed[:-1] + b"!"), (b"s", "jobs/a/out/0/0", data)):
        with pytest.raises(signing.UnauthenticatedObject):
            signing.unseal(secret, key, blob)


def test_a_planted_joblib_argument_is_refused_before_unpickling(storage_root, tmp_path):
    """joblib's large arguments are stored once under their SHA-256; the worker checks it first."""
    from fnmap.joblib import StoredArgument

    store = open_store(storage_root.as_uri())
    honest = pickle.dumps(list(range(10)), protocol=5)
    key = f"jobs/{keys.new_job_id()}/joblib/{__import__('hashlib').sha256(honest).hexdigest()}"
    store.put(key, honest)
    assert StoredArgument(key, store.url).load() == list(range(10))
    marker = str(tmp_path / "unpickled")
    planted_key = key[:-1] + ("0" if key[-1] != "0" else "1")  # another job's slot, not yet read
    store.put(planted_key, pickle.dumps(_TouchOnUnpickle(marker)))
    with pytest.raises(signing.UnauthenticatedObject, match="refused, not unpickled"):
        StoredArgument(planted_key, store.url).load()
    assert not os.path.exists(marker)
