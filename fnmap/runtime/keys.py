"""Storage key layout: every key a job writes lives under ``jobs/<job_id>/``.

Per-call keys are spread over 16 sub-prefixes (a short hash of the call id),
because S3 throttles writes per prefix (about 3,500 PUT/s); one LIST of the
job's ``out/`` prefix still finds every finished call.
"""

from __future__ import annotations

import secrets
import zlib


def new_job_id() -> str:
    """A random, unguessable job id (128 bits), so one job cannot name another's objects."""
    return secrets.token_hex(16)


#: Where every job's own objects live (``jobs/<job_id>/...``).
JOBS_PREFIX = "jobs/"
#: How the file store names a file being written, renamed into place once complete: what a
#: writer killed meanwhile leaves behind (``fnmap gc`` collects them).
TEMP_PREFIX = ".tmp-"


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def job_of(key: str) -> str | None:
    """The job id of a key under ``jobs/<job_id>/`` (inverse of every per-job key), else None."""
    parts = key.split("/", 2)
    if len(parts) < 3 or parts[0] + "/" != JOBS_PREFIX or not parts[1]:
        return None
    return parts[1]


def is_temporary(key: str) -> bool:
    """Whether ``key`` (or a file path) names a file store's unfinished write (:data:`TEMP_PREFIX`)."""
    return key.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)


def temp_name(pid: int, thread: int, serial: int) -> str:
    """The name of a file store's file being written by process ``pid`` (renamed into place when complete)."""
    return f"{TEMP_PREFIX}{pid}-{thread}-{serial}"


def temp_writer(key: str) -> int | None:
    """The pid of the process that wrote a temporary file (inverse of :func:`temp_name`), or None."""
    name = key.rsplit("/", 1)[-1]
    pid = name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
    return int(pid) if name.startswith(TEMP_PREFIX) and pid.isdigit() else None


def spread(index: int) -> str:
    """The sub-prefix (one of 16) of a per-call key: S3 rates are per prefix (DESIGN.md)."""
    return format(zlib.crc32(str(index).encode()) & 0xF, "x")


def function_key(digest: str) -> str:
    """Functions are content-addressed and shared across jobs."""
    return f"functions/{digest}.pkl"


def input_key(job_id: str, call_id: int, name: str) -> str:
    """A call's input over the inline limit, stored for that call alone under its SHA-256 (hex),
    which the worker checks before unpickling (:func:`content_digest`).  The worker that commits
    the call's result deletes it: nothing runs the call again once a result is committed."""
    return f"jobs/{job_id}/in/{spread(call_id)}/{call_id}-{name}"


def is_input_of(key: str, job_id: str, call_id: int) -> bool:
    """Whether ``key`` is the :func:`input_key` of this call (the one input its worker may delete)."""
    prefix = f"jobs/{job_id}/in/{spread(call_id)}/{call_id}-"
    return key.startswith(prefix) and _is_sha256(key[len(prefix):])


_HEX_DIGITS = frozenset("0123456789abcdef")


def _is_sha256(text: str) -> bool:
    """Whether ``text`` is a SHA-256 as :meth:`hashlib.sha256().hexdigest` spells it."""
    return len(text) == 64 and _HEX_DIGITS.issuperset(text)


def result_key(job_id: str, call_id: int) -> str:
    return f"jobs/{job_id}/out/{spread(call_id)}/{call_id}"


def results_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/out/"


def status_key(job_id: str, call_id: int, attempt: int) -> str:
    return f"jobs/{job_id}/status/{spread(call_id)}/{call_id}.{attempt}.json"


def status_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/status/"


def call_status_prefix(job_id: str, call_id: int) -> str:
    """Every attempt's status record of one call."""
    return f"jobs/{job_id}/status/{spread(call_id)}/{call_id}."


def call_attempt_of(key: str) -> tuple[int, int]:
    """``(call_id, attempt)`` of a status or log key (inverse of :func:`status_key`, :func:`log_key`)."""
    call, attempt, _ext = key.rsplit("/", 1)[1].split(".")
    return int(call), int(attempt)


def call_id_from_key(key: str) -> int:
    """Inverse of :func:`result_key` (the last path segment)."""
    return int(key.rsplit("/", 1)[1])


def content_digest(key: str) -> str | None:
    """The SHA-256 hex digest (or, for a function, its first 32 digits) a content-addressed key
    names (inverse of :func:`function_key`, :func:`input_key` and :func:`joblib_argument_key`);
    None for any other key."""
    name = key.rsplit("/", 1)[-1]
    if key.startswith("functions/") and name.endswith(".pkl") and len(name) == 36:
        return name[:32]
    job_id = job_of(key) or ""
    if key.startswith(f"jobs/{job_id}/in/"):
        name = name.partition("-")[2]
    elif key != joblib_argument_key(job_id, name):
        return None
    return name if _is_sha256(name) else None


