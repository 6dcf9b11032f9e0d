"""Every price fnmap knows, dated and sourced: AWS Lambda, S3 requests, EC2 instances (AWS Batch).

Two layers:

* **Built-in tables** below, checked on :data:`PRICES_DATE` against the sources in :data:`SOURCES`.
* **A cache** that ``fnmap prices update`` writes from AWS's Price List API
  (``$XDG_CACHE_HOME/fnmap/prices.json``, by default ``~/.cache/fnmap/prices.json``).  Its figures
  take precedence region by region; a region or instance type it lacks keeps the built-in figure.
  The file is read on first use and again whenever it changes; a corrupt or foreign file is
  ignored with one warning, never an error in the middle of a map.

Prices are never fetched here, and so never during a map: only the command fetches.

The figures are list prices of the first tier (no free tier, no savings plans, no volume tiers,
no taxes); the platform's own bill is the truth.  Ask through the functions, not the tables, so
that an updated cache is seen:

>>> lambda_price("us-east-1").request  # doctest: +SKIP
2e-07
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import warnings
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from ..runtime import forks

#: When the built-in tables were last checked against their sources.
PRICES_DATE = "2026-12-06"
#: Since this date AWS bills the INIT phase (a cold start's initialization) of on-demand Lambda
#: functions, ZIP packages with managed runtimes included, at the duration (GB-second) price: a
#: cold call's billed duration is its INIT time plus its handler time.  Source: SOURCES["lambda_init"].
LAMBDA_INIT_BILLED_SINCE = "2025-08-01"
#: The region whose figures stand in where a table has no figure of its own (S3 only, see s3_price).
DEFAULT_REGION = "us-east-1"

#: Where each figure comes from (name -> URL).  The AWS pages are the primary sources; the two
#: ``crosscheck_*`` entries are third-party readings of AWS's price list that the figures were
#: compared with on PRICES_DATE (the pricing pages render their regional tables with scripts).
SOURCES: dict[str, str] = {
    "lambda": "https://aws.amazon.com/lambda/pricing/",
    "lambda_init": "https://aws.amazon.com/blogs/compute/aws-lambda-standardizes-billing-for-init-phase/",
    "s3": "https://aws.amazon.com/s3/pricing/",
    "ec2": "https://aws.amazon.com/ec2/pricing/on-demand/",
    "price_list_api": "https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-price-list-query-api.html",
    # us-east-1 Lambda GB-s/request and S3 Tier1/Tier2 prices, read from AWS's offer files on 2026-09-06.
    "crosscheck_price_list": "https://github.com/ocelhq/ocel/blob/main/docs/research/price-book.md",
    # us-east-1 on-demand prices of the GPU types (g4dn, g5, g6, p4d after AWS's June 2025 cut), March 2026.
    "crosscheck_gpu": "https://instances.vantage.sh/",
}

#: The source named by prices_basis() for each layer.
BUILT_IN = "built-in tables"
PRICE_LIST_API = "AWS Price List API"
#: The ``format`` of the cache file; any other value is a foreign file.
CACHE_FORMAT = "fnmap-prices/1"


class UnknownPrice(ConfigError):
    """No price is known for a region or an instance type; the message lists the known ones and the fix."""


@dataclass(frozen=True)
class LambdaPrice:
    """AWS Lambda list prices of one region, in USD: per GB-second (first tier) and per request."""

    gb_second_x86: float
    gb_second_arm: float
    request: float


@dataclass(frozen=True)
class S3Price:
    """S3 Standard request prices of one region, in USD per request.

    ``put``: PUT, COPY, POST, LIST; ``get``: GET, SELECT and the other requests.  ``region``: the
    region the figures are of, which is ``us-east-1`` where fnmap has no figure of the asked region's
    own (see :func:`s3_price`)."""

    put: float
    get: float
    region: str = DEFAULT_REGION


# -- the built-in tables (checked PRICES_DATE) -------------------------------------------------------

#: Lambda's standard price, most regions: x86 $0.0000166667 and Arm $0.0000133334 per GB-second for the
#: first 6 billion (x86) / 7.5 billion (Arm) GB-seconds a month, $0.20 per million requests (SOURCES
#: "lambda"; the same three figures in the us-east-1 price list, SOURCES "crosscheck_price_list").
_STANDARD = LambdaPrice(0.0000166667, 0.0000133334, 0.0000002)
_STANDARD_REGIONS = (
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1",
    "eu-central-1", "eu-west-1", "eu-west-2", "eu-west-3", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
    "sa-east-1",
)
#: Region -> Lambda prices.  The regions priced above the standard (SOURCES "lambda"): Arm duration is
#: 20% below x86 there as everywhere, hence 0.00001768 and 0.00002292 (the 2025-06 table rounded the
#: first to 0.0000177 and had 0.0000229 for the second).
_LAMBDA: dict[str, LambdaPrice] = {
    **dict.fromkeys(_STANDARD_REGIONS, _STANDARD),
    "af-south-1": LambdaPrice(0.0000221, 0.00001768, 0.00000028),
    "ap-east-1": LambdaPrice(0.00002865, 0.00002292, 0.00000028),
    "eu-south-1": LambdaPrice(0.0000195172, 0.0000156138, 0.00000023),
    "me-south-1": LambdaPrice(0.0000206667, 0.0000165334, 0.00000025),
}

#: Region -> S3 Standard request prices: $0.005 per 1,000 PUT/COPY/POST/LIST and $0.0004 per 1,000
#: GET/SELECT in us-east-1 (SOURCES "s3"; usage types Requests-Tier1 / Requests-Tier2 in the price list,
#: SOURCES "crosscheck_price_list").  Other regions have figures of their own (a few are dearer), not
#: checked here: they use us-east-1's until ``fnmap prices update --region R`` fetches theirs.
_S3: dict[str, S3Price] = {
    "us-east-1": S3Price(0.000005, 0.0000004, "us-east-1"),
}

#: Region -> EC2 instance type -> on-demand USD per hour, Linux, shared tenancy (what AWS Batch jobs
#: run on; SOURCES "ec2").  The GPU types were compared with SOURCES "crosscheck_gpu" (March 2026):
#: p4d.24xlarge is $21.96 since AWS's June 2025 price cut on P4 and P5 (it was $32.7726).
_EC2: dict[str, dict[str, float]] = {
    "us-east-1": {
        "c5.large": 0.085,
        "c5.xlarge": 0.17,
        "m5.large": 0.096,
        "m5.xlarge": 0.192,
        "g4dn.xlarge": 0.526,
        "g4dn.2xlarge": 0.752,
        "g5.xlarge": 1.006,
        "g5.2xlarge": 1.212,
        "g6.xlarge": 0.8048,
        "p3.2xlarge": 3.06,
        "p4d.24xlarge": 21.96,
    },
}

#: The instance types ``fnmap prices update`` asks the Price List API for.
INSTANCE_TYPES = tuple(_EC2["us-east-1"])


# -- the cache ----------------------------------------------------------------------------------------

def cache_path() -> str:
    """Where ``fnmap prices update`` writes its figures: ``$XDG_CACHE_HOME/fnmap/prices.json``.

    The same cache folder as the default storage (:func:`fnmap.storage.default_storage_url`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "fnmap", "prices.json")


