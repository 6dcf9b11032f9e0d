"""``functools.cache`` / ``lru_cache`` functions travel by value, like the functions they wrap.

A cached function is a C object (``functools._lru_cache_wrapper``) whose own reduction is its
qualified name, so it pickled by reference even where its module travels by value: on a worker a
notebook's ``@functools.cache def load_model()`` failed with "Can't get attribute 'load_model' on
<module '__main__'>", and a local module holding one could not be imported there.  It
now travels as its wrapped function (by value, as cloudpickle ships any function of ``__main__``
or of a module registered by value) and is wrapped again on load with the same ``maxsize`` and
``typed``.  The cache starts empty in each worker process and lasts as long as the worker keeps
the function loaded (the whole job, and later jobs of the same function).

Shared by the client and the worker: it must not import client-only modules.
"""

from __future__ import annotations

import functools
from typing import Any

import cloudpickle

CACHE_WRAPPER = functools._lru_cache_wrapper
_should_pickle_by_reference = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)


def travels_by_value(wrapper: Any) -> bool:
    """Whether ``wrapper`` (a cached function) must travel by value: its wrapped function is one
    cloudpickle would ship by value (defined in ``__main__``, a notebook or a local module)."""
    func = wrapper.__wrapped__
    if _should_pickle_by_reference is not None:
        return not _should_pickle_by_reference(func)
    module = getattr(func, "__module__", None)  # pragma: no cover - a cloudpickle without the helper
    return module == "__main__" or str(module).split(".")[0] in cloudpickle.list_registry_pickle_by_value()


def reduce_cached_function(wrapper: Any) -> tuple:
    """The pickle reduction of a cached function: its wrapped function and its cache's settings."""
    parameters = wrapper.cache_parameters()
    return cached_function, (wrapper.__wrapped__, parameters["maxsize"], parameters["typed"])


def cached_function(func, maxsize: int | None, typed: bool):
    """``func`` wrapped again as the client had it (``functools.cache`` is ``lru_cache(None)``)."""
    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)
