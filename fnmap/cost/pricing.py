"""What a job costs at list prices: the price of one attempt of a call (:class:`Pricing`), what a
finished job cost (:func:`job_cost`, what ``job.cost()`` and ``fnmap job`` read), and how an amount
of money reads (:func:`usd`, the one formatter every message and page uses).

The model, per attempt of a call, on the platform the job's backend stands for (the emulator,
``local`` and ``http`` are priced as AWS Lambda, so a laptop run tells what the same job would cost
in the cloud):

* **AWS Lambda**: the duration rounded up to the millisecond (at least 1 ms), plus a cold start's
  INIT phase (billed since 2025-08-01; the worker reports it as ``init_seconds``), times the memory
  in GB, at the GB-second price of the region and architecture; plus the price of one request.
* **AWS Batch**: the instance time of the container, by the second with a one-minute minimum,
  at the instance type's on-demand hourly price.
* **S3 requests** (for short calls they can cost more than Lambda's compute): each attempt makes
  :data:`S3_PUTS_PER_CALL` PUTs and :data:`S3_GETS_PER_CALL` GET-priced requests, a cold worker one
  GET more (the function), a call whose input is stored (larger than ``inline_limit``) one PUT and
  one GET more; each job :data:`S3_PUTS_PER_JOB` PUTs (its function, index entry and record).

These are list prices (the first tier) without free tier, savings plans or volume tiers: an upper
bound for small jobs, a good guide for large ones.  The platform's own bill is the truth.  The
prices themselves, dated and with their sources, are in :mod:`fnmap.cost.prices`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .prices import DEFAULT_REGION, UnknownPrice, instance_price, lambda_price, prices_basis, s3_price

__all__ = ["BATCH_MINIMUM_SECONDS", "DEFAULT_LAMBDA_MEMORY_MB", "Pricing", "UnknownPrice", "job_cost",
           "pricing_of", "requests", "usd"]

#: Memory assumed for Lambda when a job did not set ``memory`` (fnmap's deploy default).
DEFAULT_LAMBDA_MEMORY_MB = 1024
DEFAULT_CPU_INSTANCE = "c5.large"
DEFAULT_GPU_INSTANCE = "g5.xlarge"  # the family `fnmap deploy batch` picks by default
BATCH_MINIMUM_SECONDS = 60.0
#: S3 requests of one attempt: the worker's PUTs (its result, its status record) and GET-priced
#: requests (its two checks before it runs: the job's record is there, the result is not yet).
S3_PUTS_PER_CALL = 2
S3_GETS_PER_CALL = 2
#: S3 PUTs of one job, whatever its size: its function, its index entry (twice) and its record.
S3_PUTS_PER_JOB = 4


@dataclass(frozen=True)
class Pricing:
    """The list price of one attempt of a job's calls, for the platform its backend stands for.

    Made by :meth:`of`, which looks the prices up once: a job is priced with the prices in use
    when it started, however long it runs (and an attempt is priced with no lookup)."""

    model: str  # "aws-lambda" or "aws-batch"
    region: str
    memory_mb: int
    arch: str = "x86_64"
    instance_type: str | None = None
    #: The settings the job did not give, taken from fnmap's defaults (``memory``, ``region``, ...).
    assumed: tuple = ()
    #: USD per GB-second (Lambda), per request (Lambda), per S3 PUT and GET, per instance-hour (Batch).
    per_gb_second: float = 0.0
    per_request: float = 0.0
    per_put: float = 0.0
    per_get: float = 0.0
    per_hour: float = 0.0

    @classmethod
    def of(cls, backend: str | None, options: dict, arch: str = "x86_64") -> Pricing:
        """The pricing of a job of ``backend`` with these options (a record's ``options``, or a
        :class:`fnmap.config.Config`'s fields); raises :class:`UnknownPrice` for an unknown region,
        architecture or instance type."""
        region = options.get("region") or DEFAULT_REGION
        memory = options.get("memory") or DEFAULT_LAMBDA_MEMORY_MB
        if isinstance(memory, (list, tuple)):  # memory steps: most calls run at the first
            memory = memory[0]
        if backend == "batch":
            instance = options.get("instance_type") or (
                DEFAULT_GPU_INSTANCE if options.get("gpu") else DEFAULT_CPU_INSTANCE)
            rates = {"per_hour": instance_price(instance, region)}
            model, assumed = "aws-batch", () if options.get("instance_type") else ("instance_type",)
        else:
            instance = None
            price = lambda_price(region)
            if arch not in ("x86_64", "arm64"):
                raise UnknownPrice(f"no AWS Lambda price for architecture {arch!r}; use x86_64 or arm64")
            rates = {"per_gb_second": price.gb_second_x86 if arch == "x86_64" else price.gb_second_arm,
                     "per_request": price.request}
            model, assumed = "aws-lambda", tuple(n for n in ("memory", "region") if not options.get(n))
        s3 = s3_price(region)
        return cls(model, region, memory, arch, instance, assumed, per_put=s3.put, per_get=s3.get, **rates)

    def parts(self, seconds: float, *, memory_mb: int | None = None, init_seconds: float = 0.0,
              puts: int = S3_PUTS_PER_CALL, gets: int = S3_GETS_PER_CALL) -> dict:
        """What one attempt that ran ``seconds`` costs, in parts (USD): compute, request, storage."""
        storage = puts * self.per_put + gets * self.per_get
        if self.model == "aws-batch":
            instance_seconds = max(seconds, BATCH_MINIMUM_SECONDS)
            return {"compute": instance_seconds / 3600 * self.per_hour, "request": 0.0, "storage": storage,
                    "instance_seconds": instance_seconds, "gb_seconds": 0.0}
        billed_ms = max(1, math.ceil(max(seconds, 0.0) * 1000)) + math.ceil(max(init_seconds, 0.0) * 1000)
        gb_seconds = billed_ms / 1000 * (memory_mb or self.memory_mb) / 1024
        return {"compute": gb_seconds * self.per_gb_second, "request": self.per_request, "storage": storage,
                "gb_seconds": gb_seconds, "instance_seconds": 0.0}

    def attempt(self, seconds: float, **kwargs) -> float:
        """What one attempt that ran ``seconds`` costs (USD); options as :meth:`parts`."""
        parts = self.parts(seconds, **kwargs)
        return parts["compute"] + parts["request"] + parts["storage"]

    def minimum(self, memory_mb: int | None = None) -> float:
        """The least one attempt costs: the minimum billed duration, its request, its S3 requests."""
        return self.attempt(0.0, memory_mb=memory_mb)

    def job_overhead(self) -> float:
        """What a job costs whatever its calls: the S3 PUTs of its function, index entry and record."""
        return S3_PUTS_PER_JOB * self.per_put

    def describe(self) -> str:
        """The platform and settings priced, e.g. ``AWS Lambda us-east-1, 1024 MB``."""
        def said(name: str, text: str) -> str:
            return text + (" (assumed)" if name in self.assumed else "")

        if self.model == "aws-batch":
            return f"AWS Batch on {said('instance_type', self.instance_type)}"
        return f"AWS Lambda {said('region', self.region)}, {said('memory', f'{self.memory_mb} MB')}"


def usd(amount: float) -> str:
    """Dollars to three significant digits (cents from a dollar up): a cap is often a fraction of a
    cent.  The one way fnmap writes an amount of money: messages, ``fnmap job``, the dashboard."""
    if amount >= 1 or amount < 1e-9:  # a sum of attempts less the same attempts is 1e-20, not 0
        return f"${amount:.2f}"
    text = f"{amount:.{2 - math.floor(math.log10(amount))}f}".rstrip("0")
    return "$" + text.ljust(len(text.partition(".")[0]) + 3, "0")  # cents at least: $0.10, not $0.1


def pricing_of(config) -> Pricing:
    """The pricing of a job run with ``config`` (:class:`fnmap.config.Config`)."""
    return Pricing.of(config.backend, {"region": config.region, "memory": config.memory, "gpu": config.gpu,
                                       "instance_type": getattr(config, "instance_type", None)})



def requests(stored_input: bool, first_attempt: bool, cold: bool) -> tuple[int, int]:
    """The S3 PUTs and GETs of one attempt (see the module's docstring): a stored input is PUT once
    by the client and read by every attempt; a cold worker GETs the function."""
    puts = S3_PUTS_PER_CALL + (stored_input and first_attempt)
    gets = S3_GETS_PER_CALL + stored_input + cold
    return puts, gets


def _attempts(record: dict):
    """``(call, attempt index, billed seconds)`` of every attempt of a record that was sent."""
    for call in record.get("calls", []):
        counted = call.get("attempt")
        for index, attempt in enumerate(call.get("attempts", [])):
            if attempt["attempt"] == counted and call.get("started") is not None:
                end = call.get("written") or call.get("finished")
                yield call, index, end - call["started"]
            elif attempt.get("ended") is not None and attempt.get("sent") is not None \
                    and attempt.get("outcome") != "cancelled":  # cancelled before it was sent: no bill
                yield call, index, attempt["ended"] - attempt["sent"]


def cache_hits(calls: list[dict]) -> int:
    """Items of a record's calls answered by the result cache (``cached_from``: no call sent)."""
    return sum(n for c in calls for _first, n, _job in c.get("cached_from") or ())


def job_cost(record: dict) -> dict:
    """The list-price estimate of a job record: ``usd``, its parts, and what it assumed.

    An unknown region or instance type gives ``usd=None`` and a ``note`` instead of an error, so a
    summary always prints."""
    options = record.get("options", {})
    try:
        pricing = Pricing.of(record.get("backend"), options)
    except UnknownPrice as e:
        return {"model": None, "usd": None, "note": str(e)}
    totals = {"compute": 0.0, "request": 0.0, "storage": 0.0, "gb_seconds": 0.0, "instance_seconds": 0.0}
    attempts = puts = gets = 0
    for call, index, seconds in _attempts(record):
        p, g = requests(bool(call.get("stored_input")), index == 0, bool(call.get("cold")) and index == 0)
        memory = next((a.get("memory") for a in call["attempts"][index:index + 1]), None)
        init = (call.get("init_seconds") or 0.0) if call.get("cold") and index == 0 else 0.0
        for name, value in pricing.parts(seconds, memory_mb=memory, init_seconds=init, puts=p, gets=g).items():
            totals[name] += value
        attempts, puts, gets = attempts + 1, puts + p, gets + g
    hits = cache_hits(record.get("calls", []))
    if hits:  # a result-cache hit is one GET, no invocation
        totals["storage"] += hits * pricing.per_get
        gets += hits
    overhead = pricing.job_overhead()
    result = {
        "model": pricing.model,
        "region": pricing.region,
        "arch": pricing.arch,
        "memory_mb": pricing.memory_mb,
        "instance_type": pricing.instance_type,
        "gb_seconds": totals["gb_seconds"],
        "instance_seconds": totals["instance_seconds"],
        "requests": attempts if pricing.model == "aws-lambda" else 0,
        "s3_puts": puts + S3_PUTS_PER_JOB,
        "s3_gets": gets,
        "compute_usd": totals["compute"],
        "requests_usd": totals["request"],
        "storage_usd": totals["storage"] + overhead,
        "usd": totals["compute"] + totals["request"] + totals["storage"] + overhead,
        "assumed": list(pricing.assumed),
        "prices": prices_basis()["date"],
    }
    if record.get("backend") not in ("aws", "batch"):
        result["note"] = f"as if the {record.get('backend')} job had run on {pricing.model}"
    return result

