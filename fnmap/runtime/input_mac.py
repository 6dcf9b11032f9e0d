"""How a call's stored input is authenticated: its SHA-256, or an AES-GMAC tag made with the secret.

A worker checks a stored input before unpickling it against what its key names (the key travels
in the signed request).  Two forms of name:

* ``<64 hex digits>``: the SHA-256 of the bytes.  Any worker can check it; the form for workers
  that run elsewhere (a Lambda function's zip carries no compiled libraries).
* ``g<24 hex digits of nonce><32 hex digits of tag>``: an AES-GMAC tag over the bytes (AES-GCM
  with the bytes as associated data and nothing to encrypt), under a key derived from the
  deployment's secret and the job id.  On this kind of machine SHA-256 (with the CPU's SHA
  instructions) takes 0.85 ms per MB and GMAC (AES and carry-less multiply instructions) 0.19 ms,
  paid once by the client and once by the worker: 1.3 ms of a 1 MB call's 3.9 ms of CPU.  Used
  where the workers run with the client's installation (the emulator, ``local``).

Why the tag is as strong as the digest here: the key is ``HMAC-SHA256(secret, "fnmap-input-gmac" |
job id)`` cut to 128 bits, so it is unknown to anyone without the secret and differs per job; the
96-bit nonce is random per stored input (a job would need about 2^48 inputs for an even chance of
one repeat, the only misuse GCM's authentication does not survive); a forgery without the key
succeeds with probability about (length in 16-byte blocks) / 2^128 per try.  The comparison is
constant-time (``finalize`` of the ``cryptography`` package's GCM decryptor).
"""

from __future__ import annotations

import hashlib
import hmac
import os

#: The first character of a GMAC name (a SHA-256 name is hex digits only).
GMAC_MARK = "g"
_NONCE, _TAG = 12, 16
GMAC_NAME_LENGTH = 1 + 2 * (_NONCE + _TAG)
SHA256_NAME_LENGTH = 64


def _job_key(secret: bytes, job_id: str) -> bytes:
    return hmac.new(secret, b"fnmap-input-gmac\n" + job_id.encode(), hashlib.sha256).digest()[:16]


def _gcm(key: bytes, nonce: bytes, tag: bytes | None = None):
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    cipher = Cipher(algorithms.AES(key), modes.GCM(nonce, tag, min_tag_length=_TAG))
    return cipher.encryptor() if tag is None else cipher.decryptor()


def name(parts: list, secret: bytes | None = None, job_id: str | None = None) -> str:
    """The name of the bytes ``parts`` make, one after another: a GMAC name under the job's key
    when ``secret`` is given, else their SHA-256."""
    if secret is None:
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        return digest.hexdigest()
    nonce = os.urandom(_NONCE)
    tagger = _gcm(_job_key(secret, job_id), nonce)
    for part in parts:
        tagger.authenticate_additional_data(part)
    tagger.finalize()
    return GMAC_MARK + nonce.hex() + tagger.tag.hex()


def is_name(text: str) -> bool:
    """Whether ``text`` is a name :func:`name` makes (either form)."""
    if len(text) == SHA256_NAME_LENGTH:
        return _is_hex(text)
    return len(text) == GMAC_NAME_LENGTH and text[0] == GMAC_MARK and _is_hex(text[1:])


_HEX_DIGITS = frozenset("0123456789abcdef")


def _is_hex(text: str) -> bool:
    return _HEX_DIGITS.issuperset(text)


class Checker:
    """Takes the bytes of a stored input as they are read (``update``); ``matches()`` says whether
    they are what ``expected`` (a :func:`name`) names, for the job ``job_id`` under ``secret``."""

    def __init__(self, expected: str, secret: bytes | None, job_id: str | None):
        self._expected = expected
        if expected.startswith(GMAC_MARK) and len(expected) == GMAC_NAME_LENGTH:
            if secret is None or job_id is None:
                raise ValueError("a GMAC-named input is checked with the secret and the job id")
            raw = bytes.fromhex(expected[1:])
            self._gmac, self._sha = _gcm(_job_key(secret, job_id), raw[:_NONCE], raw[_NONCE:]), None
        else:
            self._gmac, self._sha = None, hashlib.sha256()

    def update(self, data) -> None:
        if self._gmac is not None:
            self._gmac.authenticate_additional_data(data)
        else:
            self._sha.update(data)

    def matches(self) -> bool:
        if self._gmac is None:
            return hmac.compare_digest(self._sha.hexdigest(), self._expected)
        from cryptography.exceptions import InvalidTag

        try:
            self._gmac.finalize()
        except InvalidTag:
            return False
        return True
