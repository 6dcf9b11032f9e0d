"""Word count over a folder or bucket of text with ``fnmap.map_reduce`` (PyWren's classic).

    python examples/wordcount.py                          # generated sample text in a temp folder
    python examples/wordcount.py s3://my-bucket/books/    # any prefix, glob or file:// folder
    python examples/wordcount.py file:///data/logs/ --chunk-mb 16

Each map call counts the words of one partition of the input -- a line-aligned
byte range of an object, read with ranged GETs (S3) or seeks (files) -- and
the reduce merges the counters as a tree, so no single call holds every
partial count.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import fnmap

WORD = re.compile(rb"[a-z']+")


def count_words(part) -> Counter:
    """Word counts of one partition (a fnmap.runtime.partition.Partition)."""
    counts: Counter = Counter()
    for line in part.stream():
        counts.update(w.decode() for w in WORD.findall(line.lower()))
    return counts


def merge(counters: list[Counter]) -> Counter:
    """Merge counters; it also accepts its own results, as a reduce tree needs."""
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    return total


def make_sample(folder: Path, n_files: int = 12, lines: int = 4000, seed: int = 1) -> None:
    """Write text files whose word frequencies follow a Zipf-like law."""
    rng = random.Random(seed)
    vocabulary = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "serverless",
        "function",
        "object",
        "storage",
        "map",
        "reduce",
        "partition",
        "bucket",
        "worker",
        "lambda",
        "emulator",
        "python",
        "data",
        "line",
        "byte",
        "range",
        "call",
        "result",
        "cloud",
        "parallel",
    ]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    for i in range(n_files):
        text = "\n".join(
            " ".join(rng.choices(vocabulary, weights, k=rng.randint(1, 14))) for _ in range(lines)
        )
        (folder / f"book-{i:02d}.txt").write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="word count over a folder or bucket of text")
    parser.add_argument(
        "data",
        nargs="?",
        help="s3://bucket/prefix/, a glob, or file:///folder/ (default: generated sample text)",
    )
    parser.add_argument("--chunk-mb", type=float, default=0.1, help="partition size in MB")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()

    sample = None
    data = args.data
    if data is None:
        sample = tempfile.TemporaryDirectory(prefix="fnmap-wordcount-")
        make_sample(Path(sample.name))
        data = Path(sample.name).as_uri() + "/"
    try:
        started = time.perf_counter()
        counts = fnmap.map_reduce(
            count_words, data, merge, reduce_fanin=8, obj_chunk_size=int(args.chunk_mb * (1 << 20))
        )
        elapsed = time.perf_counter() - started
        print(
            f"fnmap wordcount over {data}: {sum(counts.values())} words, "
            f"{len(counts)} distinct, {elapsed:.2f} s"
        )
        for word, n in counts.most_common(args.top):
            print(f"  {word:<12} {n}")
        if sample is not None:  # check against a plain local count
            local = merge(
                [
                    Counter(w.decode() for w in WORD.findall(p.read_bytes().lower()))
                    for p in sorted(Path(sample.name).iterdir())
                ]
            )
            assert counts == local, "the distributed count differs from a local count"
            print("  matches a local count of the same files")
    finally:
        if sample is not None:
            sample.cleanup()


if __name__ == "__main__":
    main()
