"""Several invocations in one request (the emulator's ``POST /invoke-many``), and their answers.

A request is the number of calls, then for each call its signature and its envelope, each exactly
what ``POST /invoke`` takes (and each verified on its own: the batch itself carries no authority).
The answer holds, for each call in the same order, what ``POST /invoke`` would have answered: the
status, the headers (JSON) and the body.  Lengths are 4-byte big-endian, so a reader never scans.

The emulator's pipe to a worker carries the same call frames (``fnmap.emulator.process``).
"""

from __future__ import annotations

import json
import struct

from .wire import LENGTH

#: Where a host that takes several invocations in one request (the emulator) takes them.
MANY_PATH = "/invoke-many"
#: The most calls one request may carry (the client sends far fewer: see ``fnmap.dispatch``).
MAX_CALLS = 256
_ANSWER_HEAD = struct.Struct(">III")  # status, headers' length, body's length


def pack_calls(calls: list[tuple[str | None, bytes]]) -> bytes:
    """One request body from ``(signature, envelope)`` pairs."""
    parts = [LENGTH.pack(len(calls))]
    for signature, body in calls:
        signed = (signature or "").encode("ascii")
        parts += [LENGTH.pack(len(signed)), signed, LENGTH.pack(len(body)), body]
    return b"".join(parts)


def unpack_calls(data: bytes | memoryview) -> list[tuple[str | None, bytes]]:
    """The ``(signature, envelope)`` pairs of a request body; ValueError says what is malformed."""
    view = memoryview(data)
    count, offset = _read_u32(view, 0, "the number of calls")
    if not 0 < count <= MAX_CALLS:
        raise ValueError(f"a batch carries 1 to {MAX_CALLS} calls, not {count}")
    calls = []
    for index in range(count):
        signed, offset = _read_bytes(view, offset, f"the signature of call {index}")
        body, offset = _read_bytes(view, offset, f"the envelope of call {index}")
        try:
            signature = signed.decode("ascii") or None
        except UnicodeDecodeError:
            raise ValueError(f"the signature of call {index} is not ASCII") from None
        calls.append((signature, body))
    if offset != len(view):
        raise ValueError(f"{len(view) - offset} bytes after the last call")
    return calls


def pack_answers(answers: list[tuple[int, bytes, dict]]) -> bytes:
    """The answer body from ``(status, body, headers)`` per call, in the calls' order."""
    parts = []
    for status, body, headers in answers:
        head = json.dumps(headers).encode() if headers else b""
        parts += [_ANSWER_HEAD.pack(status, len(head), len(body)), head, body]
    return b"".join(parts)


def unpack_answers(data: bytes, count: int) -> list[tuple[int, dict, bytes]]:
    """``(status, headers, body)`` per call from an answer body; ValueError if it is not ``count`` answers."""
    view = memoryview(data)
    answers, offset = [], 0
    for index in range(count):
        if offset + _ANSWER_HEAD.size > len(view):
            raise ValueError(f"the answer ends before call {index}'s")
        status, head_len, body_len = _ANSWER_HEAD.unpack_from(view, offset)
        offset += _ANSWER_HEAD.size
        if offset + head_len + body_len > len(view):
            raise ValueError(f"call {index}'s answer is cut short")
        headers = json.loads(bytes(view[offset:offset + head_len])) if head_len else {}
        offset += head_len
        answers.append((status, headers, bytes(view[offset:offset + body_len])))
        offset += body_len
    if offset != len(view):
        raise ValueError(f"{len(view) - offset} bytes after the last answer")
    return answers


def _read_u32(view: memoryview, offset: int, what: str) -> tuple[int, int]:
    if offset + LENGTH.size > len(view):
        raise ValueError(f"the batch ends before {what}")
    return LENGTH.unpack_from(view, offset)[0], offset + LENGTH.size


def _read_bytes(view: memoryview, offset: int, what: str) -> tuple[bytes, int]:
    length, offset = _read_u32(view, offset, f"the length of {what}")
    if offset + length > len(view):
        raise ValueError(f"{what} is cut short ({length} bytes announced, {len(view) - offset} left)")
    return bytes(view[offset:offset + length]), offset + length
