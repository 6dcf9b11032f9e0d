"""``@fnmap.function(**options)``: the options a function needs, on the function.

>>> import fnmap
>>> @fnmap.function(retries=5)
... def square(x: int) -> int:
...     return x * x
>>> square(3)                      # a plain call, here, as the undecorated function
9
>>> square.map(range(4))           # fnmap.map(square, range(4), retries=5)
[0, 1, 4, 9]

The decorated object has ``.map``, ``.starmap``, ``.imap``, ``.imap_unordered``, ``.map_reduce``,
``.submit`` (a future), ``.call(*args, **kwargs)`` (one remote call, its result) and ``.local``,
each with its ``.aio`` twin (:mod:`fnmap.aio`); keywords given to one of them override the
decorator's options for that call, and ``.with_options(**options)`` makes a new object with
more options (the original is unchanged).  The options are checked when the function is
decorated, so a misspelt one fails at import, naming the closest option.

The plain function is what runs and what travels: calling the decorated object runs it in this
process, and a worker gets the plain function (fnmap's pickler ships the wrapper as the function
it wraps, :func:`fnmap.runtime.serialization.travels_as`), so a recursive call or a helper calling
it by name runs it in the worker, never as another remote call.  The object keeps the function's
``__name__``, ``__doc__``, ``__module__``, ``__wrapped__``, signature and type hints, and pickles
(plain ``pickle`` too) as a reference to the module's name, as a plain function does.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from . import aio, api
from .config import resolve
from .executor import Executor
from .runtime.serialization import travels_as
from .runtime.wire import MODE_ARGS
from .twins import with_aio


class Function:
    """A function with fnmap options on it (made by :func:`function`)."""

    def __init__(self, func, options: dict):
        if not callable(func):
            raise TypeError(f"@fnmap.function decorates a function, got {type(func).__name__}: {func!r:.100}")
        resolve(**options)  # a misspelt or bad option fails here, at decoration
        functools.update_wrapper(self, func)
        self._options = dict(options)
        self._executor: Executor | None = None
        self._executor_lock = threading.Lock()

    @property
    def options(self) -> dict:
        """The options given to the decorator (and ``with_options``)."""
        return dict(self._options)

    def _merged(self, options: dict) -> dict:
        return {**self._options, **options}

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def local(self, *args, **kwargs):
        """Run the function here, in this process (the same as calling it)."""
        return self.__wrapped__(*args, **kwargs)

    def with_options(self, **options) -> Function:
        """A new decorated function with these options added (this one is unchanged)."""
        return Function(self.__wrapped__, self._merged(options))

    def __reduce__(self):
        return self.__qualname__  # a reference to the module's name, as pickle stores a function

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"<fnmap.function {self.__module__}.{self.__qualname__}({options})>"

    # -- the front ends, with these options -------------------------------------------------

    async def _map_aio(self, items, **options):
        return await aio.map(self.__wrapped__, items, **self._merged(options))

    @with_aio(_map_aio)
    def map(self, items, **options):
        """``fnmap.map(func, items, **options)`` with this function's options."""
        return api.map(self.__wrapped__, items, **self._merged(options))

    async def _starmap_aio(self, iterable, **options):
        return await aio.starmap(self.__wrapped__, iterable, **self._merged(options))

    @with_aio(_starmap_aio)
    def starmap(self, iterable, **options):
        """``fnmap.starmap(func, iterable, **options)`` with this function's options."""
        return api.starmap(self.__wrapped__, iterable, **self._merged(options))

    def _imap_aio(self, items, **options):
        return aio.imap(self.__wrapped__, items, **self._merged(options))

    @with_aio(_imap_aio)
    def imap(self, items, **options):
        """``fnmap.imap(func, items, **options)`` with this function's options."""
        return api.imap(self.__wrapped__, items, **self._merged(options))

    def _imap_unordered_aio(self, items, **options):
        return aio.imap_unordered(self.__wrapped__, items, **self._merged(options))

    @with_aio(_imap_unordered_aio)
    def imap_unordered(self, items, **options):
        """``fnmap.imap_unordered(func, items, **options)`` with this function's options."""
        return api.imap_unordered(self.__wrapped__, items, **self._merged(options))

    async def _map_reduce_aio(self, items, reduce_func, **options):
        return await aio.map_reduce(self.__wrapped__, items, reduce_func, **self._merged(options))

    @with_aio(_map_reduce_aio)
    def map_reduce(self, items, reduce_func, **options):
        """``fnmap.map_reduce(func, items, reduce_func, **options)`` with this function's options."""
        return api.map_reduce(self.__wrapped__, items, reduce_func, **self._merged(options))

    async def _call_aio(self, *args, **kwargs):
        from .loop import run_blocking

        return await run_blocking(self._call, args, kwargs)

    @with_aio(_call_aio)
    def call(self, *args, **kwargs):
        """Run ``func(*args, **kwargs)`` as one remote call (a job of one call); its result."""
        from .blocking import warn_if_in_coroutine

        warn_if_in_coroutine(f"{self.__name__}.call(...)", f"await {self.__name__}.call.aio(...)", self._options)
        return self._call(args, kwargs)

    @api.remote_error_from_here(warn=False)
    def _call(self, args: tuple, kwargs: dict):
        config = resolve(**self._options)
        return api.start_map(self.__wrapped__, [(args, kwargs)], config, mode=MODE_ARGS).results()[0]

    async def _submit_aio(self, *args, **kwargs):
        from .loop import run_blocking

        return await (await run_blocking(self.submit, *args, **kwargs))  # pickled on fnmap's thread

    @with_aio(_submit_aio)
    def submit(self, *args, **kwargs):
        """Start ``func(*args, **kwargs)`` as a call of this function's :class:`fnmap.Executor`; its
        future (awaitable).  The executor is made at the first submit, with these options."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = Executor(**self._options)
        return self._executor.submit(self.__wrapped__, *args, **kwargs)


travels_as(Function, lambda f: f.__wrapped__)


def function(func=None, /, **options: Any):
    """Decorate a function with fnmap options: ``@fnmap.function`` or ``@fnmap.function(memory=2048,
    retries=5)``; any option ``fnmap.map`` takes (see :class:`fnmap.config.Config`)."""
    if func is None:
        return lambda f: Function(f, options)
    return Function(func, options)
