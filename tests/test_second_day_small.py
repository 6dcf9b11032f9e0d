"""The second day's smaller findings: typo hints, a refused storage, deterministic crashes,
tracebacks that start at the user's code, and what a job really takes on disk."""

from __future__ import annotations

import os
import re
import warnings

import pytest

import fnmap
from fnmap.config import resolve

# -- "did you mean" ------------------------------------------------------------------------------


@pytest.mark.parametrize("options, hint", [
    ({"chunk_size": 1}, "'chunk_size' (did you mean 'chunksize'?)"),
    ({"retrys": 1}, "'retrys' (did you mean 'retries'?)"),
    ({"retrys": 1, "chunk_size": 2}, "'chunk_size' (did you mean 'chunksize'?), 'retrys' (did you mean 'retries'?)"),
    ({"return_exception": True}, "'return_exception' (did you mean 'return_exceptions'?)"),  # map's own keyword
])
def test_an_unknown_option_names_the_closest_valid_one(options, hint):
    with pytest.raises(fnmap.ConfigError) as info:
        fnmap.map(abs, [1], **options)
    assert hint in str(info.value) and "valid options: backend," in str(info.value)
    assert isinstance(info.value, TypeError)  # as a wrong keyword of any function


@pytest.mark.parametrize("call, hint", [
    (lambda: fnmap.imap(abs, [1], job_name="nightly"), "'job_name' (a keyword of fnmap's map and starmap only"),
    (lambda: fnmap.Executor(return_job=True), "'return_job' (a keyword of fnmap's map, starmap and map_reduce only"),
])
def test_a_keyword_of_another_front_end_is_named_as_such_not_as_a_misspelling_of_itself(call, hint):
    with pytest.raises(fnmap.ConfigError) as info:
        call()
    assert hint in str(info.value) and "did you mean" not in str(info.value)


@pytest.mark.parametrize("name, meant", [("lambda", "aws"), ("Lambda", "aws"), ("lamda", "aws"), ("AWS", "aws"),
                                         ("emulater", "emulator"), ("gpu", "batch")])
def test_an_unknown_backend_names_the_closest_one_or_its_alias(name, meant):
    with pytest.raises(fnmap.UnknownBackend, match=rf"backend={name!r} \(from keyword\) is not a backend; "
                       rf"did you mean {meant!r}\? choose one of: emulator, local, http, aws, batch"):
        resolve(backend=name)


def test_a_backend_nothing_resembles_gets_the_choices_only(monkeypatch):
    monkeypatch.setenv("FNMAP_BACKEND", "qqq")
    with pytest.raises(fnmap.UnknownBackend) as info:
        resolve()
    assert "did you mean" not in str(info.value)
    assert "FNMAP_BACKEND='qqq' (from the environment) is not a backend; choose one of" in str(info.value)


