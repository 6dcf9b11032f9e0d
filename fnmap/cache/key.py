"""The cache key: what a call computes, encoded so that the same call has the same key anywhere.

A key is two SHA-256 digests: the **function's** (:func:`function_digest`: its code, closure cells,
the globals it reads, the user functions and modules it reaches, the versions of the installed
packages it uses, the options that change what it returns, fnmap's protocol and the Python version)
and the **item's** (:func:`item_digest`: the item, or a call's args and kwargs).  Both come from
one canonical encoding (:func:`encode`), never from pickle bytes: pickles of sets, and of
functions whose globals hold sets, differ with ``PYTHONHASHSEED``, and pickles of ``__main__``
functions differ between cloudpickle versions.  The encoding sorts dicts and sets by the digests
of their members, hashes numpy arrays and pandas columns by their buffer, and refuses, naming the
type and ``key=``, what it cannot encode deterministically.

Code is hashed as the interpreter runs it (bytecode, constants, names, recursively), not as text:
a comment or a blank line changes no key; an edit that changes what runs does.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import os
import pathlib
import re
import struct
import sys
import sysconfig
import types
import uuid
from typing import Any

from ..runtime.serialization import FNMAP_PROTOCOL

#: Bumped when the encoding changes: every key changes with it.
KEY_VERSION = 1
#: Nesting deeper than this is refused (a cycle, or data no key should walk).
_MAX_DEPTH = 200


class Uncacheable(TypeError):
    """A value the cache cannot encode deterministically (its message names the type and the fix)."""


def _refuse(value: Any, where: str) -> Uncacheable:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return Uncacheable(
        f"cache=True cannot key {where}: a {kind} has no deterministic encoding (fnmap encodes builtins, "
        "numpy arrays, pandas objects, dataclasses, enums and dates, never pickle bytes). Pass "
        "cache=fnmap.Cache(key=lambda *args, **kwargs: ...) returning what identifies the call, or "
        "ignore=['name'] to leave that argument (or global, or closure variable) out of the key")


# -- values ----------------------------------------------------------------------------------

def encode(value: Any, where: str = "the item") -> bytes:
    """The canonical encoding of ``value`` as a SHA-256 digest; :class:`Uncacheable` if it has none."""
    h = hashlib.sha256()
    _Encoder(where).write(h, value, 0)
    return h.digest()


class _Encoder:
    """Writes a value's canonical encoding into a hash (tag, length and content of each part)."""

    def __init__(self, where: str, functions: _FunctionHasher | None = None):
        self.where = where
        self.functions = functions

    def digest(self, value: Any, depth: int) -> bytes:
        h = hashlib.sha256()
        self.write(h, value, depth)
        return h.digest()

    def write(self, h, value: Any, depth: int) -> None:  # noqa: C901 - one branch per type, in order
        if depth > _MAX_DEPTH:
            raise Uncacheable(f"cache=True cannot key {self.where}: it nests deeper than {_MAX_DEPTH} "
                              "levels (or holds itself); pass cache=fnmap.Cache(key=...)")
        t = type(value)
        if value is None or t is bool:
            h.update(b"N" if value is None else b"T" if value else b"F")
        elif t is int:
            text = str(value).encode()
            h.update(b"i%d:" % len(text) + text)
        elif t is float:
            h.update(b"f" + struct.pack("<d", value))
        elif t is str:
            data = value.encode("utf-8", "surrogatepass")
            h.update(b"s%d:" % len(data) + data)
        elif t in (bytes, bytearray, memoryview):
            data = bytes(value)
            h.update(b"b%d:" % len(data) + data)
        elif t in (tuple, list):
            h.update(b"(%d:" % len(value) if t is tuple else b"[%d:" % len(value))
            for v in value:
                self.write(h, v, depth + 1)
        elif t is dict:
            pairs = sorted(self.digest(k, depth + 1) + self.digest(v, depth + 1) for k, v in value.items())
            h.update(b"{%d:" % len(pairs) + b"".join(pairs))
        elif t in (set, frozenset):
            members = sorted(self.digest(v, depth + 1) for v in value)
            h.update(b"S%d:" % len(members) + b"".join(members))
        else:
            self._write_other(h, value, depth)

    def _write_other(self, h, value: Any, depth: int) -> None:  # noqa: C901 - one branch per kind
        t = type(value)
        writer = _writer_of(t)
        if writer is not None:
            h.update(b"x" + _type_name(t).encode() + b"\0")
            writer(self, h, value, depth)
        elif isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):  # pandas' Timestamp...
            h.update(b"t" + _type_name(t).encode() + b"\0")
            _WRITERS[datetime.timedelta if isinstance(value, datetime.timedelta) else datetime.date](
                self, h, value, depth)
        elif isinstance(value, enum.Enum):
            h.update(b"e" + _type_name(t).encode() + b"\0")
            self.write(h, value.value, depth + 1)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            h.update(b"d" + _type_name(t).encode() + b"\0")
            for f in dataclasses.fields(value):
                self.write(h, f.name, depth + 1)
                self.write(h, getattr(value, f.name), depth + 1)
        elif isinstance(value, (int, float, str, bytes, tuple, list, dict, set, frozenset)):  # subclasses
            h.update(b"u" + _type_name(t).encode() + b"\0")
            base = next(b for b in (bool, int, float, str, bytes, tuple, list, dict, frozenset, set)
                        if isinstance(value, b))
            self.write(h, base(value), depth + 1)
        elif self.functions is not None and _is_code_like(value):
            h.update(b"c" + self.functions.identity(value))
        elif isinstance(value, types.ModuleType) and self.functions is not None:
            h.update(b"m" + self.functions.module(value, None))
        else:
            raise _refuse(value, self.where)


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _is_code_like(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type,
                              functools.partial, staticmethod, classmethod, property))


