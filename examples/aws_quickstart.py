"""AWS quickstart: the same fnmap.map on AWS Lambda, or on the emulator's Lambda API without an account.

With AWS credentials and a deployment (`fnmap deploy aws deploy`, then the
printed `export FNMAP_...` lines) it runs on your account:

    python examples/aws_quickstart.py

Without credentials, or with --emulator, it starts `fnmap emulator` on loopback
and points boto3 at it with AWS_ENDPOINT_URL_LAMBDA, so the aws backend runs
unchanged (real boto3 Lambda client; results in a local folder).  Each call then
runs as on Lambda: the emulator unpacks the package `fnmap deploy aws` uploads
and runs it under AWS's runtime interface client (`python -m awslambdaric
handlers.aws_lambda.handler`) through Lambda's Runtime API, in warm-reused
execution environments.
"""

import os
import sys
import time

import fnmap
from fnmap.emulator.launcher import EmulatorLauncher


def primes_below(n: int) -> int:
    """Count primes below n by trial division: a small CPU-bound unit of work."""
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n))


def start_emulator() -> EmulatorLauncher:
    """`fnmap emulator` on a free loopback port; sets the environment the aws backend reads."""
    emulator = EmulatorLauncher(embedded=True)
    os.environ.update(
        AWS_ENDPOINT_URL_LAMBDA=emulator.url, FNMAP_SECRET=emulator.secret, AWS_DEFAULT_REGION="us-east-1",
        # boto3 signs every request; the emulator's Lambda API accepts only its own credentials.
        **emulator.aws_environment,
    )
    print(f"no AWS account in use: emulator's Lambda API at {emulator.url} (calls run under awslambdaric "
          "when it is installed)")
    return emulator


def has_aws_credentials() -> bool:
    import boto3

    return boto3.session.Session().get_credentials() is not None


def main() -> None:
    emulator = None
    if "--emulator" in sys.argv or not has_aws_credentials():
        emulator = start_emulator()
    else:
        print(f"AWS Lambda function {os.environ.get('FNMAP_FUNCTION_NAME', 'fnmap')} "
              f"with storage {os.environ.get('FNMAP_STORAGE', '(unset: set FNMAP_STORAGE=s3://...)')}")
    try:
        items = [20_000 + 1_000 * i for i in range(40)]
        start = time.perf_counter()
        job = fnmap.map(primes_below, items, backend="aws", return_job=True)
        results = job.results()
        elapsed = time.perf_counter() - start
        assert results[:3] == [primes_below(n) for n in items[:3]], "results differ from a local run"
        summary = job.summary()
        print(f"{len(results)} calls in {elapsed:.2f} s: primes below {items[-1]:,} = {results[-1]:,}; "
              f"retries {summary['retries']}, job {summary['job_id']}")
    finally:
        if emulator is not None:
            emulator.stop()


if __name__ == "__main__":
    main()
