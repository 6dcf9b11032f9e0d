"""AWS Signature Version 4 on the emulator's Lambda and Batch APIs: nothing runs unsigned.

These APIs run code (``Invoke``, ``CreateFunction``, ``SubmitJob``), change functions and
reveal configuration, so every request to them must be signed as AWS requires, with
credentials the emulator knows:

* its own access key (``FNMAP_EMULATOR_ACCESS_KEY_ID`` / ``FNMAP_EMULATOR_SECRET_ACCESS_KEY``,
  which :class:`~fnmap.emulator.launcher.EmulatorLauncher` sets; else the ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` of its environment, yours; else a new one it prints at start);
* the credentials of its environment (``AWS_ACCESS_KEY_ID``...), which its Lambda execution
  environments keep, so their spawners' Invokes are accepted;
* otherwise those environments get an emulated execution role's session credentials, allowed to
  Invoke only.

The signature is recomputed with botocore's own signer (:class:`botocore.auth.SigV4Auth`) over
the request as it arrived: the path and query as sent, the headers the client signed, the
SHA-256 of the body.  ``X-Amz-Date`` must be within :data:`MAX_SKEW_SECONDS` of now.  A refused
request gets AWS's error (HTTP 403, ``x-amzn-ErrorType``) and nothing else happens.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import string
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

ACCESS_KEY_ENV = "FNMAP_EMULATOR_ACCESS_KEY_ID"
SECRET_KEY_ENV = "FNMAP_EMULATOR_SECRET_ACCESS_KEY"
#: How far ``X-Amz-Date`` may be from the emulator's clock (AWS allows 15 minutes).
MAX_SKEW_SECONDS = 300
ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH_PART = re.compile(r"(Credential|SignedHeaders|Signature)=([^,\s]+)")
_HINT = ("; the fnmap emulator accepts requests signed with the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
         "it printed when it started (or that `fnmap emulator --aws` exported)")


@dataclass(frozen=True)
class Key:
    """A secret access key the emulator accepts, with its session token and what it may do."""

    secret: str
    token: str | None = None
    #: An execution role's key: Lambda's Invoke only.
    invoke_only: bool = False


@dataclass(frozen=True)
class EmulatorCredentials:
    """The emulator's own access key pair; ``generated`` when nobody gave it one (it is printed)."""

    access_key_id: str
    secret_access_key: str
    generated: bool = False

    def environment(self) -> dict:
        """What a client exports to sign with these (boto3 reads them)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}


def new_credentials(prefix: str = "AKIA") -> tuple[str, str]:
    """A fresh ``(access key id, secret access key)`` shaped as AWS's (20 and 40 characters)."""
    alphabet = string.ascii_uppercase + "234567"
    key_id = prefix + "".join(secrets.choice(alphabet) for _ in range(20 - len(prefix)))
    return key_id, secrets.token_urlsafe(30)


def take_credentials(env: dict) -> EmulatorCredentials:
    """The emulator's own credentials from ``env`` (see the module's docstring), or new ones.

    ``FNMAP_EMULATOR_*`` are removed from ``env``: the worker processes made with it never see them.
    """
    key_id, secret = env.pop(ACCESS_KEY_ENV, None), env.pop(SECRET_KEY_ENV, None)
    if key_id and secret:
        return EmulatorCredentials(key_id, secret)
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return EmulatorCredentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    return EmulatorCredentials(*new_credentials(), generated=True)


class KnownCredentials:
    """The access keys the emulator accepts, and the execution role its Lambda environments get."""

    def __init__(self, own: EmulatorCredentials, env: dict):
        self.keys: dict[str, Key] = {own.access_key_id: Key(own.secret_access_key)}
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            self.keys.setdefault(env["AWS_ACCESS_KEY_ID"], Key(env["AWS_SECRET_ACCESS_KEY"],
                                                               env.get("AWS_SESSION_TOKEN") or None))
        role_id, role_secret = new_credentials("ASIA")
        role_token = secrets.token_urlsafe(32)
        self.keys[role_id] = Key(role_secret, role_token, invoke_only=True)
        #: The execution role's session credentials, as Lambda gives them to an execution environment.
        self.role_environment = {"AWS_ACCESS_KEY_ID": role_id, "AWS_SECRET_ACCESS_KEY": role_secret,
                                 "AWS_SESSION_TOKEN": role_token}


def known_credentials(app, emulator) -> KnownCredentials:
    """The emulator's :class:`KnownCredentials`, made once per app (the Lambda and Batch APIs share them)."""
    known = app.extensions.get("fnmap_sigv4")
    if known is None:
        env = dict(getattr(emulator.pool, "env", None) or os.environ)
        own = getattr(emulator, "aws_credentials", None) or take_credentials(env)
        known = app.extensions["fnmap_sigv4"] = KnownCredentials(own, env)
    return known


class SigV4Error(Exception):
    """A request refused: answered with AWS's HTTP status and error code."""

    def __init__(self, code: str, message: str, status: int = 403):
        super().__init__(message)
        self.code, self.status = code, status


