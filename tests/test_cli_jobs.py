"""``fnmap jobs``, ``job``, ``logs`` and ``gc`` run as subprocesses against a finished job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fnmap


def fnmap_cli(*args: str, storage: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if storage:
        env["FNMAP_STORAGE"] = storage
    return subprocess.run(
        [sys.executable, "-m", "fnmap", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.fixture(scope="module")
def finished_job(storage_root, tmp_path_factory):
    """A 5-call job on a real emulator: call 1 crashes once (retried), call 3 prints and fails."""
    from conftest import EmulatorProcess

    marker = str(tmp_path_factory.mktemp("marker") / "crashed")

    def work(x):
        if x == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        print(f"item {x} here")
        if x == 3:
            raise KeyError(f"no such thing as {x}")
        return x

    emu = EmulatorProcess(workers=2)
    try:
        job = fnmap.map(
            work,
            range(5),
            return_job=True,
            storage=storage_root.as_uri(),
            emulator_url=emu.url,
            secret=emu.secret,
            progress=False,
        )
        results = job.results(return_exceptions=True)
        assert isinstance(results[3], KeyError)
        assert job.wait(30)
    finally:
        from fnmap import client

        for c in list(client._clients.values()):  # pooled connections would delay the stop
            c.close()
        emu.stop()
    return job


@pytest.mark.parametrize("command", ["jobs", "job", "logs", "gc"])
def test_every_command_has_help(command):
    done = fnmap_cli(command, "--help")
    assert done.returncode == 0 and "usage: fnmap " + command in done.stdout


def test_jobs_lists_the_job(finished_job):
    done = fnmap_cli("jobs", "--json")
    assert done.returncode == 0, done.stderr
    listed = {j["job_id"]: j for j in json.loads(done.stdout)}
    assert listed[finished_job.id]["status"] == "failed" and listed[finished_job.id]["calls"] == 5
    text = fnmap_cli("jobs", "--limit", "50")
    assert text.returncode == 0 and finished_job.id[:12] in text.stdout and "STATUS" in text.stdout


def test_job_json_fields(finished_job):
    done = fnmap_cli("job", finished_job.id[:8], "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    s = record["summary"]
    assert (s["job_id"], s["calls"], s["calls_failed"], s["failed_items"]) == (
        finished_job.id,
        5,
        1,
        1,
    )
    assert s["retries"] == 1 and s["calls_retried"] == 1
    assert set(s["duration_seconds"]) >= {"p50", "p95", "max"} and s["duration_seconds"]["max"] > 0
    assert s["throughput"]["items_per_second"] > 0
    assert s["cost"]["model"] == "aws-lambda" and s["cost"]["usd"] > 0
    for call in record["calls"]:
        for field in (
            "submitted",
            "started",
            "finished",
            "worker",
            "cold",
            "attempts",
            "bytes_in",
            "bytes_out",
            "peak_memory_kb",
            "status",
        ):
            assert call[field] is not None, (call["call"], field)
    assert [a["outcome"] for a in record["calls"][1]["attempts"]] == ["crashed", "ok"]
    assert record["calls"][3]["status"] == "error" and "KeyError" in record["calls"][3]["error"]


def test_job_priced_with_other_settings(finished_job):
    done = fnmap_cli("job", finished_job.id, "--json", "--memory", "4096", "--region", "eu-west-1")
    assert done.returncode == 0, done.stderr
    priced = json.loads(done.stdout)["summary"]["cost"]
    assert (priced["memory_mb"], priced["region"], priced["assumed"]) == (4096, "eu-west-1", [])
    unknown = fnmap_cli("job", finished_job.id, "--region", "moon-1")
    assert (
        unknown.returncode == 0
        and "unknown (no AWS Lambda price for region 'moon-1'" in unknown.stdout
    )


def test_job_text_summary_and_plot(finished_job, tmp_path):
    path = tmp_path / "timeline.png"
    done = fnmap_cli("job", finished_job.id, "--plot", str(path))
    assert done.returncode == 0, done.stderr
    for words in (
        "calls    5 (5 items)",
        "failed 1 (1 items)",
        "retried 1 (1 retries)",
        "p95",
        "cost     $",
        "call 3 (item 3): error: KeyError",
    ):
        assert words in done.stdout, words
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000


def test_logs_of_the_failing_call(finished_job):
    done = fnmap_cli("logs", finished_job.id, "--call", "3")
    assert done.returncode == 0, done.stderr
    output, traceback = done.stdout.split("--- call 3 traceback ---\n")
    assert output == "--- call 3 attempt 1 ---\nitem 3 here\n"
    assert traceback.startswith("Traceback (most recent call last):")
    assert 'raise KeyError(f"no such thing as {x}")' in traceback  # the source line, from this file
    assert traceback.rstrip().endswith("KeyError: 'no such thing as 3'")
    every = fnmap_cli("logs", finished_job.id[:6])
    assert every.returncode == 0 and every.stdout.count("--- call") == 6  # 5 outputs, 1 traceback


def test_job_shows_the_remote_traceback_of_a_failure(finished_job):
    done = fnmap_cli("job", finished_job.id)
    assert done.returncode == 0, done.stderr
    shown = done.stdout.split("traceback of call 3")[1]
    assert 'raise KeyError(f"no such thing as {x}")' in shown
    assert "KeyError: 'no such thing as 3'" in shown


@pytest.mark.parametrize(
    "args, reason",
    [
        (("job", "0123456789abcdef"), "no job id starts with '0123456789abcdef'"),
        (("job", "not-an-id"), "is not a job id"),
        (("logs", "{job}", "--call", "99"), "has no call 99"),
        (("gc", "--older-than", "soon"), "is not an age"),
    ],
)
def test_failures_exit_nonzero_with_one_line(finished_job, args, reason):
    done = fnmap_cli(*(a.format(job=finished_job.id) for a in args))
    assert done.returncode != 0
    assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_job_from_another_storage_is_not_found(finished_job, tmp_path):
    (tmp_path / "empty").mkdir()
    done = fnmap_cli("job", finished_job.id, "--storage", (tmp_path / "empty").as_uri())
    assert done.returncode == 1 and "has no record and no status records" in done.stderr


@pytest.mark.parametrize("command", [("jobs",), ("job", "{job}"), ("logs", "{job}"), ("gc",), ("cancel", "{job}")])
def test_commands_on_a_folder_that_does_not_exist_say_so_and_create_nothing(finished_job, tmp_path, command):
    """``fnmap jobs --storage file:///typo/dir`` once created the folder and listed nothing."""
    typo = tmp_path / "typo" / "dir"
    args = [a.format(job=finished_job.id) for a in command]
    done = fnmap_cli(*args, "--storage", typo.as_uri())
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"the folder {typo} does not exist (nothing was created)" in done.stderr
    assert f"(--storage '{typo.as_uri()}')" in done.stderr
    from_environment = fnmap_cli(*args, storage=typo.as_uri())
    assert f"(FNMAP_STORAGE='{typo.as_uri()}' (from the environment))" in from_environment.stderr
    assert not (tmp_path / "typo").exists()


