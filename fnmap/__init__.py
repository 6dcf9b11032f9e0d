"""fnmap: run plain Python functions over many inputs in parallel on serverless compute.

>>> import fnmap
>>> fnmap.map(lambda x: x + 1, [1, 2, 3])
[2, 3, 4]

The default backend is a local emulator started on demand; see the README and docs/ for
``backend=`` (``local``, ``http``, ``aws``, ``batch``) and ``storage=``.
"""

from __future__ import annotations

from .errors import (
    CallLost,
    ConfigError,
    CostCapReached,
    FnmapError,
    InitializerError,
    KeyNotFound,
    OutOfMemory,
    PlatformError,
    RemoteError,
    RemoteExit,
    SerializationError,
    SignatureError,
    StorageError,
    TimeoutError,
    UnknownBackend,
    UnknownStorage,
    VersionMismatch,
    WorkerCrashed,
)

__version__ = "0.1.0"

__all__ = [
    "map", "starmap", "imap", "imap_unordered", "map_reduce", "Executor", "job", "estimate", "function", "Cache",
    "FnmapError", "ConfigError", "UnknownBackend", "UnknownStorage", "KeyNotFound",
    "SerializationError", "VersionMismatch", "SignatureError", "StorageError", "PlatformError", "WorkerCrashed",
    "CallLost", "TimeoutError", "RemoteError", "RemoteExit", "InitializerError", "OutOfMemory",
    "CostCapReached", "BlockingCallWarning",
]


def __getattr__(name: str):
    # Keep `import fnmap` light: the client machinery loads on first use.
    if name in ("map", "starmap", "imap", "imap_unordered", "map_reduce"):
        from . import aio  # hangs each front end's async twin on it: fnmap.map.aio

        return getattr(aio.api, name)
    if name == "BlockingCallWarning":
        from .blocking import BlockingCallWarning

        return BlockingCallWarning
    if name == "function":
        from .decorator import function

        return function
    if name == "Executor":
        from .executor import Executor

        return Executor
    if name == "estimate":
        from .cost.forecast import estimate

        return estimate
    if name == "Cache":
        from .config import Cache

        return Cache
    if name == "job":
        from .attach import job

        return job
    raise AttributeError(f"module 'fnmap' has no attribute {name!r}")


def __dir__():
    # The lazy names above are public too: tab completion and dir() must show them.
    return sorted(set(globals()) | set(__all__))
