"""Pickling of functions, items, results and exceptions (cloudpickle).

Shared by the client and the worker: it must not import client-only modules.
"""

from __future__ import annotations

import hashlib
import io
import linecache
import pickle
import re
import struct
import sys
import traceback
import types
from typing import Any

import cloudpickle

from ..errors import RemoteError, SerializationError
from .cached import CACHE_WRAPPER, reduce_cached_function, travels_by_value
from .local_modules import explain_missing_module, ship_local_modules

PICKLE_PROTOCOL = 5


def dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=PICKLE_PROTOCOL).dump(obj)
    return buffer.getvalue()


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle, except that open files are refused and code keeps its file name.

    cloudpickle ships a file opened for reading as a copy of its contents, so the
    worker would get a StringIO of the client's file, silently; fnmap refuses it
    like a lock or a socket, and the message says to open the file in the function.

    cloudpickle 3.1 renames the file of code shipped by value to ``<dynamic-code>``,
    so a remote traceback of a notebook or ``__main__`` function named no file; the
    original name is kept, and the client fills in the source lines it has
    (:func:`add_local_source_lines`).
    """

    def reducer_override(self, obj):
        if isinstance(obj, CACHE_WRAPPER) and travels_by_value(obj):  # functools.cache: by value
            return reduce_cached_function(obj)
        travelling = _TRAVELS_AS.get(type(obj))
        if travelling is not None:  # a wrapper that travels as what it wraps (see travels_as)
            return _arrived, (travelling(obj),)
        if isinstance(obj, BaseException):
            # The exception's own reduction, never one registered globally in copyreg: tblib's
            # pickling support (installed by ``distributed`` and ``dask.multiprocessing`` when
            # imported) rebuilds every exception without calling ``__init__``, so a remote
            # ``SystemExit(4)`` came back with no exit code, and it ships the traceback's frames.
            return obj.__reduce_ex__(self.proto)
        if isinstance(obj, types.CodeType):
            return _code_reduce_keeping_filename(obj)
        if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)) and (
            obj not in (sys.stdin, sys.stdout, sys.stderr)
        ):
            raise TypeError(f"cannot pickle an open file ({type(obj).__name__})")
        return super().reducer_override(obj)


#: Types whose objects travel to workers as something else: type -> what an object travels as.
_TRAVELS_AS: dict[type, Any] = {}


def travels_as(cls: type, travelling) -> None:
    """Objects of ``cls`` travel to workers as ``travelling(obj)``: a decorated function
    (``@fnmap.function``) as the plain function it wraps, so that the function's own references to
    its name (a recursive call, a helper calling it) run it where it is, never through the wrapper."""
    _TRAVELS_AS[cls] = travelling


def _arrived(value: Any) -> Any:
    """What a ``travels_as`` object is on the worker: the value it travelled as."""
    return value


_cloudpickle_code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


def _code_reduce_keeping_filename(code: types.CodeType):
    if _cloudpickle_code_reduce is None:  # a cloudpickle without it keeps file names itself
        return NotImplemented
    constructor, args = _cloudpickle_code_reduce(code)
    args = tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)
    return constructor, args


def loads(data: bytes | memoryview) -> Any:
    """Unpickle what :func:`dumps` or :func:`dump_parts` (joined) wrote."""
    if data[: len(FRAMED_MAGIC)] == FRAMED_MAGIC:
        return load_stream(_ViewReader(memoryview(data)))
    return pickle.loads(data)

# -- large buffers out of band ---------------------------------------------------------------
#
# A 1 MB argument pickled in-band is copied into the pickle, and a fresh megabyte costs as much
# as hashing it on this kind of machine (page faults); the copy then travels through the request,
# the emulator and the worker's pipe, each adding one.  With pickle protocol 5 a buffer (a NumPy
# array, a DataFrame's blocks, a bytes argument) can stay where it is: the pickle holds a
# placeholder and the buffers are written after it, straight from the caller's memory, and read
# back each into its own object, so the worker's ``bytes`` argument *is* the bytes it read.
#
# Framed layout:  FRAMED_MAGIC | u32 count | u64 pickle length | count x (u64 length, u8 writable)
#                 | pickle | buffer 0 | buffer 1 | ...
# A plain pickle starts with b"\x80", so the two never look alike.

FRAMED_MAGIC = b"FNB1"
_FRAME_HEAD = struct.Struct("<IQ")
_FRAME_BUFFER = struct.Struct("<QB")
#: Buffers smaller than this stay inside the pickle (framing a few bytes saves nothing).
OUT_OF_BAND_MIN = 64 << 10


class _OutOfBandBytes:
    """Marks a large ``bytes`` value for out-of-band pickling (pickle never asks a reducer about
    exact ``bytes``, so the chunk's top-level values are wrapped before pickling)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce_ex__(self, protocol):
        return _as_bytes, (pickle.PickleBuffer(self.data),)


def _as_bytes(buffer) -> bytes:
    return buffer if type(buffer) is bytes else bytes(buffer)


def out_of_band(value: Any) -> Any:
    """``value``, marked to travel out of band if it is a large ``bytes`` (anything else already
    does where its type supports protocol 5: NumPy arrays, pandas blocks)."""
    if type(value) is bytes and len(value) >= OUT_OF_BAND_MIN:
        return _OutOfBandBytes(value)
    return value


def dump_parts(obj: Any) -> list:
    """Pickle ``obj`` as a list of parts to be written one after another: ``[pickle]`` when it has
    no large buffers, else the framed layout whose large buffers are views of ``obj``'s own memory
    (no copy: they must not change until the parts are written)."""
    buffers: list[pickle.PickleBuffer] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:  # True keeps it in-band
        if buffer.raw().nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(buffer)
        return False

    stream = io.BytesIO()
    _Pickler(stream, protocol=PICKLE_PROTOCOL, buffer_callback=keep).dump(obj)
    data = stream.getvalue()
    if not buffers:
        return [data]
    raws = [b.raw() for b in buffers]
    head = [FRAMED_MAGIC, _FRAME_HEAD.pack(len(raws), len(data))]
    head += [_FRAME_BUFFER.pack(raw.nbytes, not raw.readonly) for raw in raws]
    return [b"".join(head), data, *raws]


def parts_size(parts: list) -> int:
    return sum(memoryview(part).nbytes for part in parts)


class _ViewReader:
    """``read`` and ``readinto`` over a memoryview; what ``read`` returns is a view, not a copy."""

    def __init__(self, view: memoryview):
        self._view, self._at = view, 0

    def read(self, size: int = -1) -> memoryview:
        end = len(self._view) if size < 0 else self._at + size
        part = self._view[self._at : end]
        self._at += len(part)
        return part

    def readinto(self, buffer) -> int:
        part = self.read(len(buffer))
        buffer[: len(part)] = part
        return len(part)


def load_stream(stream, before_unpickle=None) -> Any:
    """Unpickle what :func:`dump_parts` wrote, reading from a binary file object: each large buffer
    is read into its own object (``bytes``, or a ``bytearray`` where the original was writable),
    so nothing is copied after the read.  ``before_unpickle()`` runs after the last read and before
    anything is unpickled (the worker checks the object's digest there; it raises to refuse)."""
    magic = stream.read(len(FRAMED_MAGIC))
    if magic != FRAMED_MAGIC:
        data = bytes(magic) + stream.read()
        if before_unpickle is not None:
            before_unpickle()
        return pickle.loads(data)
    head = _read_exactly(stream, _FRAME_HEAD.size)
    count, pickle_size = _FRAME_HEAD.unpack(head)
    sizes = [_FRAME_BUFFER.unpack(_read_exactly(stream, _FRAME_BUFFER.size)) for _ in range(count)]
    data = _read_exactly(stream, pickle_size)
    buffers = []
    for size, writable in sizes:
        if writable:  # a writable array stays writable
            buffer = bytearray(size)
            if stream.readinto(buffer) != size:
                raise pickle.UnpicklingError("stored object ends inside a buffer")
            buffers.append(buffer)
        else:
            buffers.append(_read_exactly(stream, size))
    if before_unpickle is not None:
        before_unpickle()
    return pickle.loads(data, buffers=buffers)


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise pickle.UnpicklingError(f"stored object ends early: {len(data)} of {size} bytes")
    return data


#: The fnmap protocol: what client and worker exchange (requests, responses, stored objects and
#: their keys).  Before 1.0 there is no compatibility with other versions: any change to it bumps
#: this number, and a client and worker whose numbers differ refuse each other with the fix.
FNMAP_PROTOCOL = 1


def runtime_info() -> dict:
    """What must match between client and worker: the fnmap protocol, and for pickles to load,
    Python's minor version and cloudpickle's major version."""
    return {
        "protocol": FNMAP_PROTOCOL,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cloudpickle": cloudpickle.__version__,
    }


def protocol_mismatch(client: dict, worker: dict) -> str | None:
    """Which side to upgrade when the client's and worker's fnmap protocols differ, else None."""
    theirs, mine = client.get("protocol"), worker.get("protocol")
    if theirs == mine:
        return None
    older = "worker" if not isinstance(mine, int) or (isinstance(theirs, int) and theirs > mine) else "client"
    fix = ("redeploy the handler with the client's fnmap (`fnmap deploy ...`), or upgrade fnmap where the calls "
           "run" if older == "worker" else "upgrade fnmap where the client runs (`pip install -U fnmap`), or "
           "deploy the handler with the client's version")
    return (f"the client speaks fnmap protocol {theirs} but the worker speaks {mine}: the {older}'s fnmap is "
            f"older; {fix}")


def runtime_mismatch(client: dict, worker: dict | None = None) -> str | None:
    """A plain-words description of a client/worker mismatch, or None when they agree.

    ``worker`` defaults to this process (the worker's side); a client passes what
    the deployment reports, to find a mismatch before it sends anything.
    """
    mine = worker or runtime_info()
    protocol = protocol_mismatch(client, mine)
    if protocol:
        return protocol
    problems = []
    if client.get("python") != mine["python"]:
        problems.append(f"the client runs Python {client.get('python')} but the worker runs Python {mine['python']}")
    client_cp = str(client.get("cloudpickle", ""))
    if client_cp.split(".")[:1] != mine["cloudpickle"].split(".")[:1]:
        problems.append(
            f"the client has cloudpickle {client_cp} but the worker has {mine['cloudpickle']}"
        )
    if not problems:
        return None
    return (
        "; ".join(problems)
        + ". Pickled functions only load on the same Python minor version and cloudpickle major "
        "version: deploy the handler with the client's versions, or run the client on the runtime's."
    )


def pickle_function(func: Any) -> tuple[str, bytes]:
    """Pickle a function once; return ``(content digest, bytes)``.

    The user's own modules (scripts, test files, local packages that are not
    installed) do not exist on the worker, so they are shipped by value.
    """
    ship_local_modules()
    data = dumps_checked(func, "the function")
    return hashlib.sha256(data).hexdigest()[:32], data


def dumps_checked(obj: Any, what: str) -> bytes:
    """Pickle ``obj``, or raise :class:`SerializationError` naming the unpicklable part and its path."""
    try:
        return dumps(obj)
    except Exception as e:
        path, culprit = find_unpicklable(obj, what)
        raise SerializationError(
            f"{path} cannot be pickled ({type(culprit).__name__}: {culprit!r:.200}): {e}. "
            "Objects such as locks, sockets and open files cannot travel to a worker; create them "
            "inside the function instead."
        ) from e


def find_unpicklable(obj: Any, path: str, depth: int = 0, seen: set | None = None) -> tuple[str, Any]:
    """Search ``obj`` for the innermost part that does not pickle; return ``(path, part)``."""
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen:
        return path, obj
    seen.add(id(obj))
    for child_path, child in _children(obj, path):
        try:
            dumps(child)
        except Exception:
            return find_unpicklable(child, child_path, depth + 1, seen)
    return path, obj


def _children(obj: Any, path: str):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}[{k!r}]", v
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield f"{path}[{i}]", v
    elif callable(obj) and hasattr(obj, "__code__"):
        yield from _function_parts(obj, path)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for k, v in vars(obj).items():
            yield f"{path}.{k}", v


