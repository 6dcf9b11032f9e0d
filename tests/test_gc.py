"""Storage that does not grow without bound: gc of old jobs and of the shared objects no job uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import fnmap
from fnmap.observe import gc, history, records
from fnmap.runtime import keys
from fnmap.storage import open_store

#: Inputs larger than this go through storage (the default is 4 MB).
SMALL = 64 * 1024


def gc_since(store, cutoff: float, **options) -> dict:
    """``fnmap gc`` of the jobs created before ``cutoff`` (a clock reading), whatever the delay until it runs."""
    now = time.time()
    return gc.collect_garbage(store, older_than=now - cutoff, now=now, **options)


def first_byte(blob: bytes) -> int:
    return blob[0]


def last_byte(blob: bytes) -> int:
    return blob[-1]


def noise(n: int) -> bytes:
    return os.urandom(n)  # does not compress: the result takes n bytes in storage


def gc_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    """``fnmap gc`` as a user runs it, in its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    done = subprocess.run([sys.executable, "-m", "fnmap", "gc", "--storage", url, *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def test_gc_removes_shared_objects_no_kept_job_uses_and_reports_bytes(tmp_path):
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    big = os.urandom(1024 * 1024)
    old = fnmap.map(first_byte, [big], storage=url, return_job=True, inline_limit=SMALL)
    old.results()
    other = fnmap.map(last_byte, [b"small"], storage=url, return_job=True)
    other.results()
    other_function = records.load(store, other.id)["shared"]
    time.sleep(0.05)
    between = time.time()
    time.sleep(0.05)
    new = fnmap.map(first_byte, [b"small"], storage=url, return_job=True)  # the same function as old
    new.results()
    function = records.load(store, old.id)["shared"]  # its input went once its call committed
    assert len(function) == 1 and function[0].startswith("functions/")
    assert records.load(store, new.id)["shared"] == function

    dry = gc_since(store, between, dry_run=True)
    assert sorted(dry["deleted_jobs"]) == sorted([old.id, other.id])
    # The function no kept job uses goes; old's stays, though written before the cutoff: the kept
    # job uses it.
    assert len(other_function) == 1 and dry["deleted_shared"] == other_function
    assert dry["deleted_bytes"] > 0 and dry["deleted_job_bytes"][old.id] > 0
    assert store.list(keys.job_prefix(old.id)) and set(other_function) <= set(store.list("functions/"))

    done = gc_since(store, between)
    assert done["deleted_bytes"] == dry["deleted_bytes"]
    assert store.list(keys.job_prefix(old.id)) == []
    assert store.list("functions/") == function
    assert fnmap.job(new.id, storage=url).results() == [ord("s")]

    time.sleep(0.05)
    assert gc.collect_garbage(store, older_than=0)["deleted_shared"] == function  # no job left
    # The same process maps the deleted function again: it is looked up per job and stored again.
    assert fnmap.map(first_byte, [big], storage=url, inline_limit=SMALL) == [big[0]]


def test_while_a_kept_job_runs_no_shared_object_is_removed(tmp_path):
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    old = fnmap.map(first_byte, [os.urandom(1024 * 1024)], storage=url, inline_limit=SMALL, return_job=True)
    old.results()
    old_function = records.load(store, old.id)["shared"]  # no kept job uses it
    time.sleep(0.05)
    between = time.time()
    time.sleep(0.05)
    with fnmap.Executor(storage=url) as ex:
        assert ex.submit(len, b"abc").result() == 3
        # Listed from its first call on, not only once it is shut down: gc sees it running.
        assert any(j["job_id"] == ex.job.id and j["status"] == "running" for j in history.list_jobs(store))
        report = gc_since(store, between)
        assert report["deleted_jobs"] == [old.id]
        assert report["kept_shared_because_running"] and report["deleted_shared"] == []
        assert set(old_function) <= set(store.list("functions/"))
    after = gc_since(store, between)
    assert after["deleted_jobs"] == [] and after["deleted_shared"] == old_function
    assert not set(old_function) & set(store.list("functions/"))


def test_gc_cli_reports_bytes_per_job_human_and_json(tmp_path):
    """A fetched result stays in storage (fnmap.job(ID) reads it again) until gc; gc says how big each job is."""
    url = (tmp_path / "store").as_uri()
    job = fnmap.map(noise, [300_000], storage=url, backend="local", return_job=True)
    assert len(job.results()[0]) == 300_000

    kept = json.loads(gc_cli(url, "--older-than", "1h", "--dry-run", "--json").stdout)
    assert kept["deleted_jobs"] == [] and kept["deleted_bytes"] == 0
    size = kept["kept_job_bytes"][job.id]
    # kept_bytes is every byte the storage holds (the function and index entry too), as `du` counts them
    assert 300_000 < size < 360_000 and kept["kept_bytes"] == disk_bytes(tmp_path / "store") > size
    shown = gc_cli(url, "--older-than", "1h", "--dry-run").stdout
    assert shown.split("largest jobs in storage:")[1].split() == [job.id[:12], f"{size / 1024:.1f}", "KB", "kept"]

    dry = json.loads(gc_cli(url, "--older-than", "0s", "--dry-run", "--json").stdout)
    assert dry["deleted_jobs"] == [job.id] and dry["deleted_job_bytes"] == {job.id: size}
    assert dry["deleted_bytes"] > size and dry["kept_job_bytes"] == {}  # and the function no job uses
    shown = gc_cli(url, "--older-than", "0s", "--dry-run").stdout
    assert shown.startswith("would delete 1 job(s)") and f"{dry['deleted_bytes'] / 1024:.1f} KB;" in shown, shown
    assert shown.split("largest jobs in storage:")[1].split()[-2:] == ["would", "delete"], shown
    assert fnmap.job(job.id, storage=url).results()[0] == job.results()[0]  # a dry run deletes nothing

    done = gc_cli(url, "--older-than", "0s").stdout
    assert done.startswith("deleted 1 job(s)") and f"{dry['deleted_bytes'] / 1024:.1f} KB;" in done, done
    assert "largest jobs" not in done
    assert store_keys(url, keys.job_prefix(job.id)) == [] and store_keys(url, "functions/") == []


def disk_bytes(root) -> int:
    """The bytes allocated to every file and folder under ``root`` (not ``root`` itself), as ``du``
    counts them: whole blocks, not the files' lengths."""
    return sum(os.stat(os.path.join(d, name)).st_blocks * 512
               for d, folders, files in os.walk(root) for name in (*folders, *files))


def store_keys(url: str, prefix: str) -> list[str]:
    return open_store(url).list(prefix)


def test_a_job_being_submitted_keeps_the_old_objects_it_reuses(tmp_path):
    """A map still storing its inputs has no record yet; the function it found already stored (written
    by an older job, before the cutoff) must survive a gc that runs meanwhile."""
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    big = os.urandom(1024 * 1024)
    fnmap.map(first_byte, [big], storage=url, inline_limit=SMALL, backend="local")
    time.sleep(0.05)
    between = time.time()
    time.sleep(0.05)
    reports = []

    def items():
        yield big
        reports.append(gc_since(store, between))  # another process's gc
        yield os.urandom(1024 * 1024)

    results = fnmap.map(first_byte, items(), storage=url, inline_limit=SMALL, chunksize=1, backend="local")
    assert reports[0]["deleted_shared"] == [] and results[0] == big[0]


def second_byte(blob: bytes) -> int:
    return blob[1]


def test_a_gc_while_a_job_is_being_submitted_keeps_every_shared_object(tmp_path):
    """A map still storing its inputs has only its "running" index entry: a gc meanwhile removes the
    old job but no shared object (the new job may use any of them); once it is done, they go."""
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    old = fnmap.map(first_byte, [os.urandom(1024 * 1024)], storage=url, inline_limit=SMALL, return_job=True)
    old.results()
    old_shared = records.load(store, old.id)["shared"]
    time.sleep(0.05)
    between = time.time()
    time.sleep(0.05)
    fresh = os.urandom(1024 * 1024)
    reports = []

    def items():
        yield fresh  # a new function and a new input, stored now
        reports.append(gc_since(store, between))  # another process's gc
        yield os.urandom(1024 * 1024)

    results = fnmap.map(second_byte, items(), storage=url, inline_limit=SMALL, chunksize=1, backend="local")
    assert results[0] == fresh[1]
    assert reports[0]["deleted_jobs"] == [old.id]
    assert reports[0]["deleted_shared"] == [] and reports[0]["kept_shared_because_running"]
    later = gc_since(store, between)
    assert sorted(later["deleted_shared"]) == sorted(old_shared)  # no job left uses them


def slow_double(x: int) -> int:
    time.sleep(0.3)
    return 2 * x


def test_gc_during_a_running_job_keeps_it_whole(tmp_path):
    """A cutoff in the future makes every job old: the running one stays whole, function included,
    and every result is readable afterwards; once it has ended, the same gc deletes it."""
    from conftest import until

    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    job = fnmap.map(slow_double, range(8), storage=url, return_job=True, chunksize=1, workers=2)
    until(lambda: store.list(keys.status_prefix(job.id)))  # mid-job: a call has reported
    report = gc_since(store, time.time() + 3600)
    assert report["deleted_jobs"] == [] and report["kept_running_jobs"] == [job.id]
    assert report["deleted_shared"] == [] and report["kept_shared_because_running"]
    assert job.results() == [2 * x for x in range(8)]
    assert fnmap.job(job.id, storage=url).results() == [2 * x for x in range(8)]
    after = gc_since(store, time.time() + 3600)
    assert after["deleted_jobs"] == [job.id] and store.list(keys.job_prefix(job.id)) == []


def test_gc_keeps_a_job_whose_lease_is_live(tmp_path):
    """A live lease (a client redriving the job elsewhere) keeps even a finished job; an expired one does not."""
    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    job = fnmap.map(first_byte, [b"a"], storage=url, return_job=True)
    job.results()

    def lease(expires: float) -> None:
        store.put(keys.lease_key(job.id), json.dumps(
            {"holder": "another-host:123", "renewed": time.time(), "expires": expires}).encode())

    lease(time.time() + 600)
    report = gc_since(store, time.time() + 3600)
    assert report["deleted_jobs"] == [] and report["kept_running_jobs"] == [job.id]
    assert fnmap.job(job.id, storage=url).results() == [ord("a")]
    lease(time.time() - 1)
    report = gc_since(store, time.time() + 3600)
    assert report["deleted_jobs"] == [job.id] and store.list(keys.job_prefix(job.id)) == []


def test_gc_collects_a_job_whose_lease_holder_is_gone_from_this_host(tmp_path):
    """A lease good for ten more minutes, held by a process of this host that is gone (killed): gc
    judges it as ``fnmap jobs``, ``redrive`` and ``cancel`` do, at once, not when it expires."""
    import socket
    import subprocess
    import sys

    url = (tmp_path / "store").as_uri()
    store = open_store(url)
    job = fnmap.map(first_byte, [b"a"], storage=url, return_job=True)
    job.results()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.put(keys.lease_key(job.id), json.dumps(
        {"holder": {"host": socket.gethostname(), "pid": dead.pid, "start": None},
         "renewed": time.time(), "expires": time.time() + 600}).encode())
    report = gc_since(store, time.time() + 3600)
    assert report["deleted_jobs"] == [job.id], report


def test_gc_collects_temporary_files_of_killed_writers_and_counts_bytes_on_disk(tmp_path):
    root = tmp_path / "store"
    url = root.as_uri()
    store = open_store(url)
    job = fnmap.map(first_byte, [b"a"], storage=url, return_job=True)
    job.results()
    folder = root / "jobs" / job.id / "out"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a writer that has exited, as one killed mid-write
    killed = folder / keys.temp_name(gone.pid, 1, 1)
    killed.write_bytes(b"x" * 5000)
    killed_bytes = killed.stat().st_blocks * 512  # whole blocks: 8 KiB on ext4
    writing = folder / keys.temp_name(os.getpid(), 1, 2)  # this process's: a writer still at work
    writing.write_bytes(b"y" * 3000)
    minute_ago = time.time() - 60
    for path in (killed, writing):
        os.utime(path, (minute_ago, minute_ago))
    on_disk = disk_bytes(root)
    shown = gc_cli(url, "--older-than", "30s", "--dry-run").stdout
    assert f"would delete 1 temporary file(s) of killed writers, {killed_bytes / 1024:.1f} KB" in shown, shown

    report = gc_since(store, time.time() - 30)  # the job, created since, is kept
    assert report["deleted_jobs"] == [] and report["deleted_temporary_bytes"] == killed_bytes
    assert report["deleted_temporary"] == [f"jobs/{job.id}/out/{killed.name}"]
    assert not killed.exists() and writing.exists()
    assert report["kept_bytes"] == disk_bytes(root) == on_disk - killed_bytes
