"""The job index: one small summary per job under ``index/jobs/`` (:func:`fnmap.runtime.keys.job_index_key`),
written when a job starts and again when it ends, so ``fnmap jobs`` lists recent jobs with one
LIST and a few small GETs, and a job id can be given as any unique prefix of it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from .. import lease
from ..errors import FnmapError
from ..lease import ABANDONED
from ..runtime import keys


class JobNotFound(FnmapError, LookupError):
    """No job with this id (or id prefix) has a record or status records in the store."""


def write_index(store, summary: dict) -> None:
    store.put(keys.job_index_key(summary["job_id"], summary["created"]), json.dumps(summary).encode())


def index_keys(store) -> dict[str, str]:
    """Every job's index key, by job id."""
    return {keys.job_index_entry(key)[1]: key for key in store.list(keys.job_index_prefix())}


def get_json(store, key: str) -> dict | None:
    """A stored JSON object, or None when it is gone (gc) or partial (a dead writer's)."""
    try:
        return json.loads(store.get(key))
    except (FnmapError, ValueError):
        return None


def get_json_many(store, keys_: list[str]) -> list[dict]:
    """The JSON objects at ``keys_`` that could be read, fetched 16 at a time."""
    if not keys_:
        return []
    with ThreadPoolExecutor(min(16, len(keys_))) as pool:
        return [s for s in pool.map(lambda key: get_json(store, key), keys_) if s is not None]


def list_jobs(store, limit: int | None = 20) -> list[dict]:
    """Summaries of the most recent jobs, newest first."""
    entries = store.list(keys.job_index_prefix())
    entries.reverse()  # keys sort by creation time
    if limit is not None:
        entries = entries[:limit]
    out = []
    for key in entries:
        summary = read_entry(store, key)
        if summary is None:
            continue
        out.append(judge_entry(store, summary))
    return out


def read_entry(store, key: str) -> dict | None:
    """The job index entry at ``key``, or None when it is gone (gc), a dead writer's partial
    object, or not an index entry at all (anyone who can write the bucket can put one)."""
    summary = get_json(store, key)
    return summary if _is_summary(summary, key) else None


def judge_entry(store, summary: dict) -> dict:
    """An index entry as it stands now: a running job's calls counted from its status records, and
    ``abandoned`` if its client is gone (:func:`fnmap.lease.judge`; with no lease, its start entry's
    client on this host), its states counted after that judgement.  Changes ``summary`` in place."""
    if summary.get("status") != "running":
        return lease.judge(store, summary)
    done = {keys.call_attempt_of(k)[0] for k in store.list(keys.status_prefix(summary["job_id"]))}
    summary["calls_done"] = max(summary.get("calls_done") or 0, len(done))
    # An automatically chunked job's entry counts the calls made at its start only: never fewer calls than done.
    summary["calls"] = max(summary.get("calls") or 0, summary["calls_done"])
    lease.judge(store, summary)
    # whether a reported call succeeded is in its status record: this listing reads none of them
    unfinished = max(0, summary["calls"] - summary["calls_done"])
    summary["states"] = {"done": summary["calls_done"],
                         ABANDONED if summary["status"] == ABANDONED else "running": unfinished}
    return summary


def _is_summary(summary, key: str) -> bool:
    """Whether ``summary`` read at ``key`` is a job's index entry: the job its key names, with a
    status and a creation time (what ``fnmap jobs`` shows of every job)."""
    if not isinstance(summary, dict):
        return False
    try:
        job_id = keys.job_index_entry(key)[1]
    except (ValueError, IndexError):
        return False
    return (summary.get("job_id") == job_id and isinstance(summary.get("status"), str)
            and isinstance(summary.get("created"), (int, float)))


def resolve_id(store, job_id: str) -> str:
    """The full id of a job given its id or a unique prefix of it."""
    job_id = job_id.strip().lower()
    if not job_id or any(ch not in "0123456789abcdef" for ch in job_id):
        raise JobNotFound(f"{job_id!r} is not a job id: ids are hexadecimal (see `fnmap jobs`)")
    if len(job_id) == 32:
        return job_id
    matches = sorted(found for found in index_keys(store) if found.startswith(job_id))
    if not matches:
        raise JobNotFound(f"no job id starts with {job_id!r} in {store.url} (see `fnmap jobs`)")
    if len(matches) > 1:
        raise JobNotFound(f"job id prefix {job_id!r} is ambiguous: {', '.join(matches[:5])}; give more digits")
    return matches[0]


def started_entry(store, job_id: str) -> dict | None:
    """The index entry a job wrote when it started (or its final one), if any."""
    key = index_keys(store).get(job_id)
    return get_json(store, key) if key else None
