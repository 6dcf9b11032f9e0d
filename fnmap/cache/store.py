"""Cache entries in the job storage: one sealed object per call, first writer wins.

An entry lives at :func:`fnmap.runtime.keys.cache_key` and is sealed with the deployment's secret
(:func:`fnmap.runtime.signing.seal`, bound to its key) like every result: an entry planted or
altered by anyone without the secret fails its MAC and is refused, never unpickled.  Its body is
one JSON line (the job that wrote it, when, the function's name) and the result's pickle
(compressed as results are).  Entries are written only for items that returned a value.

This module is also what ``fnmap cache ls`` and ``fnmap cache clear`` read and delete.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple

from ..errors import KeyNotFound
from ..runtime import compression, keys, signing


class Entry(NamedTuple):
    """A cached result as stored: its pickle (packed), the job that wrote it and when."""

    packed: bytes | memoryview
    job: str
    created: float


def pack_entry(secret: bytes, key: str, packed: bytes, job_id: str, function: str | None) -> bytes:
    """The sealed object of an entry holding ``packed`` (a result's pickle, :func:`compression.pack`)."""
    head = json.dumps({"job": job_id, "created": time.time(), "function": function}, separators=(",", ":"))
    return signing.seal(secret, key, head.encode() + b"\n" + packed)


def read_entry(store, secret: bytes, key: str) -> Entry | None:
    """The entry at ``key``, or None if there is none; raises
    :class:`fnmap.runtime.signing.UnauthenticatedObject` for one whose MAC fails."""
    try:
        sealed = store.get(key)
    except KeyNotFound:
        return None
    data = signing.unseal(secret, key, sealed)
    end = bytes(data[:4096]).find(b"\n")
    if end < 0:
        raise signing.UnauthenticatedObject(f"cache entry {key!r} has no header")
    head = json.loads(bytes(data[:end]))
    return Entry(data[end + 1:], str(head.get("job")), float(head.get("created") or 0.0))


def unpack_value(entry: Entry):
    """The result an entry holds (its MAC was checked by :func:`read_entry`)."""
    from ..runtime.serialization import loads

    return loads(compression.unpack(entry.packed))


def write_function(store, digest: str, name: str, job_id: str) -> None:
    """Name the function of ``digest`` for ``fnmap cache ls`` (first writer wins)."""
    body = json.dumps({"function": name, "job": job_id, "created": time.time()}).encode()
    store.put_if_absent(keys.cache_function_key(digest), body)


def listing(store) -> list[dict]:
    """Per cached function: its digest, name, entries, bytes, oldest and newest entry (epoch seconds)."""
    found: dict[str, dict] = {}
    names: dict[str, str] = {}
    for key, size, modified in store.list_details(keys.CACHE_PREFIX):
        digest = keys.cache_function_of(key)
        if digest is None:
            continue
        if key == keys.cache_function_key(digest):
            try:
                names[digest] = json.loads(store.get(key)).get("function") or "?"
            except (KeyNotFound, ValueError):
                names[digest] = "?"
            continue
        row = found.setdefault(digest, {"function_digest": digest, "entries": 0, "bytes": 0,
                                        "oldest": modified, "newest": modified})
        row["entries"] += 1
        row["bytes"] += size
        row["oldest"], row["newest"] = min(row["oldest"], modified), max(row["newest"], modified)
    for digest, row in found.items():
        row["function"] = names.get(digest, "?")
    return sorted(found.values(), key=lambda r: (r["function"], r["function_digest"]))


def clear(store, function: str | None = None, older_than: float | None = None,
          now: float | None = None) -> dict:
    """Delete cache entries: all, those of functions named ``function`` (qualified name or digest
    prefix), those older than ``older_than`` seconds.  Returns what was deleted."""
    cutoff = None if older_than is None else (time.time() if now is None else now) - older_than
    chosen = {row["function_digest"] for row in listing(store)
              if function is None or function in (row["function"], row["function"].rsplit(".", 1)[-1])
              or row["function_digest"].startswith(function)}
    doomed, freed = [], 0
    for key, size, modified in store.list_details(keys.CACHE_PREFIX):
        digest = keys.cache_function_of(key)
        if digest not in chosen or key == keys.cache_function_key(digest):
            continue
        if cutoff is None or modified < cutoff:
            doomed.append(key)
            freed += size
    store.delete(doomed)
    emptied = [d for d in chosen if cutoff is None]  # every entry of the function went: its name too
    store.delete([keys.cache_function_key(d) for d in emptied])
    return {"entries": len(doomed), "bytes": freed, "functions": len(chosen)}
