"""``fnmap prices``: the prices cost estimates and the cost cap use; ``fnmap prices update`` fetches
current ones from the AWS Price List API (:mod:`fnmap.cost.fetch`) into the cache that
:mod:`fnmap.cost.prices` reads.  Only this command fetches prices; a map never does.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "prices",
        help="show the prices cost estimates use; `fnmap prices update` fetches current ones",
        description="Show the list prices fnmap's cost estimates and max_cost use: their date and source, "
        "AWS Lambda's GB-second (x86_64 and arm64) and request prices, S3's PUT and GET prices, and the "
        "EC2 instance types' hourly prices (AWS Batch). List prices of the first tier, without free tier "
        "or savings plans: the platform's bill is the truth. `fnmap prices update` fetches current ones.",
    )
    p.add_argument("--region", default="us-east-1", help="AWS region to show (default us-east-1)")
    p.add_argument("--json", action="store_true", help="print the prices as JSON")
    p.set_defaults(run=run_show)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    u = actions.add_parser(
        "update",
        help="fetch current prices from the AWS Price List API into the cache",
        description="Fetch current list prices from the AWS Price List API (boto3, pricing:GetProducts; "
        "needs AWS credentials, no billing permission) for AWS Lambda, S3 requests and the EC2 instance "
        "types, write them to the price cache ($XDG_CACHE_HOME/fnmap/prices.json) and print what changed. "
        "Later estimates use the cached figures over the built-in ones, region by region.",
    )
    u.add_argument("--region", action="append", dest="regions", metavar="REGION",
                   help="region to fetch; repeat for more (default: us-east-1 and boto3's configured region)")
    u.add_argument("--instance-type", action="append", dest="instance_types", metavar="TYPE",
                   help="EC2 instance type to fetch; repeat for more (default: the types fnmap knows)")
    u.set_defaults(run=run_update)


def run_show(args) -> int:
    from ..cost import prices
    from ..cost.pricing import usd

    region = args.region
    basis = prices.prices_basis()
    lam, s3 = prices.lambda_price(region), prices.s3_price(region)
    ec2 = prices.table()["ec2"].get(region)
    if args.json:
        print(json.dumps({**basis, "region": region, "lambda": vars(lam), "s3": vars(s3), "ec2": ec2,
                          "lambda_init_billed_since": prices.LAMBDA_INIT_BILLED_SINCE,
                          "sources": prices.SOURCES}, indent=2))
        return 0
    print(f"prices of {basis['date']}, from the {basis['source']}" + (f" ({basis['file']})" if basis["file"] else ""))
    print("list prices in USD, first tier, no free tier or savings plans: the platform's bill is the truth")
    print(f"\nAWS Lambda, {region}")
    print(f"  per GB-second   x86_64 {lam.gb_second_x86:.10f}   arm64 {lam.gb_second_arm:.10f}")
    print(f"  per request     {lam.request:.10f}  ({usd(lam.request * 1e6)} per million)")
    print(f"  a cold start's INIT phase is billed at the duration price since {prices.LAMBDA_INIT_BILLED_SINCE}")
    other = "" if s3.region == region else (
        f"  (us-east-1's: no figure for {region}; `fnmap prices update --region {region}`)")
    print(f"\nS3 Standard requests, {region}{other}")
    print(f"  PUT, COPY, POST, LIST  {s3.put:.10f}  ({usd(s3.put * 1000)} per 1,000)")
    print(f"  GET, SELECT            {s3.get:.10f}  ({usd(s3.get * 1000)} per 1,000)")
    print(f"\nEC2 on-demand, Linux (AWS Batch), {region}, USD per hour")
    if ec2:
        for name, hourly in ec2.items():
            print(f"  {name:<15} {hourly:.4f}")
    else:
        print(f"  no figures for {region}: `fnmap prices update --region {region}` fetches them")
    print("\nsources")
    for name, url in prices.SOURCES.items():
        print(f"  {name:<22} {url}")
    return 0


def run_update(args) -> int:
    from ..cost import fetch

    where = ", ".join(args.regions) if args.regions else "us-east-1 and the configured region"
    print(f"fetching prices for {where} from the AWS Price List API...", file=sys.stderr, flush=True)
    done = fetch.update(args.regions, args.instance_types)
    for name, old, new in done["changed"]:
        print(f"{name}: {'(none)' if old is None else f'{old:.10g}'} -> {new:.10g}")
    print(f"{len(done['changed'])} of {done['fetched']} fetched prices changed; written to {done['path']} "
          f"(dated {done['date']})")
    for line in done["missing"]:
        print(f"not fetched: {line}", file=sys.stderr)
    return 0
