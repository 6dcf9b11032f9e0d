"""``fnmap gc``: delete old jobs from storage, and what no job left uses.

A job is old when it was created before the cutoff (dated by its index entry, else by its newest
status record).  An old job is kept whole while it may still run: its lease
(:func:`fnmap.runtime.keys.lease_key`) has not expired, or it has no final record and neither an
expired lease nor a client known to be gone says it stopped.  Shared objects (function pickles)
go once no kept job names them and no kept job is running.  The file
store's temporary files left by killed writers (``.tmp-*``) go too, and the folders of the jobs
deleted.  Every byte is counted as the storage holds it (a file store's blocks and folders, as
``du`` counts them, not the files' lengths): what is deleted and what is left add up to it.
"""

from __future__ import annotations

import time

from .. import lease as leases
from ..options import parse_age  # noqa: F401 - `fnmap gc --older-than` reads ages with it
from ..runtime import keys, processes
from .history import get_json, get_json_many, index_keys

#: A temporary file not written to for this long has no live writer, whoever wrote it (seconds).
STALE_TEMPORARY = 3600.0


class _Listing:
    """Every object of the store, once: by job, the shared ones, the index entries, the rest.

    Sizes are what the storage holds: an object's length on S3, the blocks a file takes on a file
    store, with its folders (:meth:`fnmap.storage.file.FileStore.disk_usage`), as ``du`` counts them.
    A job of one-item calls writes two small files per call (a 64-byte result, a status record),
    so its lengths add up to a tenth of what it takes on disk."""

    def __init__(self, store):
        self.by_job: dict[str, dict[str, int]] = {}
        self.shared: list[tuple[str, int, float]] = []
        self.sizes: dict[str, int] = {}
        #: Bytes of each job's folders, and of the other folders (file store only).
        self.job_folders: dict[str, int] = {}
        self.other_folders = 0
        usage = getattr(store, "disk_usage", None)  # only a file store allocates blocks and folders
        if usage is not None:
            found, folders = usage()
        else:
            found, folders = [(key, size, size, modified) for key, size, modified in store.list_details("")], {}
        for folder, size in folders.items():
            job_id = keys.job_of(folder)
            if job_id is not None:
                self.job_folders[job_id] = self.job_folders.get(job_id, 0) + size
            else:
                self.other_folders += size
        for key, _length, size, modified in found:
            self.sizes[key] = size
            job_id = keys.job_of(key)
            if job_id is not None:
                self.by_job.setdefault(job_id, {})[key] = size
            elif key.startswith(keys.SHARED_PREFIXES):
                self.shared.append((key, size, modified))

    def job_bytes(self, job_id: str) -> int:
        return sum(self.by_job.get(job_id, {}).values()) + self.job_folders.get(job_id, 0)

    def total(self) -> int:
        """Every byte the storage holds for what was listed (temporary files aside)."""
        return sum(self.sizes.values()) + sum(self.job_folders.values()) + self.other_folders


def collect_garbage(store, older_than: float, dry_run: bool = False, now: float | None = None) -> dict:
    """Delete every object of the jobs created over ``older_than`` seconds ago that cannot be running
    (and their index entries), then the shared objects that no job left in storage uses, and the
    temporary files of killed writers; report what went and what is left, in objects and bytes.

    Jobs with no index entry (their client died) are dated by their newest status record; a job
    with neither is left alone and reported.  A shared object is kept if a kept job's record or
    index entry names it, if it was written after the cutoff (a job being submitted right now), or
    while a kept job has no final record yet (it runs, and may use any of them).
    """
    cutoff = (time.time() if now is None else now) - older_than
    index = index_keys(store)
    listing = _Listing(store)
    old, kept, undated = _date_jobs(store, listing, index, cutoff)
    live = [job_id for job_id in old if _may_run(store, listing, index, job_id)]
    old = [job_id for job_id in old if job_id not in live]
    doomed = {job_id: [*listing.by_job.get(job_id, {}), *([index[job_id]] if job_id in index else [])]
              for job_id in old}
    in_use, running = _shared_in_use(store, listing, kept + live + undated, index)
    shared_doomed = [(key, size) for key, size, modified in listing.shared
                     if key not in in_use and modified < cutoff and not running]
    temporaries = _temporaries(store)
    temporary = _dead_temporaries(temporaries, cutoff)
    everything = [key for keys_ in doomed.values() for key in keys_] + [key for key, _ in shared_doomed]
    if not dry_run:
        store.delete(everything)
        store.delete([key for key, _ in temporary])
        prune = getattr(store, "remove_empty_folders", None)  # a file store's folders take blocks too
        for job_id in old if prune is not None else ():
            prune(keys.job_prefix(job_id))
    deleted_bytes = (sum(listing.sizes.get(key, 0) for key in everything) + sum(size for _, size in temporary)
                     + sum(listing.job_folders.get(job_id, 0) for job_id in old))
    total = listing.total() + sum(size for _, size, _ in temporaries)
    return {
        "deleted_jobs": old,
        "deleted_job_bytes": {job_id: listing.job_bytes(job_id) for job_id in old},
        "deleted_keys": len(everything) + len(temporary),
        "deleted_bytes": deleted_bytes,
        "deleted_shared": [key for key, _ in shared_doomed],
        "deleted_shared_bytes": sum(size for _, size in shared_doomed),
        "deleted_temporary": [key for key, _ in temporary],
        "deleted_temporary_bytes": sum(size for _, size in temporary),
        "kept_jobs": len(kept) + len(live),
        # every byte left in storage (jobs, index, shared objects, temporary files, a file store's
        # folders): what `du` shows of the storage's folders
        "kept_bytes": total - deleted_bytes,
        # what each job left in storage takes (results stay until gc: fnmap.job(ID) reads them again)
        "kept_job_bytes": {job_id: listing.job_bytes(job_id) for job_id in kept + live},
        "kept_running_jobs": live,
        "kept_shared_because_running": running,
        "undated_jobs": undated,
        "dry_run": dry_run,
        "older_than_seconds": older_than,
    }


