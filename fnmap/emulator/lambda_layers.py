"""The emulator's Lambda layers: published versions, each unpacked in a folder of its own.

A function naming a version in its ``Layers`` gets that folder's ``python/`` on its path
(:class:`.lambda_environment.Environment`), as Lambda extracts layers into ``/opt``.  A deleted
version stays in the functions already using it, as on Lambda.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from ..deploy.package import code_sha256
from .lambda_common import ACCOUNT, REGION


@dataclass
class LayerVersion:
    """One published version of a layer: its unpacked folder and what GetLayerVersion reports."""

    name: str
    version: int
    folder: str
    description: str = ""
    runtimes: list = field(default_factory=list)
    architectures: list = field(default_factory=list)
    sha256: str = ""
    size: int = 0
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S.000+0000", time.gmtime()))

    @property
    def arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:layer:{self.name}:{self.version}"


class LayerStore:
    """Layer name -> its versions in publishing order (None where one was deleted)."""

    def __init__(self, unzip):
        #: ``unzip(data) -> folder``: unpacks a layer's zip (ValueError for one that is not a zip).
        self._unzip = unzip
        self._lock = threading.Lock()
        self._versions: dict[str, list[LayerVersion | None]] = {}

    def publish(self, name: str, zip_file: bytes, spec: dict | None = None) -> LayerVersion:
        """Unpack a new version of layer ``name``; ``spec``: PublishLayerVersion's other fields."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,140}", name):
            raise ValueError(f"LayerName={name!r} must be 1-140 letters, digits, '-' or '_'")
        folder = self._unzip(zip_file)
        spec = spec or {}
        with self._lock:
            versions = self._versions.setdefault(name, [])
            layer = LayerVersion(name, len(versions) + 1, folder, str(spec.get("Description") or ""),
                                 list(spec.get("CompatibleRuntimes") or []),
                                 list(spec.get("CompatibleArchitectures") or []), code_sha256(zip_file), len(zip_file))
            versions.append(layer)
            return layer

    def get(self, name: str, version: int) -> LayerVersion | None:
        with self._lock:
            versions = self._versions.get(name, [])
            return versions[version - 1] if 1 <= version <= len(versions) else None

    def listed(self, name: str) -> list[LayerVersion]:
        """The versions of ``name`` not deleted, newest first (ListLayerVersions' order)."""
        with self._lock:
            return [v for v in reversed(self._versions.get(name, [])) if v is not None]

    def delete(self, name: str, version: int) -> None:
        with self._lock:
            versions = self._versions.get(name, [])
            if 1 <= version <= len(versions):
                versions[version - 1] = None

    def folder(self, arn: str) -> str:
        """The folder of the version ``arn`` names; ValueError if it was not published here."""
        match = re.fullmatch(r"arn:aws:lambda:[^:]+:\d+:layer:([^:]+):(\d+)", str(arn))
        layer = self.get(match.group(1), int(match.group(2))) if match else None
        if layer is None:
            raise ValueError(f"layer {arn!r} was not published here; publish_layer_version it first")
        return layer.folder
