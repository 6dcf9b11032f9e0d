"""HMAC-SHA256 signatures over invocation bodies.

Unpickling is code execution, so every handler verifies a request's signature
with the deployment's shared secret *before* it unpickles anything.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

SIGNATURE_HEADER = "X-Fnmap-Signature"
SECRET_ENV = "FNMAP_SECRET"


def sign(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, signature: str | None) -> bool:
    if not signature:
        return False
    return hmac.compare_digest(sign(secret, body), signature)


def new_secret() -> str:
    return secrets.token_hex(32)


def secret_from_env() -> bytes | None:
    value = os.environ.get(SECRET_ENV)
    return value.encode() if value else None
