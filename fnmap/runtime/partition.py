"""Partitions of objects in storage, and reading exactly the lines a partition owns.

A partition is a byte range ``[start, end)`` of one object.  Byte ranges cut
lines, so ownership is by line start: a partition owns every line that
*starts* inside its range.  A line starts at offset 0 and after every ``\\n``.
Reading a partition therefore

* skips the partial first line: unless ``start`` is 0 it looks at byte
  ``start - 1`` onward and begins after the first ``\\n`` found there (when
  byte ``start - 1`` is itself a ``\\n``, the line at ``start`` is whole and
  is kept);
* reads past ``end`` to finish its last line: it stops after the first
  ``\\n`` at offset ``end - 1`` or later, or at the end of the object.

Adjacent ranges thus hand over every line exactly once, whatever the chunk
size and line lengths (tests/test_data.py checks this as a property).  A
partition covering a whole object returns the object's bytes unchanged, so
binary objects can be mapped whole.

This module runs on workers: a :class:`Partition` travels pickled to the call
that reads it, so it imports nothing from the client side.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from ..errors import ConfigError, UnknownStorage

#: Bytes fetched per request while reading a partition (one ranged GET each on S3).
READ_BLOCK = 8 << 20
#: Bytes fetched past a partition's end to finish its last line, usually in the same request.
LOOKAHEAD = 64 << 10


@dataclass(frozen=True)
class Partition:
    """Bytes ``[start, end)`` of the object at ``url`` (``size`` bytes): the lines starting there.

    ``part`` is this partition's position among the ``parts`` partitions of
    its object.  ``stream()`` gives a file-like object reading exactly the
    partition's records; ``read()`` returns them at once.
    """

    url: str
    start: int
    end: int
    size: int
    part: int = 0
    parts: int = 1

    @property
    def whole(self) -> bool:
        """True when the partition is its whole object (no line alignment applies)."""
        return self.start == 0 and self.end >= self.size

    def stream(self, block: int = READ_BLOCK) -> io.BufferedReader:
        """File-like, binary, over the partition's records (ranged GETs on S3, seeks on files)."""
        fetch, close = _fetcher(self.url)
        raw = _BlockReader(owned_blocks(fetch, self.size, self.start, self.end, block), close)
        return io.BufferedReader(raw, buffer_size=1 << 16)

    def read(self) -> bytes:
        """The partition's records as one bytes object."""
        fetch, close = _fetcher(self.url)
        try:
            return b"".join(owned_blocks(fetch, self.size, self.start, self.end))
        finally:
            if close is not None:
                close()

    def __repr__(self) -> str:
        return (
            f"Partition({self.url!r}, bytes {self.start}..{self.end} of {self.size}, "
            f"part {self.part + 1}/{self.parts})"
        )


# -- planning: plain functions over (url, size) ------------------------------


def split_object(
    url: str, size: int, chunk_size: int | None = None, chunk_number: int | None = None
) -> list[Partition]:
    """The partitions of one object: whole, ``chunk_size`` bytes each, or ``chunk_number`` pieces.

    Every object gives at least one partition, so an empty object is one empty partition.
    """
    if chunk_size is not None and chunk_number is not None:
        raise ConfigError(
            f"obj_chunk_size={chunk_size!r} and obj_chunk_number={chunk_number!r} were both given; "
            "pass one of them (bytes per partition, or partitions per object)"
        )
    if chunk_size is not None:
        _check_positive(
            "obj_chunk_size", chunk_size, "bytes per partition, e.g. obj_chunk_size=64 << 20"
        )
        step = chunk_size
    elif chunk_number is not None:
        _check_positive(
            "obj_chunk_number", chunk_number, "partitions per object, e.g. obj_chunk_number=4"
        )
        step = max(1, math.ceil(size / chunk_number))
    else:
        step = max(1, size)
    starts = range(0, size, step) if size else range(1)
    parts = len(starts)
    return [Partition(url, s, min(s + step, size), size, i, parts) for i, s in enumerate(starts)]


def split_objects(
    objects, chunk_size: int | None = None, chunk_number: int | None = None
) -> list[Partition]:
    """Partitions of every ``(url, size)`` pair, in the given order."""
    out: list[Partition] = []
    for url, size in objects:
        out.extend(split_object(url, size, chunk_size, chunk_number))
    return out


