"""Aggregate read throughput of ``fnmap.map`` over objects, as a ratio to reading them directly.

    python benchmarks/data_throughput.py                  # 1 GB of text files, emulator backend
    python benchmarks/data_throughput.py --size 256 --s3  # 256 MB in moto's S3 server on loopback

It writes ``--objects`` text objects totalling ``--size`` MB, then measures

* direct: one process on the client reads every object once, in 8 MB
  blocks (``open().read`` for files, boto3 ``get_object`` for S3);
* fnmap: ``fnmap.map(count, data, obj_chunk_size=...)`` on the emulator,
  each call streaming its partition (seeks or ranged GETs) and counting its
  lines, after a warm-up job that reads a tiny object on every worker, so the
  emulator's start-up and the workers' first boto3 client are not counted
  (the direct reader's client is made before its clock starts too).

Both read the same bytes (the files are in the page cache for both) and the
line counts must agree.  The ratio is fnmap's MB/s over direct MB/s: above 1
means the parallel map reads faster than one process can.  Prints one JSON
line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

MB = 1 << 20


def _text_block(rng: random.Random, size: int) -> bytes:
    words = [
        bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(2000)
    ]
    lines, n = [], 0
    while n < size:
        line = b" ".join(rng.choice(words) for _ in range(rng.randint(1, 16))) + b"\n"
        lines.append(line)
        n += len(line)
    return b"".join(lines)[:size]


def write_objects(put, n_objects: int, total: int, seed: int = 0) -> int:
    """Write ``n_objects`` text objects of ``total`` bytes together through ``put(name, data)``."""
    rng = random.Random(seed)
    block = _text_block(rng, 4 * MB)
    each = total // n_objects
    for i in range(n_objects):
        shift = rng.randrange(len(block))
        data = (block[shift:] + block[:shift]) * (each // len(block) + 1)
        put(f"part-{i:04d}.txt", data[:each])
    return each * n_objects


def count_lines(part) -> tuple[int, int]:
    """Bytes and lines of a partition, streamed in 8 MB reads."""
    n_bytes = n_lines = 0
    with part.stream() as f:
        while True:
            chunk = f.read(8 * MB)
            if not chunk:
                return n_bytes, n_lines
            n_bytes += len(chunk)
            n_lines += chunk.count(b"\n")


def direct_read(read_all) -> tuple[float, int, int]:
    started = time.perf_counter()
    n_bytes, n_lines = read_all()
    return time.perf_counter() - started, n_bytes, n_lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="total MB of objects (default 1024)")
    parser.add_argument("--objects", type=int, default=16, help="number of objects (default 16)")
    parser.add_argument(
        "--chunk",
        type=int,
        default=64,
        help="obj_chunk_size in MB (default 64; 0: one partition per object)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="emulator workers (default: its own)"
    )
    parser.add_argument(
        "--s3", action="store_true", help="objects in moto's S3 server instead of files"
    )
    args = parser.parse_args(argv)

    import fnmap

    work = tempfile.mkdtemp(prefix="fnmap-bench-data-")
    server = None
    try:
        os.environ.setdefault("FNMAP_STORAGE", "file://" + os.path.join(work, "store"))
        os.environ.setdefault("FNMAP_PROGRESS", "false")
        if args.s3:
            server, url, client = _start_moto()
            bucket = "fnmap-bench"
            client.create_bucket(Bucket=bucket)

            def put(name, data):
                client.put_object(Bucket=bucket, Key=f"data/{name}", Body=data)

            def read_all():
                n_bytes = n_lines = 0
                for obj in client.list_objects_v2(Bucket=bucket, Prefix="data/")["Contents"]:
                    body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
                    while chunk := body.read(8 * MB):
                        n_bytes += len(chunk)
                        n_lines += chunk.count(b"\n")
                return n_bytes, n_lines

            data_url = f"s3://{bucket}/data/"
            client.put_object(Bucket=bucket, Key="warm-up.txt", Body=b"warm\n")
            warm_url = f"s3://{bucket}/warm-up.txt"
        else:
            folder = os.path.join(work, "data")
            os.makedirs(folder)

            def put(name, data):
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(data)

            def read_all():
                n_bytes = n_lines = 0
                for name in sorted(os.listdir(folder)):
                    with open(os.path.join(folder, name), "rb") as f:
                        while chunk := f.read(8 * MB):
                            n_bytes += len(chunk)
                            n_lines += chunk.count(b"\n")
                return n_bytes, n_lines

            data_url = "file://" + folder + "/"
            with open(os.path.join(work, "warm-up.txt"), "wb") as f:
                f.write(b"warm\n")
            warm_url = "file://" + os.path.join(work, "warm-up.txt")

        t0 = time.perf_counter()
        total = write_objects(put, args.objects, args.size * MB)
        print(
            f"wrote {total / MB:.0f} MB in {args.objects} objects "
            f"in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        opts = {"workers": args.workers} if args.workers else {}
        fnmap.map(count_lines, [warm_url] * 16, **opts)  # start-up outside the measurement

        direct_s, direct_bytes, direct_lines = direct_read(read_all)
        started = time.perf_counter()
        chunk = args.chunk * MB if args.chunk else None
        job = fnmap.map(count_lines, data_url, obj_chunk_size=chunk, return_job=True, **opts)
        counts = job.results()
        fnmap_s = time.perf_counter() - started
        fnmap_bytes = sum(b for b, _ in counts)
        fnmap_lines = sum(n for _, n in counts)
        if (fnmap_bytes, fnmap_lines) != (direct_bytes, direct_lines):
            raise SystemExit(
                f"fnmap read {fnmap_bytes} bytes / {fnmap_lines} lines but the direct read "
                f"{direct_bytes} / {direct_lines}: partitions lost or duplicated data"
            )
        report = {
            "storage": "s3 (moto)" if args.s3 else "file",
            "backend": job.summary()["backend"],
            "mb": round(total / MB),
            "objects": args.objects,
            "partitions": len(counts),
            "calls": job.summary()["calls"],
            "cpus": os.cpu_count(),
            "direct_s": round(direct_s, 3),
            "direct_mb_s": round(total / MB / direct_s, 1),
            "fnmap_s": round(fnmap_s, 3),
            "fnmap_mb_s": round(total / MB / fnmap_s, 1),
            "ratio": round(direct_s / fnmap_s, 3),
        }
        print(
            f"direct read: {report['direct_mb_s']} MB/s ({direct_s:.2f} s); fnmap.map over "
            f"{report['partitions']} partitions: {report['fnmap_mb_s']} MB/s ({fnmap_s:.2f} s); "
            f"ratio {report['ratio']}",
            file=sys.stderr,
        )
        print(json.dumps(report))
        return report
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _start_moto():
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # Set before the first job, so the emulator's workers inherit the endpoint.
    os.environ.update(
        AWS_ENDPOINT_URL_S3=url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return server, url, boto3.client("s3", endpoint_url=url)


if __name__ == "__main__":
    main()
