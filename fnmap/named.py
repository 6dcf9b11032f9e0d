"""Named jobs: ``fnmap.map(f, items, job_name="nightly-2026-12-04")``.

A name is an idempotency key for a whole map, as an execution name is for Lambda's durable
functions.  The first map with a name claims it (``keys.job_name_key``, written first-writer-wins)
with the job id it will run under and the SHA-256 of its function's pickle and of its items'
pickle.  A map under a name that exists, with the same function and items, does not run again:
it re-attaches to that job (its results, if it succeeded; the job itself, if a live client still
runs it) or redrives the calls that have no result (:mod:`fnmap.redrive`).  Another function or
other items under the name are refused, saying which differs.  :func:`claim` says which of these
holds; the caller (:mod:`fnmap.api`) starts the map when it is to run anew.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from . import lease
from .attach import AttachedJob
from .chunk_pickle import dump_chunk
from .errors import ConfigError
from .observe.records import JobNotFound
from .redrive import redrive
from .runtime import keys
from .runtime.serialization import pickle_function
from .runtime.setup import with_initializer

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class JobNameTaken(ConfigError):
    """``job_name`` names a job of another function or other items."""


@dataclass(frozen=True)
class Claim:
    """What a job name stands for now."""

    #: The id of the job the name stands for.
    job_id: str
    #: That job as it stands (its results if it succeeded or a live client runs it, else its
    #: redrive), or None: the map is to be started under ``job_id`` (the name was claimed now, or
    #: the process that claimed it stopped before the job started).
    job: Any = None


def check_name(name) -> None:
    """Raise if ``name`` cannot name a job (before anything starts or an item is read)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"job_name={name!r} is not a job name: use up to 200 letters, digits, '.', '_' "
                          "and '-', starting with a letter or digit, e.g. job_name='nightly-2026-12-04'")


def claim(client, config, name: str, func, items: list, mode: str = "one") -> Claim:
    """Claim ``name`` for ``func`` over ``items``, or find the job it names; refused
    (:class:`JobNameTaken`) if that job ran another function or other items."""
    check_name(name)
    identity = {
        "function": pickle_function(with_initializer(func, config))[0],
        "function_name": getattr(func, "__qualname__", None) or type(func).__name__,
        "inputs": _items_digest(mode, items),
        "items": len(items),
    }
    key = keys.job_name_key(name)
    job_id = keys.new_job_id()
    claimed = {"job_id": job_id, **identity, "created": time.time()}
    with client.storage_errors(f"claim the job name {name!r}"):
        if client.store.put_if_absent(key, json.dumps(claimed).encode()):
            return Claim(job_id)
        named = json.loads(client.store.get(key))
    _check_same(name, named, identity)
    return Claim(named["job_id"], _as_it_stands(client, config, named["job_id"]))


def _items_digest(mode: str, items: list) -> str:
    digest = hashlib.sha256()
    for part in dump_chunk((mode, items))[0]:
        digest.update(part)
    return digest.hexdigest()


def _check_same(name: str, named: dict, identity: dict) -> None:
    differs = []
    if named.get("function") != identity["function"]:
        if named.get("function_name") == identity["function_name"]:
            differs.append(f"function {identity['function_name']} has changed (its pickle differs)")
        else:
            differs.append(f"function is {identity['function_name']}, not {named.get('function_name')}")
    if named.get("inputs") != identity["inputs"]:
        if named.get("items") != identity["items"]:
            differs.append(f"items are {identity['items']}, not {named.get('items')}")
        else:
            differs.append(f"{identity['items']} items differ in value")
    if differs:
        raise JobNameTaken(
            f"job_name={name!r} names job {named.get('job_id')}, which ran other work: the "
            + " and the ".join(differs) + ". A name re-attaches only to the same function and items; "
            f"choose another job_name (e.g. {name + '-2'!r}), or leave job_name out to run anew")


def _as_it_stands(client, config, job_id: str):
    """The named job as it stands: its results if it succeeded or a live client runs it, else a
    redrive; None if the process that claimed the name stopped before the job started."""
    try:
        attached = AttachedJob(client.store, job_id, secret=client.secret.decode())
    except JobNotFound:
        return None
    if attached.status == "succeeded" or lease.live(lease.read(client.store, job_id)):
        return attached
    return redrive(client.store, job_id, config=config)
