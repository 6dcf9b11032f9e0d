"""Data in object storage as map input: a prefix, a glob or a list of object URLs -> partitions.

``fnmap.map(func, "s3://bucket/logs/")`` lists the objects (one LIST request
per 1,000 keys, never reading their contents here), splits them into
:class:`fnmap.runtime.partition.Partition` objects, and maps ``func`` over those.

Accepted inputs (``s3://`` or ``file://``):

* ``s3://bucket/prefix/`` -- every object under the prefix (a trailing ``/``
  means a prefix); for ``file://`` a folder, with or without the slash;
* ``s3://bucket/logs/*.csv`` -- a glob: ``*`` and ``?`` match within one
  path segment, ``**`` matches across segments, ``[abc]`` a character class;
* ``s3://bucket/key`` -- one object;
* a list or tuple of such URLs, all of them storage URLs.

Keys ending in ``/`` (folder markers) are skipped.  Objects come in key order
for prefixes and globs, in the given order for lists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote, urlparse

from .errors import KeyNotFound, UnknownStorage
from .runtime.partition import Partition, file_url, split_objects, split_s3_url

__all__ = ["partitions", "list_objects", "is_data_input"]

SCHEMES = ("s3", "file")
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_data_input(items) -> bool:
    """Whether ``items`` names data in storage: a storage URL, or a non-empty list/tuple of them.

    A generator of URL strings is not: ``fnmap.map(func, iter(urls))`` passes
    the strings themselves to ``func``.
    """
    if isinstance(items, str):
        return _is_storage_url(items)
    if isinstance(items, (list, tuple)) and items:
        return all(isinstance(u, str) and _is_storage_url(u) for u in items)
    return False


def _is_storage_url(text: str) -> bool:
    return text.split("://", 1)[0] in SCHEMES and "://" in text


def partitions(
    data: str | Iterable[str],
    obj_chunk_size: int | None = None,
    obj_chunk_number: int | None = None,
) -> list[Partition]:
    """List the objects ``data`` names and split them into partitions.

    With neither option each object is one partition.  ``obj_chunk_size``
    cuts objects into ranges of that many bytes, ``obj_chunk_number`` into
    that many pieces; either way each partition reads only the lines that
    start in its range, so no line is cut or read twice.

    >>> import fnmap.data, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_text("x\\n" * 10)
    >>> [p.read() for p in fnmap.data.partitions(d.as_uri(), obj_chunk_size=8)][0]
    b'x\\nx\\nx\\nx\\n'
    """
    return split_objects(list_objects(data), obj_chunk_size, obj_chunk_number)


def list_objects(data: str | Iterable[str]) -> list[tuple[str, int]]:
    """``(url, size)`` of every object ``data`` names (see the module docstring)."""
    if isinstance(data, str):
        return _list_one(data)
    urls = list(data)
    bad = [u for u in urls if not (isinstance(u, str) and _is_storage_url(u))]
    if bad:
        raise UnknownStorage(
            f"{bad[0]!r} is not a storage URL; a list of data must hold s3://bucket/key or "
            "file:///path URLs only"
        )
    if any(u.endswith("/") or _GLOB_CHARS.search(u) for u in urls):
        out: list[tuple[str, int]] = []
        for u in urls:
            out.extend(_list_one(u))
        return out
    return _sizes(urls)


def _list_one(url: str) -> list[tuple[str, int]]:
    scheme = url.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise UnknownStorage(
            f"data URL {url!r} has scheme {scheme!r}; fnmap reads s3://bucket/prefix/ and "
            "file:///path URLs"
        )
    glob = _GLOB_CHARS.search(url)
    if scheme == "s3":
        bucket, key = split_s3_url(url)
        if not bucket:
            raise UnknownStorage(f"data URL {url!r} names no bucket: use s3://bucket/prefix/")
        if glob:
            pattern = _glob_regex(key)
            prefix = key[: _GLOB_CHARS.search(key).start()]
            found = [
                (u, s) for u, s in _s3_list(bucket, prefix) if pattern.fullmatch(split_s3_url(u)[1])
            ]
        elif key == "" or key.endswith("/"):
            found = _s3_list(bucket, key)
        else:
            return _sizes([url])
    else:
        path = _file_path(url)
        if glob:
            pattern = _glob_regex(path)
            root = os.path.dirname(path[: _GLOB_CHARS.search(path).start()]) or "/"
            found = [(file_url(p), s) for p, s in _walk(root) if pattern.fullmatch(p)]
        elif os.path.isdir(path):
            found = [(file_url(p), s) for p, s in _walk(path)]
        else:
            return _sizes([url])
    if not found:
        raise KeyNotFound(
            f"no objects match {url!r}; check the bucket, prefix or pattern (a prefix needs a "
            "trailing '/', e.g. s3://bucket/logs/)"
        )
    return found


def _glob_regex(pattern: str) -> re.Pattern:
    """``**``: any characters; ``*``, ``?``: within one path segment; ``[...]``: as in fnmatch."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# -- S3 ----------------------------------------------------------------------


def _s3_list(bucket: str, prefix: str) -> list[tuple[str, int]]:
    """Every object under a prefix with its size: one LIST per 1,000 keys, contents never read."""
    from .storage.s3 import make_s3_client

    client = make_s3_client()
    found = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                if not obj["Key"].endswith("/"):
                    found.append((f"s3://{bucket}/{obj['Key']}", obj["Size"]))
    except client.exceptions.NoSuchBucket:
        raise KeyNotFound(
            f"bucket {bucket!r} does not exist (listing s3://{bucket}/{prefix})"
        ) from None
    return found


def _sizes(urls: list[str]) -> list[tuple[str, int]]:
    """Sizes of explicitly named objects: HEAD requests on S3 (in parallel), stat on files."""
    s3_urls = [u for u in urls if u.startswith("s3://")]
    sizes: dict[str, int] = {}
    if s3_urls:
        from .storage.s3 import make_s3_client

        client = make_s3_client()
        with ThreadPoolExecutor(min(32, len(s3_urls))) as pool:
            found = pool.map(lambda u: _s3_size(client, u), s3_urls)
            sizes.update(zip(s3_urls, found, strict=True))
    out = []
    for u in urls:
        if u in sizes:
            out.append((u, sizes[u]))
            continue
        path = _file_path(u)
        if not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise KeyNotFound(f"{u} {what}; name a file, a folder or a glob")
        out.append((u, os.path.getsize(path)))
    return out


def _s3_size(client, url: str) -> int:
    from botocore.exceptions import ClientError

    bucket, key = split_s3_url(url)
    try:
        return client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    except ClientError as e:
        if str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")) == "404":
            raise KeyNotFound(
                f"{url} does not exist; to read every object under it as a prefix, end it with "
                f"'/': {url}/"
            ) from None
        raise


# -- files -------------------------------------------------------------------


def _file_path(url: str) -> str:
    parsed = urlparse(url)
    path = unquote(parsed.path)
    if parsed.netloc not in ("", "localhost") or not os.path.isabs(path):
        raise UnknownStorage(
            f"data URL {url!r} needs an absolute path with three slashes, e.g. file:///data/logs/"
        )
    return path


def _walk(root: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every file under ``root``, sorted by path."""
    found = []
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=True):
                stack.append(entry.path)
            elif entry.is_file(follow_symlinks=True):
                found.append((entry.path, entry.stat().st_size))
    found.sort()
    return found
