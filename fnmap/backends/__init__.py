"""Backends: where calls run, chosen by name.

The names and the classes they stand for are in :mod:`fnmap.backend_table` (one leaf module,
with each backend's options); a backend is imported on first use, so ``import fnmap`` never
pulls in boto3 or Flask.  Every backend implements :class:`fnmap.backends.base.Backend`.
"""

from __future__ import annotations

import importlib

from ..backend_table import BACKENDS

__all__ = ["BACKENDS", "create_backend"]


def create_backend(config):
    """Instantiate the backend ``config.backend`` names (a name :class:`fnmap.config.Config` checked)."""
    module_name, class_name = BACKENDS[config.backend].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config)
