"""Object storage behind one small interface, chosen by URL scheme.

``file:///path`` is the default (a per-user cache folder); ``s3://bucket/prefix``
works with AWS and any S3-compatible server through boto3's own endpoint
settings.  Stores are cached per URL per process, so their clients and
connection pools are reused; an ``s3://`` store also per the ``AWS_*`` and
``FNMAP_S3_ENDPOINT_URL`` settings it was made with, so the same URL under
another endpoint or account is another store.
"""

from __future__ import annotations

import os
import threading
from typing import BinaryIO, Protocol, runtime_checkable
from urllib.parse import urlparse

from ..errors import KeyNotFound, StorageError, UnknownStorage
from ..runtime import forks

__all__ = ["Store", "KeyNotFound", "StorageError", "open_store", "default_storage_url", "STORES"]

#: URL scheme -> "module:Class", imported on first use.
STORES = {
    "file": "fnmap.storage.file:FileStore",
    "s3": "fnmap.storage.s3:S3Store",
}


@runtime_checkable
class Store(Protocol):
    """What every storage implementation offers.  Keys are ``/``-separated relative paths."""

    url: str

    def put(self, key: str, data: bytes | list) -> None:
        """Write atomically (readers see the old object or the new one, never a part).  ``data`` may
        be a list of bytes-like parts, written one after another without joining them where the
        storage allows (a large argument goes from the caller's memory to the file)."""

    def put_if_absent(self, key: str, data: bytes | list) -> bool:
        """Write only if the key does not exist yet; True if this call wrote it (first writer wins)."""

    def get(self, key: str) -> bytes:
        """Read a whole object; raises :class:`KeyNotFound`."""

    def reader(self, key: str) -> BinaryIO:
        """A binary file object reading the whole object from its start (close it after use), so a
        reader can take its parts into separate objects; raises :class:`KeyNotFound`."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Read bytes ``[start, end)`` of an object; raises :class:`KeyNotFound`."""

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` (all pages), sorted."""

    def list_details(self, prefix: str) -> list[tuple[str, int, float]]:
        """``(key, size in bytes, last modified as epoch seconds)`` of every key under ``prefix``, sorted."""

    def delete(self, keys: list[str]) -> None:
        """Delete keys; missing keys are ignored."""


_cache: dict[tuple, Store] = {}
_lock = threading.Lock()


def _forget_in_child() -> None:
    """In a forked child: the parent's stores (an S3 store's pooled connections) are the parent's."""
    global _cache, _lock
    forks.keep(_cache)
    _cache, _lock = {}, threading.Lock()


forks.at_fork(_forget_in_child)


def default_storage_url() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return "file://" + os.path.join(os.path.abspath(base), "fnmap")


def open_store(url: str, setting: str | None = None, create: bool = True) -> Store:
    """Return the (cached) store for a storage URL.

    ``setting``: where the URL came from (``storage='...' (from keyword)``, ``FNMAP_STORAGE=...``,
    a config file, the default), named by every :class:`StorageError` of the store.  ``create``:
    whether a missing folder is created; commands that only read (``fnmap jobs``, ``fnmap.job``)
    pass False and get a StorageError saying it does not exist, and nothing is created."""
    key = (url, _client_settings(url), create)
    with _lock:
        store = _cache.get(key)
        if store is None:
            store = _cache[key] = _create(url, setting, create)
        elif setting:
            store.setting = setting
        return store


def storage_failure(url: str, setting: str | None, problem: str, fix: str, reason: str) -> StorageError:
    """The one error of a storage failure: what failed, on which storage, set where, and the fix."""
    where = f"storage {url}" + (f" ({setting})" if setting else "")
    error = StorageError(f"{where}: {problem}; {fix}")
    error.reason = reason
    return error


def _client_settings(url: str) -> tuple:
    """The environment an ``s3://`` store's boto3 client is made from (endpoint, credentials, region)."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        return ()
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_") or k == "FNMAP_S3_ENDPOINT_URL"))


def _create(url: str, setting: str | None, create: bool) -> Store:
    if not isinstance(url, str) or "://" not in url:
        raise UnknownStorage(
            f"storage URL {url!r} is malformed: use file:///absolute/path or s3://bucket/prefix"
        )
    scheme = urlparse(url).scheme
    target = STORES.get(scheme)
    if target is None:
        known = ", ".join(f"{s}://" for s in sorted(STORES))
        raise UnknownStorage(f"storage URL {url!r} has unknown scheme {scheme!r}; known schemes: {known}")
    module_name, class_name = target.split(":")
    import importlib

    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(url, setting=setting, create=create)


def is_unreachable(e: BaseException | None) -> bool:
    """botocore could not connect to the storage endpoint at all (no address, refused, no answer),
    whether raised as itself or as the :class:`StorageError` a store made of it."""
    return (type(e).__name__ in ("EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError")
            or getattr(e, "reason", None) == "unreachable")


def _check_key(key: str) -> None:
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise ValueError(f"invalid storage key {key!r}: keys are relative paths without '..'")


def _not_found(url: str, key: str) -> KeyNotFound:
    return KeyNotFound(f"{url.rstrip('/')}/{key} does not exist")
