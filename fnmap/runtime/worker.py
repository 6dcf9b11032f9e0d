"""The one worker routine every handler wraps (HTTP, Lambda, container job, emulator).

``handle(body, signature, secret)`` verifies the request's signature before
anything is unpickled, then ``run`` does the work in small named steps:
check the runtime, load the function (cached per process) and the chunk, run
each item, commit the outcomes once (first writer wins), and write a status
record.  A user exception is an outcome, not a failure of the call; only
platform problems (storage down, bad request, version mismatch) make the
response ``ok=False``.  Nothing here imports the client side.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

from ..errors import STORAGE_REFUSED_ERRNOS, storage_fix
from ..errors import TimeoutError as CallTimeout
from ..storage import is_unreachable, open_store
from . import compression, forks, keys, processes, setup, signing
from .call_error import remote_error
from .capture import captured as _captured
from .items import Deadline, Expired, run_items
from .local_modules import ModuleFiles
from .outcome import count, count_failed, dump_all, each, failure, from_exception, retry_outcome, succeeded
from .peakmem import PeakMemory
from .serialization import load_stream, loads, runtime_mismatch
from .wire import CallRequest, CallResponse, EncodedDict, decode_header, decode_request, encode

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
_functions: OrderedDict[str, Any] = OrderedDict()
_FUNCTION_CACHE_SIZE = 32
_functions_lock = threading.Lock()


@forks.at_fork
def _new_functions_lock() -> None:
    """In a forked child: fresh locks (a local-backend thread loading a function, or starting a call
    and writing to /proc under the peak-memory lock, at the fork held one, and that thread is gone:
    the child's first call waited for ever)."""
    global _functions_lock, _peak_memory
    _functions_lock = threading.Lock()
    _peak_memory = PeakMemory()


_calls_served = 0
_peak_memory = PeakMemory()

#: The user's module files this process imported (:class:`ModuleFiles`): looked at when a call of
#: another job arrives, or one after the process served none for this many seconds (an Executor's
#: next call, a named job run again); not between the calls of a job it is kept busy with, which
#: all run the code of the job's first.
MODULE_LOOK_IDLE_SECONDS = 1.0
_module_files: ModuleFiles | None = None
#: The job of the last call this process served, and when that call ended (``time.monotonic``).
_last_call: tuple[str, float] = ("", 0.0)
#: Whether a changed module is imported afresh (a process serving calls alone), not only its
#: functions loaded again (the client's own process, whose modules are the user's to reload).
_reimport = False


def reimport_changed_modules() -> None:
    """Called by a process that serves calls alone and for long (the emulator's workers) before its
    first call: when a module of the user's files it imported has changed since (an edit, a
    ``reload`` in the client), the next job's calls import the user's modules afresh, as a new
    worker would.  Elsewhere (the ``local`` backend) only the functions are loaded again."""
    global _module_files, _reimport
    _module_files, _reimport = ModuleFiles(baseline=True), True


def _look_at_module_files(job_id: str) -> None:
    """Forget the loaded functions, and with :data:`_reimport` the user's modules, if a module file
    the calls imported changed since (see :class:`ModuleFiles`)."""
    global _module_files
    last_job, ended = _last_call
    if job_id == last_job and time.monotonic() - ended < MODULE_LOOK_IDLE_SECONDS:
        return
    with _functions_lock:
        if _module_files is None:
            _module_files = ModuleFiles(baseline=False)
        if _module_files.changed():
            _functions.clear()
            if _reimport:
                _module_files.forget()


#: Seconds this process spent starting before it could serve its first call, where the platform
#: bills that (AWS Lambda's INIT phase, billed since 2025-08-01): reported with the first call's
#: stats as ``init_seconds`` and priced into its cost.  None where it is not billed.
_init_seconds: float | None = None


def note_init() -> None:
    """Called by a handler whose platform bills its start-up (the Lambda handler, as it is imported):
    the time since this process started is its INIT phase, reported with the first call."""
    global _init_seconds
    started = processes.started_at()
    if started is not None:
        _init_seconds = max(0.0, time.time() - started)


def handle(body: bytes, signature: str | None, secret: bytes | None,
           time_limit: float | None = None, verified: bool = False) -> tuple[int, bytes]:
    """Verify and run one invocation; return ``(HTTP status, response body)``.

    401: no signature; 403: a signature that does not hold for this route, call, body and time
    (one generic text either way: an unauthenticated caller learns nothing); 400: malformed
    request; 500: the handler has no secret configured.  Nothing is unpickled before the check.
    ``time_limit``: seconds the platform still allows (Lambda's remaining time
    less a reserve); the call's timeout is cut to it, so a timeout error is
    written before the platform kills the call.
    ``verified``: only :mod:`fnmap.emulator.process` sets it, for a request that reached it over
    its private pipe from the emulator that verified this signature with this same secret (see
    :meth:`fnmap.emulator.app.Emulator.execute`); every other route checks here.
    """
    if not secret:
        return 500, b"fnmap handler has no secret: set FNMAP_SECRET to the deployment's secret"
    if not signature and not verified:
        return 401, signing.REFUSED
    try:
        header, offset = decode_header(body)
        malformed = None
    except ValueError as e:
        header, offset, malformed = {}, 0, e  # verified as a body with no call; refused as malformed after
    if not verified and not signing.verify_request(secret, signing.ROUTE_CALL, header.get("job_id", ""),
                                                   header.get("call_id", ""), header.get("attempt", ""),
                                                   body, signature):
        return 403, signing.REFUSED
    try:
        if malformed is not None:
            raise malformed
        req, payload = decode_request(body, header, offset)
    except ValueError as e:
        return 400, f"malformed fnmap request: {e}".encode()
    if time_limit is not None and (req.timeout is None or req.timeout > time_limit):
        req.timeout = max(time_limit, 0.001)
    signing.set_current_secret(secret)
    try:
        resp, out = run(req, payload, secret)
    finally:
        signing.set_current_secret(None)
    return 200, encode(resp, out)


def run(req: CallRequest, payload: bytes | memoryview, secret: bytes) -> tuple[CallResponse, bytes]:
    """Run one call and commit its outcomes; return the response header and inline payload."""
    global _last_call
    _peak_memory.call_started()
    try:
        return _run(req, payload, secret)
    finally:
        _peak_memory.call_ended()
        _last_call = (req.job_id, time.monotonic())


def _run(req: CallRequest, payload: bytes | memoryview, secret: bytes) -> tuple[CallResponse, bytes]:
    global _calls_served
    started = time.time()
    cold = _calls_served == 0
    _calls_served += 1
    resp = CallResponse(job_id=req.job_id, call_id=req.call_id, attempt=req.attempt)
    mismatch = runtime_mismatch(req.runtime)
    if mismatch:
        return _platform_error(resp, "version", mismatch), b""
    try:
        store = open_store(req.store_url)
    except Exception as e:
        return _platform_error(resp, "rejected", f"cannot open storage {req.store_url!r}: {e}"), b""
    result_key = keys.result_key(req.job_id, req.call_id)
    loaded = _load_call(store, req, resp, payload, result_key)
    if isinstance(loaded, CallResponse):  # refused as final, or a platform error
        return loaded, b""
    func, items, mode, error, loaded_at = loaded
    logs = io.StringIO() if req.capture_logs else None
    with _call_environment(req.extra_env), _captured(logs, echo=req.echo_output):
        if error is None:
            func, error = _set_up(func, req)  # the initializer, once per worker process
        outcomes = run_items(func, items, mode, req.timeout, req.first_index) \
            if error is None else [from_exception(error)] * max(1, len(items or ()))
    # Large results compressed where it pays; sealed with the secret, so the reader checks before unpickling.
    packed = compression.pack(dump_all(outcomes), worth=compression.worth_it(req.store_url))
    data = signing.seal(secret, result_key, packed)
    observed = (req, started, time.time(), cold, len(payload), loaded_at, logs, outcomes)
    if _wants_retry(req, outcomes):  # the client re-runs it: commit nothing, answer inline
        resp.error_kind, resp.committed, resp.inline = "retry_on", False, True
        resp.stats = _all_stats(observed, len(data))
        _add_output(resp.stats, req, logs)
        return resp, data
    return _commit(store, resp, data, observed, result_key)


def _load_call(store, req: CallRequest, resp: CallResponse, payload, result_key: str):
    """``(func, items, mode, None, when loaded)``, or ``(None, None, None, the error, when)`` when the
    user's function or chunk failed to load (every item fails with it), or the response to give."""
    try:
        if _refused_as_final(store, req, resp, result_key):  # a replay, a late copy, or a job removed by gc
            _forget_input(store, req)  # left by a worker stopped between its commit and the delete
            return resp
        return (*_load(store, req, payload), None, time.time())
    # An unpicklable/unimportable function or chunk fails every item alike; a sys.exit or
    # KeyboardInterrupt while it loads (module code, __setstate__) is the user's code too.
    except BaseException as e:  # noqa: B036
        if _input_taken_by_commit(store, req, resp, result_key, e):
            return resp
        if is_unreachable(e):  # botocore has retried already; more attempts only wait longer
            return _platform_error(resp, "storage", _unreachable_message(req.store_url, e))
        if isinstance(e, signing.UnauthenticatedObject):
            return _platform_error(resp, "rejected", str(e))
        if _is_storage_error(e):
            return _platform_error(resp, "server", f"storage read failed: {e!r}")
        return None, None, None, e, time.time()


def _all_stats(observed: tuple, bytes_out: int) -> dict:
    req, started, finished, cold, bytes_in, loaded_at, logs, outcomes = observed
    stats = _stats(req, started, finished, cold, bytes_in, bytes_out, outcomes)
    stats.update(_observed(loaded_at, logs, outcomes))
    return stats


def _commit(store, resp: CallResponse, data: bytes, observed: tuple, result_key: str) -> tuple[CallResponse, bytes]:
    """Commit the outcomes (first writer wins), the output and the status record; answer."""
    req, logs = observed[0], observed[6]
    try:
        committed = store.put_if_absent(result_key, data)
        if not committed:  # an earlier attempt or a speculative copy won: its result is the result
            data = store.get(result_key)
        if logs is not None and logs.tell():
            store.put(keys.log_key(req.job_id, req.call_id, req.attempt), logs.getvalue().encode())
        stats = _all_stats(observed, len(data))
        text = json.dumps(stats)
        store.put(keys.status_key(req.job_id, req.call_id, req.attempt), text.encode())
        # the output is not in the stored status (the log object has it all); without it the answer
        # sends the status record's text as it is (encoded once)
        resp.stats = stats if _add_output(stats, req, logs) else EncodedDict(stats, text)
    except Exception as e:
        if is_unreachable(e):
            return _platform_error(resp, "storage", _unreachable_message(req.store_url, e)), b""
        if isinstance(e, OSError) and e.errno in STORAGE_REFUSED_ERRNOS:  # full or read-only: not retried
            return _platform_error(resp, "storage", f"cannot write to storage {req.store_url}: "
                                   f"{e.strerror} ({e.filename}); {storage_fix(e, req.store_url)}"), b""
        return _platform_error(resp, "server", f"storage write failed: {e!r}"), b""
    resp.committed = committed
    resp.result_key = result_key
    resp.inline = len(data) <= req.inline_result_limit
    _forget_input(store, req)
    return resp, data if resp.inline else b""


def _forget_input(store, req: CallRequest) -> None:
    """Delete the call's stored input once its result is committed (by this attempt or another):
    no attempt runs it again (a late one is answered from the result, see :func:`_refused_as_final`),
    so storage holds a map's inputs only while their calls run.  Only the call's own input
    (:func:`keys.input_key`).  Best effort: what a failed delete leaves goes with its job at ``fnmap gc``."""
    if req.items_key and keys.is_input_of(req.items_key, req.job_id, req.call_id):
        with contextlib.suppress(Exception):
            store.delete([req.items_key])


def _input_taken_by_commit(store, req: CallRequest, resp: CallResponse, result_key: str,
                           error: BaseException) -> bool:
    """Whether the call's input could not be read because another attempt committed the result
    and deleted it meanwhile (a speculative copy, a redrive beside the stopped client's attempt):
    then this attempt is answered from the committed result, as a late copy is."""
    from ..errors import KeyNotFound

    if not (isinstance(error, KeyNotFound) and req.items_key):
        return False
    try:
        return _refused_as_final(store, req, resp, result_key)
    except Exception:
        return False


def _platform_error(resp: CallResponse, kind: str, message: str) -> CallResponse:
    resp.ok, resp.error_kind, resp.error = False, kind, message
    return resp



def _refused_as_final(store, req: CallRequest, resp: CallResponse, result_key: str) -> bool:
    """Whether the call must not run: its job record is gone (``fnmap gc`` removed the job: a
    replay would re-create its objects) or its result is committed already (a replay, or a copy
    arriving late: answered with the committed result's key, nothing run or unpickled)."""
    if not store.exists(req.job_record or keys.job_record_key(req.job_id)):
        _platform_error(resp, "rejected", f"job {req.job_id} has no record in {req.store_url} (removed by "
                        "`fnmap gc`?): the call is refused, nothing was run")
        return True
    if not store.exists(result_key):
        return False
    resp.committed, resp.result_key, resp.inline = False, result_key, False
    resp.stats = {"job_id": req.job_id, "call_id": req.call_id, "attempt": req.attempt, "worker": WORKER_ID,
                  "already_final": True, "items": 0, "failed_items": 0}
    return True


def _unreachable_message(store_url: str, e: BaseException) -> str:
    return (f"the worker cannot reach storage {store_url} ({e}): the storage endpoint must be reachable from "
            "where the function runs. Offline, point the worker at a local S3 server by setting "
            "AWS_ENDPOINT_URL_S3 (or FNMAP_S3_ENDPOINT_URL) in the environment that starts `fnmap emulator`; "
            "in the cloud, check the function's network access to S3")


def _is_storage_error(e: BaseException) -> bool:
    from ..errors import KeyNotFound

    return isinstance(e, (KeyNotFound, OSError)) or type(e).__module__.startswith("botocore")


def _load(store, req: CallRequest, payload) -> tuple[Any, list, str]:
    _look_at_module_files(req.job_id)
    func = _functions.get(req.func_key)
    if func is None:
        with _functions_lock:  # threads (the local backend) share one load: one namespace, one setup
            func = _functions.get(req.func_key)
            if func is None:
                data = store.get(req.func_key)
                if not signing.content_digest_ok(req.func_key, data):
                    raise signing.UnauthenticatedObject(
                        f"function object {req.func_key!r} does not have the SHA-256 its key names: it was "
                        "planted or altered; refused, not unpickled")
                func = _functions[req.func_key] = loads(data)
            if len(_functions) > _FUNCTION_CACHE_SIZE:
                _functions.popitem(last=False)
    else:
        with contextlib.suppress(KeyError):  # another thread may have dropped it meanwhile
            _functions.move_to_end(req.func_key)
    if req.items_key:
        with store.reader(req.items_key) as stream:  # large buffers read each into its own object
            checked = _CheckingReader(stream, req.items_key)
            chunk = load_stream(checked, before_unpickle=checked.check)
    else:
        chunk = loads(payload)
    if not (isinstance(chunk, tuple) and len(chunk) == 2 and isinstance(chunk[1], (list, tuple))):
        raise ValueError(f"the call's chunk is not a (mode, items) pair: {type(chunk).__name__}")
    mode, items = chunk
    return func, items, mode


def _set_up(func, req: CallRequest) -> tuple[Any, BaseException | None]:
    """``(the function to run, None)`` once its initializer has run in this process, or
    ``(None, the error)`` every item of the call fails with (the initializer's, or the timeout)."""
    if not isinstance(func, setup.WithInitializer):  # nothing to run: no timer to set (4 system calls)
        return func, None
    with Deadline(req.timeout) as deadline:
        try:
            deadline.armed = True
            return setup.prepare(func), None
        except Expired:
            return None, CallTimeout(f"the initializer exceeded the call timeout of {req.timeout} s and was stopped")
        except BaseException as e:  # noqa: B036 - the initializer is user code: SystemExit is an outcome
            return None, e
        finally:
            deadline.armed = False


class _CheckingReader:
    """A binary reader that hashes what it reads, so a stored input is checked against the SHA-256
    its key names (:func:`keys.content_digest`) after it is read and before it is unpickled."""

    def __init__(self, stream, key: str):
        self._stream, self._key = stream, key
        self._expected = keys.content_digest(key)
        self._digest = hashlib.sha256()

    def read(self, size: int = -1):
        data = self._stream.read(size)
        self._update(data)
        return data

    def readinto(self, buffer) -> int:
        n = self._stream.readinto(buffer)
        self._update(memoryview(buffer)[:n])
        return n

    def _update(self, data) -> None:
        self._digest.update(data)

    def check(self) -> None:
        while True:  # the rest of the object (nothing, for a well-formed one) counts too
            rest = self._stream.read(1 << 20)
            if not rest:
                break
            self._update(rest)
        if self._expected is None or not hmac.compare_digest(self._digest.hexdigest(), self._expected):
            raise signing.UnauthenticatedObject(
                f"input object {self._key!r} does not match the SHA-256 its key names: it "
                "was planted or altered; refused, not unpickled")


def _wants_retry(req: CallRequest, outcomes) -> bool:
    """Whether an item raised a ``retry_on`` type with attempts left (then nothing is committed)."""
    if not req.retry_on or not count_failed(outcomes):
        return False
    retries_left_after = req.max_attempts - 1  # attempt n may be re-run while n <= max_attempts - 1
    return any(
        not succeeded(o) and retry_outcome(failure(o).names, req.retry_on, req.attempt, retries_left_after)
        for o in each(outcomes)
    )


@contextlib.contextmanager
def _call_environment(extra_env: dict):
    if not extra_env:
        yield
        return
    saved = {k: os.environ.get(k) for k in extra_env}
    os.environ.update({str(k): str(v) for k, v in extra_env.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stats(req, started, finished, cold, bytes_in, bytes_out, outcomes) -> dict:
    peak_kb = _peak_memory.peak_kb()
    failed = count_failed(outcomes)
    return {
        "job_id": req.job_id,
        "call_id": req.call_id,
        "first_item": req.first_index,  # where the call's items stand: a re-attach aligns on it
        "attempt": req.attempt,
        "worker": WORKER_ID,
        "cold": cold,
        **({"init_seconds": _init_seconds} if cold and _init_seconds is not None else {}),
        "started": started,
        "finished": finished,
        "written": time.time(),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "peak_memory_kb": peak_kb,
        "items": count(outcomes),
        "failed_items": failed,
    }


#: Characters of captured output sent back with a call that had a failing item.
LOG_TAIL_CHARS = 2000


#: Characters of a call's output sent back with its answer for the client to show (output="after").
OUTPUT_CHARS = 4000


def _add_output(stats: dict, req: CallRequest, logs: io.StringIO | None) -> bool:
    """A call that printed something, for a job with output="after": its output rides back with the
    answer (the first OUTPUT_CHARS characters; the rest is in the call's log object).  Whether it did."""
    if req.output == "after" and logs is not None and logs.tell():
        text = logs.getvalue()
        stats["output"] = text[:OUTPUT_CHARS]
        if len(text) > OUTPUT_CHARS:
            stats["output_chars"] = len(text)
        return True
    return False


#: Characters of a failing call's traceback kept in its status record (its end, where the error is).
TRACEBACK_CHARS = 20_000


def _observed(loaded_at: float, logs: io.StringIO | None, outcomes) -> dict:
    """Stats for job records: when loading ended and, for a failing call, its error (the first
    failing item's ``[status, "Type: message", traceback]``) and the tail of its output, so that a
    reader of a running job, whose client has written no record yet, shows them."""
    extra: dict = {"loaded": loaded_at}
    if not count_failed(outcomes):
        return extra
    status, message, tb = remote_error(outcomes)
    extra["error"] = [status, message, tb[-TRACEBACK_CHARS:]]
    if logs is not None and logs.tell():
        extra["log_tail"] = logs.getvalue()[-LOG_TAIL_CHARS:]
    return extra
