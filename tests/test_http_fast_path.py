"""The lean invocation paths (issue 9): keep-alive ``http.client`` posting, and the WSGI fast path."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

import fnmap
from fnmap.runtime import worker
from fnmap.runtime.http_app import create_app, in_process_execute
from fnmap.runtime.signing import SIGNATURE_HEADER, new_secret, sign
from fnmap.runtime.wire import CallRequest, encode

pytestmark = pytest.mark.timeout(120)


def square(x):
    return x * x


class _ClosingHandler(http.server.BaseHTTPRequestHandler):
    """Answers with HTTP/1.1 and no ``Connection: close``, then hangs up anyway: a stale keep-alive."""

    protocol_version = "HTTP/1.1"
    secret = b""
    connections = 0

    def setup(self):
        type(self).connections += 1
        super().setup()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status, out = worker.handle(body, self.headers.get(SIGNATURE_HEADER), self.secret)
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_http_backend_reconnects_when_the_server_drops_idle_connections():
    secret = new_secret()
    handler = type("Handler", (_ClosingHandler,), {"secret": secret.encode(), "connections": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = fnmap.map(square, range(30), backend="http", http_url=url, secret=secret, workers=2, chunksize=1)
        assert out == [x * x for x in range(30)]
        assert handler.connections >= 30
        # A connection the server dropped while idle is noticed before a request is sent on it,
        # not by that request failing (one connection fault and a retry per call without the check).
        with fnmap.Executor(backend="http", http_url=url, secret=secret, workers=1) as ex:
            for x in range(6):
                assert ex.submit(square, x).result() == x * x
                time.sleep(0.05)  # idle: the hang-up has arrived before the next call
            assert ex.job.summary()["retries"] == 0, ex.job.summary()
    finally:
        server.shutdown()
        server.server_close()


def _signed_body(store_url: str) -> bytes:
    req = CallRequest(job_id="0" * 32, call_id=0, func_key="functions/missing.pkl", store_url=store_url)
    return encode(req, b"")


def test_wsgi_fast_path_refuses_as_the_flask_views_do(tmp_path):
    secret = new_secret().encode()
    app = create_app(in_process_execute(secret))
    client = app.test_client()
    body = _signed_body(tmp_path.as_uri())
    unsigned = client.post("/invoke", data=body)
    assert unsigned.status_code == 401 and unsigned.mimetype == "text/plain"
    assert b"signature invalid" in unsigned.data
    wrong = client.post("/", data=body, headers={SIGNATURE_HEADER: "0" * 64})
    assert wrong.status_code == 403
    assert client.get("/invoke").status_code == 405  # not the fast path: Flask answers
    good = client.post("/invoke", data=body, headers={SIGNATURE_HEADER: sign(secret, body)})
    assert good.status_code == 200 and good.mimetype == "application/octet-stream"
    assert int(good.headers["Content-Length"]) == len(good.data)


def test_invocations_skip_flasks_request_machinery(tmp_path):
    """``POST /invoke`` is answered by the fast path: Flask's dispatch (and so its hooks) never runs
    for it, while every other route still goes through Flask."""
    secret = new_secret().encode()
    app = create_app(in_process_execute(secret))
    through_flask = []
    app.before_request(lambda: through_flask.append(1))
    client = app.test_client()
    body = _signed_body(tmp_path.as_uri())
    for path in ("/invoke", "/"):
        assert client.post(path, data=body, headers={SIGNATURE_HEADER: sign(secret, body)}).status_code == 200
    assert through_flask == []
    client.get("/invoke")
    assert through_flask == [1]
