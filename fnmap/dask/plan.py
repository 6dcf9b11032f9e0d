"""Planning for the Dask shim: a Dask graph becomes units of work, with no I/O.

1. The graph is normalised to Dask's task-spec nodes (``convert_legacy_graph``
   turns legacy tuple tasks into ``Task`` objects) and culled to the requested
   keys.
2. ``DataNode`` values (and the caller's ``cache``) are known to the client up
   front; an ``Alias`` is resolved on the client when its target is, at no cost.
3. Every other node is a task.  Linear chains are fused into one *unit*: a
   task whose only dependent is a task whose only task-input it is (its other
   inputs being data known up front) runs in the same invocation as that
   dependent, so its value never leaves the worker.  Fusing a task into a
   dependent that still waits for another task would only delay it, so such
   a pair is not fused.
4. Units are prioritised with ``dask.order`` (lower runs first), as Dask's
   own schedulers do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dask
from dask.core import flatten
from dask.order import order

try:
    from dask._task_spec import Alias, DataNode, convert_legacy_graph
except ImportError as e:  # Dask before its task-spec graphs (2024.12)
    raise ImportError(
        f"fnmap.dask needs Dask's task-spec graphs (dask._task_spec, Dask 2024.12 or later); "
        f"this is Dask {dask.__version__}: pip install -U dask"
    ) from e

from ..runtime.dask_tasks import Unit


@dataclass
class Plan:
    """Units of work and how keys connect them."""

    #: Dask graph after normalisation and culling (what callbacks see).
    graph: dict
    units: dict[int, Unit] = field(default_factory=dict)
    #: Unit id -> keys it needs from outside (outputs of other units, aliases, data).
    needs: dict[int, set] = field(default_factory=dict)
    priority: dict[int, int] = field(default_factory=dict)
    #: Values known up front: data nodes and the caller's cache.
    data: dict = field(default_factory=dict)
    #: Alias key -> target key.
    aliases: dict = field(default_factory=dict)
    #: Output key -> the unit producing it.
    producer: dict = field(default_factory=dict)
    #: Key -> ids of the units waiting for it, and the aliases of it.
    waiters: dict = field(default_factory=lambda: defaultdict(list))
    alias_waiters: dict = field(default_factory=lambda: defaultdict(list))
    #: Task key -> dependencies, for Dask's callback state.
    dependencies: dict = field(default_factory=dict)

    @property
    def n_tasks(self) -> int:
        return sum(len(u.nodes) for u in self.units.values())


def requested_keys(keys) -> list:
    """The flat list of keys in a possibly nested ``keys`` argument."""
    return list(flatten(keys)) if isinstance(keys, list) else [keys]


def make_plan(dsk: Any, wanted: list, cache: Mapping | None = None) -> Plan:
    """Normalise, cull, classify and fuse ``dsk`` for computing ``wanted``."""
    if not isinstance(dsk, Mapping):
        dsk = dsk.__dask_graph__()
    cache = dict(cache or {})
    missing = [k for k in wanted if k not in dsk and k not in cache]
    if missing:
        raise KeyError(
            f"requested key(s) {', '.join(map(repr, missing[:5]))} are not in the Dask graph "
            f"of {len(dsk)} keys"
        )
    graph = convert_legacy_graph(dsk, all_keys=set(dsk) | set(cache))
    graph = {k: v for k, v in graph.items() if k not in cache}  # a cached value is not recomputed
    graph = _cull(graph, [k for k in wanted if k in graph])
    plan = Plan(graph=graph, data={k: cache[k] for k in wanted if k in cache})
    tasks = {}
    for key, node in graph.items():
        for dep in node.dependencies:
            if dep in cache:
                plan.data[dep] = cache[dep]
            elif dep not in graph:
                raise ValueError(f"Missing dependency {dep!r} of Dask key {key!r}")
        if isinstance(node, DataNode):
            plan.data[key] = node()
        elif isinstance(node, Alias):
            plan.aliases[key] = node.target
        else:
            tasks[key] = node
    _fuse(plan, tasks, set(wanted))
    return plan


def _chains(plan: Plan, tasks: dict, wanted: set) -> dict:
    """Which task each task absorbs, ``{user: task}``: a task (not wanted, not blocking fusion) whose
    only user is a task with no other computed dependency (and not blocking fusion) is fused into it."""
    dependents: dict = defaultdict(list)
    for key, node in plan.graph.items():
        if key not in plan.data:
            for dep in node.dependencies:
                dependents[dep].append(key)
    computed = tasks.keys() | plan.aliases.keys()
    fused_from = {}
    for key, node in tasks.items():
        users = dependents.get(key, ())
        if key in wanted or len(users) != 1 or getattr(node, "block_fusion", False):
            continue
        (user,) = users
        target = tasks.get(user)
        if target is None or getattr(target, "block_fusion", False):
            continue
        if sum(1 for d in target.dependencies if d in computed) != 1:
            continue
        fused_from[user] = key
    return fused_from


def _cull(graph: dict, wanted: list) -> dict:
    """The part of ``graph`` that ``wanted`` depends on."""
    out, todo = {}, list(wanted)
    while todo:
        key = todo.pop()
        if key in out or key not in graph:
            continue
        out[key] = graph[key]
        todo.extend(graph[key].dependencies)
    return out


def _fuse(plan: Plan, tasks: dict, wanted: set) -> None:
    fused_from = _chains(plan, tasks, wanted)  # dependent -> the task fused into it
    fused = set(fused_from.values())
    priorities = order(plan.graph) if tasks else {}
    for uid, tail in enumerate(k for k in tasks if k not in fused):
        chain = [tail]
        while chain[-1] in fused_from:
            chain.append(fused_from[chain[-1]])
        chain.reverse()
        nodes = [tasks[k] for k in chain]
        inside = set(chain)
        needs = {d for n in nodes for d in n.dependencies} - inside
        plan.units[uid] = Unit(uid, nodes, tail)
        plan.needs[uid] = needs
        plan.producer[tail] = uid
        plan.priority[uid] = min(priorities.get(k, 0) for k in chain)
        for dep in needs:
            plan.waiters[dep].append(uid)
        for k, n in zip(chain, nodes, strict=True):
            plan.dependencies[k] = set(n.dependencies)
    for key, target in plan.aliases.items():
        plan.alias_waiters[target].append(key)
