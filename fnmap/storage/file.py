"""``file://`` storage: a folder on the local disk, with atomic writes."""

from __future__ import annotations

import itertools
import os
import threading
from urllib.parse import unquote, urlparse

from ..errors import STORAGE_REFUSED_ERRNOS, UnknownStorage, storage_fix
from ..runtime import keys as key_layout
from . import _check_key, _not_found, storage_failure

_counter = itertools.count()
#: Whether a key ("a/b/c") is a path below the root as it is (POSIX); elsewhere its parts are joined.
_SLASH_PATHS = os.sep == "/" and os.altsep is None


class FileStore:
    """Objects are files under a root folder; writes go to a temp file then ``os.replace``/``os.link``."""

    def __init__(self, url: str, setting: str | None = None, create: bool = True):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise UnknownStorage(
                f"storage URL {url!r} names host {parsed.netloc!r}; a file URL needs an absolute "
                "path with three slashes, e.g. file:///tmp/fnmap"
            )
        path = unquote(parsed.path)
        if not path or not os.path.isabs(path):
            raise UnknownStorage(f"storage URL {url!r} needs an absolute path, e.g. file:///tmp/fnmap")
        self.root = path
        self._prefix = path if path.endswith(os.sep) else path + os.sep
        self.url = url
        self.setting = setting
        if not create:
            if not os.path.isdir(self.root):
                raise storage_failure(url, setting, f"the folder {self.root} does not exist (nothing was created)",
                                      "no job has stored anything there: check the URL for a typo, or name the "
                                      "storage your jobs used", "missing")
            return
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise storage_failure(url, setting, f"cannot create the folder {self.root}: {e.strerror} "
                                  f"({e.filename})", storage_fix(e, url), "refused") from e
        self._check_writable()

    def _check_writable(self) -> None:
        """Write and remove one byte: a folder that is read-only or full is reported now, once, with
        the fix, before a job writes its first record there (each refused record write was a
        warning of its own before the job's error)."""
        try:
            os.unlink(self._write_temp(f"{self._prefix}probe", b"\0"))
        except OSError as e:
            if e.errno not in STORAGE_REFUSED_ERRNOS:
                raise
            raise storage_failure(self.url, self.setting, f"cannot write to the folder {self.root}: {e.strerror}",
                                  storage_fix(e, self.url), "refused") from e

    def _path(self, key: str) -> str:
        _check_key(key)
        if _SLASH_PATHS:  # the key's folders are the path's as they are (os.path.join: ~10 us a key)
            return f"{self._prefix}{key}"
        return os.path.join(self.root, *key.split("/"))

    def _write_temp(self, path: str, data: bytes | list) -> str:
        # A unique name from pid, thread and a counter, and the folder created only when the
        # open says it is missing: tempfile.mkstemp's random names and makedirs' stats were
        # half of a worker's time on a noop call.
        directory = path.rpartition(os.sep)[0] if _SLASH_PATHS else os.path.dirname(path)
        tmp = f"{directory}{os.sep}{key_layout.temp_name(os.getpid(), threading.get_ident(), next(_counter))}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, flags, 0o600)
        try:
            for part in data if isinstance(data, list) else [data]:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
        except BaseException as e:
            os.close(fd)
            os.unlink(tmp)
            if isinstance(e, OSError) and e.filename is None:  # os.write names no file: "(None)" in the error
                raise OSError(e.errno, e.strerror, path) from None
            raise
        os.close(fd)
        return tmp

    def put(self, key: str, data: bytes | list) -> None:
        path = self._path(key)
        os.replace(self._write_temp(path, data), path)

    def put_if_absent(self, key: str, data: bytes | list) -> bool:
        path = self._path(key)
        if os.path.exists(path):
            return False
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)  # atomic, and fails if the target exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise _not_found(self.url, key) from None

    def reader(self, key: str):
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError):
            raise _not_found(self.url, key) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except (FileNotFoundError, NotADirectoryError):
            raise _not_found(self.url, key) from None

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def list(self, prefix: str) -> list[str]:
        # Walk only the deepest folder the prefix names fully.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *folder.split("/")) if folder else self.root
        keys = []
        for dirpath, _dirnames, filenames in os.walk(start):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                if key_layout.is_temporary(name):
                    continue
                key = rel + name
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return keys

    def list_details(self, prefix: str) -> list[tuple[str, int, float]]:
        found = []
        for key in self.list(prefix):
            try:
                st = os.stat(self._path(key))
            except FileNotFoundError:  # deleted since it was listed
                continue
            found.append((key, st.st_size, st.st_mtime))
        return found

    def list_temporary(self) -> list[tuple[str, int, float]]:
        """``(key, bytes on disk, modified)`` of every file being written, or left by a writer killed
        while writing it (:func:`fnmap.runtime.keys.temp_name`): what ``fnmap gc`` collects once stale."""
        found = []
        for dirpath, _dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                if key_layout.is_temporary(name):
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:  # renamed into place meanwhile
                        continue
                    found.append((rel + name, _allocated(st), st.st_mtime))
        return sorted(found)

    def disk_usage(self) -> tuple[list[tuple[str, int, int, float]], dict[str, int]]:
        """What the file system holds for the store, as ``du`` counts it, in one walk: ``(key,
        length, bytes allocated, modified)`` of every key, sorted, and the bytes allocated to each
        folder below the root (``"jobs/<id>/out/3/"``).  A key takes whole blocks, so a job of many
        small results takes far more than their lengths add up to (a 64-byte result and its
        344-byte status record take 4 KiB each on ext4).  Temporary files are
        :meth:`list_temporary`'s."""
        files: list[tuple[str, int, int, float]] = []
        folders: dict[str, int] = {}
        for dirpath, _dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if rel:
                try:
                    folders[rel] = _allocated(os.stat(dirpath))
                except FileNotFoundError:  # removed meanwhile
                    continue
            for name in filenames:
                if key_layout.is_temporary(name):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # deleted since it was listed
                    continue
                files.append((rel + name, st.st_size, _allocated(st), st.st_mtime))
        files.sort()
        return files, folders

    def remove_empty_folders(self, prefix: str) -> None:
        """Remove the folders under ``prefix`` (a folder key, ``"jobs/<id>/"``) left empty once its
        keys are deleted, deepest first, the prefix's own folder too: each takes a block of its own
        (``fnmap gc`` of a job of 16 call shards left 40 empty folders).  A folder something was
        written to meanwhile stays."""
        _check_key(prefix.rstrip("/"))
        top = self._path(prefix.rstrip("/"))
        for dirpath, _dirnames, _filenames in os.walk(top, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:  # not empty (or gone): it stays
                pass

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                pass


def _allocated(st: os.stat_result) -> int:
    """The bytes the file system allocated for a file or folder (its blocks), or its length where
    the platform does not say (Windows)."""
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size
