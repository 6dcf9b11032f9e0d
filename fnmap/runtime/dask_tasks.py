"""Worker side of the Dask shim: run one batch of fused task chains.

The client (:mod:`fnmap.dask`) sends a :class:`Batch`: a few *units*, each a
linear chain of Dask graph nodes, plus the values of every input the units
need from outside.  An input is either its pickled bytes (a small value,
inline) or a :class:`Stored` reference to an object in storage.  The worker
runs each unit's nodes in order and pickles the unit's output once: small
outputs go back inline in the call's result, large ones are written to
storage and only their reference goes back, so a large intermediate value
never passes through the client.

A process keeps the values it recently wrote or read (by storage key, which is
unique per job) so that a dependent task landing on the same warm worker does
not read them back; Dask already asks tasks not to mutate their inputs, as the
threaded scheduler shares them too.

This module is imported in the worker (``run_batch`` is pickled by reference),
so it imports only worker-side modules (storage, serialization, the worker) and Dask.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..storage import open_store
from . import forks, signing
from .serialization import dumps, loads
from .stored import Stored
from .worker import WORKER_ID


def _recent_budget() -> int:
    """256 MiB, or an eighth of a Lambda function's memory (Lambda sets the variable, in MB)."""
    mb = os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "")
    return min(256 << 20, int(mb) << 17) if mb.isdigit() else 256 << 20


#: Bytes of recently written or read values a worker process keeps in memory.
RECENT_VALUES_BYTES = _recent_budget()
_recent: OrderedDict[str, tuple[Any, int]] = OrderedDict()
_recent_bytes = 0
_recent_lock = threading.Lock()  # the local backend runs batches on several threads


@forks.at_fork
def _new_recent_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent holding it at the fork is gone)."""
    global _recent_lock
    _recent_lock = threading.Lock()


@dataclass
class Unit:
    """A linear chain of graph nodes run in one go; only ``output`` leaves the worker.

    With ``export`` False the output is used by a later unit of the same batch only,
    and does not leave the worker at all.
    """

    uid: int
    nodes: list
    output: Any
    export: bool = True


@dataclass
class Batch:
    """What one invocation runs."""

    store_url: str
    #: Storage prefix for the values this batch stores (under the job's folder).
    prefix: str
    #: Outputs up to this many pickled bytes travel inline; larger ones are stored.
    inline_bytes: int
    #: Every outside input of the units: Dask key -> pickled bytes or :class:`Stored`.
    inputs: dict
    units: list


@dataclass
class BatchResult:
    """Per unit, the output (pickled bytes, :class:`Stored`, or None when not exported) and its
    run time; what the batch moved."""

    outputs: list
    durations: list
    bytes_read: int
    bytes_written: int
    started: float
    finished: float
    worker: str


def run_batch(blob: bytes) -> BatchResult:
    """Run every unit of a pickled :class:`Batch`; a failing task's exception propagates.

    The exception carries the failing Dask key in ``_fnmap_dask_key`` (an
    attribute survives pickling where a note may not), so the client names it.
    """
    started = time.time()
    batch: Batch = loads(blob)
    store = open_store(batch.store_url)
    counts = [0, 0]  # bytes read, bytes written
    loaded: dict = {}
    outputs, durations = [], []
    for unit in batch.units:
        began = time.perf_counter()
        data: dict = {}
        for node in unit.nodes:
            for dep in node.dependencies:
                if dep not in data:
                    if dep not in loaded:
                        loaded[dep] = _load(store, batch.inputs[dep], counts)
                    data[dep] = loaded[dep]
            try:
                data[node.key] = node(data)
            except BaseException as e:
                _mark(e, node.key)
                raise
        loaded[unit.output] = data[unit.output]  # for later units of the batch
        kept = _keep(store, batch, unit, data[unit.output], counts) if unit.export else None
        outputs.append(kept)
        durations.append(time.perf_counter() - began)
    return BatchResult(outputs, durations, counts[0], counts[1], started, time.time(), WORKER_ID)


def _mark(exc: BaseException, key) -> None:
    if getattr(exc, "_fnmap_dask_key", None) is None:
        try:
            exc._fnmap_dask_key = key
        except (AttributeError, TypeError):  # an exception type without a __dict__
            pass


def _load(store, ref, counts: list) -> Any:
    if isinstance(ref, (bytes, bytearray)):
        return loads(ref)
    with _recent_lock:
        hit = _recent.get(ref.key)
        if hit is not None:
            _recent.move_to_end(ref.key)
            return hit[0]
    data = store.get(ref.key)
    counts[0] += len(data)
    value = loads(signing.unseal(signing.current_secret(), ref.key, data))  # checked before unpickling
    _remember(ref.key, value, len(data))
    return value


def _keep(store, batch: Batch, unit: Unit, value: Any, counts: list) -> bytes | Stored:
    data = dumps(value)
    if len(data) <= batch.inline_bytes:
        return data
    key = f"{batch.prefix}{zlib.crc32(str(unit.uid).encode()) & 0xF:x}/{unit.uid}"
    # First writer wins: a retried or speculative copy then points at the same bytes.
    if store.put_if_absent(key, signing.seal(signing.current_secret(), key, data)):
        counts[1] += len(data)
        _remember(key, value, len(data))
    return Stored(key, len(data))


def _remember(key: str, value: Any, nbytes: int) -> None:
    global _recent_bytes
    with _recent_lock:
        if nbytes > RECENT_VALUES_BYTES // 4 or key in _recent:
            return
        _recent[key] = (value, nbytes)
        _recent_bytes += nbytes
        while _recent_bytes > RECENT_VALUES_BYTES:
            _, (_, n) = _recent.popitem(last=False)
            _recent_bytes -= n