def _date_jobs(store, listing: _Listing, index: dict[str, str], cutoff: float) -> tuple[list, list, list]:
    """The job ids created before ``cutoff``, those created after, and those of unknown age."""
    old, kept, undated = [], [], []
    for job_id in sorted(set(listing.by_job) | set(index)):
        if job_id in index:
            created = keys.job_index_entry(index[job_id])[0]
        else:
            stats = get_json_many(store, store.list(keys.status_prefix(job_id))[-64:])
            created = max((s.get("written") or 0 for s in stats), default=None)
        if created is None:
            undated.append(job_id)
        else:
            (old if created < cutoff else kept).append(job_id)
    return old, kept, undated


def lease_live(store, listing: _Listing, job_id: str) -> bool | None:
    """Whether the job's lease is live (True), gone (False: :func:`fnmap.lease.gone` judges, as for
    every other reader), or absent or unreadable (None)."""
    key = keys.lease_key(job_id)
    if key not in listing.by_job.get(job_id, {}):
        return None
    lease = get_json(store, key)
    if lease is None or not isinstance(lease.get("expires"), (int, float)):
        return None
    return leases.live(lease)


def _may_run(store, listing: _Listing, index: dict[str, str], job_id: str) -> bool:
    """Whether the job may still be running: a live lease; or no final record, no expired lease, and
    a started entry whose client is not known to be gone."""
    lease = lease_live(store, listing, job_id)
    if lease is not None:
        return lease
    if keys.job_record_key(job_id) in listing.by_job.get(job_id, {}) or job_id not in index:
        return False
    return _judged(store, get_json(store, index[job_id])) == "running"


def _judged(store, started: dict | None) -> str | None:
    """The status of a job's start entry once judged (:func:`fnmap.lease.judge`: ``abandoned`` if its
    client is gone), or None without one."""
    return None if started is None else leases.judge(store, dict(started)).get("status")


def _shared_in_use(store, listing: _Listing, job_ids: list[str], index: dict[str, str]) -> tuple[set[str], bool]:
    """The shared objects the given jobs name, and whether one of them has no final record yet."""
    in_use: set[str] = set()
    running = False
    for job_id in job_ids:
        record = get_json(store, keys.job_record_key(job_id))
        if record is None:
            started = get_json(store, index[job_id]) if job_id in index else None
            if _judged(store, started) != leases.ABANDONED:
                running = True  # it may still submit calls that use any shared object
            in_use.update((started or {}).get("shared") or [])
            continue
        in_use.update(record.get("shared") or [])
    return in_use, running


def _dead_temporaries(temporaries: list[tuple[str, int, float]], cutoff: float) -> list[tuple[str, int]]:
    """The file store's temporary files older than ``cutoff`` whose writer is gone: its process no
    longer exists on this host, or nothing wrote to the file for :data:`STALE_TEMPORARY` seconds."""
    stale = time.time() - STALE_TEMPORARY
    found = []
    for key, size, modified in temporaries:
        writer = keys.temp_writer(key)  # None: not ours to judge, wait until it is stale
        if modified < cutoff and (modified < stale or (writer is not None and not processes.alive(writer))):
            found.append((key, size))
    return found


def _temporaries(store) -> list[tuple[str, int, float]]:
    lister = getattr(store, "list_temporary", None)  # only the file store writes through temporary files
    return lister() if lister is not None else []