def joblib_argument_key(job_id: str, digest: str) -> str:
    """A large argument of a joblib job, stored once for the job by its SHA-256 (``fnmap.joblib``)."""
    return f"jobs/{job_id}/joblib/{digest}"


#: Prefixes of objects shared by jobs (functions), kept while a job refers to them.
SHARED_PREFIXES = ("functions/",)


def blob_key(job_id: str, name: str) -> str:
    """Large arguments or values stored by reference (10 MB and more)."""
    return f"jobs/{job_id}/blobs/{name}"


def batch_request_prefix(job_id: str, array_id: str) -> str:
    """Where a Batch array job's signed requests are stored, one per child (``fnmap.runtime.container``)."""
    return f"jobs/{job_id}/requests/{array_id}/"


def job_record_key(job_id: str) -> str:
    return f"jobs/{job_id}/job.json"


def lease_key(job_id: str) -> str:
    """The running client's lease on the job: JSON ``{"holder": ..., "renewed": t, "expires": t}``
    (epoch seconds), rewritten while it runs the job; a job whose lease has expired is abandoned."""
    return f"jobs/{job_id}/lease.json"


def cancel_key(job_id: str) -> str:
    """Written by ``fnmap cancel``: the client running the job stops it when it sees this."""
    return f"jobs/{job_id}/cancel.json"


def log_key(job_id: str, call_id: int, attempt: int) -> str:
    """Captured stdout/stderr of one attempt of a call."""
    return f"jobs/{job_id}/logs/{spread(call_id)}/{call_id}.{attempt}.txt"


def logs_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/logs/"


def call_logs_prefix(job_id: str, call_id: int) -> str:
    """Every attempt's captured output of one call."""
    return f"jobs/{job_id}/logs/{spread(call_id)}/{call_id}."


def job_index_key(job_id: str, created: float) -> str:
    """One small summary per job, named by creation time, so ``fnmap jobs`` needs no walk of every job."""
    return f"index/jobs/{int(created * 1000):013d}-{job_id}.json"  # milliseconds: sorts by time


def job_index_prefix() -> str:
    return "index/jobs/"


def job_index_entry(key: str) -> tuple[float, str]:
    """``(created, job_id)`` of an index key (inverse of :func:`job_index_key`; created in seconds)."""
    millis, _, rest = key.rsplit("/", 1)[1].partition("-")
    return int(millis) / 1000, rest.removesuffix(".json")


def is_job_index_key(value: str, job_id: str) -> bool:
    """Whether ``value`` is a key :func:`job_index_key` makes for ``job_id`` (whatever its time)."""
    return value.startswith(job_index_prefix()) and value.endswith(f"-{job_id}.json")


def call_inputs_key(job_id: str, first_call: int) -> str:
    """What a batch of calls sent together ran, from call ``first_call`` on (their function, items and
    inline inputs; sealed): written before they are sent, so ``redrive`` can run them again."""
    return f"jobs/{job_id}/calls/{first_call}.pkl"


def call_inputs_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/calls/"


def job_items_key(job_id: str) -> str:
    """Every item of an automatically chunked map (sealed), stored at its start: the items in no call
    yet when its client stopped are only here."""
    return f"jobs/{job_id}/items.pkl"


def job_start_key(job_id: str, run: int, attempt: int) -> str:
    """Who starts run ``run`` of a named job (its first, 0, or a later one under its id), written
    first-writer-wins by the client that starts it (JSON, as a lease: holder, expires); ``attempt``
    counts the claims of that run whose client stopped before it started the run."""
    return f"jobs/{job_id}/starts/{run}.{attempt}.json"


def job_name_key(name: str) -> str:
    """``job_name=`` of ``fnmap.map``: the job id it names, its function and inputs (JSON)."""
    return f"names/{name}.json"


#: Where the result cache lives (``fnmap.map(..., cache=True)``): ``cache/<function>/<item>``, shared by
#: every job of the storage; ``fnmap gc`` leaves it alone unless asked (``fnmap cache clear``).
CACHE_PREFIX = "cache/"


def cache_key(function_digest: str, item_digest: str) -> str:
    """The cached result of one call: the function's digest (its code, what it reads, the options
    that change results) and the item's (:mod:`fnmap.cache.key`), spread over 16 sub-prefixes by
    the item digest's first digit (S3 rates are per prefix; a file store's folders are locked per
    write)."""
    return f"cache/{function_digest}/{item_digest[:1]}/{item_digest}"


def cache_function_key(function_digest: str) -> str:
    """The name and first job of a cached function (JSON), for ``fnmap cache ls``."""
    return f"cache/{function_digest}.json"


def cache_function_of(key: str) -> str | None:
    """The function digest of a :func:`cache_key` or :func:`cache_function_key`, else None."""
    if not key.startswith(CACHE_PREFIX):
        return None
    rest = key[len(CACHE_PREFIX):]
    return rest.split("/", 1)[0].removesuffix(".json") or None
