"""fnmap's s3:// store where a mock and a real object store may differ, run on moto and on SeaweedFS.

Concurrent conditional writes, ranged reads at the edges of an object, listings past one page
(1,000 keys), objects over 100 MB (uploaded in parts), and the 409 ConditionalRequestConflict that
AWS S3 answers when a conflicting operation runs during a conditional write (neither server sends
it, so a small proxy on loopback injects it in front of each).

Where the servers differ (moto 5.2, SeaweedFS 4.48), and what AWS's documentation says:

* DeleteObjects with more than 1,000 keys: moto deletes them all; SeaweedFS refuses
  (InvalidArgument), as AWS does ("up to 1,000 keys").  fnmap sends 1,000 a request.
* Concurrent conditional CompleteMultipartUploads of one key: moto lets nearly all succeed,
  SeaweedFS sometimes two; AWS lets the first to finish succeed and answers 412 to the rest.
  Single conditional PUTs were exclusive on both (30 races of 16 writers each).
* A PUT to a missing bucket: moto answers NoSuchBucket (404), as AWS does; SeaweedFS, with no
  identities configured, answers AccessDenied (403).  Reads and listings say NoSuchBucket on all.
* A key with ``//`` in it: moto keeps it, as AWS does (any UTF-8 key); SeaweedFS, a file system
  underneath, stores and lists ``a//b`` as ``a/b``.  The keys fnmap lays out (fnmap/runtime/keys.py) hold
  no ``//``; a storage URL with ``//`` in its prefix would, and is left as AWS reads it.
* Concurrent conditional PUTs on SeaweedFS are answered in steps of about 1 s (measured: 412s at
  0, 1, 2, 3, 4 s), so a race of 16 writers can take seconds there; the answers are right.
"""

from __future__ import annotations

import http.client
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from botocore.exceptions import ClientError
from s3servers import *  # noqa: F403 -- the S3 server fixtures

from fnmap.data import list_objects
from fnmap.errors import StorageError, UnknownStorage
from fnmap.storage import s3 as s3_storage
from fnmap.storage.s3 import S3Store


@pytest.fixture
def store(s3_env, tmp_path) -> S3Store:
    """A fresh S3Store (its own client, its own prefix) on each S3 server."""
    bucket = s3_env("fnmap-real")
    return S3Store(f"s3://{bucket}/{tmp_path.name}")


def _race(store: S3Store, key: str, payloads: list[bytes]) -> list[bool]:
    """Every payload written with put_if_absent at once (threads released together)."""
    start = threading.Barrier(len(payloads))

    def write(data: bytes) -> bool:
        start.wait()
        return store.put_if_absent(key, data)

    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(pool.map(write, payloads))


def test_put_if_absent_under_concurrent_writers(store):
    payloads = [f"writer {i} ".encode() * 50 for i in range(16)]
    won = _race(store, "commit/result", payloads)
    assert won.count(True) == 1, won
    assert store.get("commit/result") == payloads[won.index(True)]
    assert store.put_if_absent("commit/result", b"late") is False  # and later writers lose too
    assert store.get("commit/result") == payloads[won.index(True)]


def test_put_if_absent_race_of_multipart_uploads(store, s3_env, monkeypatch):
    # Smaller parts (S3's minimum is 5 MiB) so that a race of multipart uploads stays cheap.
    monkeypatch.setattr(s3_storage, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3_storage, "PART_SIZE", 5 << 20)
    body = bytes(range(256)) * (7 << 12)  # 7 MiB: two parts
    payloads = [bytes([i]) * 16 + body for i in range(4)]
    won = _race(store, "commit/big", payloads)
    assert True in won
    assert store.get("commit/big") in [p for p, w in zip(payloads, won, strict=True) if w]  # one upload whole
    # Every upload was completed or aborted, none left behind (S3 keeps and bills their parts).
    assert not s3_env.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads")
    if won.count(True) > 1:
        # Seen with moto 5.2 (nearly always) and SeaweedFS 4.48 (about a third of races): concurrent
        # conditional CompleteMultipartUploads all succeed.  AWS: "If multiple conditional writes occur
        # for the same object name, the first write operation to finish succeeds", the rest get 412.
        pytest.xfail(f"{s3_env.server}: {won.count(True)} of 4 concurrent conditional multipart uploads won")


