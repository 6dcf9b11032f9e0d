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


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def spread(index: int) -> str:
    """The sub-prefix (one of 16) of a per-call key: S3 rates are per prefix (DESIGN.md)."""
    return format(zlib.crc32(str(index).encode()) & 0xF, "x")


def function_key(digest: str) -> str:
    """Functions are content-addressed and shared across jobs."""
    return f"functions/{digest}.pkl"


def input_key(job_id: str, call_id: int) -> str:
    return f"jobs/{job_id}/in/{spread(call_id)}/{call_id}"


def result_key(job_id: str, call_id: int) -> str:
    return f"jobs/{job_id}/out/{spread(call_id)}/{call_id}"


def results_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/out/"


def status_key(job_id: str, call_id: int, attempt: int) -> str:
    return f"jobs/{job_id}/status/{spread(call_id)}/{call_id}.{attempt}.json"


def status_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/status/"


def call_id_from_key(key: str) -> int:
    """Inverse of :func:`result_key` (the last path segment)."""
    return int(key.rsplit("/", 1)[1])


def shared_input_key(digest: str) -> str:
    """A call's input over the inline limit, stored once by content hash: the same 500 MB
    argument passed to two jobs is one object.  ``fnmap gc`` removes it once no kept job uses it."""
    return f"inputs/{digest[:2]}/{digest}"


#: Prefixes of objects shared by jobs (functions, inputs), kept while a job refers to them.
SHARED_PREFIXES = ("functions/", "inputs/")


def blob_key(job_id: str, name: str) -> str:
    """Large arguments or values stored by reference (10 MB and more)."""
    return f"jobs/{job_id}/blobs/{name}"


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


def job_name_key(name: str) -> str:
    """``job_name=`` of ``fnmap.map``: the job id it names, its function and inputs (JSON)."""
    return f"names/{name}.json"