def _as_text(enc: _Encoder, h, value: Any, depth: int) -> None:
    enc.write(h, value.isoformat() if hasattr(value, "isoformat") else str(value), depth + 1)


def _complex(enc: _Encoder, h, value: complex, depth: int) -> None:
    h.update(struct.pack("<dd", value.real, value.imag))


def _range(enc: _Encoder, h, value, depth: int) -> None:
    enc.write(h, (value.start, value.stop, value.step), depth + 1)


def _numpy_array(enc: _Encoder, h, value, depth: int) -> None:
    import numpy as np

    enc.write(h, (value.dtype.str, value.shape), depth + 1)
    if value.dtype.hasobject:
        enc.write(h, value.tolist(), depth + 1)
    else:
        h.update(memoryview(np.ascontiguousarray(value)).cast("B"))


def _numpy_scalar(enc: _Encoder, h, value, depth: int) -> None:
    enc.write(h, value.dtype.str, depth + 1)
    h.update(value.tobytes())


def _pandas(enc: _Encoder, h, value, depth: int) -> None:
    """A DataFrame by its column names, then each column; a Series by its name, dtype, values and
    index; an Index by its name, dtype and values.  Values by their buffer (numbers, datetimes),
    else one by one (strings, objects: :meth:`_Encoder.write` refuses what it cannot encode)."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        enc.write(h, ("frame", list(value.columns), value.shape), depth + 1)
        for _name, column in value.items():
            _pandas_values(enc, h, column, depth)
        _pandas_values(enc, h, value.index, depth)
    elif isinstance(value, pd.Series):
        enc.write(h, ("series", value.name), depth + 1)
        _pandas_values(enc, h, value, depth)
        _pandas_values(enc, h, value.index, depth)
    else:  # an Index
        enc.write(h, ("index", value.name), depth + 1)
        _pandas_values(enc, h, value, depth)


def _pandas_values(enc: _Encoder, h, values, depth: int) -> None:
    enc.write(h, str(values.dtype), depth + 1)
    array = values.to_numpy()
    if array.dtype.hasobject:
        enc.write(h, array.tolist(), depth + 1)
    else:
        _numpy_array(enc, h, array, depth)


def _writer_of(t: type):
    """The writer of a type beside the builtins, found by the module that defines it."""
    found = _WRITERS.get(t)
    if found is not None:
        return found
    module = t.__module__.split(".", 1)[0]
    if module == "numpy":
        import numpy as np

        if issubclass(t, np.ndarray) and t is np.ndarray:
            return _numpy_array
        if issubclass(t, np.generic):
            return _numpy_scalar
    if module == "pandas":
        import pandas as pd

        if t in (pd.DataFrame, pd.Series) or issubclass(t, pd.Index):
            return _pandas
    return None


_WRITERS = {
    complex: _complex, range: _range, decimal.Decimal: _as_text, fractions.Fraction: _as_text,
    uuid.UUID: _as_text, datetime.datetime: _as_text, datetime.date: _as_text, datetime.time: _as_text,
    datetime.timedelta: lambda enc, h, v, d: enc.write(h, v.total_seconds(), d + 1),
    pathlib.PurePosixPath: _as_text, pathlib.PosixPath: _as_text, pathlib.PureWindowsPath: _as_text,
    pathlib.WindowsPath: _as_text,
    re.Pattern: lambda enc, h, v, d: enc.write(h, (v.pattern, v.flags), d + 1),
}


# -- functions ---------------------------------------------------------------------------------

_STDLIB = {os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])}
_INSTALLED = {os.path.realpath(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}


@functools.cache
def _package_version(top: str) -> str:
    """The installed distribution version(s) providing top-level module ``top``; ``""`` for stdlib."""
    from importlib import metadata

    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return ""  # the Python version stands for it
    try:
        return f"{top}=={metadata.version(top)}"  # most distributions are named as their module
    except (metadata.PackageNotFoundError, ValueError):
        pass
    names = _distributions().get(top, [])
    versions = []
    for name in sorted(set(names)):
        try:
            versions.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ",".join(versions)


@functools.cache
def _distributions() -> dict:
    """Top-level module -> the distributions providing it (a walk of every installed one, once)."""
    from importlib import metadata

    return metadata.packages_distributions()


@functools.cache
def _is_users_module(name: str) -> bool:
    """Whether module ``name`` is the user's own code (``__main__``, a script, a local package that is
    not installed), which the key follows into, rather than stdlib or an installed package."""
    if name == "__main__" or name.startswith("__main__."):
        return True
    module = sys.modules.get(name)
    if module is None:  # code with no module (exec'd, a notebook cell's namespace): walked, as the user's
        return True
    path = getattr(module, "__file__", None)
    if path is None or name.split(".", 1)[0] in sys.builtin_module_names:
        return False
    if name.split(".", 1)[0] == "fnmap":
        return False  # fnmap's own code: its protocol number stands in for it
    real = os.path.realpath(path)
    if any(real.startswith(p + os.sep) for p in _INSTALLED):
        return False
    return not any(real.startswith(p + os.sep) for p in _STDLIB)


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


class _FunctionHasher:
    """The identity of functions, classes and modules of the user's code, each hashed once."""

    def __init__(self, ignore: tuple = ()):
        #: Names of globals and closure variables left out (``fnmap.Cache(ignore=...)``).
        self.ignore = frozenset(ignore)
        self._done: dict[int, bytes] = {}
        self._keep: list = []  # what _done's ids refer to, alive while this hasher lives

    def identity(self, obj: Any) -> bytes:
        key = id(obj)
        found = self._done.get(key)
        if found is not None:
            return found
        self._done[key] = b"R" + _qualname(obj).encode()  # a recursion reaches here: named, not walked
        self._keep.append(obj)
        h = hashlib.sha256()
        self._identity(h, obj)
        self._done[key] = digest = h.digest()
        return digest

    def _identity(self, h, obj: Any) -> None:
        if isinstance(obj, functools.partial):
            h.update(b"partial" + self.identity(obj.func))
            self._values(h, (obj.args, obj.keywords), f"the arguments of {obj!r:.60}")
        elif isinstance(obj, (staticmethod, classmethod)):
            h.update(b"wrapped" + self.identity(obj.__func__))
        elif isinstance(obj, property):
            h.update(b"property" + b"".join(self.identity(f) for f in (obj.fget, obj.fset, obj.fdel) if f))
        elif isinstance(obj, types.MethodType):
            h.update(b"method" + self.identity(obj.__func__))
            self._values(h, obj.__self__, f"the object of method {_qualname(obj)}")
        elif not isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):  # an object with __call__
            h.update(b"callable" + self.identity(type(obj)))
            state = vars(obj) if hasattr(obj, "__dict__") and not dataclasses.is_dataclass(obj) else obj
            self._values(h, state, f"the callable {type(obj).__qualname__} object")
        elif not _is_users_module(getattr(obj, "__module__", None) or ""):
            h.update(b"extern" + self._extern(obj).encode())
        elif isinstance(obj, types.FunctionType):
            self._function(h, obj)
        elif isinstance(obj, type):
            self._class(h, obj)
        else:  # a builtin of the user's code (a C extension of theirs): by name
            h.update(b"extern" + self._extern(obj).encode())

    @staticmethod
    def _extern(obj: Any) -> str:
        module = getattr(obj, "__module__", None) or ""
        return f"{module}:{_qualname(obj)}:{_package_version(module.split('.', 1)[0])}"

    def _function(self, h, func: types.FunctionType) -> None:
        wrapped = getattr(func, "__wrapped__", None)  # a decorator's wrapper: the function it wraps too
        h.update(b"function" + func.__qualname__.encode() + b"\0" + self._code(func.__code__))
        where = f"function {func.__qualname__}"
        self._values(h, (func.__defaults__, func.__kwdefaults__), f"the defaults of {where}")
        for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=True):
            if name in self.ignore:
                continue
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (the function refers to a name bound later)
                h.update(b"empty-cell" + name.encode())
                continue
            h.update(b"cell" + name.encode() + b"\0")
            self._values(h, value, f"closure variable {name!r} of {where}")
        self._globals(h, func.__globals__, _code_names(func.__code__), where)
        if wrapped is not None and callable(wrapped):
            h.update(b"wraps" + self.identity(wrapped))

    def _globals(self, h, namespace: dict, names: set[str], where: str) -> None:
        for name in sorted(names):
            if name not in namespace or name.startswith("__") and name.endswith("__") or name in self.ignore:
                continue
            value = namespace[name]
            h.update(b"global" + name.encode() + b"\0")
            if isinstance(value, types.ModuleType):
                h.update(self.module(value, names))
            else:
                self._values(h, value, f"global {name!r} read by {where}")

    def module(self, module: types.ModuleType, names: set[str] | None) -> bytes:
        """A module's identity: its name and version when installed or stdlib; for the user's own,
        the attributes of it the code reads (``names``), followed like globals."""
        name = module.__name__
        if not _is_users_module(name):
            return f"module:{name}:{_package_version(name.split('.', 1)[0])}".encode()
        h = hashlib.sha256(b"local-module:" + name.encode())
        attrs = sorted(n for n in (names or ()) if n in vars(module))
        self._globals(h, vars(module), set(attrs), f"module {name}")
        return h.digest()

    def _class(self, h, cls: type) -> None:
        h.update(b"class" + cls.__qualname__.encode() + b"\0")
        for base in cls.__bases__:
            h.update(self.identity(base))
        for name, value in sorted(vars(cls).items()):
            if name.startswith("_abc_") or (name.startswith("__") and name.endswith("__") and not _is_code_like(value)):
                continue  # Python's bookkeeping (dataclass fields, ABC caches, __dict__): the code stays
            h.update(b"attr" + name.encode() + b"\0")
            self._values(h, value, f"attribute {name!r} of class {cls.__qualname__}")

    def _code(self, code: types.CodeType) -> bytes:
        """The code as it runs: bytecode, constants (nested code too), names; no line numbers."""
        h = hashlib.sha256()
        for part in (code.co_code, getattr(code, "co_exceptiontable", b"")):
            h.update(b"%d:" % len(part) + part)
        for text in (*code.co_names, b"|", *code.co_varnames, b"|", *code.co_freevars, b"|", *code.co_cellvars):
            h.update((text if isinstance(text, bytes) else text.encode()) + b"\0")
        h.update(struct.pack("<5i", code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                             code.co_flags, code.co_nlocals))
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                h.update(b"code" + self._code(const))
            else:
                h.update(encode(const, "a constant"))
        return h.digest()

    def _values(self, h, value: Any, where: str) -> None:
        h.update(_Encoder(where, self).digest(value, 0))


def _qualname(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__


# -- the two digests -------------------------------------------------------------------------

def function_digest(func: Any, options: Any = (), ignore: tuple = ()) -> str:
    """The hex digest of ``func``'s identity with the result-changing ``options`` (encodable values),
    fnmap's protocol, the key version and the Python version; globals and closure variables named in
    ``ignore`` are left out."""
    hasher = _FunctionHasher(ignore)
    h = hashlib.sha256(b"fnmap-cache-function\n")
    h.update(hasher.identity(func))
    h.update(_Encoder("the call options", hasher).digest(options, 0))
    h.update(f"|protocol={FNMAP_PROTOCOL}|key={KEY_VERSION}|python={sys.version_info[0]}."
             f"{sys.version_info[1]}".encode())
    return h.hexdigest()[:32]


def item_digest(value: Any, where: str = "the item") -> str:
    """The hex digest of a call's input (an item, or ``(args, kwargs)``)."""
    return encode(value, where).hex()