def test_ranged_gets_at_the_edges(store):
    data = bytes(range(256)) * 4 + b"end"
    n = len(data)
    store.put("r/obj", data)
    cases = [(0, 1), (0, n), (n - 1, n), (n - 3, n + 100), (5, 6), (255, 257), (n, n + 10), (n + 5, n + 9), (7, 7),
             (9, 3)]  # fmt: skip
    for start, end in cases:
        assert store.get_range("r/obj", start, end) == data[start:end], (start, end)
    store.put("r/empty", b"")
    assert store.get_range("r/empty", 0, 10) == b""
    assert store.get("r/empty") == b""


def _write_many(store: S3Store, server: str, keys: list[str]) -> None:
    if server == "moto":
        # moto runs in this process: its store is written directly (a PUT through its HTTP front
        # costs ~12 ms); the listing and deleting under test still go over HTTP.
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key in keys:
            backend.put_object(store.bucket, store.prefix + key, b"x")
        return
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))


def test_listing_past_one_page_of_1000_keys(store, s3_env):
    keys = [f"many/{i % 7}/{i:05d}" for i in range(1003)]  # two pages, two DeleteObjects requests
    _write_many(store, s3_env.server, keys)
    store.put("many-not/0", b"x")  # shares the string prefix "many", not the folder
    assert store.list("many/") == sorted(keys)
    assert store.list("many/3/") == sorted(k for k in keys if k.startswith("many/3/"))
    # Data inputs are listed the same way: every object once, with its size.
    listed = list_objects(f"s3://{store.bucket}/{store.prefix}many/")
    assert listed == [(f"s3://{store.bucket}/{store.prefix}{k}", 1) for k in sorted(keys)]
    store.delete(keys)  # DeleteObjects takes 1,000 keys a request
    assert store.list("many/") == []
    assert store.list("many-not/") == ["many-not/0"]


