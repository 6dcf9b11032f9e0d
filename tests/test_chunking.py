"""Automatic chunking (issue 24): ``chunksize`` unset sizes a job's calls as it runs.

The sizing rule is :class:`fnmap.policy.ChunkSizer` (plain data, tested first without servers);
the rest runs real jobs on the embedded emulator (the default backend) and counts calls, never time.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import CancelledError

import pytest

import fnmap
from fnmap.policy import ChunkSizer
from fnmap.runtime import keys

# -- the sizing rule ------------------------------------------------------------------------


def test_calls_have_one_item_until_one_was_measured():
    sizer = ChunkSizer(target=0.1, parallelism=4)
    assert [sizer.next_size(1000) for _ in range(5)] == [1] * 5


def test_fast_calls_grow_by_the_measured_ratio_in_two_steps():
    """joblib's ratio: target over the measured call's seconds (was: at most 8x per measured size,
    1, 8, 64, 512, ..., one round trip each)."""
    sizer = ChunkSizer(target=0.1, parallelism=4, growth=8)
    sizer.observe(1, 0.001)  # a millisecond per call: 100 items would take the target
    assert sizer.next_size(10**6) == 100
    sizer.observe(100, 0.002)  # 10 us an item past the call's own millisecond: 50x the ratio
    assert sizer.next_size(10**6) == 5_000


def test_ratio_growth_is_bounded_by_the_items_left_per_slot():
    sizer = ChunkSizer(target=0.1, parallelism=4, growth=8)
    sizer.observe(1, 0.00001)  # one very fast first item: 10,000 items by the ratio
    assert sizer.next_size(1_000) == 125  # an eighth of the items left per slot, as Pool.map's chunks
    assert sizer.next_size(40) == 8  # never below the old growth


def test_a_call_carries_at_most_the_bytes_budget():
    sizer = ChunkSizer(target=0.1, parallelism=4, item_bytes=1 << 20, max_bytes=16 << 20)
    assert sizer.next_size(10**6) == 1
    sizer.observe(1, 0.001)
    assert sizer.next_size(10**6) == 16
    assert ChunkSizer(target=0.1, parallelism=4, item_bytes=64 << 20).max_items == 1  # one at least


def test_slow_items_stay_one_per_call():
    sizer = ChunkSizer(target=0.1, parallelism=4)
    for _ in range(10):
        sizer.observe(1, 2.0)
        assert sizer.next_size(100) == 1


def test_chunks_shrink_at_once_when_items_turn_slow():
    sizer = ChunkSizer(target=1.0, parallelism=2, growth=8)
    sizer.observe(1, 0.01)
    assert sizer.next_size(10**6) == 100
    sizer.observe(100, 100.0)  # a second an item now
    assert sizer.next_size(10**6) == 1


def test_the_tail_is_spread_over_the_workers_down_to_quarter_target_calls():
    sizer = ChunkSizer(target=1.0, parallelism=4, growth=1000)
    sizer.observe(1, 0.01)
    sizer.observe(10, 0.1)  # 0.01 s an item: 100 items take the target, 25 a quarter of it
    assert sizer.next_size(10_000) == 100
    assert sizer.next_size(400) == 50  # 400 left over 4 workers: an eighth each
    assert sizer.next_size(80) == 25  # not below a quarter-target call
    assert sizer.next_size(3) == 3


def test_calls_made_before_the_chunks_grew_do_not_count():
    sizer = ChunkSizer(target=0.1, parallelism=4, growth=8)
    sizer.observe(1, 0.001)
    sizer.observe(8, 0.001)
    sizer.observe(64, 0.002)
    before = sizer.per_item
    sizer.observe(1, 5.0)  # a one-item call that waited behind big ones
    assert sizer.per_item == before


# -- jobs -------------------------------------------------------------------------------------


def ident(x):
    return x


def fails_on_sevens(x):
    if x % 1000 == 7:
        raise ValueError(f"bad item {x}")
    return x


def sleepy(x):
    time.sleep(0.3)
    return x


def test_many_fast_items_make_far_fewer_calls_than_items_and_come_back_in_order():
    job = fnmap.map(ident, range(20_000), return_job=True)
    assert job.results() == list(range(20_000))
    assert len(job.run.calls) < 2_000, f"{len(job.run.calls)} calls for 20,000 items"
    firsts = [s.first_index for s in job.run.calls]
    assert firsts == sorted(firsts) and sum(s.n_items for s in job.run.calls) == 20_000
    assert job.record()["options"]["chunksize"] == "auto"


def test_a_tiny_item_job_grows_past_its_one_item_calls_by_the_measured_ratio():
    """Through the job record: the calls start with one item each (one per dispatch slot) and then
    grow by target / the measured call's time (joblib's ratio: about 0.1 s / 0.5 ms after a warm
    one-item call), so some call is more than 8x every call before it.  The old ramp grew at most
    8x the largest call measured (1, 8, 64, 512, 4096, ...: one round trip per step)."""
    job = fnmap.map(ident, range(100_000), return_job=True)
    assert job.results() == list(range(100_000))
    sizes = [c["items"] for c in job.record()["calls"]]
    ones = next(i for i, n in enumerate(sizes) if n > 1)
    assert 1 <= ones <= job.run.feed.sizer.parallelism, sizes
    assert any(sizes[i] > 8 * max(sizes[:i]) for i in range(1, len(sizes))), sizes
    assert max(sizes) >= 1_000, sizes


def test_errors_stay_at_their_items_index_in_bigger_chunks():
    job = fnmap.map(fails_on_sevens, range(5_000), return_job=True)
    out = job.results(return_exceptions=True)
    assert len(job.run.calls) < 5_000
    assert [i for i, v in enumerate(out) if isinstance(v, Exception)] == [7, 1007, 2007, 3007, 4007]
    assert all(v == i for i, v in enumerate(out) if not isinstance(v, Exception))
    with pytest.raises(ValueError, match="bad item 7") as info:
        fnmap.map(fails_on_sevens, range(5_000))
    assert any("item 7 " in note for note in info.value.__notes__)
    attached = fnmap.job(job.id).results(return_exceptions=True)  # re-attach: one entry per item
    assert len(attached) == 5_000
    assert [i for i, v in enumerate(attached) if isinstance(v, Exception)] == [7, 1007, 2007, 3007, 4007]


@pytest.mark.parametrize("chunksize", [1, 7])
def test_an_explicit_chunksize_wins(chunksize):
    job = fnmap.map(ident, range(50), chunksize=chunksize, return_job=True)
    assert job.results() == list(range(50))
    whole, rest = divmod(50, chunksize)
    assert [s.n_items for s in job.run.calls] == [chunksize] * whole + ([rest] if rest else [])


def test_a_few_slow_items_spread_over_one_call_each():
    job = fnmap.map(sleepy, range(6), return_job=True)
    assert job.results() == list(range(6))
    assert [s.n_items for s in job.run.calls] == [1] * 6


def test_imap_and_starmap_are_chunked_and_complete():
    assert list(fnmap.imap(ident, range(3_000))) == list(range(3_000))
    assert sorted(fnmap.imap_unordered(ident, range(3_000))) == list(range(3_000))
    job = fnmap.starmap(pow, [(i, 2) for i in range(3_000)], return_job=True)
    assert job.results() == [i * i for i in range(3_000)] and len(job.run.calls) < 3_000


def test_a_cancelled_job_still_has_one_entry_per_item():
    job = fnmap.map(sleepy, range(40), return_job=True)
    job.cancel(stop_platform=True)
    job.wait(60)
    record = job.record()
    assert sum(c["items"] for c in record["calls"]) == 40
    with pytest.raises(CancelledError):
        job.results()
    attached = fnmap.job(job.id).results(return_exceptions=True)
    assert len(attached) == 40
    assert any(isinstance(v, CancelledError) for v in attached)


def test_the_job_record_does_not_grow_per_item(storage_root):
    sizes = {}
    for n in (2_000, 50_000):
        job = fnmap.map(ident, range(n), return_job=True)
        job.results()
        sizes[n] = len(job.store.get(keys.job_record_key(job.id)))
    # 25 x the items: the record grows far less (a few more calls), and stays small.
    assert sizes[50_000] < 4 * sizes[2_000] and sizes[50_000] < 100_000, sizes


def test_a_stored_call_entry_is_compact():
    job = fnmap.map(ident, range(20), chunksize=1, return_job=True)
    job.results()
    stored = json.loads(job.store.get(keys.job_record_key(job.id)))
    per_call = len(json.dumps(stored["calls"], separators=(",", ":"))) / 20
    assert per_call < 400, per_call
    assert "traceback" not in stored["calls"][0] and isinstance(stored["calls"][0]["attempts"][0], list)
    read = fnmap.job(job.id).record()["calls"][0]  # read back as the record was built
    assert read["traceback"] is None and read["submitted"] == read["attempts"][0]["sent"]


def test_a_bad_item_past_the_first_calls_still_fails_before_anything_runs(tmp_path):
    """Chunks are pickled as the job runs, so every item is checked up front: none ran."""
    import threading

    items = list(range(100))
    items[70] = threading.Lock()
    with pytest.raises(fnmap.SerializationError, match="item 70"):
        fnmap.map(ident, items, backend="local", workers=2, storage=tmp_path.as_uri())
    results = f"/{keys.result_key('x', 0).split('/')[2]}/"  # the folder of a job's committed results
    assert any(tmp_path.glob("jobs/*")), "the failed job's record is there: the check looks in the right place"
    assert not [p for p in tmp_path.glob("jobs/*/**/*") if p.is_file() and results in str(p)], "a call ran"


def test_a_large_chunk_among_small_ones_is_not_a_straggler():
    from fnmap.policy import stragglers

    # 0.1 s per item measured; call 7 has 100 items and has run 5 s: half its expected time.
    per_item, running = [0.1] * 20, {7: 95.0}
    assert stragglers(running, per_item, 20, 21, 100.0, items={7: 100}) == []
    assert stragglers(running, per_item, 20, 21, 100.0, items={7: 10}) == [7]  # 10 items: 5x late
