"""Every backend: its name, where its class lives, and the options only it reads.

The one place a backend's name is spelled: :mod:`fnmap.config` checks ``backend=`` against
:data:`BACKENDS`, :func:`fnmap.backends.create_backend` imports the class it names.  Each
backend's options are declared in its entry of :data:`BACKEND_OPTIONS` (name, type, default,
help, checks, and whether they identify a deployment); :mod:`fnmap.config` assembles them with
the options every job has into :class:`fnmap.config.Config`.  The options of every job are
declared in :mod:`fnmap.config`.

A leaf module (it imports only :mod:`fnmap.options`), so that ``config`` can read it without
importing the backends themselves: they import boto3, the emulator launcher and the client's
transport, which configuration must not drag in.
"""

from __future__ import annotations

from .options import Option, check_int, check_url

#: Each backend's name and its class, as ``"module:Class"``, imported on first use (so ``import
#: fnmap`` never pulls in boto3 or Flask).  Benchmarks add entries of their own at run time.
BACKENDS = {
    "emulator": "fnmap.backends.emulator:EmulatorBackend",
    "local": "fnmap.backends.local:LocalBackend",
    "http": "fnmap.backends.http:HttpBackend",
    "aws": "fnmap.backends.aws:AwsBackend",
    "batch": "fnmap.backends.batch:BatchBackend",
}

#: Other names people give a backend (the platform's, or another library's), for "did you mean"
#: hints: never accepted in its place, so a setting has one spelling.
BACKEND_ALIASES = {
    "lambda": "aws", "aws_lambda": "aws", "awslambda": "aws",
    "aws_batch": "batch", "gpu": "batch", "container": "batch",
    "cloud_functions": "http", "cloudfunctions": "http", "gcf": "http", "knative": "http", "url": "http",
    "process": "local", "processes": "local", "threads": "local", "multiprocessing": "local",
    "flask": "emulator", "offline": "emulator",
}


def _check_fanout(config, option: Option) -> None:
    """``lambda_fanout``: None, 0 (no spawners) or a number of calls, at least ``option.minimum``."""
    value = config.lambda_fanout
    if not (type(value) is int and value == 0):
        check_int(config, option)


def _check_emulator_options(config, option: Option) -> None:
    from .errors import ConfigError

    value = config.emulator_options
    if not value:
        return
    if not isinstance(value, str):
        raise ConfigError(f"{config.describe('emulator_options')} must be a string of `fnmap emulator` options, "
                          "e.g. emulator_options='--fail-rate 0.1 --seed 1'")
    from .emulator.options import check_options  # the emulator's own parser (argparse only)

    try:
        check_options(value)
    except ValueError as e:
        raise ConfigError(f"{config.describe('emulator_options')}: {e}") from None


def _check_emulator_idle(config, option: Option) -> None:
    from .errors import ConfigError

    value = config.emulator_idle
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"{config.describe('emulator_idle')} must be a number of seconds >= 0 "
                          "(0: an emulator per process, stopped when it exits), e.g. emulator_idle=300")


_REGION = Option(
    "region", None, "AWS region for the aws and batch backends (None: boto3's default).", identifies=True,
)

#: The options each backend reads (an option two backends read is declared once and listed in both).
BACKEND_OPTIONS: dict[str, tuple[Option, ...]] = {
    "emulator": (
        Option("emulator_url", None, "URL of a running emulator; unset means start one on demand.",
               identifies=True, check=check_url),
        Option("emulator_options", "", "Extra command-line options for an auto-started emulator "
               '(e.g. "--fail-rate 0.1 --seed 1"); a process with them gets an emulator of its own.',
               identifies=True, check=_check_emulator_options),
        Option("emulator_idle", 300.0, "Seconds an auto-started emulator stays up after its last request, "
               "shared by your processes (a fresh script's first call then waits for no start-up; the process "
               "that attached last sets it); 0: each process starts its own, stopped when it exits.", kind="float",
               identifies=True, check=_check_emulator_idle),
    ),
    "local": (),
    "http": (
        Option("http_url", None, "Function URL for the http backend.", identifies=True),
    ),
    "aws": (
        Option("function_name", "fnmap", "AWS Lambda function name (aws backend).", identifies=True),
        _REGION,
        Option("lambda_invocation", "auto", 'aws backend: Lambda invocation type, "auto" (synchronous while '
               'few calls are in flight, asynchronous "Event" beyond), "Event" or "RequestResponse".',
               identifies=True),
        Option("lambda_sync_limit", 6 * 1024 * 1024, "aws backend: Lambda's synchronous payload limit in "
               "bytes; a larger request travels by reference through storage.", kind="int", identifies=True),
        Option("lambda_async_limit", 1024 * 1024, "aws backend: Lambda's asynchronous payload limit in "
               "bytes (256 KiB before late 2025).", kind="int", identifies=True),
        Option("lambda_fanout", None, "aws backend: jobs of at least this many calls are invoked from inside "
               "Lambda by a few spawner calls (the client's cost stops growing with the job); None (default): "
               "only the calls sent as Event go through spawners; 0: no spawners at all.",
               kind="int", identifies=True, check=_check_fanout, minimum=2,
               fix="calls in a job from which all go through spawners; 0 for no spawners"),
    ),
    "batch": (
        _REGION,
        Option("job_queue", "fnmap", "AWS Batch job queue (batch backend).", identifies=True),
        Option("job_definition", "fnmap", "AWS Batch job definition (batch backend).", identifies=True),
    ),
}
