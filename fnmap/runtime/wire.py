"""The wire format between client and handlers: one envelope for requests and responses.

An envelope is ``4-byte big-endian header length | JSON header | binary payload``.
The JSON header can be read without unpickling anything, so a handler verifies
the signature (over the whole body) and inspects routing fields safely first.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from . import keys

#: Chunk modes: how each item is applied to the function.
MODE_ONE = "one"  # func(item)
MODE_ARGS = "args"  # func(*args, **kwargs) for (args, kwargs) items

#: A 4-byte big-endian length or count: how every byte format a call travels in over HTTP is framed
#: (this envelope, and :mod:`.batch_frames`).
LENGTH = struct.Struct(">I")


@dataclass
class CallRequest:
    """One invocation: run the function over one chunk of items."""

    job_id: str
    call_id: int
    func_key: str
    store_url: str
    attempt: int = 1
    timeout: float | None = None
    #: Storage key of the pickled chunk, when it is too big to travel inline.
    items_key: str | None = None
    #: Results up to this size ride back in the response as well.
    inline_result_limit: int = 1 << 20
    extra_env: dict = field(default_factory=dict)
    runtime: dict = field(default_factory=dict)
    #: Index of the chunk's first item in the job, for error messages.
    first_index: int = 0
    #: Whether user code's stdout/stderr is captured and stored.
    capture_logs: bool = True
    #: Qualified names of user exception types the client re-runs (``retry_on``), and the attempt
    #: limit: an attempt that raised one of them, with attempts left, is answered without committing.
    retry_on: list = field(default_factory=list)
    max_attempts: int = 1
    #: The job's ``output`` option: "live" (user output also goes to the worker's own stderr),
    #: "after" (captured only, and sent back with the answer, bounded) or "none" (captured only).
    output: str = "live"
    #: Whether captured output is also written to the worker's own stderr: on a cloud platform that
    #: is its log (CloudWatch...); the emulator's and the local backend's stderr is the caller's terminal.
    echo_output: bool = True
    #: Memory (MB) this attempt may use (the job's ``memory`` step); the emulator enforces it.
    memory: int | None = None
    #: Storage key of the job's index entry (``index/jobs/<created>-<job id>.json``): the worker
    #: refuses the call once it is gone (``fnmap gc`` removed the job; a replay must not re-create it).
    job_record: str | None = None


@dataclass
class CallResponse:
    """What a handler answers.  ``ok`` is False only for platform-level failures."""

    job_id: str
    call_id: int
    attempt: int
    ok: bool = True
    #: Platform failure kind (see ``errors.PlatformFault``) and message, when not ok.
    error_kind: str | None = None
    error: str | None = None
    result_key: str | None = None
    #: True when the payload holds the pickled outcomes.
    inline: bool = False
    #: False when another attempt had already committed this call's result.
    committed: bool = True
    stats: dict = field(default_factory=dict)


class EncodedDict(dict):
    """A dict whose JSON text is made already (a worker's stats, written as its status record):
    :func:`encode` sends that text rather than encoding the dict again."""

    __slots__ = ("text",)

    def __init__(self, value: dict, text: str):
        super().__init__(value)
        self.text = text


def encode(header: Any, payload: bytes = b"") -> bytes:
    # vars(), not dataclasses.asdict: the headers hold only JSON values, and asdict's recursive
    # deep copy cost about 30 us per call on each side of the wire.
    if not hasattr(header, "__dataclass_fields__"):
        meta = json.dumps(header).encode()
    elif type(stats := getattr(header, "stats", None)) is EncodedDict:  # the last field: same text
        rest = json.dumps({name: value for name, value in vars(header).items() if name != "stats"})
        meta = f'{rest[:-1]}, "stats": {stats.text}}}'.encode()
    else:
        meta = json.dumps(vars(header)).encode()
    return b"".join((LENGTH.pack(len(meta)), meta, payload))


def decode_header(body: bytes) -> tuple[dict, int]:
    """Parse the JSON header; return it with the payload's offset.  Raises ValueError when malformed."""
    if len(body) < LENGTH.size:
        raise ValueError("body too short for an fnmap envelope")
    (n,) = LENGTH.unpack_from(body)
    if n > len(body) - LENGTH.size:
        raise ValueError("envelope header length exceeds the body")
    header = json.loads(body[LENGTH.size : LENGTH.size + n])
    if not isinstance(header, dict):
        raise ValueError("envelope header is not a JSON object")
    return header, LENGTH.size + n


def decode_request(body: bytes, header: dict | None = None, offset: int = 0) -> tuple[CallRequest, memoryview]:
    """The request in ``body``; ``header`` and ``offset``: what :func:`decode_header` gave for it
    already (the worker reads the header once, to verify the signature, and once is enough)."""
    if header is None:
        header, offset = decode_header(body)
    try:
        req = CallRequest(**header)
    except TypeError as e:
        raise ValueError(f"malformed call request: {e}") from None
    _check_request(req)
    return req, memoryview(body)[offset:]


_NUMBER = (int, float)
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: Field -> (accepted types, what to say).  A request is checked before anything acts on it, so
#: that no value a caller can send makes a worker raise outside its error handling.
_REQUEST_TYPES = {
    "job_id": (str, "a job id (letters, digits, '-' and '_')"),
    "call_id": (int, "an integer >= 0"),
    "func_key": (str, "a string"),
    "store_url": (str, "a string"),
    "attempt": (int, "an integer >= 0"),
    "timeout": ((*_NUMBER, type(None)), "a positive number of seconds or null"),
    "items_key": ((str, type(None)), "a string or null"),
    "inline_result_limit": (int, "an integer"),
    "extra_env": (dict, "an object of names to strings or numbers"),
    "runtime": (dict, "an object"),
    "first_index": (int, "an integer >= 0"),
    "capture_logs": (bool, "true or false"),
    "retry_on": (list, "a list of strings"),
    "max_attempts": (int, "an integer"),
    "output": (str, '"live", "after" or "none"'),
    "echo_output": (bool, "true or false"),
    "job_record": ((str, type(None)), "the key of the job's index entry"),
}
#: Field -> the exact types a well-formed value has (JSON gives no subclasses; a bool is only
#: accepted where the field says so): the per-call check is one set lookup per field.
_EXACT_TYPES = {name: frozenset(types if isinstance(types, tuple) else (types,))
                for name, (types, _what) in _REQUEST_TYPES.items()}
_EXTRA_ENV_VALUES = (str, int, float)


def _check_request(req: CallRequest) -> None:
    values = vars(req)
    for name, exact in _EXACT_TYPES.items():
        value = values[name]
        # a subclass of an accepted type (never made by JSON) is refused too: it may redefine anything
        if type(value) not in exact or (name in _OUT_OF_RANGE and _OUT_OF_RANGE[name](value, req)):
            raise ValueError(f"malformed call request: {name}={value!r:.100} is not {_REQUEST_TYPES[name][1]}")


def _bad_env(env: dict, req) -> bool:
    return not all(isinstance(k, str) and isinstance(v, _EXTRA_ENV_VALUES) and k
                   and "=" not in k and "\0" not in k + str(v) for k, v in env.items())


#: Field -> whether a value of an accepted type is out of range for it.
_OUT_OF_RANGE = {
    "timeout": lambda value, req: value is not None and not 0 < value < 1e9,
    "call_id": lambda value, req: value < 0,
    "attempt": lambda value, req: value < 0,
    "first_index": lambda value, req: value < 0,
    "job_id": lambda value, req: not _JOB_ID.fullmatch(value),  # one path segment: no reaching into other jobs
    "extra_env": lambda value, req: bool(value) and _bad_env(value, req),
    "job_record": lambda value, req: value is not None and not keys.is_job_index_key(value, req.job_id),
    "retry_on": lambda value, req: bool(value) and not all(type(v) is str for v in value),
}


def decode_response(body: bytes) -> tuple[CallResponse, memoryview]:
    header, offset = decode_header(body)
    return CallResponse(**header), memoryview(body)[offset:]


#: HTTP header a handler sets on a non-200 answer to say what kind of platform failure it was.
ERROR_KIND_HEADER = "X-Fnmap-Error-Kind"
#: HTTP header naming the client session whose workers run a call on a shared emulator
#: (:mod:`fnmap.emulator.sessions`); every other host ignores it.
SESSION_HEADER = "X-Fnmap-Session"
#: HTTP status of a shared emulator's answer to a request naming a session it does not have (its
#: client's socket closed, or another emulator made it): the client attaches again.
SESSION_GONE_STATUS = 410
