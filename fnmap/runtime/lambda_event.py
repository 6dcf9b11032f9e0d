"""How one fnmap invocation travels through AWS Lambda: the event in, the result out.

Lambda payloads are JSON, so the binary envelope (:mod:`fnmap.runtime.wire`) travels
base64-encoded with its HMAC beside it::

    {"fnmap": 1, "body": "<base64 envelope>", "signature": "<hex>"}

An envelope too big for Lambda's payload limit is written to the job's storage
first and sent by reference::

    {"fnmap": 1, "store": "s3://bucket/prefix", "key": "jobs/<id>/blobs/...", "size": <bytes>,
     "sha256": "<hex>", "job_id": ..., "call_id": ..., "attempt": ..., "reference_signature": "<sig>",
     "signature": "<sig>"}

The reference (store, key, size, SHA-256) is signed (route :data:`ROUTE_REFERENCE`) and checked
*before* anything is read; the size is bounded first, and what is read must have that size and
digest; then the worker verifies the envelope's own signature as for an inline body.

A *spawner* event carries many call events (each as above, already signed) for the function
to invoke itself, asynchronously, from inside the platform (a big job's fan-out)::

    {"fnmap": 1, "spawn": [<call event>, ...], "job_id": ..., "spawn_id": ..., "store": ...,
     "job_record": "index/jobs/...", "signature": "<sig>"}

signed like a call (route ``spawn``, over its calls' signatures), fanned out once: the handler
writes ``jobs/<id>/spawned/<spawn_id>`` first-writer-wins and refuses a spawner seen before, or
one whose job record is gone.  It is answered with the calls it could not invoke,
``[[index, fault kind, message], ...]``.  The handler answers ``{"fnmap": 1, "status": <int>, "body":
"<base64>"}``.  Function URL events (HTTP payload format 2.0) are accepted as
well: the envelope is the request body and the signature the
``X-Fnmap-Signature`` header, as for every HTTP host.

Used by the client (``fnmap.backends.aws``), the handler
(``handlers/aws_lambda.py``) and the emulator's Lambda API; imports nothing of
the client side.
"""

from __future__ import annotations

import base64
import hashlib
import json

from .signing import REFUSED, ROUTE_SPAWN, SIGNATURE_HEADER, sign_request, verify_request

#: Route of a by-reference event's signature over its reference.
ROUTE_REFERENCE = "call-reference"
#: Largest request read by reference (as large as an HTTP host takes: bigger arguments go
#: through storage as inputs, not inside the request).
MAX_REFERENCE_BYTES = 64 << 20


class Refused(ValueError):
    """An event whose signature does not hold: answered 403 with :data:`REFUSED`, nothing read."""

VERSION = 1
#: How a spawner event begins (see :func:`encode_spawn_event`).
SPAWN_PREFIX = b'{"fnmap": %d, "spawn": [' % VERSION


def encode_event(body: bytes, signature: str) -> bytes:
    """The Invoke payload carrying the envelope inline."""
    return json.dumps(
        {"fnmap": VERSION, "body": base64.b64encode(body).decode("ascii"), "signature": signature}
    ).encode()


def _reference_text(store_url: str, key: str, size: int, digest: str) -> bytes:
    return f"{store_url}\n{key}\n{size}\n{digest}".encode()


def encode_reference_event(store_url: str, key: str, body: bytes, signature: str, secret: bytes,
                           call: tuple, lifetime: float | None = None) -> bytes:
    """The Invoke payload naming an envelope ``body`` stored under ``key`` of ``store_url``;
    ``call`` is ``(job id, call id, attempt)``."""
    digest = hashlib.sha256(body).hexdigest()
    reference = sign_request(secret, ROUTE_REFERENCE, *call, _reference_text(store_url, key, len(body), digest),
                             lifetime=lifetime)
    job_id, call_id, attempt = call
    return json.dumps({"fnmap": VERSION, "store": store_url, "key": key, "size": len(body), "sha256": digest,
                       "job_id": job_id, "call_id": call_id, "attempt": attempt,
                       "reference_signature": reference, "signature": signature}).encode()


def encode_spawn_event(payloads: list[bytes], signatures: list[str], secret: bytes, job_id: str,
                       spawn_id: str, store_url: str, job_record: str, lifetime: float | None = None) -> bytes:
    """The Invoke payload of a spawner: ``payloads`` are call events (:func:`encode_event`),
    ``signatures`` their calls' signatures, in order; ``job_record`` the key of the job's index entry."""
    text = _spawn_text(signatures, store_url, job_record)
    signature = sign_request(secret, ROUTE_SPAWN, job_id, spawn_id, "", text, lifetime=lifetime)
    tail = json.dumps({"job_id": job_id, "spawn_id": spawn_id, "store": store_url, "job_record": job_record,
                       "signature": signature})
    return SPAWN_PREFIX + b", ".join(payloads) + b"], " + tail[1:].encode()


def _spawn_text(signatures: list, store_url: str, job_record: str) -> bytes:
    return "\n".join([store_url, job_record, *(str(s) for s in signatures)]).encode()


def is_spawn_event(event) -> bool:
    return isinstance(event, dict) and event.get("fnmap") == VERSION and isinstance(event.get("spawn"), list)


