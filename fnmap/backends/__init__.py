"""Backends: where calls run, chosen by name.

One registry maps each user-facing name to ``"module:Class"``; a backend is
imported on first use, so ``import fnmap`` never pulls in boto3 or Flask.
Every backend implements :class:`fnmap.backends.base.Backend`.
"""

from __future__ import annotations

import importlib

from ..errors import UnknownBackend

BACKENDS = {
    "emulator": "fnmap.backends.emulator:EmulatorBackend",
    "local": "fnmap.backends.local:LocalBackend",
    "http": "fnmap.backends.http:HttpBackend",
    "aws": "fnmap.backends.aws:AwsBackend",
    "batch": "fnmap.backends.batch:BatchBackend",
}


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
