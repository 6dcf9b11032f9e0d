"""Group-by over CSV files in storage: revenue per region, then per file with ``reduce_by_key``.

    python examples/csv_groupby.py                               # generated sales CSVs
    python examples/csv_groupby.py "s3://my-bucket/sales/*.csv"  # same columns, in a bucket

Every file has the header ``day,region,product,units,price``.  Files are cut
into line-aligned partitions; only a file's first partition sees the header,
and no row is cut or read twice, so the partial sums add up exactly.
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import tempfile
import time
from pathlib import Path

import fnmap

HEADER = ["day", "region", "product", "units", "price"]


def revenue_by_region(part) -> dict[str, list]:
    """``{region: [rows, revenue]}`` of one partition."""
    groups: dict[str, list] = {}
    rows = csv.reader(io.TextIOWrapper(part.stream(), encoding="utf-8", newline=""))
    for row in rows:
        if row == HEADER or not row:
            continue
        _day, region, _product, units, price = row
        g = groups.setdefault(region, [0, 0.0])
        g[0] += 1
        g[1] += int(units) * float(price)
    return groups


def merge(partials: list[dict[str, list]]) -> dict[str, list]:
    """Add up partial groups; it accepts its own results too, as a reduce tree needs."""
    total: dict[str, list] = {}
    for partial in partials:
        for region, (rows, revenue) in partial.items():
            g = total.setdefault(region, [0, 0.0])
            g[0] += rows
            g[1] += revenue
    return total


def make_sample(folder: Path, n_files: int = 6, rows: int = 5000, seed: int = 2) -> None:
    rng = random.Random(seed)
    regions = ["north", "south", "east", "west", "central"]
    products = {"widget": 2.5, "gadget": 9.99, "doohickey": 0.75, "gizmo": 24.0}
    for i in range(n_files):
        with open(folder / f"sales-2024-{i + 1:02d}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(HEADER)
            for _ in range(rows):
                product = rng.choice(list(products))
                writer.writerow(
                    [
                        f"2024-{i + 1:02d}-{rng.randint(1, 28):02d}",
                        rng.choice(regions),
                        product,
                        rng.randint(1, 20),
                        products[product],
                    ]
                )


def main() -> None:
    parser = argparse.ArgumentParser(description="revenue per region over CSV files in storage")
    parser.add_argument(
        "data",
        nargs="?",
        help="glob, prefix or file:// folder of CSV files (default: generated sample data)",
    )
    parser.add_argument("--chunk-kb", type=int, default=64, help="partition size in KB")
    args = parser.parse_args()

    sample = None
    data = args.data
    if data is None:
        sample = tempfile.TemporaryDirectory(prefix="fnmap-csv-")
        make_sample(Path(sample.name))
        data = Path(sample.name).as_uri() + "/*.csv"
    try:
        chunk = args.chunk_kb << 10
        started = time.perf_counter()
        by_region = fnmap.map_reduce(revenue_by_region, data, merge, obj_chunk_size=chunk)
        print(f"fnmap csv group-by over {data} ({time.perf_counter() - started:.2f} s)")
        print(f"  {'region':<10}{'rows':>8}{'revenue':>14}")
        for region, (rows, revenue) in sorted(by_region.items()):
            print(f"  {region:<10}{rows:>8}{revenue:>14,.2f}")

        per_file = fnmap.map_reduce(
            revenue_by_region, data, merge, obj_chunk_size=chunk, reduce_by_key=True
        )
        print("  revenue per file (reduce_by_key=True):")
        for url, groups in per_file.items():
            print(f"    {url.rsplit('/', 1)[1]:<24}{sum(g[1] for g in groups.values()):>14,.2f}")

        if sample is not None:  # check against reading every file whole, locally
            local = merge(
                [revenue_by_region_of_file(p) for p in sorted(Path(sample.name).iterdir())]
            )
            assert {r: g[0] for r, g in by_region.items()} == {r: g[0] for r, g in local.items()}
            assert all(abs(by_region[r][1] - local[r][1]) < 1e-6 * local[r][1] for r in local)
            print("  matches a local group-by of the same files")
    finally:
        if sample is not None:
            sample.cleanup()


def revenue_by_region_of_file(path: Path) -> dict[str, list]:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and r != HEADER]
    return merge([{r[1]: [1, int(r[3]) * float(r[4])]} for r in rows])


if __name__ == "__main__":
    main()