def _parse_authorization(header: str) -> tuple[list[str], list[str], str]:
    """``(credential scope parts, signed header names, signature)`` of a SigV4 ``Authorization``."""
    if not header:
        raise SigV4Error("MissingAuthenticationTokenException", "Missing Authentication Token" + _HINT)
    algorithm, _, rest = header.partition(" ")
    if algorithm != ALGORITHM:
        raise SigV4Error("IncompleteSignatureException",
                             f"Authorization header's algorithm {algorithm[:40]!r} is not {ALGORITHM}" + _HINT)
    parts = dict(_AUTH_PART.findall(rest))
    missing = [name for name in ("Credential", "SignedHeaders", "Signature") if name not in parts]
    if missing:
        raise SigV4Error("IncompleteSignatureException",
                             f"Authorization header requires the {', '.join(missing)} parameter" + _HINT)
    scope = parts["Credential"].split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise SigV4Error("IncompleteSignatureException",
                             "Credential must be ACCESS_KEY_ID/YYYYMMDD/REGION/SERVICE/aws4_request" + _HINT)
    return scope, parts["SignedHeaders"].lower().split(";"), parts["Signature"]


def _request_time(amz_date: str | None, now: datetime.datetime) -> datetime.datetime:
    if not amz_date:
        raise SigV4Error("IncompleteSignatureException",
                             "Authorization header requires existence of a signed 'X-Amz-Date' header" + _HINT)
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise SigV4Error("IncompleteSignatureException",
                             f"X-Amz-Date {amz_date[:40]!r} is not YYYYMMDDTHHMMSSZ" + _HINT) from None
    if abs((now - when).total_seconds()) > MAX_SKEW_SECONDS:
        raise SigV4Error("InvalidSignatureException",
                             f"Signature expired: {amz_date} is not within {MAX_SKEW_SECONDS // 60} minutes of "
                             f"{now.strftime('%Y%m%dT%H%M%SZ')} (the emulator's clock)")
    return when


def verify(known: KnownCredentials, service: str, method: str, target: str, headers, body: bytes,
           now: datetime.datetime | None = None) -> Key:
    """Check a request's SigV4 signature; return the key that signed it, or raise :class:`SigV4Error`.

    ``target``: the path and query as sent (``/2015-03-31/functions/f%3A1/invocations?x=1``);
    ``headers``: the request's headers (case-insensitive mapping).
    """
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    scope, signed, signature = _parse_authorization(headers.get("Authorization", ""))
    key_id, day, region, scoped_service = scope[:4]
    when = _request_time(headers.get("X-Amz-Date") if "x-amz-date" in signed else None,
                         now or datetime.datetime.now(datetime.timezone.utc))
    key = known.keys.get(key_id)
    if key is None:
        raise SigV4Error("UnrecognizedClientException",
                             "The security token included in the request is invalid" + _HINT)
    if scoped_service != service or day != when.strftime("%Y%m%d"):
        raise SigV4Error("InvalidSignatureException",
                             f"Credential should be scoped to service {service!r} and the day of X-Amz-Date")
    if "host" not in signed or any(name not in headers for name in signed):
        raise SigV4Error("IncompleteSignatureException",
                             "every signed header, 'host' included, must be in the request" + _HINT)
    claimed = headers.get("X-Amz-Content-SHA256")
    if claimed is not None and claimed != hashlib.sha256(body).hexdigest():
        raise SigV4Error("InvalidSignatureException", "X-Amz-Content-SHA256 is not the body's SHA-256")
    if key.token is not None and not hmac.compare_digest(headers.get("X-Amz-Security-Token", ""), key.token):
        raise SigV4Error("UnrecognizedClientException", "The security token included in the request is invalid")
    split = urlsplit(target if "://" in target else "http://host" + target)
    url = f"http://{headers['Host']}{split.path}" + (f"?{split.query}" if split.query else "")
    request = AWSRequest(method=method, url=url, data=body, headers={name: headers[name] for name in signed})
    request.context["timestamp"] = headers["X-Amz-Date"]
    signer = SigV4Auth(Credentials(key_id, key.secret), service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if signer.signed_headers(signer.headers_to_sign(request)) != ";".join(signed) or not hmac.compare_digest(
            expected, signature):
        raise SigV4Error("InvalidSignatureException", (
            "The request signature we calculated does not match the signature you provided. Check your AWS "
            "Secret Access Key and signing method" + _HINT))
    return key


def require_signatures(app, known: KnownCredentials, path: re.Pattern, service: str, role_may=None) -> None:
    """Refuse every request to ``app`` whose path matches ``path`` unless it is signed for ``service``
    with ``known`` credentials; an execution role's key only where ``role_may(method, path)``."""
    from flask import Response, request

    @app.before_request
    def check_signature():
        if not path.match(request.path):
            return None
        environ = request.environ
        target = environ.get("RAW_URI") or environ.get("REQUEST_URI") or (
            quote(request.path) + (f"?{environ['QUERY_STRING']}" if environ.get("QUERY_STRING") else ""))
        try:
            key = verify(known, service, request.method, target, request.headers, request.get_data())
            if key.invoke_only and not (role_may and role_may(request.method, request.path)):
                raise SigV4Error("AccessDeniedException", (
                    f"the emulated execution role may not {request.method} {request.path}: it may only invoke"))
        except SigV4Error as e:
            body = json.dumps({"Type": "User", "message": str(e)})
            return Response(body, status=e.status, mimetype="application/json", headers={"x-amzn-ErrorType": e.code})
        return None