def test_object_over_100_mb_goes_up_in_parts(store, s3_env, monkeypatch):
    # By default a 100 MB object is over the threshold; the upload is tried with S3's smallest parts
    # (5 MiB) so that it stays cheap: three parts, the last one short.
    assert s3_storage.MULTIPART_THRESHOLD < 100 << 20
    monkeypatch.setattr(s3_storage, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3_storage, "PART_SIZE", 5 << 20)
    block = bytes(range(256)) * 4096  # 1 MiB with every offset distinguishable mod 256
    data = block * 10 + b"+" * 12345
    store.put("big/obj", data)
    head = s3_env.client.head_object(Bucket=store.bucket, Key=store.prefix + "big/obj")
    parts = -(-len(data) // s3_storage.PART_SIZE)
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith(f"-{parts}")  # a multipart upload's ETag
    assert store.get("big/obj") == data
    edge = s3_storage.PART_SIZE
    assert store.get_range("big/obj", edge - 3, edge + 3) == data[edge - 3 : edge + 3]
    assert store.get_range("big/obj", len(data) - 5, len(data) + 5) == data[-5:]
    assert store.put_if_absent("big/obj", data) is False
    assert not s3_env.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads")


def test_missing_bucket_is_named_not_taken_for_a_missing_key(s3_env):
    store = S3Store("s3://fnmap-never-made/p")
    reads = [lambda: store.get("k"), lambda: store.get_range("k", 0, 5), lambda: store.list("x/"),
             lambda: store.delete(["k"])]  # fmt: skip
    if s3_env.server == "moto":
        # AWS and moto answer a write to a missing bucket with NoSuchBucket; SeaweedFS (4.48), with
        # no identities configured, answers AccessDenied, which says nothing about the bucket.
        reads.append(lambda: store.put("k", b"x"))
    for operation in reads:
        with pytest.raises(UnknownStorage, match=r"bucket 'fnmap-never-made' does not exist .*aws s3 mb"):
            operation()
    assert store.exists("k") is False  # HEAD's 404 has no body to tell a missing bucket from a missing key


# -- 409 ConditionalRequestConflict ------------------------------------------------------------------


class ConflictInjector:
    """An HTTP proxy on loopback in front of an S3 server that answers the first ``conflicts``
    conditional writes (``If-None-Match`` on a PUT, or on the POST that completes a multipart upload)
    with AWS's 409 ConditionalRequestConflict, without passing
    them on; everything else is passed on unchanged (Host header included, so signatures hold)."""

    ERROR = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict</Code>'
        b"<Message>A conflicting operation occurred. Retry the request.</Message></Error>"
    )

    def __init__(self, upstream: str, conflicts: int):
        self.upstream = urlparse(upstream)
        self.conflicts = conflicts
        self.conditional_writes = 0
        self._lock = threading.Lock()
        injector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _relay(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if "If-None-Match" in self.headers and injector._take_conflict():
                    self.send_response(409)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(injector.ERROR)))
                    self.end_headers()
                    self.wfile.write(injector.ERROR)
                    return
                conn = http.client.HTTPConnection(injector.upstream.hostname, injector.upstream.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    resp = conn.getresponse()
                    payload = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _take_conflict(self) -> bool:
        with self._lock:
            self.conditional_writes += 1
            if self.conflicts > 0:
                self.conflicts -= 1
                return True
            return False

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


@pytest.fixture
def conflicting_store(s3_env, s3_server, tmp_path, monkeypatch):
    """Factory: an S3Store whose first ``conflicts`` conditional writes are answered 409."""
    bucket = s3_env("fnmap-conflicts")
    injectors: list[ConflictInjector] = []

    def make(conflicts: int) -> tuple[S3Store, ConflictInjector]:
        injector = ConflictInjector(s3_server, conflicts)
        injectors.append(injector)
        monkeypatch.setenv("FNMAP_S3_ENDPOINT_URL", injector.url)
        return S3Store(f"s3://{bucket}/{tmp_path.name}-{len(injectors)}"), injector

    yield make
    for injector in injectors:
        injector.stop()


def test_conflict_409_is_written_again_not_taken_as_lost(conflicting_store):
    # AWS: "If a conflicting operation occurs during the upload S3 returns a 409
    # ConditionalRequestConflict response. On a 409 failure you should retry the upload."
    store, injector = conflicting_store(conflicts=2)
    assert store.put_if_absent("k", b"mine") is True
    assert store.get("k") == b"mine"
    assert injector.conditional_writes == 3
    assert store.put_if_absent("k", b"second") is False  # a 412 is still "someone else wrote it"


def test_conflict_409_that_persists_is_an_error(conflicting_store):
    store, injector = conflicting_store(conflicts=1000)
    with pytest.raises(StorageError, match="ConditionalRequestConflict") as info:
        store.put_if_absent("k", b"mine")
    assert isinstance(info.value.__cause__, ClientError) and info.value.reason == "failed"
    assert injector.conditional_writes == s3_storage._CONFLICT_ATTEMPTS
    assert not store.exists("k")


def test_conflict_409_on_completing_a_multipart_upload_uploads_again(conflicting_store, s3_env, monkeypatch):
    # AWS: "On a 409 failure you should re-initiate the multipart upload with CreateMultipartUpload
    # and re-upload each part."
    monkeypatch.setattr(s3_storage, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3_storage, "PART_SIZE", 5 << 20)
    store, injector = conflicting_store(conflicts=1)
    data = bytes(range(256)) * (7 << 12)
    assert store.put_if_absent("big", data) is True
    assert store.get("big") == data
    assert injector.conditional_writes == 2
    # The upload answered 409 was aborted, not left with its parts.
    assert not s3_env.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads")