def test_gc_removes_the_jobs(tmp_path):
    url = (tmp_path / "gc").as_uri()
    job = fnmap.map(abs, [-1, -2], backend="local", storage=url, return_job=True)
    assert job.results() == [1, 2]
    dry = fnmap_cli("gc", "--older-than", "0s", "--dry-run", "--json", storage=url)
    assert dry.returncode == 0 and json.loads(dry.stdout)["deleted_jobs"] == [job.id]
    assert job.id[:12] in fnmap_cli("jobs", storage=url).stdout
    done = fnmap_cli("gc", "--older-than", "0s", storage=url)
    assert done.returncode == 0 and "deleted 1 job(s)" in done.stdout
    assert fnmap_cli("jobs", "--json", storage=url).stdout.strip() == "[]"


def test_commands_read_s3_storage(s3_env):
    url = f"s3://{s3_env('fnmap-records')}/team"
    job = fnmap.map(abs, [-3, -4, -5], backend="local", storage=url, return_job=True)
    assert job.results() == [3, 4, 5]
    listed = fnmap_cli("jobs", "--json", "--storage", url)
    assert listed.returncode == 0, listed.stderr
    assert [j["job_id"] for j in json.loads(listed.stdout)] == [job.id]
    shown = fnmap_cli("job", job.id[:8], "--json", "--storage", url)
    assert shown.returncode == 0 and json.loads(shown.stdout)["summary"]["calls_done"] == 3
    missing = fnmap_cli("jobs", "--storage", "s3://no-such-bucket-here/x")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "'s3://no-such-bucket-here/x': bucket 'no-such-bucket-here' does not exist" in missing.stderr


def test_logs_into_a_closed_pipe_says_nothing(finished_job):
    """`fnmap logs ID | head`: a reader that has gone is not an error worth printing."""
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "logs", finished_job.id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes before anything is written
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert err.decode() == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports a tool killed by it


def test_version():
    done = fnmap_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"fnmap {fnmap.__version__}"


def test_dir_lists_the_lazy_public_names():
    assert {"map", "map_reduce", "Executor"} <= set(dir(fnmap))


def test_jobs_name_the_function_and_where_it_was_started(finished_job):
    listed = fnmap_cli("jobs", "--json")
    entry = next(j for j in json.loads(listed.stdout) if j["job_id"] == finished_job.id)
    assert entry["function"].endswith("work") and entry["origin"]
    assert "work" in fnmap_cli("jobs").stdout
    shown = fnmap_cli("job", finished_job.id).stdout
    assert "function finished_job.<locals>.work" in shown, shown


