"""A value kept in object storage instead of travelling inline in a request or an answer.

Dask units (:mod:`fnmap.runtime.dask_tasks`) and ``map_reduce`` stages (:mod:`fnmap.runtime.reduce`)
hand each other large values this way: the worker that made the value writes it once, and only
the reference (key and size) goes through the client.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stored:
    """A value kept in object storage: its key and its pickled size in bytes."""

    key: str
    nbytes: int
