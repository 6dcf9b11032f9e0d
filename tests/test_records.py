"""Job records, logs, cost and plots (issue 8), against a real emulator on loopback."""

from __future__ import annotations

import io
import json
import os
import time

import pytest

import fnmap
from fnmap.cost import pricing as cost
from fnmap.observe import gc, history, records
from fnmap.observe.progress import Progress
from fnmap.runtime import keys
from fnmap.storage import open_store


def _close_clients():
    """Close pooled connections first, so an emulator stops at once instead of waiting on them."""
    from fnmap import client

    for c in list(client._clients.values()):
        c.close()


@pytest.fixture(scope="module")
def _emulator():
    from conftest import EmulatorProcess

    emu = EmulatorProcess(workers=2)
    yield emu
    _close_clients()
    emu.stop()


@pytest.fixture
def emulator(_emulator, monkeypatch):
    """One emulator for the module (starting one costs seconds), pointed at by every test."""
    monkeypatch.setenv("FNMAP_EMULATOR_URL", _emulator.url)
    monkeypatch.setenv("FNMAP_SECRET", _emulator.secret)
    return _emulator


@pytest.fixture
def store():
    return open_store(os.environ["FNMAP_STORAGE"])


def test_success_record(emulator, store):
    job = fnmap.map(lambda x: x * 2, range(6), chunksize=1, return_job=True)  # one call per item
    assert job.results() == [0, 2, 4, 6, 8, 10]
    # The record is in storage by the time results are back: no waiting (its calls stored compact).
    record = json.loads(store.get(keys.job_record_key(job.id)))
    records.expand_calls(record["calls"])
    s = record["summary"]
    assert (s["status"], s["calls"], s["calls_done"], s["failed_items"], s["retries"]) == (
        "succeeded",
        6,
        6,
        0,
        0,
    )
    assert (
        s["duration_seconds"]["p50"] <= s["duration_seconds"]["p95"] <= s["duration_seconds"]["max"]
    )
    assert s["throughput"]["items_per_second"] > 0
    assert 1 <= s["workers"] <= 2 and s["cold_starts"] <= 2
    for call in record["calls"]:
        assert call["status"] == "ok" and call["attempt"] == 1 and len(call["attempts"]) == 1
        assert (
            call["submitted"]
            <= call["started"]
            <= call["finished"]
            <= call["written"]
            <= call["ended"]
        )
        assert call["worker"] and isinstance(call["cold"], bool)
        assert call["bytes_in"] > 0 and call["bytes_out"] > 0 and call["peak_memory_kb"] > 0
    assert [j["job_id"] for j in history.list_jobs(store)][0] == job.id
    assert records.load(store, job.id[:10])["calls"] == record["calls"]
    assert job.record()["summary"]["calls"] == 6


def test_failure_record_logs_and_exception_note(emulator, store):
    def noisy(x):
        print(f"working on {x}")
        if x == 2:
            print("about to fail")
            raise ValueError(f"bad item {x}")
        return x

    job = fnmap.map(noisy, range(4), return_job=True)
    with pytest.raises(ValueError, match="bad item 2") as info:
        job.results()
    notes = "\n".join(info.value.__notes__)
    assert "about to fail" in notes and f"fnmap logs {job.id} --call 2" in notes
    assert job.wait(
        30
    )  # the first failure is raised at once; the record follows when all calls end
    record = records.load(store, job.id)
    # The first failure is raised at once and stops the job's other calls: one still running then is
    # recorded cancelled (timing), not failed.
    failed = [c for c in record["calls"] if c["status"] not in ("ok", "cancelled")]
    assert [(c["call"], c["status"], c["error"], c["failed_items"]) for c in failed] == [
        (2, "error", "ValueError: bad item 2", 1)
    ]
    assert record["summary"]["status"] == "failed" and record["summary"]["failed_items"] == 1
    assert "working on 2\nabout to fail" in failed[0]["log_tail"]
    assert job.logs(2) == "--- call 2 attempt 1 ---\nworking on 2\nabout to fail\n"
    # Every call that ran has its output in the job's logs (one stopped by the failure may not have).
    logs = job.logs()
    ran = [c["call"] for c in record["calls"] if c["status"] != "cancelled"]
    assert all(f"--- call {call} attempt 1 ---\nworking on {call}\n" in logs for call in ran), (ran, logs)
    assert len(ran) >= 3 and logs.count("--- call") in (len(ran), 4)


