"""The two stores behind one interface: file:// on disk, and s3:// through boto3 against moto's server
and against SeaweedFS (a real object store)."""

from __future__ import annotations

import threading

import pytest
from s3servers import *  # noqa: F403 -- the S3 server fixtures
from s3servers import SERVERS, point_boto3_at

import fnmap
from fnmap.storage import KeyNotFound, open_store


@pytest.fixture(params=["file", *SERVERS])
def store(request, tmp_path, monkeypatch):
    """The file store, then an s3:// store on each S3 server."""
    if request.param == "file":
        return open_store((tmp_path / "store").as_uri())
    endpoint = request.getfixturevalue(f"{request.param}_server")
    point_boto3_at(endpoint, monkeypatch, request.param)("fnmap-store-test")
    return open_store(f"s3://fnmap-store-test/t-{tmp_path.name}")


def test_put_get_exists_delete(store):
    store.put("a/b/c", b"hello")
    assert store.get("a/b/c") == b"hello"
    assert store.exists("a/b/c") and not store.exists("a/b/x")
    store.put("a/b/c", b"again")
    assert store.get("a/b/c") == b"again"
    store.delete(["a/b/c", "never/was"])
    assert not store.exists("a/b/c")


def test_missing_key_is_one_error(store):
    with pytest.raises(KeyNotFound) as info:
        store.get("nope/missing")
    assert "nope/missing" in str(info.value)
    assert isinstance(info.value, KeyError)
    with pytest.raises(KeyNotFound):
        store.get_range("nope/missing", 0, 3)


def test_parts_are_written_as_one_object_and_read_back_as_a_stream(store):
    """A large argument is written as parts (no join on disk) and read with ``reader`` (each
    buffer into its own object): both must see exactly the bytes of the parts, in order."""
    parts = [b"head:", memoryview(b"middle:"), bytearray(b"tail")]
    store.put("p/one", parts)
    assert store.get("p/one") == b"head:middle:tail"
    assert store.put_if_absent("p/two", parts) and not store.put_if_absent("p/two", [b"other"])
    with store.reader("p/two") as stream:
        assert stream.read(5) == b"head:"
        assert stream.read() == b"middle:tail"
    with pytest.raises(KeyNotFound):
        store.reader("p/missing")


def test_get_range(store):
    store.put("r", b"0123456789")
    assert store.get_range("r", 2, 5) == b"234"
    assert store.get_range("r", 8, 100) == b"89"
    assert store.get_range("r", 4, 4) == b""


def test_list_finds_all_under_prefix(store):
    for i in range(30):
        store.put(f"jobs/j1/out/{i % 4}/{i}", b"x")
    store.put("jobs/j2/out/0/0", b"x")
    keys = store.list("jobs/j1/out/")
    assert len(keys) == 30 and all(k.startswith("jobs/j1/out/") for k in keys)
    assert store.list("jobs/j1/ou") == keys
    assert store.list("jobs/none/") == []


def test_put_if_absent_first_writer_wins(store):
    results = []

    def write(i):
        results.append((i, store.put_if_absent("commit/key", f"writer {i}".encode())))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results if won]
    assert len(winners) == 1
    assert store.get("commit/key") == f"writer {winners[0]}".encode()


def test_bad_keys_refused(store):
    for key in ("", "/abs", "a/../b"):
        with pytest.raises(ValueError):
            store.put(key, b"x")


def test_file_store_writes_are_atomic_no_temp_files_left(tmp_path):
    store = open_store((tmp_path / "atomic").as_uri())
    store.put("k", b"x" * 100000)
    assert [p.name for p in (tmp_path / "atomic").iterdir()] == ["k"]


def test_file_url_needs_absolute_path():
    with pytest.raises(fnmap.UnknownStorage, match="absolute"):
        open_store("file://relative/path")


def test_s3_url_needs_bucket():
    with pytest.raises(fnmap.UnknownStorage, match="bucket"):
        open_store("s3:///prefix-only")


def test_s3_endpoint_override(s3_env, monkeypatch, s3_server):
    s3_env("fnmap-override")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("FNMAP_S3_ENDPOINT_URL", s3_server)
    from fnmap.storage.s3 import S3Store

    store = S3Store("s3://fnmap-override/p")
    store.put("x", b"1")
    assert store.get("x") == b"1"


def test_map_with_s3_storage(s3_env):
    bucket = s3_env("fnmap-map-bucket")
    url = f"s3://{bucket}/runs"
    assert fnmap.map(lambda x: x + 1, range(20), storage=url, chunksize=3) == list(range(1, 21))
    keys = s3_env.client.list_objects_v2(Bucket=bucket, Prefix="runs/jobs/")["Contents"]
    assert any("/out/" in k["Key"] for k in keys)
    assert any(k["Key"].startswith("runs/functions/") for k in
               s3_env.client.list_objects_v2(Bucket=bucket, Prefix="runs/functions/")["Contents"])


def test_same_s3_url_under_another_endpoint_is_another_store(moto_server, seaweedfs_server, monkeypatch):
    servers = {"moto": moto_server, "seaweedfs": seaweedfs_server}
    for name, endpoint in servers.items():
        point_boto3_at(endpoint, monkeypatch, name)("fnmap-two-endpoints")
        open_store("s3://fnmap-two-endpoints/p").put("who", name.encode())
    for name, endpoint in servers.items():
        point_boto3_at(endpoint, monkeypatch, name)
        assert open_store("s3://fnmap-two-endpoints/p").get("who") == name.encode()
