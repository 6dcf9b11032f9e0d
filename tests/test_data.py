"""Data in object storage (issue 7): partitions, listing, map over data, reduce trees, compression.

Partitioning and reading rules are checked as plain functions first (no
server); then against files and S3 servers on loopback (moto's, and SeaweedFS
for the ranged reads), and through the emulator.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from s3servers import *  # noqa: F403 -- the S3 server fixtures
from s3servers import point_boto3_at

import fnmap
from fnmap.data import is_data_input, list_objects, partitions
from fnmap.errors import ConfigError, KeyNotFound, UnknownStorage
from fnmap.runtime import compression, signing
from fnmap.runtime.partition import Partition, owned_blocks, split_object, split_objects
from fnmap.runtime.reduce import MapStage, ReduceStage, Stored, plan_level, tree_shape

EMU = {"workers": 2}  # small pools: the machine is shared


@pytest.fixture
def moto_env(moto_server, monkeypatch):
    """boto3 pointed at moto's server; returns a bucket maker."""
    return point_boto3_at(moto_server, monkeypatch, "moto")


@pytest.fixture(autouse=True)
def _one_emulator(moto_env):
    """Every test runs with the moto S3 environment (unless it asks for ``s3_env``), so most of the
    file shares one embedded emulator (emulators are keyed by the AWS_* environment their workers
    inherit)."""


def _lines(rng: random.Random, n: int, longest: int = 40, tail: bool = True) -> bytes:
    body = b"".join(
        rng.choice(b"abc ").to_bytes(1, "big") * rng.randint(0, longest) + b"\n" for _ in range(n)
    )
    return body + (b"x" * rng.randint(1, longest) if tail and rng.random() < 0.5 else b"")


def _pieces(data: bytes, parts: list[Partition], block: int, lookahead: int) -> list[bytes]:
    fetch = lambda a, b: data[a:b]  # noqa: E731
    return [
        b"".join(owned_blocks(fetch, len(data), p.start, p.end, block, lookahead)) for p in parts
    ]


# -- plain functions: partition boundaries -------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    line_lengths=st.lists(st.integers(0, 50), max_size=40),
    tail=st.integers(0, 20),
    chunk=st.integers(1, 120),
    block=st.integers(1, 64),
    lookahead=st.integers(1, 16),
    by_number=st.booleans(),
)
def test_partitions_never_cut_or_duplicate_a_line(
    line_lengths, tail, chunk, block, lookahead, by_number
):
    data = b"".join(b"a" * n + b"\n" for n in line_lengths) + b"t" * tail
    if by_number:
        parts = split_object("u", len(data), chunk_number=chunk)
    else:
        parts = split_object("u", len(data), chunk_size=chunk)
    pieces = _pieces(data, parts, block, lookahead)
    assert b"".join(pieces) == data  # every byte once, in order
    nonempty = [piece for piece in pieces if piece]
    assert all(piece.endswith(b"\n") for piece in nonempty[:-1])  # whole lines only
    starts = [0] + [i + 1 for i, c in enumerate(data) if c == 10 and i + 1 < len(data)]
    # Each partition holds exactly the lines that start in it.
    for p, piece in zip(parts, pieces, strict=True):
        owned = [s for s in starts if p.start <= s < p.end]
        assert piece.count(b"\n") + (1 if piece and not piece.endswith(b"\n") else 0) == len(owned)