def test_a_config_file_option_with_a_typo_names_the_right_one(tmp_path, monkeypatch):
    (tmp_path / "fnmap.toml").write_text("retrys = 3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fnmap.ConfigError, match=r"has unknown option 'retrys' \(did you mean 'retries'\?\)"):
        resolve()


def test_a_misspelt_fnmap_variable_is_warned_about_with_the_right_name(monkeypatch):
    monkeypatch.setenv("FNMAP_RETRYS", "3")
    monkeypatch.setattr("fnmap.config._warned_variables", set())
    with pytest.warns(UserWarning, match="FNMAP_RETRYS is not a setting fnmap reads.*did you mean FNMAP_RETRIES?"):
        resolve()


def test_every_fnmap_variable_fnmap_reads_is_known_so_none_is_warned_about(monkeypatch):
    """Each ``FNMAP_*`` name quoted in the package is a setting or one of the other variables read:
    setting it draws no "not a setting fnmap reads" warning (the emulator's access key did)."""
    root = os.path.dirname(fnmap.__file__)
    spelt = set()
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    # in quotes or backticks: a variable's name, not a constant such as FNMAP_PROTOCOL
                    spelt.update(re.findall(r"[\"'`](FNMAP_[A-Z0-9_]*[A-Z0-9])\b", f.read()))
    assert {"FNMAP_SIGNATURE_WINDOW", "FNMAP_EMULATOR_ACCESS_KEY_ID"} <= spelt
    spelt.discard("FNMAP_CHUNK_SIZE")  # the typo fnmap.config's docstring gives as an example
    monkeypatch.setattr("fnmap.config._warned_variables", set())
    for name in sorted(spelt):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # empty: read as unset, still named
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve()


# -- what a job takes on disk --------------------------------------------------------------------


def _du(root) -> int:
    """What ``du`` counts under ``root`` (not ``root`` itself): the blocks of every file and folder."""
    return sum(os.stat(os.path.join(folder, name)).st_blocks * 512
               for folder, folders, files in os.walk(root) for name in (*folders, *files))


def test_gc_counts_what_a_one_item_per_call_job_takes_on_disk_and_frees_it_all(tmp_path):
    """A job of one-item calls writes two small files per call in 32 folders: its lengths add up to
    a fraction of its blocks.  gc reports the blocks, and leaves no empty folder of it behind."""
    from fnmap.observe import gc
    from fnmap.runtime import keys
    from fnmap.storage import open_store

    root = tmp_path / "store"
    store = open_store(root.as_uri())
    job = fnmap.map(abs, range(-60, 0), chunksize=1, storage=store.url, return_job=True)
    assert job.results() == list(range(60, 0, -1))
    lengths = sum(size for _key, size, _mtime in store.list_details(keys.job_prefix(job.id)))
    before = _du(root)

    kept = gc.collect_garbage(store, older_than=3600)
    assert kept["kept_bytes"] == before
    assert kept["kept_job_bytes"][job.id] > 4 * lengths  # 120 files of under 400 bytes, a block each
    done = gc.collect_garbage(store, older_than=0)
    assert done["deleted_jobs"] == [job.id] and done["deleted_job_bytes"][job.id] == kept["kept_job_bytes"][job.id]
    assert done["kept_bytes"] == _du(root) == before - done["deleted_bytes"]
    assert not (root / "jobs" / job.id).exists()  # its folders went with its files


# -- tracebacks start at the caller's code -----------------------------------------------------


def _fails_on_two(x):
    if x == 2:
        raise ValueError(f"bad item {x}")
    return x


def _fnmap_frames(exc: BaseException) -> list[str]:
    """The frames of ``exc``'s own traceback (not the remote one) that lie inside the fnmap package."""
    import traceback

    package = os.path.dirname(fnmap.__file__) + os.sep
    return [f"{frame.filename}:{frame.name}" for frame in traceback.extract_tb(exc.__traceback__)
            if frame.filename.startswith(package)]


@pytest.mark.parametrize("run", [
    lambda: fnmap.map(_fails_on_two, range(4), backend="local"),
    lambda: fnmap.map(_fails_on_two, range(4)),  # the emulator
    lambda: fnmap.starmap(_fails_on_two, [(x,) for x in range(4)], backend="local"),
    lambda: list(fnmap.imap(_fails_on_two, range(4), backend="local")),
    lambda: fnmap.map_reduce(_fails_on_two, range(4), sum, backend="local"),
], ids=["map-local", "map-emulator", "starmap", "imap", "map_reduce"])
def test_a_remote_exception_passes_through_one_fnmap_frame_only(run):
    with pytest.raises(ValueError, match="bad item 2") as info:
        run()
    assert len(_fnmap_frames(info.value)) == 1, _fnmap_frames(info.value)  # the API's raise, not the job's
    assert "bad item {x}" in str(info.value.__cause__)  # the remote traceback is still there, as the cause
    assert any("raised remotely by item 2" in note for note in info.value.__notes__)


def test_fnmaps_own_errors_keep_their_frames():
    with pytest.raises(fnmap.ConfigError) as info:
        fnmap.map(abs, [1], chunksize=0)
    assert any("config.py" in frame for frame in _fnmap_frames(info.value))


def test_a_notebook_traceback_goes_from_the_cell_to_the_remote_error(tmp_path):
    """In a real Jupyter kernel: after the cell's line, one fnmap frame (where the API raised), not
    the job's and its calls' (three before)."""
    from test_notebook import run_cells, text_of

    cells = [
        "import fnmap",
        "def parse(x):\n    if x == 2:\n        raise ValueError(f'bad item {x}')\n    return x",
        "fnmap.map(parse, range(4))",
    ]
    shown = text_of(run_cells(cells, tmp_path)[2])
    local = shown.split("The above exception was the direct cause of the following exception:")[1]
    assert "raise ValueError(f'bad item {x}')" in shown.split("The above exception")[0], shown  # the remote one
    assert "Cell In[3], line 1" in local, shown
    assert "jobs.py" not in local and local.count("fnmap/api.py") == 1, shown


# -- a function that crashes its worker ------------------------------------------------------------


@pytest.mark.parametrize("message, exit", [
    ("worker process 812 died while running the call (killed by signal SIGSEGV)", "killed by signal SIGSEGV"),
    ("worker process 812 died while running the call (exit code 3)", "exit code 3"),
    ("fnmap: Runtime.ExitError: RequestId: 5b1 Error: Runtime exited with error: signal: segmentation fault",
     "signal: segmentation fault"),
    ("fnmap: Runtime.ExitError: Runtime exited with error: exit status 3", "exit status 3"),
    ("Runtime exited with error: worker process 9 died while running the call (killed by signal SIGABRT)",
     "killed by signal SIGABRT"),
    ("worker process 812 died while running the call (exit status unknown)", None),
    ("Runtime exited without providing a reason", None),
])
def test_how_a_crashed_worker_ended_is_read_from_each_platforms_words(message, exit):
    from fnmap import policy

    assert policy.crash_exit(message) == exit


def test_only_the_same_known_exit_twice_in_a_row_is_a_deterministic_crash():
    from fnmap.policy import deterministic_crash

    assert deterministic_crash(["exit code 3"]) is None  # once: the platform's, maybe
    assert deterministic_crash(["exit code 3", "exit code 3"]) == "exit code 3"
    assert deterministic_crash(["killed by signal SIGKILL", "exit code 3"]) is None
    assert deterministic_crash([None, None]) is None  # the platform did not say how: retried as before
    # Killed from outside twice (kill -9, the OOM killer, the emulator's --kill-rate): not the function's doing.
    assert deterministic_crash(["killed by signal SIGKILL", "killed by signal SIGKILL"]) is None
    assert deterministic_crash(["exit code 3", "killed by signal SIGSEGV", "killed by signal SIGSEGV"])


def _crash_in_turn(x, marker, ways):
    """Crash the worker the ``n``-th way of ``ways`` on the ``n``-th run (counted in ``marker``),
    return ``x`` once they are used up."""
    import ctypes

    runs = 0
    if os.path.exists(marker):
        with open(marker) as f:
            runs = int(f.read())
    with open(marker, "w") as f:
        f.write(str(runs + 1))
    if runs < len(ways):
        if ways[runs] == "segfault":
            ctypes.string_at(0)  # a null pointer read in native code
        os._exit(ways[runs])
    return x


def _attempts(job, call: int = 0) -> list[str]:
    return [attempt[3] for attempt in job.attempts_summary()[call]]


@pytest.mark.parametrize("ways, shown", [(["segfault"] * 3, "killed by signal SIGSEGV"), ([3, 3, 3], "exit code 3")])
def test_a_function_that_crashes_its_worker_the_same_way_twice_is_not_run_a_third_time(tmp_path, ways, shown):
    import functools

    marker = str(tmp_path / "runs")
    job = fnmap.map(functools.partial(_crash_in_turn, marker=marker, ways=ways), [7], retries=2, return_job=True)
    with pytest.raises(fnmap.WorkerCrashed) as info:
        job.results()
    assert _attempts(job) == ["crashed", "crashed"]
    with open(marker) as f:
        assert f.read() == "2"  # two runs paid for, not three
    message = str(info.value)
    assert "call 0 (item 0)" in message and "failed after 2 attempt(s)" in message
    assert f"crashed its worker twice the same way ({shown})" in message and "not run again" in message


def test_a_crash_that_does_not_repeat_itself_is_retried_as_a_platform_fault(tmp_path):
    """Once, or twice in two ways: it may be the platform's (a worker killed from outside), so
    ``retries`` bounds it as before."""
    import functools

    once = functools.partial(_crash_in_turn, marker=str(tmp_path / "once"), ways=[3])
    assert fnmap.map(once, [5], retries=2) == [5]
    two_ways = functools.partial(_crash_in_turn, marker=str(tmp_path / "two"), ways=[3, "segfault"])
    job = fnmap.map(two_ways, [6], retries=2, return_job=True)
    assert job.results() == [6] and _attempts(job) == ["crashed", "crashed", "ok"]


# -- a read-only or full storage -------------------------------------------------------------------


def _run_on_tmpfs(tmp_path, mount_options: str, script: str, fill_kb: int = 0):
    """Run ``script`` where the storage folder is a tmpfs mounted with ``mount_options`` (inside a
    user and mount namespace: no root needed, nothing left mounted), ``fill_kb`` of it taken first."""
    import shutil
    import subprocess
    import sys

    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("user namespaces are not available here (unshare -rm)")
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "script.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env.update(FNMAP_STORAGE=store.as_uri(), FNMAP_EMULATOR_IDLE="0")
    fill = f"&& head -c {fill_kb * 1024} /dev/zero > {store}/taken " if fill_kb else ""
    shell = f"mount -t tmpfs -o {mount_options} tmpfs {store} {fill}&& exec {sys.executable} script.py"
    return subprocess.run(["unshare", "-rm", "sh", "-c", shell], env=env, capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)


ONE_MAP = """
import fnmap
try:
    fnmap.map(abs, range(3))
except fnmap.StorageError as e:
    print("STORAGE-ERROR", e)
"""


@pytest.mark.parametrize("mount, fill_kb, problem, fix", [
    ("ro", 0, "Read-only file system", "the storage is not writable: point storage= / FNMAP_STORAGE at a writable"),
    ("size=64k", 64, "No space left on device", "the storage is full: free space with `fnmap gc --older-than 0s"),
])
def test_a_refused_storage_is_one_clear_error_and_no_warning(tmp_path, mount, fill_kb, problem, fix):
    done = _run_on_tmpfs(tmp_path, mount, ONE_MAP, fill_kb)
    assert done.stdout.startswith("STORAGE-ERROR storage file://"), done.stdout + done.stderr
    assert "(FNMAP_STORAGE=" in done.stdout and f"cannot write to the folder {tmp_path / 'store'}: {problem}; {fix}" \
        in done.stdout, done.stdout
    assert done.stderr == ""  # no RuntimeWarning about the job's record before it, nor anything else


FILL_THEN_FOLLOW_THE_ADVICE = """
import re, subprocess, sys, fnmap
def noise(x):
    import os
    return os.urandom(300_000)  # does not compress
fnmap.map(noise, range(2))  # its results stay in storage (fnmap.job(ID) reads them again) until gc
try:
    fnmap.map(noise, range(2), retries=0)
    print("NO-ERROR")
except fnmap.StorageError as e:
    advice = re.search(r"`fnmap (gc [^`]*)`", str(e)).group(1)
    print("ADVICE", advice)
    subprocess.run([sys.executable, "-m", "fnmap", *advice.split()], check=True, stdout=subprocess.DEVNULL)
    print("AFTER", len(fnmap.map(noise, range(2))))
"""


def test_a_full_storages_advice_frees_the_space_of_jobs_minutes_old(tmp_path):
    """The jobs that filled the storage ended seconds ago: the command the error gives frees them."""
    done = _run_on_tmpfs(tmp_path, "size=900k", FILL_THEN_FOLLOW_THE_ADVICE)
    assert f"ADVICE gc --older-than 0s --storage {(tmp_path / 'store').as_uri()}" in done.stdout, \
        done.stdout + done.stderr
    assert "AFTER 2" in done.stdout, done.stdout + done.stderr