def test_retry_record(emulator, store, tmp_path):
    marker = str(tmp_path / "crashed-once")

    def crash_once(x):
        if x == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)  # the worker process dies: a platform fault, retried
        return x

    job = fnmap.map(crash_once, range(3), return_job=True)
    assert job.results() == [0, 1, 2]
    record = records.load(store, job.id)
    call = record["calls"][1]
    assert call["status"] == "ok" and call["attempt"] == 2
    assert [(a["attempt"], a["outcome"]) for a in call["attempts"]] == [(1, "crashed"), (2, "ok")]
    assert record["summary"]["retries"] == 1 and record["summary"]["calls_retried"] == 1
    assert record["summary"]["status"] == "succeeded"


def test_timeout_record(emulator, store):
    def sleepy(x):
        if x == 0:
            time.sleep(30)
        return x

    job = fnmap.map(sleepy, range(2), timeout=1, return_job=True)
    with pytest.raises(fnmap.TimeoutError):
        job.results()
    assert job.wait(30)
    record = records.load(store, job.id)
    call = record["calls"][0]
    assert call["status"] == "timeout" and "TimeoutError" in call["error"]
    assert call["finished"] - call["started"] < 10
    assert record["calls"][1]["status"] == "ok"
    assert record["summary"]["calls_failed"] == 1


def test_executor_record_cost_and_plot(emulator, store, tmp_path):
    with fnmap.Executor(memory=2048, region="eu-west-1") as ex:
        assert [f.result() for f in [ex.submit(pow, 2, n) for n in range(4)]] == [1, 2, 4, 8]
    job = ex.job
    record = records.load(store, job.id)
    assert record["kind"] == "executor" and record["summary"]["calls_done"] == 4
    estimate = job.cost
    assert estimate["model"] == "aws-lambda" and estimate["memory_mb"] == 2048
    assert estimate["region"] == "eu-west-1" and estimate["requests"] == 4 and estimate["usd"] > 0
    path = job.plot(str(tmp_path / "timeline.png"))
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_rebuilt_from_status_records_when_the_client_wrote_none(emulator, store):
    job = fnmap.map(lambda x: x, range(3), return_job=True)
    job.results()
    index = [k for k in store.list(keys.job_index_prefix()) if job.id in k]
    store.delete([keys.job_record_key(job.id), *index])
    record = records.load(store, job.id)
    assert record["rebuilt"] and record["summary"]["status"] == "unknown"
    assert sorted(c["call"] for c in record["calls"]) == [0, 1, 2]
    assert all(c["worker"] and c["started"] for c in record["calls"])


def test_a_running_job_is_listed_and_shown(emulator, store):
    def slow(x):
        if x == 1:
            time.sleep(2)
        return x

    job = fnmap.map(slow, range(2), return_job=True)
    deadline = time.monotonic() + 30
    while not job.run.calls[0].done and time.monotonic() < deadline:
        time.sleep(0.05)
    listed = [j for j in history.list_jobs(store) if j["job_id"] == job.id]
    assert [(j["status"], j["calls"]) for j in listed] == [("running", 2)]
    record = records.load(store, job.id)
    assert record["summary"]["status"] == "running" and record["summary"]["calls"] == 2
    assert [c["call"] for c in record["calls"]] == [0] and record["kind"] == "map"
    assert job.results() == [0, 1]
    assert records.load(store, job.id)["summary"]["status"] == "succeeded"


