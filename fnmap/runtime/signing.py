"""HMAC-SHA256 signatures over requests, and MACs over stored objects.

Unpickling is code execution, so every handler verifies a request's signature
with the deployment's shared secret *before* it unpickles anything.

A signature binds more than the body (a captured request must not run again):

    v2.<issued>.<expires>.<hex HMAC of the string below>

    fnmap-v2 \\n route \\n job id \\n call id \\n attempt \\n issued \\n expires \\n SHA-256(body)

``route`` names the operation (:data:`ROUTE_CALL` for a call on any transport: HTTP ``/`` or
``/invoke``, a Lambda event, a Batch child; :data:`ROUTE_CANCEL`; :data:`ROUTE_SPAWN` for a
Lambda fan-out event).  The job, call and attempt are read from the request's own JSON header by
the verifier, so a signature only holds for the request it was made for; ``issued``/``expires``
(epoch seconds, chosen by the signer within :data:`MAX_LIFETIME`) bound when it is accepted.
The worker also refuses a call whose result is already committed or whose job record is gone
(:mod:`fnmap.runtime.worker`), so a replay inside the window runs nothing either.

Objects a reader unpickles from storage are authenticated too: results and stored values carry
:func:`seal`'s MAC (bound to their key); functions and calls' inputs are named by their SHA-256
and the worker checks the digest their key names (:func:`content_digest_ok`; an input as it is
read); both before unpickling.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time

from . import keys

SIGNATURE_HEADER = "X-Fnmap-Signature"
SECRET_ENV = "FNMAP_SECRET"
#: Seconds a signature is valid for by default, and the clock skew allowed ("issued" in the future).
WINDOW_ENV = "FNMAP_SIGNATURE_WINDOW"
DEFAULT_WINDOW = 300
#: Longest validity a signer may choose (a Batch child may wait this long in its queue).
MAX_LIFETIME = 7 * 24 * 3600
ROUTE_CALL = "call"
ROUTE_CANCEL = "cancel"
ROUTE_SPAWN = "spawn"
#: The one answer to any request whose signature does not hold: nothing about files or jobs.
REFUSED = b"fnmap: signature invalid: request refused, nothing was run"
_VERSION = "v2"


_window: int | None = None


def window() -> int:
    """The signature window in seconds (``FNMAP_SIGNATURE_WINDOW``, default 300), read once per process."""
    global _window
    if _window is None:
        raw = os.environ.get(WINDOW_ENV, "")
        _window = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_WINDOW
    return _window


def _mac(secret: bytes, route: str, job_id, call_id, attempt, issued: int, expires: int,
         body_digest: str) -> str:
    text = f"fnmap-v2\n{route}\n{job_id}\n{call_id}\n{attempt}\n{issued}\n{expires}\n{body_digest}"
    return hmac.digest(secret, text.encode(), "sha256").hex()  # the one-shot C HMAC: a few us


def sign_request(secret: bytes, route: str, job_id, call_id, attempt, body: bytes | memoryview,
                 lifetime: float | None = None, now: float | None = None) -> str:
    """The signature of ``body`` for one operation on one call (see the module's docstring)."""
    issued = int(time.time() if now is None else now)
    expires = issued + int(min(lifetime or window(), MAX_LIFETIME))
    digest = hashlib.sha256(body).hexdigest()
    return f"{_VERSION}.{issued}.{expires}.{_mac(secret, route, job_id, call_id, attempt, issued, expires, digest)}"


def verify_request(secret: bytes, route: str, job_id, call_id, attempt, body: bytes | memoryview,
                   signature: str | None, now: float | None = None) -> bool:
    """Whether ``signature`` was made with ``secret`` for exactly this route, call and body, and
    is valid now."""
    if not signature or not isinstance(signature, str):
        return False
    parts = signature.split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not (parts[1].isdigit() and parts[2].isdigit()):
        return False
    issued, expires = int(parts[1]), int(parts[2])
    now = time.time() if now is None else now
    if issued > now + window() or now > expires or expires - issued > MAX_LIFETIME:
        return False
    digest = hashlib.sha256(body).hexdigest()
    return hmac.compare_digest(_mac(secret, route, job_id, call_id, attempt, issued, expires, digest), parts[3])


def sign(secret: bytes, body: bytes, route: str = ROUTE_CALL, lifetime: float | None = None,
         now: float | None = None) -> str:
    """Sign a call envelope (:mod:`fnmap.runtime.wire`), reading its job, call and attempt from
    its JSON header; a body that is no envelope is signed with empty ones."""
    job_id, call_id, attempt = _call_of(body)
    return sign_request(secret, route, job_id, call_id, attempt, body, lifetime, now)


def verify(secret: bytes, body: bytes, signature: str | None, route: str = ROUTE_CALL) -> bool:
    """Inverse of :func:`sign`."""
    job_id, call_id, attempt = _call_of(body)
    return verify_request(secret, route, job_id, call_id, attempt, body, signature)


def _call_of(body: bytes) -> tuple:
    from .wire import decode_header

    try:
        header, _ = decode_header(body)
    except ValueError:
        return "", "", ""
    return header.get("job_id", ""), header.get("call_id", ""), header.get("attempt", "")


# -- stored objects ------------------------------------------------------------------------

#: A sealed object: this magic, the 32-byte MAC, then the data.
SEALED_MAGIC = b"FNS1"
_SEAL_HEAD = len(SEALED_MAGIC) + 32


class UnauthenticatedObject(Exception):
    """A stored object whose MAC or digest does not hold: it was planted or altered, and is not unpickled."""


def _seal_mac(secret: bytes, key: str, data) -> bytes:
    mac = hmac.new(secret, b"fnmap-object\n" + key.encode() + b"\n", hashlib.sha256)
    mac.update(data)
    return mac.digest()


def seal(secret: bytes, key: str, data: bytes) -> bytes:
    """``data`` with a MAC bound to its storage ``key`` (whose path names the job and call)."""
    if not secret:
        raise UnauthenticatedObject(f"cannot seal stored object {key!r}: no secret to seal it with; set "
                                    "FNMAP_SECRET to the deployment's secret")
    return SEALED_MAGIC + _seal_mac(secret, key, data) + data


def unseal(secret: bytes | None, key: str, sealed: bytes | memoryview) -> memoryview:
    """The data of a sealed object after checking its MAC; raises :class:`UnauthenticatedObject`
    naming the key when it does not hold (nothing is unpickled)."""
    view = memoryview(sealed)
    if not secret:
        raise UnauthenticatedObject(
            f"cannot check stored object {key!r}: no secret to check it with; set FNMAP_SECRET "
            "to the deployment's secret")
    if bytes(view[: len(SEALED_MAGIC)]) != SEALED_MAGIC or len(view) < _SEAL_HEAD:
        raise UnauthenticatedObject(f"stored object {key!r} carries no fnmap MAC: refused, not unpickled "
                                    "(planted, or written without one)")
    data = view[_SEAL_HEAD:]
    if not hmac.compare_digest(bytes(view[len(SEALED_MAGIC) : _SEAL_HEAD]), _seal_mac(secret, key, data)):
        raise UnauthenticatedObject(f"stored object {key!r} fails its MAC check: it was altered or planted "
                                    "(or written with another secret); refused, not unpickled")
    return data


def content_digest_ok(key: str, data) -> bool:
    """Whether ``data`` has the SHA-256 a content-addressed ``key`` names (:func:`keys.content_digest`:
    ``functions/<first 32 hex digits>.pkl``, a call's input ``.../<call>-<64 hex digits>``).  Any
    other key is refused."""
    expected = keys.content_digest(key)
    if expected is None:
        return False
    return hmac.compare_digest(hashlib.sha256(data).hexdigest()[: len(expected)], expected)


# -- the secret -------------------------------------------------------------------------------

_current = threading.local()


def set_current_secret(secret: bytes | None) -> None:
    """The secret of the call this thread serves (worker side), for code that seals stored values."""
    _current.secret = secret


def current_secret() -> bytes | None:
    return getattr(_current, "secret", None) or secret_from_env()


def local_secret() -> str:
    """This user's own secret for emulators ``fnmap.map`` starts by itself (no secret configured):
    kept in ``$XDG_CONFIG_HOME/fnmap/secret`` (``~/.config``), readable by this user only, so that
    another process of the same user (``fnmap.job(ID).results()``) can check the job's results."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    folder = os.path.join(base, "fnmap")
    path = os.path.join(folder, "secret")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path) as f:
            value = f.read().strip()
        if value:
            return value
        os.unlink(path)  # an empty file left by a crash: make it again
        return local_secret()
    value = new_secret()
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return value


def new_secret() -> str:
    return secrets.token_hex(32)


def secret_from_env() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return value.encode() if value else None
