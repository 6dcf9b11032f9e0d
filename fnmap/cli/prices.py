"""``fnmap prices``: the prices cost estimates and the cost cap use; ``fnmap prices update`` fetches
current ones from the AWS Price List API into the cache that :mod:`fnmap.observe.prices` reads (issue 36).

Only this command fetches prices; a map never does.
"""

from __future__ import annotations

import datetime
import json
import sys

from ..errors import ConfigError, FnmapError


class PriceFetchError(FnmapError, OSError):
    """The AWS Price List API could not be asked, or refused: the message says why and the fix."""


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
    from ..observe import prices

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
    print(f"  per request     {lam.request:.10f}  (${lam.request * 1e6:.2f} per million)")
    print(f"  a cold start's INIT phase is billed at the duration price since {prices.LAMBDA_INIT_BILLED_SINCE}")
    other = "" if s3.region == region else (
        f"  (us-east-1's: no figure for {region}; `fnmap prices update --region {region}`)")
    print(f"\nS3 Standard requests, {region}{other}")
    print(f"  PUT, COPY, POST, LIST  {s3.put:.10f}  (${s3.put * 1000:.4f} per 1,000)")
    print(f"  GET, SELECT            {s3.get:.10f}  (${s3.get * 1000:.5f} per 1,000)")
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
    from ..observe import prices

    client, configured = _client()
    regions = list(dict.fromkeys(args.regions or ["us-east-1", *([configured] if configured else [])]))
    types = list(dict.fromkeys(args.instance_types or prices.INSTANCE_TYPES))
    before = _flat(prices.table())
    print(f"fetching prices for {', '.join(regions)} from the AWS Price List API...", file=sys.stderr, flush=True)
    figures, missing = fetch(client, regions, types)
    if not any(figures.values()):
        raise PriceFetchError(f"the AWS Price List API returned no usable prices for {', '.join(regions)} "
                              f"({'; '.join(missing)}); the cache is unchanged")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    path = prices.write_cache(figures, today)
    after = _flat(prices.table())
    fetched = _flat(figures)
    changed = [key for key in fetched if before.get(key) != after.get(key)]
    for key in changed:
        old = before.get(key)
        print(f"{'/'.join(key)}: {'(none)' if old is None else f'{old:.10g}'} -> {after[key]:.10g}")
    print(f"{len(changed)} of {len(fetched)} fetched prices changed; written to {path} (dated {today})")
    for line in missing:
        print(f"not fetched: {line}", file=sys.stderr)
    return 0


def _flat(tables: dict) -> dict[tuple, float]:
    return {(name, region, key): value for name, regions in tables.items()
            for region, values in regions.items() for key, value in values.items()}


# -- the Price List API ---------------------------------------------------------------------------------

def _client():
    """A Price List API client (its endpoint is us-east-1's; ``AWS_ENDPOINT_URL_PRICING`` moves it) and
    the region boto3 is configured with, if any."""
    try:
        import boto3
    except ImportError as e:
        raise ConfigError("`fnmap prices update` needs boto3: pip install boto3") from e
    session = boto3.session.Session()
    return session.client("pricing", region_name="us-east-1"), session.region_name


def fetch(client, regions: list[str], instance_types: list[str]) -> tuple[dict, list[str]]:
    """Current figures for ``regions``: ``({"lambda": ..., "s3": ..., "ec2": ...}, what was not found)``."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    figures: dict = {"lambda": {}, "s3": {}, "ec2": {}}
    missing: list[str] = []
    try:
        for region in regions:
            lam = _usage_prices(_products(client, "AWSLambda", regionCode=region, productFamily="Serverless"),
                                region, {"Lambda-GB-Second": "gb_second_x86", "Lambda-GB-Second-ARM": "gb_second_arm",
                                         "Request": "request"})
            s3 = _usage_prices(_products(client, "AmazonS3", regionCode=region, productFamily="API Request"),
                               region, {"Requests-Tier1": "put", "Requests-Tier2": "get"})
            for name, found, want in (("lambda", lam, 3), ("s3", s3, 2)):
                if len(found) == want:
                    figures[name][region] = found
                else:
                    missing.append(f"{name} {region}")
            for instance_type in instance_types:
                hourly = _instance_hourly(client, instance_type, region)
                if hourly is None:
                    missing.append(f"ec2 {instance_type} in {region}")
                else:
                    figures["ec2"].setdefault(region, {})[instance_type] = hourly
    except (NoCredentialsError, PartialCredentialsError) as e:
        raise ConfigError("no AWS credentials to ask the AWS Price List API: configure some (`aws configure`, "
                          "AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; any identity allowed "
                          "pricing:GetProducts) and run `fnmap prices update` again; until then the prices "
                          "in use stay (`fnmap prices` shows them)") from e
    except ClientError as e:
        error = e.response.get("Error", {})
        raise PriceFetchError(f"the AWS Price List API refused: {error.get('Code')}: {error.get('Message')}; "
                              "the identity needs the IAM permission pricing:GetProducts") from e
    except BotoCoreError as e:
        raise PriceFetchError(f"could not ask the AWS Price List API: {e}; check the network (its endpoint is "
                              "api.pricing.us-east-1.amazonaws.com, or AWS_ENDPOINT_URL_PRICING)") from e
    return figures, missing


def _products(client, service: str, **attributes: str):
    """The products of ``service`` whose attributes match, each parsed from its PriceList JSON string."""
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in attributes.items()]
    for page in client.get_paginator("get_products").paginate(ServiceCode=service, Filters=filters,
                                                              FormatVersion="aws_v1"):
        for item in page.get("PriceList", []):
            yield json.loads(item) if isinstance(item, str) else item


def base_usage(usagetype: str) -> str:
    """A usage type without its region's prefix: ``USE2-Lambda-GB-Second`` -> ``Lambda-GB-Second``
    (us-east-1's have none; the free tier's ``Global-...`` and ``Lambda-Edge-...`` keep theirs)."""
    head, _, rest = usagetype.partition("-")
    return rest if rest and head.isupper() and head.isalnum() else usagetype


def first_tier_usd(product: dict) -> float | None:
    """The on-demand USD price per unit of a product's first tier (lowest ``beginRange``), if any."""
    tiers = []
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            try:
                tiers.append((float(dim.get("beginRange", 0)), float(dim["pricePerUnit"]["USD"])))
            except (KeyError, TypeError, ValueError):
                continue
    return min(tiers)[1] if tiers else None


def _usage_prices(products, region: str, wanted: dict[str, str]) -> dict[str, float]:
    """Field -> first-tier price, from the products of ``region`` whose usage type is in ``wanted``."""
    found = {}
    for product in products:
        attributes = product.get("product", {}).get("attributes", {})
        field = wanted.get(base_usage(attributes.get("usagetype", "")))
        price = first_tier_usd(product)
        if field and attributes.get("regionCode") == region and price and price > 0:
            found[field] = price
    return found


def _instance_hourly(client, instance_type: str, region: str) -> float | None:
    """On-demand USD per hour of an instance type in a region: Linux, shared tenancy, no software."""
    hourly = set()
    for product in _products(client, "AmazonEC2", instanceType=instance_type, regionCode=region,
                             operatingSystem="Linux", tenancy="Shared", preInstalledSw="NA", capacitystatus="Used"):
        attributes = product.get("product", {}).get("attributes", {})
        price = first_tier_usd(product)
        if (base_usage(attributes.get("usagetype", "")).startswith("BoxUsage:") and price and price > 0
                and attributes.get("instanceType") == instance_type and attributes.get("regionCode") == region):
            hourly.add(price)
    return hourly.pop() if len(hourly) == 1 else None