def check_spawn(event: dict, secret: bytes | None) -> tuple[int, bytes] | None:
    """Why a spawner event must not fan out (``(status, text)``), or None: its signature holds,
    its job record exists, and it was not fanned out before (marked now, first writer wins)."""
    calls = event["spawn"]
    job_id, spawn_id, store_url, record = (event.get(k) for k in ("job_id", "spawn_id", "store", "job_record"))
    signatures = [c.get("signature") if isinstance(c, dict) else None for c in calls]
    if not (secret and all(isinstance(v, str) for v in (job_id, spawn_id, store_url, record))
            and verify_request(secret, ROUTE_SPAWN, job_id, spawn_id, "", _spawn_text(signatures, store_url, record),
                               event.get("signature"))):
        return 403, REFUSED
    from ..storage import open_store
    from .keys import job_prefix

    store = open_store(store_url)
    if not store.exists(record):
        return 410, f"job {job_id} has no record (removed by `fnmap gc`?): spawner refused".encode()
    if not store.put_if_absent(f"{job_prefix(job_id)}spawned/{spawn_id}", b""):
        return 409, f"spawner {spawn_id} of job {job_id} was fanned out already: refused".encode()
    return None


def spawn(event: dict, invoke, secret: bytes | None, threads: int = 16) -> dict:
    """Invoke each call event of a spawner event with ``invoke(payload bytes)``, which returns None
    or ``(fault kind, message)``; answer (as :func:`encode_result`) the calls that were not invoked.
    A spawner whose signature does not hold, seen before, or of a removed job invokes nothing."""
    from concurrent.futures import ThreadPoolExecutor

    refused = check_spawn(event, secret)
    if refused is not None:
        return encode_result(*refused)

    def one(index_and_call):
        index, call = index_and_call
        try:
            problem = invoke(json.dumps(call).encode())
        except Exception as e:  # the call was not invoked: the client retries it
            problem = ("server", repr(e))
        return None if problem is None else [index, *problem]

    with ThreadPoolExecutor(max(1, min(threads, len(event["spawn"])))) as pool:
        failed = [f for f in pool.map(one, enumerate(event["spawn"])) if f is not None]
    return encode_result(200, json.dumps(failed).encode())


def is_url_event(event) -> bool:
    """True for a function URL (HTTP) event rather than a direct Invoke."""
    return isinstance(event, dict) and "requestContext" in event and "fnmap" not in event


def decode_event(event, secret: bytes | None) -> tuple[bytes, str | None]:
    """Return ``(envelope, signature)``; raises :class:`Refused` for a by-reference event whose
    reference signature does not hold (nothing is read then), ValueError for a malformed event.

    A by-reference event reads the envelope from storage (errors of the store propagate).
    """
    if not isinstance(event, dict):
        raise ValueError(f"the event is a {type(event).__name__}, not a JSON object")
    if is_url_event(event):
        headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
        raw = event.get("body") or ""
        body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()
        return body, headers.get(SIGNATURE_HEADER.lower())
    if event.get("fnmap") != VERSION:
        raise ValueError(
            f"not an fnmap event (fnmap={event.get('fnmap')!r}, expected {VERSION}); "
            "invoke this function through fnmap's aws backend"
        )
    signature = event.get("signature")
    if "body" in event:
        try:
            return base64.b64decode(event["body"], validate=True), signature
        except (TypeError, ValueError) as e:
            raise ValueError(f"the event's body is not base64: {e}") from None
    if "store" in event and "key" in event:
        return _read_reference(event, secret), signature
    raise ValueError("the event has neither a body nor a store and key")


def _read_reference(event: dict, secret: bytes | None) -> bytes:
    """The stored envelope a by-reference event names: its signed reference checked first, its
    size bounded, then what was read checked against the signed size and SHA-256."""
    store_url, key, size, digest = (event.get(k) for k in ("store", "key", "size", "sha256"))
    if not (secret and isinstance(store_url, str) and isinstance(key, str) and isinstance(digest, str)
            and isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= MAX_REFERENCE_BYTES
            and verify_request(secret, ROUTE_REFERENCE, event.get("job_id", ""), event.get("call_id", ""),
                               event.get("attempt", ""), _reference_text(store_url, key, size, digest),
                               event.get("reference_signature"))):
        raise Refused("by-reference event refused")
    from ..storage import open_store

    body = open_store(store_url).get_range(key, 0, size + 1) if size else b""
    if len(body) != size or hashlib.sha256(body).hexdigest() != digest:
        raise ValueError(f"the stored request {key} does not have the size and SHA-256 its event was signed with")
    return body


def encode_result(status: int, out: bytes) -> dict:
    """The handler's return value for a direct Invoke."""
    return {"fnmap": VERSION, "status": status, "body": base64.b64encode(out).decode("ascii")}


def url_result(status: int, out: bytes) -> dict:
    """The handler's return value for a function URL request."""
    mimetype = "application/octet-stream" if status == 200 else "text/plain"
    return {
        "statusCode": status,
        "headers": {"Content-Type": mimetype},
        "body": base64.b64encode(out).decode("ascii"),
        "isBase64Encoded": True,
    }


def decode_result(payload: bytes) -> tuple[int, bytes]:
    """Parse what the handler returned; raises ValueError when it is not an fnmap result."""
    try:
        result = json.loads(payload)
        return int(result["status"]), base64.b64decode(result["body"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"the function's answer is not an fnmap result ({e!r}): {payload[:300]!r}") from None