def test_a_map_that_failed_before_any_call_is_recorded_as_failed(tmp_path):
    import threading

    storage = (tmp_path / "store").as_uri()
    with pytest.raises(fnmap.SerializationError):
        fnmap.map(str, [threading.Lock()], storage=storage)
    (entry,) = json.loads(fnmap_cli("jobs", "--json", storage=storage).stdout)
    assert entry["status"] == "failed" and entry["function"] == "str"
    assert "cannot be pickled" in entry["error"]
    shown = fnmap_cli("job", entry["job_id"], storage=storage).stdout
    assert "error    SerializationError: item 0 cannot be pickled" in shown, shown


KILLED_CLIENT = """
import sys, time, fnmap
def nap(x):
    time.sleep(0.2 if x < 2 else 120)
    return x
job = fnmap.map(nap, range(4), return_job=True, chunksize=1, workers=4, storage=sys.argv[1])
print(job.id, flush=True)
time.sleep(600)
"""


def test_a_job_whose_client_was_killed_is_abandoned_and_counts_agree(tmp_path):
    storage = (tmp_path / "store").as_uri()
    script = tmp_path / "killed_client.py"
    script.write_text(KILLED_CLIENT)
    proc = subprocess.Popen([sys.executable, str(script), storage], stdout=subprocess.PIPE, text=True)
    try:
        job_id = proc.stdout.readline().strip()
        for _ in range(600):  # until the two quick calls have reported
            record = json.loads(fnmap_cli("job", job_id, "--json", storage=storage).stdout)
            if record["summary"]["calls_done"] == 2:
                break
        listed = json.loads(fnmap_cli("jobs", "--json", storage=storage).stdout)[0]
        assert (listed["status"], listed["calls_done"], listed["calls"]) == ("running", 2, 4)
        assert record["summary"]["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
    listed = json.loads(fnmap_cli("jobs", "--json", storage=storage).stdout)[0]
    assert listed["status"] == "abandoned"
    shown = fnmap_cli("job", job_id, storage=storage).stdout
    assert "abandoned" in shown and "the client that started this job is gone" in shown


def test_jobs_lists_past_index_entries_that_are_not_a_jobs(tmp_path):
    """Anyone who can write the bucket can put objects under the index: ``fnmap jobs`` shows the
    real jobs and skips the rest (an empty object, bytes that are not JSON, another job's summary)."""
    from fnmap.runtime import keys
    from fnmap.storage import open_store

    storage = (tmp_path / "store").as_uri()
    job = fnmap.map(abs, [-1, -2], return_job=True, storage=storage, backend="local")
    assert job.wait(30)
    store = open_store(storage)
    (real,) = store.list(keys.job_index_prefix())
    summary = json.loads(store.get(real))
    store.put(keys.job_index_key("0" * 32, 1.0), b"{}")
    store.put(keys.job_index_key("1" * 32, 2.0), b"\x00not json")
    store.put(keys.job_index_key("2" * 32, 3.0), json.dumps(summary).encode())  # names another job
    done = fnmap_cli("jobs", "--json", storage=storage)
    assert done.returncode == 0, done.stderr
    assert [j["job_id"] for j in json.loads(done.stdout)] == [job.id]
    text = fnmap_cli("jobs", storage=storage)
    assert text.returncode == 0 and job.id[:12] in text.stdout, text.stderr


def test_a_running_jobs_failed_call_shows_its_error_and_traceback(tmp_path):
    """While a job runs (call 2 waits), its call 1 that failed reads as it will when the job ends:
    its error and remote traceback in `fnmap job`, `--json` and `fnmap logs --call 1`, from the
    status record its worker committed (the client writes the job's record only at the end)."""
    from dashboard_jobs import running_with_a_failure

    storage = (tmp_path / "store").as_uri()
    with running_with_a_failure(storage, str(tmp_path / "release")) as job:
        record = json.loads(fnmap_cli("job", job.id, "--json", storage=storage).stdout)
        shown = fnmap_cli("job", job.id, storage=storage).stdout
        logs = fnmap_cli("logs", job.id, "--call", "1", storage=storage)
    assert record["summary"]["status"] == "running"
    (failed,) = [c for c in record["calls"] if c["call"] == 1]
    assert (failed["status"], failed["error"]) == ("error", "KeyError: 'no such thing as 1'")
    assert "raise KeyError" in failed["traceback"], failed
    assert "call 1 (item 1): error: KeyError: 'no such thing as 1'" in shown, shown
    assert "traceback of call 1" in shown
    assert "--- call 1 traceback ---" in logs.stdout and "KeyError: 'no such thing as 1'" in logs.stdout, logs
    assert "printed nothing" not in logs.stderr
