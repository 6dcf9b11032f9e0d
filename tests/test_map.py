"""fnmap.map and map_reduce: the behaviour every backend must show (all five: the embedded emulator,
local, http, and aws and batch through the emulator's Lambda and Batch APIs)."""

from __future__ import annotations

import os

import pytest
from conftest import ALL_BACKENDS

import fnmap


@pytest.fixture(params=ALL_BACKENDS)
def backend(request, use_backend):
    return use_backend(request.param)


def square(x):
    return x * x


class NeedsTwo(Exception):
    """An exception whose __init__ takes two arguments (does not round-trip by default)."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")
        self.a, self.b = a, b


def fail_on_three(x):
    if x == 3:
        raise NeedsTwo(x, "three")
    return x


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_order_and_content(backend, n):
    assert fnmap.map(square, range(n), backend=backend) == [x * x for x in range(n)]


def test_chunksize_groups_items(backend):
    job = fnmap.map(square, range(25), chunksize=10, backend=backend, return_job=True)
    assert job.results() == [x * x for x in range(25)]
    assert len(job.run.calls) == 3
    assert [c.n_items for c in job.run.calls] == [10, 10, 5]


def test_generator_input(backend):
    gen = (i for i in range(50))
    assert fnmap.map(square, gen, chunksize=7, backend=backend) == [x * x for x in range(50)]


def test_lambdas_closures_and_local_classes(backend):
    offset = 10

    class Point:
        def __init__(self, x):
            self.x = x

        def moved(self):
            return Point(self.x + offset)

    out = fnmap.map(lambda p: p.moved(), [Point(i) for i in range(5)], backend=backend)
    assert [p.x for p in out] == [10, 11, 12, 13, 14]
    assert type(out[0]).__name__ == "Point"


def test_remote_exception_same_type_with_index_and_traceback(backend):
    with pytest.raises(NeedsTwo) as info:
        fnmap.map(fail_on_three, range(6), backend=backend)
    exc = info.value
    assert (exc.a, exc.b) == (3, "three")
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "item 3" in notes
    assert isinstance(exc.__cause__, fnmap.errors.RemoteTraceback)
    assert "fail_on_three" in str(exc.__cause__)


def fail_first_then_sleep(x):
    import time

    if x == 0:
        raise ValueError("item 0 is bad")
    time.sleep(2)
    return x


def test_first_failure_raised_before_the_other_calls_finish(backend):
    """A map raises its first failure at once, not after the slowest call (and cancels the rest)."""
    job = fnmap.map(fail_first_then_sleep, range(4), backend=backend, return_job=True, chunksize=1)
    with pytest.raises(ValueError, match="item 0 is bad"):
        job.results()
    assert not job.done  # the sleeping calls were still out when the error was raised
    assert job.wait(60)


def test_return_exceptions_puts_errors_in_place(backend):
    out = fnmap.map(fail_on_three, range(6), return_exceptions=True, backend=backend, chunksize=2)
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5]
    assert isinstance(out[3], NeedsTwo)


def test_builtin_exception_types(backend):
    out = fnmap.map(lambda x: 1 / x, [1, 0], return_exceptions=True, backend=backend)
    assert out[0] == 1.0 and isinstance(out[1], ZeroDivisionError)


def test_ten_megabyte_argument_and_result_travel_through_storage(backend):
    big = os.urandom(10 * 1024 * 1024)
    job = fnmap.map(lambda b: b[::-1], [big], backend=backend, return_job=True)
    assert job.results()[0] == big[::-1]
    assert job.run.calls[0].items_key is not None, "a 10 MB argument must go through storage"


def test_map_reduce(backend):
    assert fnmap.map_reduce(square, range(10), sum, backend=backend) == sum(x * x for x in range(10))


def test_emulator_is_reused_between_jobs():
    from fnmap.client import get_client
    from fnmap.config import resolve

    fnmap.map(square, [1])
    first = get_client(resolve()).backend.url
    fnmap.map(square, [2])
    assert get_client(resolve()).backend.url == first


def test_function_uploaded_once_under_content_hash(storage_root):
    fnmap.map(square, [1], backend="local")
    fnmap.map(square, [2], backend="local")
    functions = list((storage_root / "functions").iterdir())
    names = [p.name for p in functions]
    assert len(names) == len(set(names))
    assert all(len(n) == len("0" * 32 + ".pkl") for n in names)


def test_string_items_rejected_with_a_clear_message():
    with pytest.raises(TypeError, match="pass a list"):
        fnmap.map(square, "abc")


def test_non_callable_rejected():
    with pytest.raises(TypeError, match="needs a callable"):
        fnmap.map(42, [1], backend="local")
