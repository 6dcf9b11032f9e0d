"""What one item of a call ends with (its outcome): the named shapes both sides share.

**Outcome** (one per item, made by the worker, read by the client).  On the wire an outcome stays
a plain tuple, ``("ok", value)`` or ``("err", data, traceback, names)``: a call of 100,000 items
pickles 100,000 of them, and a tuple subclass pickled nine times slower (loads four times).  So
the shape is named here and read only through these names: :func:`ok` and :func:`error` make
one, :func:`succeeded`, :func:`value` and :func:`failure` (a :class:`Failure`) read one.

**A call's outcomes** come in two forms.  When every item returned a value, the *plain* form
``("values", [value, ...])`` (:func:`all_ok`): one tuple for the chunk, with no tuple per item
(pickling 100,000 values took 2 ms where their ``("ok", value)`` tuples took 21 ms, and loading
them as much again).  Otherwise the *mixed* form, a list with one outcome per item, each failure
at its item's index.  A list is never the plain form, nor a tuple the mixed one, so the two cannot
be confused.  Read a call's outcomes only through :func:`plain_values`, :func:`values`,
:func:`count`, :func:`count_failed`, :func:`each` and :func:`first`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ..errors import SerializationError
from . import compression, signing
from .missing import add_missing_module_note
from .serialization import dumps, loads, pack_exception

#: The first element of an outcome: the item returned a value, or raised.
OK = "ok"
ERR = "err"


class Failure(NamedTuple):
    """What an item that raised left: the pickled exception, the remote traceback, and the names of
    the exception's types (``module.Qualname``, most derived first; ``retry_on`` matches them)."""

    data: bytes
    traceback: str
    names: list


def ok(value) -> tuple:
    """The outcome of an item that returned ``value``."""
    return (OK, value)


def error(data: bytes, traceback: str, names: list) -> tuple:
    """The outcome of an item that raised (see :class:`Failure`)."""
    return (ERR, data, traceback, names)


def succeeded(outcome: tuple) -> bool:
    return outcome[0] == OK


def value(outcome: tuple):
    """The value an item returned (its outcome :func:`succeeded`)."""
    return outcome[1]


def failure(outcome: tuple) -> Failure:
    """What the item of a failed outcome raised."""
    return Failure(outcome[1], outcome[2], outcome[3])


#: The first element of a call's outcomes in the plain form (every item returned a value).
VALUES = "values"


def all_ok(values: list) -> tuple:
    """A call's outcomes when every item returned a value: the plain form, ``("values", values)``."""
    return (VALUES, values)


def plain_values(outcomes) -> list | None:
    """The values of a call's outcomes in the plain form (the list itself), or None (mixed form)."""
    return outcomes[1] if type(outcomes) is tuple else None


def values(outcomes) -> list:
    """The values of a call's outcomes that all succeeded (a chunk of 10,000 in one pass)."""
    if type(outcomes) is tuple:
        return outcomes[1]
    return [outcome[1] for outcome in outcomes]


def count(outcomes) -> int:
    """How many items a call's outcomes are for."""
    return len(outcomes[1]) if type(outcomes) is tuple else len(outcomes)


def count_failed(outcomes) -> int:
    """How many of a call's outcomes are failures."""
    if type(outcomes) is tuple:
        return 0
    return len(outcomes) - [outcome[0] for outcome in outcomes].count(OK)


def each(outcomes) -> list:
    """One outcome per item, in order, whichever the form (the mixed form is returned as it is)."""
    if type(outcomes) is tuple:
        return [(OK, v) for v in outcomes[1]]
    return outcomes


def first(outcomes) -> tuple:
    """The outcome of a call's first item (a call of one item: ``Executor.submit``, a Dask batch)."""
    if type(outcomes) is tuple:
        return (OK, outcomes[1][0])
    return outcomes[0]


def from_exception(exc: BaseException) -> tuple:
    """The outcome of an item that raised ``exc`` (pickled with its traceback and type names)."""
    add_missing_module_note(exc)
    data, tb = pack_exception(exc)
    names = [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]
    return error(data, tb, names)


def retry_outcome(exc_types: Iterable[str], retry_on: Iterable[str], attempts_made: int, retries: int) -> bool:
    """Whether a user exception (its class and bases, as qualified names) is in ``retry_on`` with attempts left."""
    wanted = set(retry_on)
    return bool(wanted) and attempts_made <= retries and any(t in wanted for t in exc_types)


def dump_all(outcomes) -> bytes:
    """The pickled outcomes of a call (either form); an item whose value does not pickle gets an
    error outcome saying so, the others keep theirs (then the call's outcomes are mixed)."""
    try:
        return dumps(outcomes)
    except Exception:
        pass
    fixed = []
    for i, outcome in enumerate(each(outcomes)):  # find the results that do not pickle, keep the rest
        try:
            dumps(outcome)
            fixed.append(outcome)
        except Exception as e:
            err = SerializationError(
                f"the result of item {i} of the call ({type(value(outcome)).__name__}) cannot be pickled: {e}"
            )
            fixed.append(from_exception(err))
    return dumps(fixed)


def open_committed(secret: bytes, key: str, data: bytes):
    """The outcomes committed at ``key`` (a call's result: :func:`dump_all`, compressed, sealed),
    read from its stored ``data`` once its seal holds (``signing.UnauthenticatedObject`` else)."""
    return loads(compression.unpack(signing.unseal(secret, key, data)))
