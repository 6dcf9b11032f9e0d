"""Backends: where calls run, chosen by name.

The names and the classes they stand for are in :mod:`fnmap.backend_table` (one leaf module,
with each backend's options); a backend is imported on first use, so ``import fnmap`` never
pulls in boto3 or Flask.  Every backend implements :class:`fnmap.backends.base.Backend`.
"""

from __future__ import annotations

import importlib

from ..backend_table import BACKENDS

__all__ = ["BACKENDS", "backend_class", "create_backend"]


def backend_class(name: str) -> type:
    """The class of backend ``name`` (a name :class:`fnmap.config.Config` checked); its module
    imports no platform library (boto3, Flask) until an instance needs one."""
    module_name, class_name = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def create_backend(config):
    """Instantiate the backend ``config.backend`` names (a name :class:`fnmap.config.Config` checked)."""
    return backend_class(config.backend)(config)
