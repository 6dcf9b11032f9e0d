"""A blocking method with an ``.aio`` twin: ``job.wait()`` blocks, ``await job.wait.aio()`` does not.

``obj.method`` is bound as usual; ``obj.method.aio(...)`` is the awaitable form, given as the async
function ``aio(obj, ...)``.  A leaf: it imports nothing of fnmap.
"""

from __future__ import annotations

import functools


class with_aio:  # noqa: N801 - used as a decorator, named as one
    """Decorate a blocking method ``method`` with ``@with_aio(method_aio)``, ``method_aio`` an async
    function taking the same arguments (the object first)."""

    def __init__(self, aio):
        self._aio = aio
        self._func = None

    def __call__(self, func):
        self._func = func
        functools.update_wrapper(self, func)
        return self

    def __set_name__(self, owner, name):
        self.__name__ = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return _Bound(self._func, self._aio, obj)


class _Bound:
    """``obj.method``: call it to block, ``.aio(...)`` to await."""

    __slots__ = ("__func__", "_aio", "__self__")

    def __init__(self, func, aio, obj):
        self.__func__, self._aio, self.__self__ = func, aio, obj

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def aio(self, *args, **kwargs):
        """The awaitable form (a coroutine)."""
        return self._aio(self.__self__, *args, **kwargs)

    @property
    def __doc__(self):
        return self.__func__.__doc__

    def __repr__(self) -> str:
        return f"<method {self.__func__.__qualname__} of {self.__self__!r} (and its .aio twin)>"