def test_gc_deletes_old_jobs_only(emulator, tmp_path):
    url = (tmp_path / "gc-store").as_uri()
    store = open_store(url)
    job = fnmap.map(lambda x: x, range(2), storage=url, return_job=True)
    job.results()
    assert store.list(keys.job_prefix(job.id))
    kept = gc.collect_garbage(store, older_than=3600)
    assert kept["deleted_jobs"] == [] and kept["kept_jobs"] == 1
    later = time.time() + 7200
    dry = gc.collect_garbage(store, older_than=3600, now=later, dry_run=True)
    assert dry["deleted_jobs"] == [job.id] and store.list(keys.job_prefix(job.id))
    report = gc.collect_garbage(store, older_than=3600, now=later)
    assert report["deleted_jobs"] == [job.id] and report["deleted_keys"] > 4
    assert store.list(keys.job_prefix(job.id)) == [] and history.list_jobs(store) == []
    assert store.list("functions/") == []  # no job left uses it
    with pytest.raises(records.JobNotFound):
        records.load(store, job.id)


@pytest.fixture(scope="module")
def _lambda_emulator(s3_server):
    from conftest import EmulatorProcess

    aws_env = {
        "AWS_ENDPOINT_URL_S3": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    emu = EmulatorProcess(workers=2, env=aws_env)
    yield emu
    _close_clients()
    emu.stop()


def test_async_lambda_job_record_from_status_records(_lambda_emulator, s3_env, monkeypatch):
    """Results gathered from S3 carry no stats: readers take them from the workers' status records,
    and a failing call's output still comes with its exception."""
    bucket = s3_env(f"fnmap-records-{os.getpid()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", _lambda_emulator.url)
    monkeypatch.setenv("FNMAP_SECRET", _lambda_emulator.secret)
    url = f"s3://{bucket}/fnmap"

    def shout(x):
        print(f"shouting {x}")
        if x == 1:
            raise RuntimeError("hoarse")
        return x

    job = fnmap.map(
        shout, range(3), backend="aws", storage=url, lambda_invocation="Event", return_job=True
    )
    with pytest.raises(RuntimeError, match="hoarse") as info:
        job.results()
    assert "shouting 1" in "\n".join(info.value.__notes__)
    assert job.wait(30)
    record = records.load(open_store(url), job.id)
    assert [c["status"] for c in record["calls"]] == ["ok", "error", "ok"]
    assert all(c["worker"] and c["started"] and c["bytes_out"] for c in record["calls"])
    assert record["summary"]["workers"] >= 1 and record["summary"]["cost"]["requests"] == 3


def test_progress_shows_calls_failed_and_retrying():
    out = io.StringIO()
    bar = Progress(total=4, description="job", calls=4, file=out)
    bar.update(1, 0, call_id=0)
    bar.retrying(1)
    bar.update(1, 1, call_id=2)
    bar.refresh()
    text = out.getvalue()
    assert "calls=2/4" in text and "failed=1" in text and "retrying=1" in text
    bar.update(1, 0, call_id=1)
    bar.update(1, 0, call_id=3)  # drawn at most every 0.1 s, but always when closed
    bar.close()
    last = out.getvalue().rsplit("\r", 1)[-1]
    assert "retrying" not in last and "4/4" in last and "calls=4/4" in last


def test_no_bar_without_a_terminal_unless_asked():
    from fnmap.observe.progress import make_progress

    assert make_progress(None, 1000, "job") is None  # pytest's stderr is not a terminal
    assert make_progress(False, 1000, "job") is None
    bar = make_progress(True, 3, "job", calls=3)
    assert isinstance(bar, Progress)
    bar.close()


def test_cost_model():
    """One attempt's list price: duration (1 ms at least) x memory, a request, its S3 requests;
    Batch: instance time with a one-minute minimum."""
    from fnmap.cost.prices import lambda_price, s3_price

    lam, s3 = lambda_price("us-east-1"), s3_price("us-east-1")
    pricing = cost.Pricing.of("emulator", {})
    assert pricing.model == "aws-lambda" and pricing.memory_mb == 1024 and "memory" in pricing.assumed
    parts = pricing.parts(1.0, puts=0, gets=0)
    assert parts["gb_seconds"] == pytest.approx(1.0) and parts["compute"] == pytest.approx(lam.gb_second_x86)
    assert parts["request"] == pytest.approx(lam.request) and parts["storage"] == 0
    assert pricing.parts(0.0001, memory_mb=128, puts=0, gets=0)["gb_seconds"] == pytest.approx(0.001 / 8)
    assert pricing.parts(1.0, init_seconds=0.25, puts=0, gets=0)["gb_seconds"] == pytest.approx(1.25)
    assert pricing.attempt(0.0, puts=2, gets=3) == pytest.approx(
        0.001 * lam.gb_second_x86 + lam.request + 2 * s3.put + 3 * s3.get)
    with pytest.raises(cost.UnknownPrice, match="us-east-1"):
        cost.Pricing.of("aws", {"region": "mars-north-1"})
    batch = cost.Pricing.of("batch", {"instance_type": "g4dn.xlarge"})
    from fnmap.cost.prices import instance_price

    assert batch.parts(10.0)["instance_seconds"] == 60 and batch.parts(120.0)["instance_seconds"] == 120
    assert batch.parts(120.0)["compute"] == pytest.approx(120 / 3600 * instance_price("g4dn.xlarge"))
    assert cost.job_cost({"backend": "aws", "options": {"region": "mars-north-1"}, "calls": []})["usd"] is None


def test_parse_age():
    assert gc.parse_age("90s") == 90 and gc.parse_age("12h") == 43200
    assert gc.parse_age("7d") == 7 * 86400 and gc.parse_age("1.5w") == 1.5 * 7 * 86400
    for bad in ("", "7", "d", "-1d", "7y"):
        with pytest.raises(ValueError, match="is not an age"):
            gc.parse_age(bad)


def _touch_200_mb(_x):
    block = bytearray(200 << 20)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))  # make every page resident
    return len(block)


