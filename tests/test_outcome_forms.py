"""The per-item cost of a chunk (issue 24): a call whose items all returned a value is committed in
the plain form, ``("values", [...])``, not one ``("ok", value)`` tuple per item; a call with a
failure keeps the mixed form, each failure at its item's index; and the worker's cheap per-item
loop still honours a call's ``timeout`` and its cancellation.

Results are read back from storage as every reader reads them (unsealed with the deployment's
secret), and through the front-ends that read them: ``results()``, ``fnmap.job(ID)`` (re-attach),
the ``Executor``.  Jobs run on the embedded emulator (the default backend) or threads (``local``).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import CancelledError

import pytest
from conftest import until

import fnmap
from fnmap.client import get_client
from fnmap.runtime import compression, keys, signing
from fnmap.runtime.serialization import loads


def _stored(job, call_id: int):
    """A call's committed outcomes, read and checked as the client reads them."""
    key = keys.result_key(job.id, call_id)
    secret = get_client(job.config).secret
    return loads(compression.unpack(signing.unseal(secret, key, job.store.get(key))))


def triple(x):
    return 3 * x


def fails_on_three(x):
    if x % 10 == 3:
        raise ValueError(f"bad item {x}")
    return x


def test_an_all_ok_chunk_is_committed_as_a_plain_list_of_values():
    job = fnmap.map(triple, range(40), chunksize=20, return_job=True)
    assert job.results() == [3 * x for x in range(40)]
    assert _stored(job, 0) == ("values", [3 * x for x in range(20)])
    assert _stored(job, 1) == ("values", [3 * x for x in range(20, 40)])
    assert fnmap.job(job.id).results() == [3 * x for x in range(40)]  # re-attach reads the plain form
    assert job.record()["summary"]["failed_items"] == 0


def test_a_chunk_with_failures_keeps_each_error_at_its_index_beside_plain_chunks():
    job = fnmap.map(fails_on_three, range(20), chunksize=5, return_exceptions=True, return_job=True)
    out = job.results(return_exceptions=True)
    assert [i for i, v in enumerate(out) if isinstance(v, ValueError)] == [3, 13]
    assert [v for i, v in enumerate(out) if i not in (3, 13)] == [x for x in range(20) if x not in (3, 13)]
    mixed = _stored(job, 0)
    assert isinstance(mixed, list) and [o[0] for o in mixed] == ["ok", "ok", "ok", "err", "ok"]
    assert [o[1] for o in mixed if o[0] == "ok"] == [0, 1, 2, 4]
    assert _stored(job, 1) == ("values", [5, 6, 7, 8, 9])
    attached = fnmap.job(job.id).results(return_exceptions=True)  # both forms, read back from storage
    assert [type(v) for v in attached] == [type(v) for v in out] and attached[5:10] == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="bad item 3") as info:
        fnmap.job(job.id).results()
    assert any("item 3" in note for note in info.value.__notes__)
    record = job.record()
    assert record["summary"]["failed_items"] == 2
    assert [c["status"] for c in record["calls"]] == ["error", "ok", "error", "ok"]


def test_executor_map_and_submit_read_both_forms():
    with fnmap.Executor() as ex:
        assert list(ex.map(triple, range(30), chunksize=10)) == [3 * x for x in range(30)]
        assert ex.submit(triple, 7).result() == 21
        with pytest.raises(ValueError, match="bad item 13"):
            list(ex.map(fails_on_three, range(10, 20), chunksize=5))


def lock_at_four(x):
    return threading.Lock() if x == 4 else x


def test_an_unpicklable_value_fails_its_item_only():
    out = fnmap.map(lock_at_four, range(8), chunksize=8, return_exceptions=True)
    assert out[:4] == [0, 1, 2, 3] and out[5:] == [5, 6, 7]
    assert isinstance(out[4], fnmap.SerializationError) and "item 4" in str(out[4])


# -- the call's timeout over many items ------------------------------------------------------------


def stuck_on_two(x):
    if x == 2:
        time.sleep(600)
    return x


def test_a_timeout_stops_a_chunk_of_many_items():
    """The timer stops the running item; the items after it are not started."""
    out = fnmap.map(stuck_on_two, range(300), chunksize=300, timeout=2, retries=0, return_exceptions=True)
    assert out[:2] == [0, 1]
    assert isinstance(out[2], fnmap.TimeoutError) and "item 2 exceeded the call timeout" in str(out[2])
    assert all(isinstance(v, fnmap.TimeoutError) and "was not started" in str(v) for v in out[3:])


def swallows_the_timer(x):
    if x == 2:
        try:
            time.sleep(600)
        except BaseException:  # noqa: B036 - user code that swallows everything, the timer's interrupt too
            return "late"
    return x


def test_a_timeout_stops_the_items_after_one_that_swallowed_the_timer():
    """The clock is still read between items: what user code swallows stops nothing more."""
    out = fnmap.map(swallows_the_timer, range(50), chunksize=50, timeout=2, retries=0, return_exceptions=True)
    assert out[:3] == [0, 1, "late"]
    assert all(isinstance(v, fnmap.TimeoutError) and "was not started" in str(v) for v in out[3:])


def slow_on_two(x):
    if x == 2:
        time.sleep(1.5)
    return x


def test_a_timeout_stops_a_chunk_in_threads(tmp_path):
    """Threads have no timer: the client fails the call at its timeout, the item runs to its end,
    and the items after it are not started (the outcomes the thread commits say so)."""
    job = fnmap.map(slow_on_two, range(50), chunksize=50, timeout=0.5, retries=0, backend="local",
                    storage=tmp_path.as_uri(), return_exceptions=True, return_job=True)
    assert all(isinstance(v, fnmap.TimeoutError) for v in job.results(return_exceptions=True))
    until(lambda: job.store.exists(keys.result_key(job.id, 0)))
    outcomes = _stored(job, 0)
    assert outcomes[:3] == [("ok", 0), ("ok", 1), ("ok", 2)]
    assert all(o[0] == "err" and "was not started" in o[2] for o in outcomes[3:]), outcomes[3]


# -- cancellation mid-chunk ------------------------------------------------------------------------


def marks_and_blocks(arg):
    folder, x = arg
    open(os.path.join(folder, str(x)), "w").close()
    if x == 1:
        time.sleep(600)
    return x


def test_cancelling_a_job_stops_its_chunk_mid_way(tmp_path):
    items = [(str(tmp_path), x) for x in range(50)]
    job = fnmap.map(marks_and_blocks, items, chunksize=50, return_job=True)
    until(lambda: (tmp_path / "1").exists())
    job.cancel(stop_platform=True)
    assert job.wait(60)
    with pytest.raises(CancelledError):
        job.results()
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]  # the rest of the chunk never ran


def test_a_result_up_to_twice_the_sample_is_compressed_in_one_pass(monkeypatch):
    """A chunk's 75 KB of results was compressed twice: its 64 KiB sample, then all of it."""
    import pickle
    import zlib

    passes = []
    compress = zlib.compress
    monkeypatch.setattr(zlib, "compress", lambda data, level: passes.append(len(data)) or compress(data, level))
    mid = pickle.dumps(("values", list(range(25_000))), protocol=5)
    packed = compression.pack(mid)
    assert packed.startswith(compression.MAGIC) and compression.unpack(packed) == mid
    assert passes == [len(mid)]
    noise = os.urandom(100_000)
    assert compression.pack(noise) is noise  # incompressible: left as it is
