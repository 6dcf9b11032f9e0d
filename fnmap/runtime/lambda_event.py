"""How one fnmap invocation travels through AWS Lambda: the event in, the result out.

Lambda payloads are JSON, so the binary envelope (:mod:`fnmap.runtime.wire`) travels
base64-encoded with its HMAC beside it::

    {"fnmap": 1, "body": "<base64 envelope>", "signature": "<hex>"}

An envelope too big for Lambda's payload limit is written to the job's storage
first and sent by reference::

    {"fnmap": 1, "store": "s3://bucket/prefix", "key": "jobs/<id>/blobs/...", "signature": "<hex>"}

A *spawner* event carries many call events (each as above, already signed) for the function
to invoke itself, asynchronously, from inside the platform (issue 16: a big job's fan-out)::

    {"fnmap": 1, "spawn": [<call event>, <call event>, ...]}

and is answered with the calls it could not invoke, ``[[index, fault kind, message], ...]``.

The handler reads those bytes back and verifies the signature over exactly
them before anything is unpickled, so a reference is trusted no more than an
inline body.  The handler answers ``{"fnmap": 1, "status": <int>, "body":
"<base64>"}``.  Function URL events (HTTP payload format 2.0) are accepted as
well: the envelope is the request body and the signature the
``X-Fnmap-Signature`` header, as for every HTTP host.

Used by the client (``fnmap.backends.aws``), the handler
(``handlers/aws_lambda.py``) and the emulator's Lambda API; imports nothing of
the client side.
"""

from __future__ import annotations

import base64
import json

from .signing import SIGNATURE_HEADER

VERSION = 1
#: How a spawner event begins (see :func:`encode_spawn_event`).
SPAWN_PREFIX = b'{"fnmap": %d, "spawn": [' % VERSION


def encode_event(body: bytes, signature: str) -> bytes:
    """The Invoke payload carrying the envelope inline."""
    return json.dumps(
        {"fnmap": VERSION, "body": base64.b64encode(body).decode("ascii"), "signature": signature}
    ).encode()


def encode_reference_event(store_url: str, key: str, signature: str) -> bytes:
    """The Invoke payload naming an envelope stored under ``key`` of ``store_url``."""
    return json.dumps({"fnmap": VERSION, "store": store_url, "key": key, "signature": signature}).encode()


def encode_spawn_event(payloads: list[bytes]) -> bytes:
    """The Invoke payload of a spawner: ``payloads`` are call events (:func:`encode_event`)."""
    return SPAWN_PREFIX + b", ".join(payloads) + b"]}"


def is_spawn_event(event) -> bool:
    return isinstance(event, dict) and event.get("fnmap") == VERSION and isinstance(event.get("spawn"), list)


def spawn(event: dict, invoke, threads: int = 16) -> dict:
    """Invoke each call event of a spawner event with ``invoke(payload bytes)``, which returns None
    or ``(fault kind, message)``; answer (as :func:`encode_result`) the calls that were not invoked."""
    from concurrent.futures import ThreadPoolExecutor

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


def decode_event(event) -> tuple[bytes, str | None]:
    """Return ``(envelope, signature)``; raises ValueError for a malformed event.

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
        from ..storage import open_store

        return open_store(event["store"]).get(event["key"]), signature
    raise ValueError("the event has neither a body nor a store and key")


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