class _Tables:
    """The figures in use: the cache's over the built-in ones."""

    def __init__(self, cache: dict | None = None, path: str | None = None):
        cache = cache or {}
        self.lambda_ = {**_LAMBDA, **{r: LambdaPrice(**v) for r, v in cache.get("lambda", {}).items()}}
        self.s3 = {**_S3, **{r: S3Price(v["put"], v["get"], r) for r, v in cache.get("s3", {}).items()}}
        self.ec2 = {r: dict(types) for r, types in _EC2.items()}
        for region, types in cache.get("ec2", {}).items():
            self.ec2.setdefault(region, {}).update(types)
        self.basis = {"date": cache.get("date", PRICES_DATE), "source": cache.get("source", BUILT_IN),
                      "file": path if cache else None}

    def regions(self) -> list[str]:
        return sorted(set(self.lambda_) | set(self.s3) | set(self.ec2))


_lock = threading.Lock()


@forks.at_fork
def _new_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent writing a job record at the fork,
    which prices it, held the old one: the child's first record would wait for ever)."""
    global _lock
    _lock = threading.Lock()
_state: dict = {"key": None, "tables": _Tables()}


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_cache(data) -> str | None:
    """What is wrong with a cache file's content, or None when it is one of ours and whole."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return f"it is not a fnmap price cache (no \"format\": \"{CACHE_FORMAT}\")"
    if not isinstance(data.get("date"), str) or not isinstance(data.get("source"), str):
        return "it has no date or source"
    fields = {"lambda": ("gb_second_x86", "gb_second_arm", "request"), "s3": ("put", "get")}
    for table, names in fields.items():
        for region, figures in (data.get(table) or {}).items():
            if not isinstance(figures, dict) or set(figures) != set(names) or not all(
                    _positive(figures[n]) for n in names):
                return f"its {table} figures of {region!r} are not {', '.join(names)} as positive numbers"
    for region, types in (data.get("ec2") or {}).items():
        if not isinstance(types, dict) or not all(_positive(v) for v in types.values()):
            return f"its ec2 figures of {region!r} are not positive USD per hour"
    return None


def _load(path: str) -> _Tables:
    """The tables with the cache at ``path`` over them; a bad file warns (once per version) and is ignored."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        problem = _check_cache(data)
    except (OSError, ValueError) as e:
        problem = f"it cannot be read as JSON ({type(e).__name__}: {e})"
    if problem is None:
        return _Tables(data, path)
    warnings.warn(f"fnmap: ignoring the price cache {path}: {problem}; using the built-in prices of "
                  f"{PRICES_DATE}. Run `fnmap prices update` to fetch current prices, or delete the file.",
                  RuntimeWarning, stacklevel=4)
    return _Tables()


