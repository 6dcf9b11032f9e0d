"""Cost estimates of a job: AWS Lambda (GB-seconds plus requests) and AWS Batch (instance time).

Every price fnmap knows is in this module, in the tables below; update them
here when AWS changes its prices.  The estimates are list prices without free
tier, savings plans or volume tiers, so they are an upper bound for small jobs
and a good guide for large ones.  Lambda bills each invocation's duration
rounded up to the millisecond, times its memory; Batch bills the EC2 instances
its jobs run on, by the second with a one-minute minimum per instance.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

#: When the tables were last checked (https://aws.amazon.com/lambda/pricing/, EC2 on-demand).
PRICES_CHECKED = "2025-06"

_STANDARD = (0.0000166667, 0.0000133334, 0.20)

#: Region -> (USD per GB-second on x86_64, USD per GB-second on arm64, USD per million requests).
LAMBDA_PRICES: dict[str, tuple[float, float, float]] = {
    **dict.fromkeys(
        [
            "us-east-1",
            "us-east-2",
            "us-west-1",
            "us-west-2",
            "ca-central-1",
            "eu-central-1",
            "eu-west-1",
            "eu-west-2",
            "eu-west-3",
            "eu-north-1",
            "ap-south-1",
            "ap-northeast-1",
            "ap-northeast-2",
            "ap-northeast-3",
            "ap-southeast-1",
            "ap-southeast-2",
            "sa-east-1",
        ],
        _STANDARD,
    ),
    "af-south-1": (0.0000221, 0.0000177, 0.28),
    "ap-east-1": (0.00002865, 0.0000229, 0.28),
    "eu-south-1": (0.0000195172, 0.0000156138, 0.23),
    "me-south-1": (0.0000206667, 0.0000165334, 0.25),
}

#: EC2 instance type -> on-demand USD per hour in us-east-1 (what AWS Batch jobs run on).
BATCH_INSTANCE_PRICES: dict[str, float] = {
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
    "p4d.24xlarge": 32.7726,
}

DEFAULT_REGION = "us-east-1"
#: Memory assumed for Lambda when a job did not set ``memory`` (fnmap's deploy default).
DEFAULT_LAMBDA_MEMORY_MB = 1024
DEFAULT_CPU_INSTANCE = "c5.large"
DEFAULT_GPU_INSTANCE = "g5.xlarge"  # the family `fnmap deploy batch` picks by default
BATCH_MINIMUM_SECONDS = 60.0


class UnknownPrice(ConfigError):
    """No price is known for a region or an instance type; the message lists the known ones."""


def lambda_cost(
    durations: list[float], memory_mb: int, region: str = DEFAULT_REGION, arch: str = "x86_64"
) -> dict:
    """List price of Lambda invocations lasting ``durations`` seconds each, at ``memory_mb``.

    >>> round(lambda_cost([1.0] * 1000, 1024)["usd"], 6)
    0.016867
    """
    prices = LAMBDA_PRICES.get(region)
    if prices is None:
        raise UnknownPrice(
            f"no AWS Lambda price for region {region!r}; known regions: "
            f"{', '.join(sorted(LAMBDA_PRICES))} "
            "(add it to fnmap/observe/cost.py LAMBDA_PRICES)"
        )
    if arch not in ("x86_64", "arm64"):
        raise UnknownPrice(f"no AWS Lambda price for architecture {arch!r}; use x86_64 or arm64")
    per_gb_s = prices[0] if arch == "x86_64" else prices[1]
    billed_ms = sum(math.ceil(max(d, 0.0) * 1000) for d in durations)
    gb_seconds = billed_ms / 1000 * memory_mb / 1024
    requests = len(durations)
    compute = gb_seconds * per_gb_s
    request_cost = requests * prices[2] / 1e6
    return {
        "model": "aws-lambda",
        "region": region,
        "arch": arch,
        "memory_mb": memory_mb,
        "gb_seconds": gb_seconds,
        "requests": requests,
        "compute_usd": compute,
        "requests_usd": request_cost,
        "usd": compute + request_cost,
    }


def batch_cost(durations: list[float], instance_type: str) -> dict:
    """List price of Batch jobs lasting ``durations`` seconds, one per ``instance_type`` instance.

    Instance boot and idle time before scale-in are not included.
    """
    hourly = BATCH_INSTANCE_PRICES.get(instance_type)
    if hourly is None:
        raise UnknownPrice(
            f"no EC2 price for instance type {instance_type!r}; known types: "
            f"{', '.join(sorted(BATCH_INSTANCE_PRICES))} "
            "(add it to fnmap/observe/cost.py BATCH_INSTANCE_PRICES)"
        )
    seconds = sum(max(d, BATCH_MINIMUM_SECONDS) for d in durations)
    return {
        "model": "aws-batch",
        "instance_type": instance_type,
        "usd_per_hour": hourly,
        "instance_seconds": seconds,
        "jobs": len(durations),
        "usd": seconds / 3600 * hourly,
    }


def attempt_durations(record: dict) -> list[float]:
    """Billed seconds of every attempt of a job record.

    The worker's own time when it reported, else the client's view (sent until answered), which
    is an upper bound.
    """
    out: list[float] = []
    for call in record.get("calls", []):
        counted = call.get("attempt")
        for attempt in call.get("attempts", []):
            if attempt["attempt"] == counted and call.get("started") is not None:
                end = call.get("written") or call.get("finished")
                out.append(end - call["started"])
            elif attempt.get("ended") is not None and attempt.get("sent") is not None:
                out.append(attempt["ended"] - attempt["sent"])
    return out


def estimate(record: dict) -> dict:
    """The estimate for a job record: Batch instance time for ``batch``, else Lambda pricing.

    Jobs run on the emulator, ``local`` or ``http`` are priced as if they had run on AWS
    Lambda, so a laptop run tells what the same job would cost in the cloud.  An unknown
    region or instance type gives ``usd=None`` and a ``note`` instead of an error, so a
    summary always prints.
    """
    options = record.get("options", {})
    durations = attempt_durations(record)
    try:
        if record.get("backend") == "batch":
            instance = options.get("instance_type") or (
                DEFAULT_GPU_INSTANCE if options.get("gpu") else DEFAULT_CPU_INSTANCE
            )
            result = batch_cost(durations, instance)
            result["assumed"] = [] if options.get("instance_type") else ["instance_type"]
        else:
            memory = options.get("memory") or DEFAULT_LAMBDA_MEMORY_MB
            if isinstance(memory, (list, tuple)):  # memory steps: most calls run at the first
                memory = memory[0]
            region = options.get("region") or DEFAULT_REGION
            result = lambda_cost(durations, memory, region)
            result["assumed"] = [name for name in ("memory", "region") if not options.get(name)]
    except UnknownPrice as e:
        return {"model": None, "usd": None, "note": str(e)}
    result["prices_checked"] = PRICES_CHECKED
    if record.get("backend") not in ("aws", "batch"):
        result["note"] = f"as if the {record.get('backend')} job had run on {result['model']}"
    return result


def describe(estimate_: dict) -> str:
    """One line for the job summary."""
    if estimate_.get("usd") is None:
        return f"unknown ({estimate_.get('note', 'no estimate')})"
    assumed = estimate_.get("assumed") or []
    if estimate_["model"] == "aws-lambda":
        memory = f"{estimate_['memory_mb']} MB" + (" (assumed)" if "memory" in assumed else "")
        region = estimate_["region"] + (" (assumed)" if "region" in assumed else "")
        detail = (
            f"AWS Lambda {region}, {memory}: {estimate_['gb_seconds']:.3f} GB-s + "
            f"{estimate_['requests']} requests"
        )
    else:
        instance = estimate_["instance_type"] + (" (assumed)" if assumed else "")
        detail = f"AWS Batch on {instance}: {estimate_['instance_seconds']:.0f} instance-seconds"
    return f"${estimate_['usd']:.6f}  {detail}"
