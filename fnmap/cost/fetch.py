"""Current list prices from the AWS Price List API (boto3, ``pricing:GetProducts``), written to
the price cache that :mod:`fnmap.cost.prices` reads: what ``fnmap prices update`` runs.

Only this module fetches prices, and only when asked: a map never does.
"""

from __future__ import annotations

import datetime
import json

from ..errors import ConfigError, FnmapError
from . import prices


class PriceFetchError(FnmapError, OSError):
    """The AWS Price List API could not be asked, or refused: the message says why and the fix."""


def update(regions: list[str] | None = None, instance_types: list[str] | None = None) -> dict:
    """Fetch current prices of ``regions`` (default: us-east-1 and boto3's configured region) and
    ``instance_types`` (default: those fnmap knows) into the cache: ``{"path", "date", "fetched",
    "changed" [(name, old or None, new)], "missing"}``; :class:`PriceFetchError` when none came back."""
    client, configured = _client()
    regions = list(dict.fromkeys(regions or [prices.DEFAULT_REGION, *([configured] if configured else [])]))
    types = list(dict.fromkeys(instance_types or prices.INSTANCE_TYPES))
    before = _flat(prices.table())
    figures, missing = fetch(client, regions, types)
    if not any(figures.values()):
        raise PriceFetchError(f"the AWS Price List API returned no usable prices for {', '.join(regions)} "
                              f"({'; '.join(missing)}); the cache is unchanged")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    path = prices.write_cache(figures, today)
    after = _flat(prices.table())
    fetched = _flat(figures)
    changed = [("/".join(key), before.get(key), after[key]) for key in fetched if before.get(key) != after.get(key)]
    return {"path": path, "date": today, "fetched": len(fetched), "changed": changed, "missing": missing}


def _flat(tables: dict) -> dict[tuple, float]:
    return {(name, region, key): value for name, regions in tables.items()
            for region, values in regions.items() for key, value in values.items()}


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
