"""Bad input fails early and plainly, and nothing a user can pass crashes the emulator (issue 3)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading

import pytest
import requests

import fnmap
from fnmap.runtime import keys, signing
from fnmap.runtime.serialization import dumps, pickle_function, runtime_info
from fnmap.storage import open_store

LOCK = threading.Lock()


def uses_global_lock(x):
    with LOCK:
        return x


def identity(x):
    return x


# -- unpicklable functions and arguments fail before anything is invoked --------------------


def _assert_nothing_invoked(emu):
    assert requests.get(emu.url + "/calls", timeout=5).json() == []


def test_unpicklable_global_of_the_function(use_emulator):
    emu = use_emulator(workers=2)
    with pytest.raises(fnmap.SerializationError) as info:
        fnmap.map(uses_global_lock, range(3))
    message = str(info.value)
    assert "the function (global 'LOCK')" in message and "lock" in message
    assert "create them inside the function" in message
    _assert_nothing_invoked(emu)


def test_unpicklable_closure_variable(use_emulator):
    emu = use_emulator(workers=2)
    sock = socket.socket()
    try:
        with pytest.raises(
            fnmap.SerializationError, match=r"the function \(closure variable 'sock'\)"
        ):
            fnmap.map(lambda x: sock.fileno() + x, range(3))
    finally:
        sock.close()
    _assert_nothing_invoked(emu)


@pytest.mark.parametrize(
    ("make", "where", "what"),
    [
        (lambda: threading.Lock(), r"item 7\b", "lock"),
        (lambda: {"conn": [1, socket.socket()]}, r"item 7\['conn'\]\[1\]", "socket"),
        (lambda: open(__file__), r"item 7\b", "open file"),
    ],
)
def test_unpicklable_argument_names_the_item_and_the_path(use_emulator, make, where, what):
    emu = use_emulator(workers=2)
    bad = make()
    items = list(range(10))
    items[7] = bad
    try:
        with pytest.raises(fnmap.SerializationError, match=where) as info:
            fnmap.map(identity, items)
    finally:
        for obj in (bad, *(bad.get("conn", []) if isinstance(bad, dict) else [])):
            if hasattr(obj, "close"):
                obj.close()
    assert what in str(info.value) or type(bad).__name__ in str(info.value)
    _assert_nothing_invoked(emu)  # not even the picklable items 0..6 ran


def test_unpicklable_submit_argument(use_emulator):
    emu = use_emulator(workers=2)
    with fnmap.Executor() as ex:
        with pytest.raises(fnmap.SerializationError, match=r"item 0.*lock"):
            ex.submit(identity, threading.Lock())
    _assert_nothing_invoked(emu)


# -- configuration mistakes raise at once with the value and the fix ---------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": -1}, r"retries=-1 \(from keyword\) must be an integer >= 0 \(use retries=0"),
        ({"retries": 1.5}, r"retries=1.5 .* must be an integer"),
        ({"timeout": 0}, r"timeout=0 .* must be a positive number of seconds"),
        ({"timeout": "5"}, r"timeout='5' .* must be a positive number"),
        (
            {"retry_on": ("ValueError",)},
            r"'ValueError' is not an exception class; pass exception types",
        ),
        ({"emulator_options": "--fail-rate 3"}, r"--fail-rate=3.0 is not a probability"),
        ({"emulator_options": "--kill-rate lots"}, r"--kill-rate: invalid float value: 'lots'"),
        (
            {"emulator_options": "--fail_rate 0.1"},
            r"unrecognized arguments: --fail_rate 0.1; see `fnmap emulator --help`",
        ),
        ({"emulator_options": "--port 80"}, r"--port cannot be set here"),
        (
            {"emulator_options": "--max-concurrency -2"},
            r"--max-concurrency=-2 must be an integer of at least 1",
        ),
    ],
)
def test_configuration_mistakes_name_the_value_and_the_fix(options, message):
    with pytest.raises(fnmap.ConfigError, match=message):
        fnmap.map(identity, [1], **options)


def test_bad_fault_options_from_the_environment(monkeypatch):
    monkeypatch.setenv("FNMAP_EMULATOR_OPTIONS", "--straggler-factor 0")
    with pytest.raises(
        fnmap.ConfigError,
        match=r"FNMAP_EMULATOR_OPTIONS=.*\(from the environment\).*--straggler-factor=0",
    ):
        fnmap.map(identity, [1])


def test_bad_fault_option_on_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "fnmap", "emulator", "--port", "0", "--kill-rate", "1.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "--kill-rate=1.5 is not a probability; use a number from 0 to 1" in proc.stderr


# -- nothing a caller sends crashes the emulator, or even a worker --------------------------------


def _envelope(header, payload=b""):
    meta = json.dumps(header).encode()
    return struct.pack(">I", len(meta)) + meta + payload


def test_malformed_signed_requests_are_refused_and_crash_nothing(use_emulator, storage_root):
    emu = use_emulator(workers=2)
    secret = emu.secret.encode()
    store_url = storage_root.as_uri()
    digest, data = pickle_function(identity)
    func_key = keys.function_key(digest)
    open_store(store_url).put(func_key, data)
    job_id = keys.new_job_id()
    open_store(store_url).put(keys.job_record_key(job_id), b"{}")  # calls of a job with a record
    base = {
        "job_id": job_id,
        "call_id": 0,
        "func_key": func_key,
        "store_url": store_url,
        "runtime": runtime_info(),
    }
    chunk = dumps(("one", [1]))
    refused = {  # body -> the status it gets
        b"": 400,
        b"\xff\xfe not an envelope": 400,
        struct.pack(">I", 2**31) + b"{}": 400,
        _envelope([1, 2]): 400,
        _envelope({"job_id": "x"}): 400,
        _envelope({**base, "unexpected": 1}, chunk): 400,
        _envelope({**base, "timeout": "soon"}, chunk): 400,
        _envelope({**base, "timeout": -1}, chunk): 400,
        _envelope({**base, "call_id": "../../x"}, chunk): 400,
        _envelope({**base, "job_id": "../other-job"}, chunk): 400,
        _envelope({**base, "store_url": 5}, chunk): 400,
        _envelope({**base, "runtime": "3.11"}, chunk): 400,
        _envelope({**base, "extra_env": {"A": "x\u0000y"}}, chunk): 400,
    }
    answered = {  # well-formed envelopes with bad contents: a 200 carrying the error
        _envelope(base, b"not a pickle"): "error outcome",
        _envelope(base, dumps(("one", 5))): "error outcome",
        _envelope(base, dumps(12345)): "error outcome",
        _envelope({**base, "items_key": "../../etc/passwd"}): "error outcome",
        _envelope({**base, "func_key": "functions/missing.pkl"}, chunk): "storage error",
        _envelope({**base, "store_url": "ftp://nowhere"}, chunk): "storage error",
        _envelope({**base, "runtime": {"python": "2.7"}}, chunk): "version error",
    }
    pids = emu.health()["worker_pids"]
    for body, status in refused.items():
        r = requests.post(
            emu.url + "/invoke",
            data=body,
            timeout=30,
            headers={signing.SIGNATURE_HEADER: signing.sign(secret, body)},
        )
        assert r.status_code == status, (body[:80], r.text)
        assert r.text  # a plain-words reason
    for body in answered:
        r = requests.post(
            emu.url + "/invoke",
            data=body,
            timeout=30,
            headers={signing.SIGNATURE_HEADER: signing.sign(secret, body)},
        )
        assert r.status_code == 200, (body[:80], r.text)
    assert requests.get(emu.url + "/nowhere", timeout=5).status_code == 404
    assert requests.get(emu.url + "/invoke", timeout=5).status_code == 405
    health = emu.health()
    assert health["status"] == "ok" and health["crashes"] == 0
    assert health["worker_pids"] == pids  # no worker process died either
    assert fnmap.map(identity, range(5)) == list(range(5))


def exits(x):
    os._exit(3)


def segfaults(x):
    os.kill(os.getpid(), signal.SIGSEGV)


def raises_system_exit(x):
    sys.exit("bye")


def raises_keyboard_interrupt(x):
    raise KeyboardInterrupt


def returns_a_lock(x):
    return threading.Lock()


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.lock = threading.Lock()


def raises_unpicklable(x):
    raise Unpicklable("broken", 2)


def recurses(x):
    return recurses(x)


def prints_a_lot(x):
    print("x" * 1_000_000)
    return x


@pytest.mark.parametrize(
    ("func", "error", "message"),
    [
        (exits, fnmap.WorkerCrashed, r"item 0\).* died .*exit code 3"),
        (segfaults, fnmap.WorkerCrashed, r"item 0\).*killed by signal SIGSEGV"),
        (raises_system_exit, fnmap.RemoteExit, r"item 0 called sys.exit\('bye'\)"),
        (raises_keyboard_interrupt, fnmap.RemoteExit, r"item 0 raised KeyboardInterrupt"),
        (returns_a_lock, fnmap.SerializationError, r"result of item 0 .*lock.* cannot be pickled"),
        (raises_unpicklable, Exception, r"broken"),
        (recurses, RecursionError, r"recursion"),
    ],
)
def test_hostile_functions_are_reported_and_the_emulator_keeps_serving(
    use_emulator, func, error, message
):
    emu = use_emulator(workers=2)
    [outcome] = fnmap.map(func, [0], retries=0, return_exceptions=True)
    assert isinstance(outcome, error), repr(outcome)
    assert outcome is not None
    if message:
        import re

        assert re.search(message, str(outcome)), str(outcome)
    assert emu.health()["status"] == "ok"
    assert fnmap.map(identity, range(4)) == list(range(4))
    assert fnmap.map(prints_a_lot, [1]) == [1]


def test_an_unpicklable_submit_argument_is_named_by_position_or_keyword():
    import threading

    with fnmap.Executor(backend="local") as ex:
        with pytest.raises(fnmap.SerializationError, match=r"^argument 1 of item 0 cannot be pickled \(lock"):
            ex.submit(str, 1, threading.Lock())
        with pytest.raises(fnmap.SerializationError, match=r"^keyword argument 'x' of item 1 cannot be pickled"):
            ex.submit(str, 1, x=threading.Lock())
    with pytest.raises(fnmap.SerializationError, match=r"^argument 0 of item 1 cannot be pickled"):
        fnmap.starmap(max, [(1, 2), (threading.Lock(), 3)], backend="local")


class _FailsOnce:
    """Pickles on every try but the second (the first stores the job's items, the second makes the
    call's chunk): a chunk whose error no item alone reproduces."""

    tries = 0

    def __reduce__(self):
        type(self).tries += 1
        if type(self).tries == 2:
            raise OSError("the chunk's own error")
        return (int, (7,))


def test_an_error_of_the_chunk_that_no_item_reproduces_is_raised_as_itself():
    import fnmap

    _FailsOnce.tries = 0
    with pytest.raises(OSError, match="the chunk's own error"):
        fnmap.map(abs, [_FailsOnce()], backend="local")