def _check_positive(name: str, value, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer ({fix})")


# -- reading -----------------------------------------------------------------


def owned_blocks(
    fetch: Callable[[int, int], bytes],
    size: int,
    start: int,
    end: int,
    block: int = READ_BLOCK,
    lookahead: int = LOOKAHEAD,
) -> Iterator[bytes | memoryview]:
    """Yield the bytes of the lines that start in ``[start, end)`` of an object of ``size`` bytes.

    ``fetch(a, b)`` returns bytes ``[a, b)`` of the object.  A whole-object
    range yields the object unchanged.  See the module docstring for the rule.
    Blocks are yielded as fetched, or as memoryviews of them (never copied).
    """
    if start >= end or start >= size:
        return
    # The unread data is buf[off:], which starts at object offset pos.
    pos, buf, off = start, b"", 0
    if start > 0:  # skip the partial first line: start after the first b"\n" at start - 1 or later
        first = _first_line(fetch, size, start, end, block, lookahead)
        if first is None:
            return
        pos, buf, off = first
    while True:
        if off >= len(buf):
            if pos >= size:
                return
            buf, off = fetch(pos, min(size, pos + _want(pos, end, block, lookahead))), 0
            if not buf:
                return
        n = len(buf) - off
        j = -1 if pos + n < end else buf.find(b"\n", off + max(0, end - 1 - pos))
        if j >= 0:  # the first b"\n" at end - 1 or later ends our last line
            yield _view(buf, off, j + 1)
            return
        yield _view(buf, off, len(buf))  # nothing at or past end - 1 here, or our last line goes on
        pos, off = pos + n, len(buf)


def _first_line(fetch, size: int, start: int, end: int, block: int, lookahead: int):
    """Where our first whole line starts, the first b"\n" at ``start - 1`` or later: (its offset,
    the block holding it, its place in the block), or None when no line of ours starts before ``end``."""
    pos = start - 1
    while True:
        if pos >= size:
            return None
        buf = fetch(pos, min(size, pos + _want(pos, end, block, lookahead)))
        if not buf:
            return None
        i = buf.find(b"\n")
        if i >= 0:
            pos, off = pos + i + 1, i + 1
            break
        pos += len(buf)
    if pos >= end:  # the first whole line starts in the next partition
        return None
    return pos, buf, off


def _view(buf: bytes, a: int, b: int) -> bytes | memoryview:
    return buf if a == 0 and b == len(buf) else memoryview(buf)[a:b]


def _want(pos: int, end: int, block: int, lookahead: int) -> int:
    """Bytes to fetch at ``pos``: the rest of the range plus a little, at most ``block``."""
    return max(1, min(block, max(0, end - pos) + lookahead))


class _BlockReader(io.RawIOBase):
    """A raw binary stream over an iterator of byte blocks."""

    def __init__(self, blocks: Iterator[bytes], close: Callable[[], None] | None = None):
        self._blocks = blocks
        self._pending = memoryview(b"")
        self._on_close = close

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        rest = [bytes(self._pending), *self._blocks]
        self._pending = memoryview(b"")
        return b"".join(rest)

    def readinto(self, b) -> int:
        while not self._pending:
            nxt = next(self._blocks, None)
            if nxt is None:
                return 0
            self._pending = memoryview(nxt)
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed and self._on_close is not None:
            self._on_close()
        super().close()


def _fetcher(url: str) -> tuple[Callable[[int, int], bytes], Callable[[], None] | None]:
    """``fetch(a, b)`` for an object URL, and what closes it: seeks on files, ranged GETs on S3."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        f = open(unquote(parsed.path), "rb")  # noqa: SIM115 - closed by the stream

        def fetch_file(a: int, b: int) -> bytes:
            f.seek(a)
            return f.read(b - a)

        return fetch_file, f.close
    if parsed.scheme == "s3":
        from ..storage import open_store

        bucket, key = split_s3_url(url)
        store = open_store(f"s3://{bucket}")
        return (lambda a, b: store.get_range(key, a, b)), None
    raise UnknownStorage(f"cannot read {url!r}: partitions read file:// and s3:// URLs only")


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; S3 keys are not percent-encoded, so no urlparse."""
    bucket, _, key = url[len("s3://") :].partition("/")
    return bucket, key


def file_url(path: str) -> str:
    """The ``file://`` URL of a local path."""
    from pathlib import Path

    return Path(os.path.abspath(path)).as_uri()