def _function_parts(fn: Any, path: str):
    """What a function's pickle holds by value: its closure cells, the globals it names, its defaults."""
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            yield f"{path} (closure variable {name!r})", cell.cell_contents
        except ValueError:
            pass
    for name in code.co_names:
        if name in getattr(fn, "__globals__", {}):
            yield f"{path} (global {name!r})", fn.__globals__[name]
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"{path} (default #{i})", default


# -- exceptions ----------------------------------------------------------------


def _rebuild_exception(cls, args, state):
    exc = cls.__new__(cls)
    exc.args = args
    if state:
        exc.__dict__.update(state)
    return exc


def pack_exception(exc: BaseException) -> tuple[bytes, str]:
    """Pickle an exception with its formatted traceback; never raises.

    Exceptions whose ``__init__`` takes other arguments than ``args`` are rebuilt
    without calling ``__init__``; one that will not pickle at all becomes a
    :class:`RemoteError` carrying its type name and message.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    state = {k: v for k, v in getattr(exc, "__dict__", {}).items() if not k.startswith("__")}
    for candidate in (exc, None):
        try:
            if candidate is None:
                data = dumps(_Rebuild(type(exc), exc.args, state))
            else:
                data = dumps(candidate)
            loads(data)  # an exception may pickle but fail to load (e.g. __init__ with two args)
            return data, tb
        except Exception:
            continue
    return dumps(RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc))), tb


class _Rebuild:
    """Pickles as a call to :func:`_rebuild_exception`."""

    def __init__(self, cls, args, state):
        self.cls, self.args, self.state = cls, args, state

    def __reduce__(self):
        return (_rebuild_exception, (self.cls, self.args, self.state))


def unpack_exception(data: bytes, tb: str) -> BaseException:
    """The remote exception, with the remote traceback chained as its cause."""
    from ..errors import RemoteTraceback

    try:
        exc = loads(data)
    except Exception as e:  # e.g. the exception's class is not importable on the client
        exc = RemoteError("unknown", f"could not unpickle the remote exception ({e})")
    if not isinstance(exc, BaseException):
        exc = RemoteError(type(exc).__name__, repr(exc))
    note = None
    if isinstance(exc, ModuleNotFoundError):
        note = explain_missing_module(exc.name)
        if note and "is a local module here" in note:  # the worker's install advice does not apply:
            # gone from the exception's notes and from the remote traceback, which printed them
            advice = {n for n in getattr(exc, "__notes__", []) if n.startswith("fnmap: ")}
            exc.__notes__ = [n for n in getattr(exc, "__notes__", []) if n not in advice]
            tb = "".join(line for line in tb.splitlines(keepends=True) if line.rstrip("\n") not in advice)
    elif isinstance(exc, AttributeError):
        note = explain_missing_attribute(str(exc))
    if note:
        exc.add_note(note)
    exc.__cause__ = RemoteTraceback(add_local_source_lines(tb))
    return exc


_MISSING_ATTRIBUTE = re.compile(r"Can't get attribute '([^']+)' on <module '([^']+)'")


def explain_missing_attribute(message: str) -> str | None:
    """Why unpickling on the worker looked up a name in ``__main__`` (or a local module), and the fix."""
    match = _MISSING_ATTRIBUTE.search(message)
    if not match:
        return None
    name, module = match.groups()
    return (f"fnmap: {module}.{name} was pickled by reference (by its name) and the worker has no such "
            "name: an object whose type pickles itself by name (a C-level wrapper, an object with its "
            "own __reduce__). Functions, classes and functools.cache / lru_cache functions of a notebook, "
            "script or local module travel by value; call such an object from a plain function, or "
            "define it in a package installed on the workers.")


_FRAME_LINE = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in .*$')


def add_local_source_lines(tb: str) -> str:
    """Fill in the source lines a remote traceback could not show, from this process's files.

    A function defined in a notebook cell or a script travels by value, so the
    worker has its file name and line numbers but not its source; the client
    does (IPython keeps its cells in :mod:`linecache` too).
    """
    lines = tb.splitlines(keepends=True)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        match = _FRAME_LINE.match(line)
        if not match:
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith(match.group(1) + "  ") and not _FRAME_LINE.match(following):
            continue  # the worker showed the source line itself
        source = linecache.getline(match.group(2), int(match.group(3))).strip()
        if source:
            out.append(f"{match.group(1)}    {source}\n")
    return "".join(out)