def _small(_x):
    return 1


def _clear_refs_allowed() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _clear_refs_allowed(), reason="needs Linux's /proc/self/clear_refs")
def test_peak_memory_is_each_calls_own_in_a_warm_worker(use_emulator):
    """A small call after a big one in the same warm worker reports its own peak, not the big one's."""
    use_emulator(workers=1)
    big = fnmap.map(_touch_200_mb, [0], return_job=True)
    big.results()
    small = fnmap.map(_small, [0], return_job=True)
    small.results()
    big_kb = big.record()["calls"][0]["peak_memory_kb"]
    small_kb = small.record()["calls"][0]["peak_memory_kb"]
    assert big.record()["calls"][0]["worker"] == small.record()["calls"][0]["worker"]
    assert big_kb > 200 * 1024 and small_kb < big_kb - 150 * 1024


def test_a_stored_call_keeps_each_attempts_memory():
    """The compact stored form of a call keeps the memory each attempt had (memory steps, issue 24)."""
    call = {"call_id": 0, "status": "ok", "attempts": [
        {"attempt": 1, "sent": 1.0, "ended": 2.0, "outcome": "out_of_memory", "memory": 128},
        {"attempt": 2, "sent": 3.0, "ended": 4.0, "outcome": "ok", "memory": 1024},
        {"attempt": 3, "sent": 5.0, "ended": 6.0, "outcome": "cancelled"}]}
    stored = json.loads(json.dumps(records.compact_calls([call])))
    attempts = records.expand_calls(stored)[0]["attempts"]
    assert [a.get("memory") for a in attempts] == [128, 1024, None]
    assert [a["outcome"] for a in attempts] == ["out_of_memory", "ok", "cancelled"]
