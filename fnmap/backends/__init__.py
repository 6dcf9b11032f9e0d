"""Backends: where calls run, chosen by name.

The names and the classes they stand for are in :mod:`fnmap.backend_table` (one leaf module,
with each backend's options); a backend is imported on first use, so ``import fnmap`` never
pulls in boto3 or Flask.  Every backend implements :class:`fnmap.backends.base.Backend`.
"""

from __future__ import annotations

import importlib

from ..backend_table import BACKENDS
from ..errors import UnknownBackend

__all__ = ["BACKENDS", "create_backend"]


def create_backend(config):
    """Instantiate the backend ``config.backend`` names."""
    target = BACKENDS.get(config.backend)
    if target is None:
        raise UnknownBackend(
            f"{config.describe('backend')} is not a backend; choose one of: {', '.join(BACKENDS)}"
        )
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config)
