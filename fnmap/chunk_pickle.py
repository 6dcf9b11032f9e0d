"""A map's items pickled on the client: large ``bytes`` out of band, an item that does not pickle named.

The client pickles each call's chunk this way, a map pickles all its items once before anything
runs (so that a bad item fails it at once, and a redrive can have them), and a named job digests
its items' pickle: one form, so the three agree byte for byte.
"""

from __future__ import annotations

from .runtime.serialization import dump_parts, dumps_checked, out_of_band
from .runtime.wire import MODE_ARGS, MODE_ONE


def dump_chunk(chunk: tuple, first_index: int = 0, plain: bool = False) -> tuple[list, bool]:
    """The parts of ``chunk``'s pickle (``(mode, items)``; see ``dump_parts``), and whether no item
    is a large ``bytes`` that travels out of band.  An item that does not pickle is named, with its
    index counted from ``first_index`` (an error no item alone reproduces is raised as itself).
    ``plain``: the caller knows that no item is such a ``bytes`` (a pass over every item saved)."""
    try:
        marked = chunk if plain else out_of_band_values(chunk)
        return dump_parts(marked), marked is chunk
    except Exception:
        _raise_unpicklable(chunk, first_index)
        raise


def out_of_band_values(chunk: tuple) -> tuple:
    """The chunk with its items' (or their arguments') large ``bytes`` marked to be pickled out of
    band (``chunk`` itself when there are none); arrays and other protocol-5 buffers are out of
    band wherever they are."""
    mode, items = chunk
    if mode == MODE_ONE:
        if bytes not in set(map(type, items)):  # no bytes at all (C speed: 100,000 ints, a few ms)
            return chunk
        return mode, [out_of_band(item) for item in items]
    if mode == MODE_ARGS:
        return mode, [(tuple(out_of_band(a) for a in args), {k: out_of_band(v) for k, v in kwargs.items()})
                      for args, kwargs in items]
    return chunk


def _raise_unpicklable(chunk: tuple, first_index: int) -> None:
    """Raise a ``SerializationError`` naming the first item (or argument) of ``chunk`` that does
    not pickle; return if each pickles on its own."""
    mode, items = chunk
    for offset, item in enumerate(items):
        where = f"item {first_index + offset}"
        if mode == MODE_ARGS:  # (args, kwargs) of Executor.submit / starmap: name the argument
            args, kwargs = item
            for position, arg in enumerate(args):
                dumps_checked(arg, f"argument {position} of {where}")
            for name, arg in kwargs.items():
                dumps_checked(arg, f"keyword argument {name!r} of {where}")
        dumps_checked(item, where)
