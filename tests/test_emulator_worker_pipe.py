"""The emulator's pipe to its workers (issue 25, the warm path): a request travels as one message
however large, a signature the emulator verified is not verified again by the worker, and the
worker stays the check wherever the emulator's verification does not stand for its own."""

from __future__ import annotations

import os

from fnmap.emulator.app import Emulator
from fnmap.emulator.pool import WorkerPool
from fnmap.runtime import signing
from fnmap.runtime.signing import SECRET_ENV
from tests.test_security_replay import _call, _runs


def _pool(secret: str) -> WorkerPool:
    return WorkerPool(1, env=dict(os.environ, **{SECRET_ENV: secret}))


def test_a_request_over_the_first_read_is_read_whole_and_the_pipe_stays_in_step():
    pool = _pool("worker-secret")
    try:
        big = b"\0" * (3 << 20)  # far past one read: the worker must read it all before answering
        for body in (big, b"x" * 10, big):
            outcome, status, out, _info = pool.execute("v2.1.2.bad", body, 30)
            assert (outcome, status, out) == ("ok", 403, signing.REFUSED)
    finally:
        pool.close()


def test_the_worker_checks_the_signature_unless_the_emulator_verified_it(tmp_path):
    pool = _pool("worker-secret")
    try:
        marks = str(tmp_path / "marks")
        _req, body = _call(f"file://{tmp_path}/store", marks)
        forged = signing.sign(b"not-the-secret", body)
        assert pool.execute(forged, body, 30)[1:3] == (403, signing.REFUSED)
        assert _runs(marks) == 0
        # Only the emulator sets this, after it verified the signature with this same secret.
        outcome, status, _out, _info = pool.execute(forged, body, 30, verified=True)
        assert (outcome, status, _runs(marks)) == ("ok", 200, 1)
    finally:
        pool.close()


def test_an_emulator_with_another_secret_than_its_workers_leaves_the_check_to_them(tmp_path):
    pool = _pool("worker-secret")
    try:
        emulator = Emulator(pool, secret=b"front-secret")
        assert not emulator.workers_trust_front
        marks = str(tmp_path / "marks")
        _req, body = _call(f"file://{tmp_path}/store", marks)
        status, out, _headers = emulator.execute(body, signing.sign(b"front-secret", body))
        assert (status, out, _runs(marks)) == (403, signing.REFUSED, 0)  # the front let it in, the worker did not
        status, _out, _headers = emulator.execute(body, signing.sign(b"worker-secret", body))
        assert (status, _runs(marks)) == (403, 0)  # and the front refuses what its own secret did not sign
    finally:
        pool.close()


def test_an_emulator_sharing_its_workers_secret_verifies_once_and_runs_the_call(tmp_path):
    pool = _pool("one-secret")
    try:
        emulator = Emulator(pool)
        assert emulator.workers_trust_front
        marks = str(tmp_path / "marks")
        _req, body = _call(f"file://{tmp_path}/store", marks)
        assert emulator.execute(body, signing.sign(b"other", body))[:2] == (403, signing.REFUSED)
        assert emulator.execute(body, signing.sign(b"one-secret", body))[0] == 200
        assert emulator.execute(body, signing.sign(b"one-secret", body))[0] == 200  # a replay: refused as final
        assert _runs(marks) == 1
    finally:
        pool.close()


def test_a_pools_first_call_goes_to_the_worker_it_started_first():
    """A starting pool (a session's, as its client attaches) hands its first call to the worker it
    started first, so the call waits for one worker to start, not for all of them: on top of the idle
    workers, the last one started made the first call wait for every fork before it."""
    pool = WorkerPool(4, env=dict(os.environ, **{SECRET_ENV: "worker-secret"}))
    try:
        first = min(pool._all, key=lambda worker: worker.started)
        outcome, _status, _out, info = pool.execute("v2.1.2.bad", b"x", 30)
        assert outcome == "ok" and info["pid"] == first.pid, (info, sorted((w.started, w.pid) for w in pool._all))
    finally:
        pool.close()