def _tables() -> _Tables:
    """The tables in use, the cache re-read whenever its file changed (one stat per call)."""
    path = cache_path()
    try:
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        key = (path, None)
    with _lock:
        if _state["key"] != key:
            _state["tables"] = _Tables() if key[1] is None else _load(path)
            _state["key"] = key
        return _state["tables"]


def _fix(region: str | None = None) -> str:
    where = f" --region {region}" if region else ""
    return (f"run `fnmap prices update{where}` to fetch it from the AWS Price List API "
            f"(cached in {cache_path()})")


# -- the API ------------------------------------------------------------------------------------------

def lambda_price(region: str) -> LambdaPrice:
    """AWS Lambda's list prices in ``region`` (USD per GB-second on x86_64 and arm64, per request).

    >>> lambda_price("eu-west-1").gb_second_arm  # doctest: +SKIP
    1.33334e-05
    """
    tables = _tables()
    price = tables.lambda_.get(region)
    if price is None:
        raise UnknownPrice(f"no AWS Lambda price for region {region!r}; known regions: "
                           f"{', '.join(sorted(tables.lambda_))}; {_fix(region)}")
    return price


def s3_price(region: str) -> S3Price:
    """S3 Standard request prices (USD per request) of ``region``.

    A region fnmap knows (it has a Lambda or EC2 price) but has no S3 figure of its own gets
    us-east-1's, and says so in the result's ``region``; S3's request prices differ by region by
    up to about 40%."""
    tables = _tables()
    price = tables.s3.get(region)
    if price is not None:
        return price
    if region in tables.lambda_ or region in tables.ec2:
        return tables.s3[DEFAULT_REGION]
    raise UnknownPrice(f"no S3 price for region {region!r}; known regions: {', '.join(tables.regions())}; "
                       f"{_fix(region)}")


def instance_price(instance_type: str, region: str = DEFAULT_REGION) -> float:
    """The on-demand price of an EC2 instance type (Linux, shared tenancy) in ``region``, USD per hour."""
    tables = _tables()
    types = tables.ec2.get(region)
    if types is None:
        raise UnknownPrice(f"no EC2 prices for region {region!r}; regions with EC2 prices: "
                           f"{', '.join(sorted(tables.ec2))}; {_fix(region)}")
    hourly = types.get(instance_type)
    if hourly is None:
        raise UnknownPrice(f"no EC2 price for instance type {instance_type!r} in {region}; known types: "
                           f"{', '.join(sorted(types))}; choose one of them, or fetch one with "
                           f"`fnmap prices update --region {region} --instance-type {instance_type}`")
    return hourly


def prices_basis() -> dict:
    """Where the prices in use come from: ``{"date", "source", "file"}``.

    ``source`` is ``"built-in tables"`` (``file`` None, ``date`` :data:`PRICES_DATE`) or
    ``"AWS Price List API"`` (``file`` the cache, ``date`` the day it was fetched).  A cache covers
    the regions and instance types it was fetched for; the others keep the built-in figures."""
    return dict(_tables().basis)


def table() -> dict:
    """Every figure in use, as plain data: ``{"lambda": {region: {...}}, "s3": ..., "ec2": ...}``."""
    tables = _tables()
    return {
        "lambda": {r: asdict(p) for r, p in sorted(tables.lambda_.items())},
        "s3": {r: {"put": p.put, "get": p.get} for r, p in sorted(tables.s3.items())},
        "ec2": {r: dict(sorted(types.items())) for r, types in sorted(tables.ec2.items())},
    }


def cached() -> dict:
    """The figures of the cache file in use (``{}`` when there is none or it is ignored)."""
    basis = _tables().basis
    if basis["file"] is None:
        return {}
    try:
        with open(basis["file"], encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):  # replaced or removed since it was read: start afresh
        return {}


def write_cache(figures: dict, date: str, source: str = PRICE_LIST_API) -> str:
    """Write fetched ``figures`` (``{"lambda": ..., "s3": ..., "ec2": ...}`` as :func:`table` gives)
    over the cache's, atomically (a temporary file, then ``os.replace``); return the path."""
    old = cached()
    data = {"format": CACHE_FORMAT, "date": date, "source": source}
    for name in ("lambda", "s3", "ec2"):
        merged = {r: dict(v) for r, v in (old.get(name) or {}).items()}
        for region, values in (figures.get(name) or {}).items():
            merged[region] = {**merged.get(region, {}), **values} if name == "ec2" else dict(values)
        data[name] = merged
    problem = _check_cache(data)
    if problem:
        raise ValueError(f"refusing to write a price cache: {problem}")
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".prices-", suffix=".json", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
