"""fnmap.starmap: Pool.starmap's meaning, on the embedded emulator and the local backend."""

from __future__ import annotations

import pytest

import fnmap
from fnmap.api import starmap


def add(a, b, c=0):
    return a + b + c


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_starmap_unpacks_each_tuple_in_input_order(backend):
    pairs = [(i, 10 * i) for i in range(25)]
    assert starmap(add, pairs, backend=backend, chunksize=4) == [11 * i for i in range(25)]
    assert starmap(add, iter([[1, 2, 3], (4, 5)]), backend=backend) == [6, 9]


def test_starmap_errors_and_return_exceptions():
    def divide(a, b):
        return a / b

    with pytest.raises(ZeroDivisionError) as info:
        starmap(divide, [(1, 1), (1, 0)])
    assert any("item 1" in note for note in info.value.__notes__)
    out = starmap(divide, [(1, 1), (1, 0)], return_exceptions=True)
    assert out[0] == 1.0 and isinstance(out[1], ZeroDivisionError)


def test_starmap_names_an_item_that_is_not_a_tuple():
    with pytest.raises(TypeError, match=r"starmap item 2 is int 7, not a tuple of arguments"):
        starmap(add, [(1, 2), (3, 4), 7])
    with pytest.raises(TypeError, match="iterable of argument tuples"):
        starmap(add, "ab")


def test_starmap_is_public():
    assert fnmap.starmap is starmap and "starmap" in dir(fnmap)
