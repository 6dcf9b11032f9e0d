"""The systems compared: each starts, maps a function over items in order, and stops.

A system's ``start`` is part of its cold time (the emulator starts lazily on the
first ``fnmap.map``, so it is timed there).  ``fnmap-emulator`` is the default: it attaches to
the emulator the user's processes share (the first run starts it); ``fnmap-own`` starts an
emulator of its own in every process (``emulator_idle=0``).  Peers that are not installed are
reported as skipped by :func:`available`.
"""

from __future__ import annotations

import importlib.util
import os

#: The peers' own packages: a system whose package is missing is skipped with this note.
REQUIRES = {
    "fnmap-emulator": "fnmap",
    "fnmap-own": "fnmap",
    "fnmap-local": "fnmap",
    "pool": "multiprocessing",
    "ppe": "concurrent",
    "serial": "builtins",
    "dask": "distributed",
    "lithops": "lithops",
    "ray": "ray",
}

#: Lithops' localhost backend starts a new Python process per call (about 3 calls/s), so it
#: runs at most this many items per workload; calls/s stays comparable, wall time does not.
LITHOPS_MAX_ITEMS = 20


def available(name: str) -> str | None:
    """None when the system can run here, else why not."""
    module = REQUIRES[name]
    if importlib.util.find_spec(module) is None:
        return f"not installed (pip install {module}, or pip install -e '.[bench]')"
    return None


def _by_value(module) -> None:
    """Ship the workload functions by value: the peers' workers do not share our sys.path."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)


class FnmapSystem:
    def __init__(self, backend: str):
        self.backend = backend

    def start(self) -> None:
        import fnmap  # noqa: F401  (the emulator itself starts on the first map)

    def map(self, func, items):
        import fnmap

        return fnmap.map(func, items, backend=self.backend, chunksize=1, progress=False)

    def close(self) -> None:
        pass


class PoolSystem:
    """``multiprocessing.Pool().map`` with its default (batched) chunksize."""

    def start(self) -> None:
        import multiprocessing

        self.pool = multiprocessing.Pool()

    def map(self, func, items):
        return self.pool.map(func, items)

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


class PpeSystem:
    """``concurrent.futures.ProcessPoolExecutor().map`` (chunksize 1, its default)."""

    def start(self) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.ex = ProcessPoolExecutor()

    def map(self, func, items):
        return list(self.ex.map(func, items))

    def close(self) -> None:
        self.ex.shutdown()


class SerialSystem:
    """A plain loop in this process: the baseline NumPy's threaded matmul can beat Pool with."""

    def start(self) -> None:
        pass

    def map(self, func, items):
        return [func(x) for x in items]

    def close(self) -> None:
        pass


class DaskSystem:
    """``distributed.LocalCluster`` with worker processes; ``client.map`` then ``gather``."""

    def start(self) -> None:
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(processes=True, dashboard_address=None)
        self.client = Client(self.cluster)

    def map(self, func, items):
        return self.client.gather(self.client.map(func, items, pure=False))

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


class LithopsSystem:
    """Lithops' ``localhost`` compute backend with ``localhost`` storage."""

    def start(self) -> None:
        import lithops

        self.ex = lithops.FunctionExecutor(backend="localhost", storage="localhost", log_level=None)

    def map(self, func, items):
        # Lithops spreads a tuple item over positional arguments: wrap each item in a 1-tuple.
        return self.ex.get_result(self.ex.map(func, [(x,) for x in items]))

    def close(self) -> None:
        self.ex.clean()


class RaySystem:
    """Ray tasks: ``ray.get([f.remote(x) for x in items])``."""

    def start(self) -> None:
        import ray

        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        self._remote = {}

    def map(self, func, items):
        import ray

        remote = self._remote.get(func)
        if remote is None:
            remote = self._remote[func] = ray.remote(func)
        return ray.get([remote.remote(x) for x in items])

    def close(self) -> None:
        import ray

        ray.shutdown()


def create(name: str):
    import workloads

    if name in ("fnmap-emulator", "fnmap-own", "fnmap-local", "dask", "lithops", "ray"):
        _by_value(workloads)
    return {
        "fnmap-emulator": lambda: FnmapSystem("emulator"),
        "fnmap-own": lambda: FnmapSystem("emulator"),  # with FNMAP_EMULATOR_IDLE=0 (compare.SYSTEM_ENV)
        "fnmap-local": lambda: FnmapSystem("local"),
        "pool": PoolSystem,
        "ppe": PpeSystem,
        "serial": SerialSystem,
        "dask": DaskSystem,
        "lithops": LithopsSystem,
        "ray": RaySystem,
    }[name]()


def cores() -> int:
    return os.cpu_count() or 1