def test_split_object_shapes():
    assert [(p.start, p.end) for p in split_object("u", 10, chunk_size=4)] == [
        (0, 4),
        (4, 8),
        (8, 10),
    ]
    assert [(p.start, p.end) for p in split_object("u", 10, chunk_number=3)] == [
        (0, 4),
        (4, 8),
        (8, 10),
    ]
    assert [(p.start, p.end, p.parts) for p in split_object("u", 10)] == [(0, 10, 1)]
    # An empty object is one empty partition; an object smaller than a chunk is one partition.
    assert [(p.start, p.end) for p in split_object("u", 0, chunk_size=4)] == [(0, 0)]
    assert [(p.start, p.end) for p in split_object("u", 3, chunk_size=100)] == [(0, 3)]
    assert len(split_object("u", 2, chunk_number=5)) == 2
    assert split_object("u", 0)[0].whole


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"chunk_size": 0}, "obj_chunk_size=0 must be a positive integer"),
        ({"chunk_number": -1}, "obj_chunk_number=-1"),
        ({"chunk_size": 1.5}, "obj_chunk_size=1.5"),
        ({"chunk_size": 4, "chunk_number": 2}, "pass one of them"),
    ],
)
def test_bad_chunk_options_are_named(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        split_object("u", 10, **kwargs)


def test_reduce_tree_plan():
    assert tree_shape(100, 4) == [25, 7, 2, 1]
    assert tree_shape(64, 64) == [1]
    assert tree_shape(65, 64) == [2, 1]
    assert tree_shape(100, None) == [1]
    assert plan_level(0, 4) == [range(0)]
    assert plan_level(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]


def test_stages_keep_large_values_in_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("FNMAP_SECRET", "stage-test-secret")  # stored values are sealed with the job's secret
    url = tmp_path.as_uri()
    stage = MapStage(lambda n: "v" * n, url)
    assert stage(("jobs/j/blobs/map/0", 10)) == "v" * 10  # small: travels back inline
    ref = stage(("jobs/j/blobs/map/1", 5000))
    assert isinstance(ref, Stored) and (tmp_path / "jobs" / "j" / "blobs" / "map" / "1").is_file()
    reduce = ReduceStage(lambda values: sorted(len(v) for v in values), url)
    assert reduce((None, ["v" * 10, ref])) == [10, 5000]  # the reducer fetches the stored value


def test_compression_round_trip():
    big = pickle.dumps(list(range(50_000)), protocol=5)
    packed = compression.pack(big)
    assert packed.startswith(compression.MAGIC) and len(packed) < len(big)
    assert compression.unpack(packed) == big
    noise = os.urandom(200_000)
    assert compression.pack(noise) is noise  # incompressible data is left alone
    assert compression.pack(b"small") == b"small"
    assert compression.unpack(memoryview(big)) == big


def test_partitioning_50000_objects_is_fast():
    objects = [(f"s3://b/k/{i:06d}", (i * 7919) % 300_000) for i in range(50_000)]
    started = time.perf_counter()
    parts = split_objects(objects, chunk_size=64 << 10)
    elapsed = time.perf_counter() - started
    assert len(parts) == sum(max(1, -(-size // (64 << 10))) for _, size in objects)
    assert elapsed < 5, f"splitting 50,000 objects took {elapsed:.2f} s"


def test_is_data_input():
    assert is_data_input("s3://b/p/") and is_data_input("file:///tmp/x")
    assert is_data_input(["s3://b/a", "file:///tmp/b"])
    assert not is_data_input(["s3://b/a", "plain"])
    assert not is_data_input("http://example.com/x")
    assert not is_data_input(iter(["s3://b/a"]))  # a generator passes the strings themselves
    assert not is_data_input([])


# -- files -----------------------------------------------------------------------------


@pytest.fixture
def text_dir(tmp_path):
    rng = random.Random(7)
    (tmp_path / "sub").mkdir()
    contents = {
        "a.csv": _lines(rng, 200),
        "b.csv": _lines(rng, 50, longest=500),  # lines longer than the chunks
        "empty.csv": b"",
        "small.txt": b"one line\n",
        "sub/c.csv": _lines(rng, 30),
    }
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path, contents


def test_file_partitions_read_every_line_once(text_dir):
    root, contents = text_dir
    parts = partitions(root.as_uri(), obj_chunk_size=97)
    by_url: dict[str, list[bytes]] = {}
    for p in parts:
        with p.stream() as f:
            by_url.setdefault(p.url, []).append(f.read())
    assert {u.split(root.name + "/", 1)[1]: b"".join(v) for u, v in by_url.items()} == contents
    empty = [p for p in parts if p.url.endswith("empty.csv")]
    small = [p for p in parts if p.url.endswith("small.txt")]
    assert [(p.start, p.end) for p in empty] == [(0, 0)] and empty[0].read() == b""
    assert len(small) == 1 and small[0].read() == b"one line\n"
    # The stream is a real binary file object: line iteration works and stops at the range end.
    part = next(p for p in parts if p.url.endswith("a.csv") and p.part == 1)
    with part.stream(block=16) as f:
        lines = list(f)
    assert lines and all(line.endswith(b"\n") for line in lines)
    assert b"".join(lines) == part.read()


def test_file_globs_and_lists(text_dir):
    root, contents = text_dir
    base = root.as_uri()
    assert [u.rsplit("/", 1)[1] for u, _ in list_objects(base + "/*.csv")] == [
        "a.csv",
        "b.csv",
        "empty.csv",
    ]
    assert len(list_objects(base + "/**.csv")) == 4
    assert [s for _, s in list_objects([base + "/small.txt", base + "/a.csv"])] == [
        9,
        len(contents["a.csv"]),
    ]
    with pytest.raises(KeyNotFound, match="no objects match"):
        list_objects(base + "/*.parquet")
    with pytest.raises(KeyNotFound, match="missing.txt does not exist"):
        list_objects([base + "/missing.txt"])
    with pytest.raises(UnknownStorage, match="'gs'"):
        list_objects("gs://bucket/x")


def test_partition_loads_on_a_worker_without_the_client(text_dir):
    root, contents = text_dir
    part = partitions(root.as_uri() + "/a.csv", obj_chunk_number=3)[1]
    script = (
        "import pickle, sys; p = pickle.loads(sys.stdin.buffer.read()); data = p.read(); "
        "client = [m for m in ('fnmap.api', 'fnmap.client', 'fnmap.data', 'boto3') "
        "if m in sys.modules]; "
        "print(len(data), client)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(part),
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.decode().split() == [str(len(part.read())), "[]"]


def test_map_and_map_reduce_over_files(text_dir):
    root, contents = text_dir
    counts = fnmap.map(
        lambda p: p.read().count(b"\n"), root.as_uri() + "/", obj_chunk_size=200, **EMU
    )
    assert sum(counts) == sum(d.count(b"\n") for d in contents.values())
    by_key = fnmap.map_reduce(
        lambda p: len(p.read()),
        root.as_uri(),
        sum,
        obj_chunk_size=100,
        reduce_by_key=True,
        reduce_fanin=3,
        **EMU,
    )
    assert {u.split(root.name + "/", 1)[1]: n for u, n in by_key.items()} == {
        k: len(v) for k, v in contents.items()
    }


def test_option_errors_name_the_value():
    with pytest.raises(ConfigError, match="obj_chunk_size/obj_chunk_number split objects"):
        fnmap.map(len, [[1], [2]], obj_chunk_size=10)
    with pytest.raises(ConfigError, match="reduce_by_key=True"):
        fnmap.map_reduce(len, [[1]], sum, reduce_by_key=True)
    with pytest.raises(ConfigError, match="reduce_fanin=1 must be an integer >= 2"):
        fnmap.map_reduce(len, [[1]], sum, reduce_fanin=1)
    with pytest.raises(TypeError, match="storage URL such as"):
        fnmap.map(len, "not a url")


# -- map_reduce: the tree -----------------------------------------------------------------


def _padded(x):
    return [x] * 200  # pickles above the inline limit, so map outputs go through storage


def test_tree_reduce_over_100_map_outputs(tmp_path):
    fanin = 4

    def merge(parts):
        if len(parts) > fanin:
            raise AssertionError(
                f"a reducer got {len(parts)} inputs, more than reduce_fanin={fanin}"
            )
        return [v for part in parts for v in part]

    storage = tmp_path.as_uri()
    job = fnmap.map_reduce(
        _padded,
        range(100),
        merge,
        reduce_fanin=fanin,
        chunksize=10,
        storage=storage,
        return_job=True,
        **EMU,
    )
    result = job.results()[0]
    assert sorted(result) == sorted(v for x in range(100) for v in _padded(x))
    assert len(job.run.calls) == 1  # the root level
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and "/blobs/" in p.as_posix()]
    assert leftovers == []  # intermediate values are deleted once consumed
    # Small outputs stay inline and the shape is the same.
    assert (
        fnmap.map_reduce(lambda x: x, range(100), sum, reduce_fanin=fanin, chunksize=10, **EMU)
        == 4950
    )


def test_map_reduce_raises_a_map_error_as_its_type():
    def boom(x):
        if x == 7:
            raise KeyError("seven")
        return x

    with pytest.raises(KeyError, match="seven") as info:
        fnmap.map_reduce(boom, range(10), sum, chunksize=5, **EMU)
    assert any("item 7" in note for note in getattr(info.value, "__notes__", []))


def test_reduce_error_in_the_tree_is_raised_as_its_type():
    def merge(values):
        if sum(values) > 40:
            raise OverflowError(f"too big: {sum(values)}")
        return sum(values)

    with pytest.raises(OverflowError, match="too big"):
        fnmap.map_reduce(lambda x: x, range(20), merge, reduce_fanin=5, chunksize=5, **EMU)


def test_large_results_are_compressed_in_storage(tmp_path):
    job = fnmap.map(
        lambda n: "x" * n, [3_000_000], storage=tmp_path.as_uri(), return_job=True, **EMU
    )
    assert job.results() == ["x" * 3_000_000]
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and "/out/" in p.as_posix()]
    assert len(stored) == 1
    sealed = stored[0].read_bytes()  # the result's MAC, then the compressed pickle
    assert sealed.startswith(signing.SEALED_MAGIC) and stored[0].stat().st_size < 100_000
    assert sealed[len(signing.SEALED_MAGIC) + 32:].startswith(compression.MAGIC)  # after the SHA-256 MAC


def test_results_on_a_local_folder_are_compressed_only_where_they_shrink_several_times(tmp_path):
    """A chunk of small ints' results (a pickle that zlib halves) is written as it is to a ``file://``
    store, where the worker writes to the reader's own disk: compressing it cost more than it saved."""
    job = fnmap.map(abs, range(60_000), chunksize=60_000, storage=tmp_path.as_uri(), return_job=True, **EMU)
    assert job.results() == list(range(60_000))
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and "/out/" in p.as_posix()]
    assert len(stored) == 1
    sealed = stored[0].read_bytes()
    assert not sealed[len(signing.SEALED_MAGIC) + 32:].startswith(compression.MAGIC)


def test_compression_bar_by_where_the_result_goes():
    """The same data that travels (S3) is compressed; to a local folder it is not (it only halves);
    data that shrinks many times is compressed for both."""
    halves = pickle.dumps(list(range(100_000)), protocol=5)
    assert compression.worth_it("file:///tmp/fnmap") == compression.LOCAL_WORTH_IT
    assert compression.worth_it("s3://bucket/prefix") == compression.WORTH_IT
    assert compression.pack(halves, worth=compression.worth_it("s3://bucket/prefix")).startswith(compression.MAGIC)
    assert compression.pack(halves, worth=compression.worth_it("file:///tmp/fnmap")) is halves
    repeated = b"x" * 300_000
    assert compression.pack(repeated, worth=compression.LOCAL_WORTH_IT).startswith(compression.MAGIC)

# -- S3 (moto and SeaweedFS on loopback) ------------------------------------------------------------------


def test_s3_partitions_through_ranged_gets(s3_env):
    bucket = s3_env("data-ranges")
    rng = random.Random(3)
    contents = {
        f"logs/{i}.log": _lines(rng, rng.randint(0, 60), longest=rng.choice([5, 80, 400]))
        for i in range(8)
    }
    contents["logs/empty.log"] = b""
    for key, data in contents.items():
        s3_env.client.put_object(Bucket=bucket, Key=key, Body=data)
    s3_env.client.put_object(
        Bucket=bucket, Key="logs/folder/", Body=b""
    )  # a folder marker: skipped
    for opts in ({"obj_chunk_size": 1500}, {"obj_chunk_number": 3}, {}):
        got: dict[str, bytes] = {}
        for p in partitions(f"s3://{bucket}/logs/", **opts):
            with p.stream(block=4096) as f:  # small blocks: several ranged GETs per partition
                got[p.url] = got.get(p.url, b"") + f.read()
        assert got == {f"s3://{bucket}/{k}": v for k, v in contents.items()}, opts
    assert len(list_objects(f"s3://{bucket}/logs/*.log")) == 9
    assert len(list_objects([f"s3://{bucket}/logs/1.log", f"s3://{bucket}/logs/2.log"])) == 2
    with pytest.raises(KeyNotFound, match="end it with '/'"):
        list_objects(f"s3://{bucket}/logs")
    with pytest.raises(KeyNotFound, match="no objects match"):
        list_objects(f"s3://{bucket}/nothing/")


def test_s3_prefix_with_5000_objects(moto_env):
    bucket = moto_env("data-many")
    keys = [f"many/{i:05d}.txt" for i in range(5000)]
    _seed_moto(bucket, {k: k.encode() + b"\n" for k in keys})
    started = time.perf_counter()
    parts = partitions(f"s3://{bucket}/many/", obj_chunk_size=1 << 20)
    elapsed = time.perf_counter() - started
    assert [p.url for p in parts] == [
        f"s3://{bucket}/{k}" for k in keys
    ]  # key order, no duplicates
    assert elapsed < 30, f"listing and partitioning 5,000 objects took {elapsed:.1f} s"
    # Dispatch every partition (1,000 per call); read a sample of them on the workers.
    sizes = fnmap.map(
        lambda p: len(p.read()) if p.url.endswith("00.txt") else p.size,
        parts,
        chunksize=1000,
        **EMU,
    )
    assert sum(sizes) == sum(len(k) + 1 for k in keys)


def _seed_moto(bucket: str, objects: dict[str, bytes]) -> None:
    """Write objects straight into the moto server's store (it runs in this process).

    5,000 PUTs through moto's HTTP front take ~40 s on a loaded 2-core box; seeding
    its backend takes under a second.  Everything fnmap does still goes over HTTP.
    """
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, data in objects.items():
        backend.put_object(bucket, key, data)


def test_word_count_over_s3_with_map_reduce(s3_env):
    bucket = s3_env("data-words")
    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta"]
    expected: Counter = Counter()
    for i in range(6):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 9))) for _ in range(300)]
        expected.update(w for line in lines for w in line.split())
        s3_env.client.put_object(Bucket=bucket, Key=f"text/{i}.txt", Body="\n".join(lines).encode())

    def count(part):
        c: Counter = Counter()
        for line in part.stream():
            c.update(line.decode().split())
        return c

    total = fnmap.map_reduce(
        count,
        f"s3://{bucket}/text/*.txt",
        lambda cs: sum(cs, Counter()),
        obj_chunk_size=1500,
        reduce_fanin=4,
        **EMU,
    )
    assert total == expected
