"""Compression of large results: zlib above a threshold, marked by a magic prefix.

A committed result is read back from storage as often as from a response, so
the marker travels with the bytes rather than in a response header: a reader
calls :func:`unpack` on whatever it got.  Pickles (protocol 2 and later) start
with ``\\x80``, so they never look like the marker.  Data that does not shrink
(already compressed, random arrays) is left as it is, judged on a sample so
the worker does not spend a full compression pass to find out (data up to twice the sample is
compressed whole, once: a chunk's 75 KB of results paid the sample's pass and then the whole's).

Compression saves bytes that travel and costs CPU on both ends (zlib level 1: about 50 MB/s here,
7 ms for the 360 KB of 100,000 small ints' results, which halve).  Where the storage is a local
folder (``file://``: the emulator's, a container's mount), the worker writes the result to the
reader's own disk, so only data that shrinks several times over is worth it (:func:`worth_it`).
"""

from __future__ import annotations

import zlib

MAGIC = b"FNZ1"
#: Results smaller than this travel as they are.
THRESHOLD = 64 << 10
_SAMPLE = 64 << 10
#: Compress only when the sample shrinks below this fraction of its size (data that travels).
WORTH_IT = 0.8
#: The same, for a result written to a local folder: only what shrinks four times or more.
LOCAL_WORTH_IT = 0.25


def worth_it(store_url: str) -> float:
    """The fraction below which a result stored at ``store_url`` is worth compressing:
    :data:`LOCAL_WORTH_IT` for a local folder (``file://``), else :data:`WORTH_IT`."""
    return LOCAL_WORTH_IT if store_url.startswith("file:") else WORTH_IT


def pack(data: bytes, threshold: int = THRESHOLD, worth: float = WORTH_IT) -> bytes:
    """``data`` zlib-compressed behind :data:`MAGIC` if large and it shrinks below ``worth`` of its
    size (judged on a sample when large), else unchanged."""
    if len(data) < threshold:
        return data
    if len(data) <= 2 * _SAMPLE:  # one pass over it all costs less than a sample's pass and then all
        packed = zlib.compress(data, 1)
        return MAGIC + packed if len(packed) <= worth * len(data) else data
    sample = bytes(data[:_SAMPLE])
    if len(zlib.compress(sample, 1)) > worth * len(sample):
        return data
    packed = zlib.compress(data, 1)
    return MAGIC + packed if len(packed) + len(MAGIC) < len(data) else data


def unpack(data: bytes | memoryview) -> bytes:
    """The original bytes of :func:`pack`'s output (or of data that was never packed)."""
    if bytes(data[: len(MAGIC)]) == MAGIC:
        return zlib.decompress(data[len(MAGIC) :])
    return data
