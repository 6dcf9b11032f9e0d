"""The benchmark workloads: each a function of one item, its items, and a check of the results.

Every system runs the same functions on the same items.  ``cpu`` spins a pure
Python loop whose length is calibrated once by the parent (about 50 ms), so
every system does the same work; every result is checked in closed form.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def noop(x):
    return x


def sleep_50ms(x):
    time.sleep(0.05)
    return x


def spin(arg):
    """``n`` iterations of pure-Python arithmetic; returns ``sum(k + i for k in range(n))``."""
    i, n = arg
    s = 0
    for k in range(n):
        s += k + i
    return s


def matmul_sum(a):
    """Multiply ``full(a)`` by ``full(2)`` (1000 x 1000); the sum is ``2e9 * a``, exact in float64."""
    import numpy as np

    x = np.full((1000, 1000), float(a))
    y = np.full((1000, 1000), 2.0)
    return float((x @ y).sum())


def length(blob):
    return len(blob)


@dataclass
class Workload:
    name: str
    func: Callable
    make_items: Callable[[int, dict], list]
    check: Callable[[list, list], bool]
    size: int
    quick_size: int
    unit: str = "calls"


def _spin_items(n: int, params: dict) -> list:
    return [(i, params["spin_n"]) for i in range(n)]


def _spin_ok(items: list, results: list) -> bool:
    return results == [n * (n - 1) // 2 + n * i for i, n in items]


def _numpy_items(n: int, params: dict) -> list:
    return [i % 7 + 1 for i in range(n)]


def _bigarg_items(n: int, params: dict) -> list:
    """New bytes on every call (a random head): no system may find a job's data stored already."""
    return [os.urandom(16) + bytes([i % 256]) * ((1 << 20) - 16) for i in range(n)]


WORKLOADS: dict[str, Workload] = {
    "noop": Workload("noop", noop, lambda n, p: list(range(n)), lambda i, r: r == i, 1000, 300),
    "sleep": Workload("sleep", sleep_50ms, lambda n, p: list(range(n)), lambda i, r: r == i, 200, 60),
    "cpu": Workload("cpu", spin, _spin_items, _spin_ok, 100, 30),
    "numpy": Workload("numpy", matmul_sum, _numpy_items,
                      lambda i, r: r == [2e9 * a for a in i], 50, 16),
    "bigarg": Workload("bigarg", length, _bigarg_items,
                       lambda i, r: r == [1 << 20] * len(i), 200, 60),
}


def calibrate_spin(target_s: float = 0.05) -> int:
    """Loop length that makes :func:`spin` take about ``target_s`` seconds here."""
    n = 100_000
    while True:
        t = time.perf_counter()
        spin((0, n))
        elapsed = time.perf_counter() - t
        if elapsed > 0.02:
            return int(n * target_s / elapsed)
        n *= 2


def describe(results: Any) -> str:
    return f"{type(results).__name__} of {len(results)}" if hasattr(results, "__len__") else repr(results)
