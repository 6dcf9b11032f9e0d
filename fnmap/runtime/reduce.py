"""The stages of ``fnmap.map_reduce``: map outputs stay in storage, reducers fetch them, as a tree.

A map call runs :class:`MapStage`: it applies the user's map function and,
when the pickled value is larger than :data:`INLINE_VALUE_LIMIT`, writes it
to storage and returns only a :class:`Stored` reference, so the client never
holds the large intermediate values.  A reduce call runs
:class:`ReduceStage` over at most ``reduce_fanin`` inputs, fetching the
stored ones itself.  With more map outputs than ``reduce_fanin`` the reduce
runs in levels (:func:`plan_level`), each reducing groups of the level below,
until one reducer remains -- so ``reduce_func`` must accept a list of its
own results, as ``sum``, ``max`` or merging ``Counter`` objects do.

This module runs on workers: the stage objects travel pickled, by reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from . import compression, signing
from .serialization import dumps, loads
from .stored import Stored

#: Map and intermediate reduce values whose pickle is larger than this go through storage.
INLINE_VALUE_LIMIT = 1024


@dataclass(frozen=True)
class MapStage:
    """``map_func(item)`` for an item ``(key, item)``; a large value is stored under ``key``."""

    map_func: object
    store_url: str

    def __call__(self, keyed_item):
        key, item = keyed_item
        return _keep(self.store_url, key, self.map_func(item))


@dataclass(frozen=True)
class ReduceStage:
    """``reduce_func(values)`` for an item ``(key, inputs)``; ``key=None``: the final reducer."""

    reduce_func: object
    store_url: str

    def __call__(self, keyed_inputs):
        key, inputs = keyed_inputs
        value = self.reduce_func(fetch_values(self.store_url, inputs))
        return value if key is None else _keep(self.store_url, key, value)


def fetch_values(store_url: str, inputs: list) -> list:
    """The inputs with every :class:`Stored` reference replaced by its value, in order."""
    store = None
    values = []
    for v in inputs:
        if isinstance(v, Stored):
            if store is None:
                from ..storage import open_store

                store = open_store(store_url)
            v = loads(compression.unpack(signing.unseal(signing.current_secret(), v.key, store.get(v.key))))
        values.append(v)
    return values


def _keep(store_url: str, key: str, value):
    data = dumps(value)
    if len(data) <= INLINE_VALUE_LIMIT:
        return value
    from ..storage import open_store

    open_store(store_url).put(key, signing.seal(signing.current_secret(), key, compression.pack(data)))
    return Stored(key, len(data))


def plan_level(n_inputs: int, fanin: int | None) -> list[range]:
    """One level of the reduce tree: consecutive groups of at most ``fanin`` inputs.

    No inputs still make one (empty) group, so ``reduce_func([])`` decides
    what an empty job reduces to; ``fanin=None`` reduces everything at once.
    """
    if n_inputs == 0 or fanin is None:
        return [range(n_inputs)]
    return [range(i, min(i + fanin, n_inputs)) for i in range(0, n_inputs, fanin)]


def tree_shape(n_inputs: int, fanin: int | None) -> list[int]:
    """Reducers per level for ``n_inputs`` map outputs: ``tree_shape(100, 4) == [25, 7, 2, 1]``."""
    shape = []
    while True:
        n = len(plan_level(n_inputs, fanin))
        shape.append(n)
        if n == 1:
            return shape
        n_inputs = n


def check_fanin(fanin) -> None:
    if fanin is None:
        return
    if isinstance(fanin, bool) or not isinstance(fanin, int) or fanin < 2:
        raise ConfigError(
            f"reduce_fanin={fanin!r} must be an integer >= 2 (map outputs per reducer), "
            "or None to reduce everything in one call"
        )
