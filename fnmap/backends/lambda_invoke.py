"""Lambda's Invoke without botocore's per-call machinery.

``client.invoke`` costs about a millisecond of client CPU per call: parameter validation,
serialization, the event hooks, endpoint rules, the retry handler and the response parser
run on every call, and they dominated a profile of a 2,000-call job.  A call here does only
what an Invoke needs:

* the URL is built once, as botocore builds it (the endpoint boto3 resolved, honouring
  ``AWS_ENDPOINT_URL_LAMBDA``; the function name percent-encoded);
* the request is signed with botocore's own ``SigV4Auth``, over credentials from boto3's
  chain taken per call with ``get_frozen_credentials()`` (refreshable credentials refresh);
* it is sent over one urllib3 keep-alive pool (``max_workers`` connections, boto3's CA
  bundle and environment proxies), connection errors retried by urllib3, nothing else;
* a response that is not a success is parsed by botocore's parser for Lambda's protocol,
  so error codes and messages read exactly as a ``ClientError`` would give them.
"""

from __future__ import annotations

from urllib.parse import quote

#: Retries of a connection that could not be opened (nothing was sent); urllib3 counts them.
CONNECT_RETRIES = 2


class InvokeError(Exception):
    """An answer that is not a success: ``response`` is botocore's parsed error (as in ``ClientError``)."""

    def __init__(self, response: dict):
        super().__init__(response.get("Error", {}).get("Code", ""))
        self.response = response


class LambdaInvoker:
    """Sends one function's Invoke requests; thread-safe."""

    def __init__(self, session, client, function_name: str, max_workers: int,
                 connect_timeout: float, read_timeout: float):
        import urllib3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.exceptions import NoCredentialsError
        from botocore.parsers import create_parser
        from botocore.utils import get_environ_proxies

        self._sigv4, self._request_class = SigV4Auth, AWSRequest
        meta = client.meta
        self.region = meta.region_name
        self.signing_name = meta.service_model.signing_name
        self.credentials = session.get_credentials()
        if self.credentials is None:
            raise NoCredentialsError()
        name = quote(function_name, safe="-_.~")  # as botocore renders a URI label
        self.url = f"{meta.endpoint_url.rstrip('/')}/2015-03-31/functions/{name}/invocations"
        self._operation = meta.service_model.operation_model("Invoke")
        self._parser = create_parser(meta.service_model.metadata["protocol"])
        self._user_agent = _user_agent()
        scheme = self.url.split(":", 1)[0]
        proxy = (meta.config.proxies or {}).get(scheme) or get_environ_proxies(self.url).get(scheme)
        options = {
            "maxsize": max_workers,
            "timeout": urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            "retries": urllib3.Retry(total=CONNECT_RETRIES, connect=CONNECT_RETRIES, read=0, status=0, other=0,
                                     redirect=False, raise_on_status=False),
        }
        if scheme == "https":
            options.update(cert_reqs="CERT_REQUIRED", ca_certs=_ca_bundle(session))
        manager = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
        self._manager = manager
        self._pool = manager.connection_from_url(self.url)
        self._path = self.url if proxy and scheme == "http" else "/" + self.url.split("/", 3)[3]

    def invoke(self, kind: str, payload: bytes) -> tuple[int, dict, bytes]:
        """Send one Invoke; ``(status, headers, body)`` of a success, else :class:`InvokeError`.

        urllib3's errors (``ReadTimeoutError``, ``ProtocolError``, ``MaxRetryError``, ...) propagate.
        """
        request = self._request_class("POST", self.url, data=payload, headers={
            "X-Amz-Invocation-Type": kind, "Content-Type": "application/octet-stream",
            "User-Agent": self._user_agent})
        self._sigv4(self.credentials.get_frozen_credentials(), self.signing_name, self.region).add_auth(request)
        resp = self._pool.urlopen("POST", self._path, body=payload, headers=dict(request.headers.items()),
                                  assert_same_host=False, redirect=False, preload_content=True)
        if resp.status < 300:
            return resp.status, resp.headers, resp.data
        parsed = self._parser.parse({"status_code": resp.status, "headers": dict(resp.headers.items()),
                                     "body": resp.data}, self._operation.output_shape)
        parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = resp.status
        raise InvokeError(parsed)

    def close(self) -> None:
        self._manager.clear()


def _ca_bundle(session) -> str:
    """The CA bundle boto3 verifies with: ``AWS_CA_BUNDLE`` / ``ca_bundle`` in the profile, else certifi's."""
    from botocore.httpsession import get_cert_path

    return session.get_config_variable("ca_bundle") or get_cert_path(True)


def _user_agent() -> str:
    import botocore

    from .. import __version__

    return f"fnmap/{__version__} Botocore/{botocore.__version__}"
