"""Configuration, resolved once into a frozen dataclass.

Precedence: keyword argument > environment (``FNMAP_<NAME>``) > config file
(``fnmap.toml`` in the working folder, else ``~/.config/fnmap/config.toml``;
keys at the top level or under ``[fnmap]``) > default.  Every value is
validated on construction and an error names the value, where it came from,
and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError


class UnknownOption(ConfigError, TypeError):
    """A keyword option fnmap does not know."""


@dataclass(frozen=True)
class Config:
    """Every option of a job and of the deployment it runs on."""

    #: Where calls run: emulator, local, http, aws, batch.
    backend: str = "emulator"
    #: Storage URL (file:///path or s3://bucket/prefix); default: a per-user cache folder.
    storage: str | None = None
    #: URL of a running emulator; unset means start one on demand.
    emulator_url: str | None = None
    #: Function URL for the http backend.
    http_url: str | None = None
    #: Shared secret that signs requests; unset means generated for an auto-started emulator.
    secret: str | None = None
    #: Items per invocation; None ("auto"): sized as the job runs to the backend's call duration.
    chunksize: int | None = None
    #: Seconds per call before it is stopped and reported as fnmap.TimeoutError.
    timeout: float | None = None
    #: How often a call is re-run after a platform fault.
    retries: int = 2
    #: User exception types that are retried too.
    retry_on: tuple = ()
    #: Launch a speculative copy of straggling calls once most of a job is done.
    speculation: bool = True
    #: Memory per call in MB, or a rising list of them (``[1024, 4096]``, ``FNMAP_MEMORY=1024,4096``):
    #: a call killed for memory is retried at the next (see :attr:`memory_steps`).
    memory: int | tuple | None = None
    #: GPUs per call (container jobs).
    gpu: int = 0
    #: Show a progress bar (None: in a terminal or notebook, for long jobs).
    progress: bool | None = None
    #: Where remote print() output is shown: "after" the job (each call's, in call order, as far as it
    #: came back with the answers), "live" (as it happens, on this process's stderr) or "none".
    output: str = "after"
    #: Called as ``initializer(*initargs)`` once per warm worker process before its first call
    #: (``multiprocessing.Pool``'s names); it travels with the function.
    initializer: Any = None
    initargs: tuple = ()
    #: Environment variables set around each call on the worker.
    extra_env: dict = field(default_factory=dict)
    #: Worker processes of an auto-started emulator / concurrent calls of the client.
    workers: int | None = None
    #: Arguments and results larger than this (bytes) travel through storage, not in request bodies.
    inline_limit: int = 256 << 10
    #: Extra command-line options for an auto-started emulator (e.g. "--fail-rate 0.1 --seed 1").
    emulator_options: str = ""
    #: AWS Lambda function name (aws backend).
    function_name: str = "fnmap"
    #: AWS region for the aws and batch backends (None: boto3's default).
    region: str | None = None
    #: aws backend: Lambda invocation type, "auto" (synchronous while few calls are in flight,
    #: asynchronous "Event" beyond), "Event" or "RequestResponse".
    lambda_invocation: str = "auto"
    #: aws backend: Lambda's payload limits in bytes (synchronous; asynchronous, 256 KiB before
    #: late 2025); a larger request travels by reference through storage.
    lambda_sync_limit: int = 6 * 1024 * 1024
    lambda_async_limit: int = 1024 * 1024
    #: aws backend: jobs of at least this many calls are invoked from inside Lambda by a few
    #: spawner calls (the client's cost stops growing with the job); None (default): only the
    #: calls sent as Event go through spawners; 0: no spawners at all.
    lambda_fanout: int | None = None
    #: AWS Batch job queue and job definition (batch backend).
    job_queue: str = "fnmap"
    job_definition: str = "fnmap"

    #: Where each value came from, for error messages (not an option).
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        _validate(self)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    @property
    def gpu_chose_backend(self) -> bool:
        """True when the backend is ``batch`` because ``gpu=`` asked for GPUs, not because it was named."""
        return self.source("backend").startswith(_GPU_SOURCE)

    def describe(self, name: str) -> str:
        """``name=value (from where)`` for error messages."""
        src = self.source(name)
        label = f"FNMAP_{name.upper()}" if src == "the environment" else name
        return f"{label}={getattr(self, name)!r} (from {src})"

    @property
    def memory_steps(self) -> tuple:
        """The memories (MB) a call climbs through as it runs out of memory; ``()`` when unset."""
        if self.memory is None:
            return ()
        return self.memory if isinstance(self.memory, tuple) else (self.memory,)

    @property
    def storage_url(self) -> str:
        from .storage import default_storage_url

        return self.storage or default_storage_url()

    @property
    def storage_origin(self) -> str:
        """Where the storage URL came from, for storage errors: ``FNMAP_STORAGE='...' (from the
        environment)``, ``storage='...' (from keyword)``, a config file, or the default."""
        if self.source("storage") == "default":
            return "the default storage: no storage= or FNMAP_STORAGE is set"
        return self.describe("storage")

    def deployment_key(self) -> tuple:
        """The options that identify a client: backend, storage and where/how calls are sent."""
        return (
            self.backend, self.storage_url, self.emulator_url, self.http_url, self.secret,
            self.workers, self.emulator_options, self.function_name, self.region,
            self.lambda_invocation, self.lambda_sync_limit, self.lambda_async_limit, self.lambda_fanout,
            self.job_queue, self.job_definition, endpoint_environment(), self.gpu_chose_backend,
        )

    def replace(self, **changes: Any) -> Config:
        sources = dict(self.sources)
        sources.update({k: "keyword" for k in changes})
        return dataclasses.replace(self, sources=sources, **changes)


def endpoint_environment() -> tuple:
    """The AWS endpoint and credential settings of the environment.

    Workers of an auto-started emulator inherit the environment when it starts,
    so a change here (say ``AWS_ENDPOINT_URL_S3`` set after the first job) must
    lead to a new client and emulator rather than to workers that see old values.
    """
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith(("AWS_", "FNMAP_S3_"))))


#: How the ``backend`` source starts when ``gpu=`` chose it.
_GPU_SOURCE = "gpu="

OPTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name != "sources")
_ENV_SKIP = {"retry_on", "extra_env", "initializer", "initargs"}


def resolve(**kwargs: Any) -> Config:
    """Build a :class:`Config` from keywords, the environment, the config file and defaults."""
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        raise UnknownOption(
            f"unknown option(s) {', '.join(map(repr, unknown))}; valid options: {', '.join(OPTIONS)}"
        )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_values, file_path = _read_config_file()
    for name in OPTIONS:
        if name in kwargs and kwargs[name] is not None:
            values[name], sources[name] = kwargs[name], "keyword"
            continue
        env = os.environ.get(f"FNMAP_{name.upper()}")
        if env not in (None, "") and name not in _ENV_SKIP:
            values[name], sources[name] = _parse(name, env, f"FNMAP_{name.upper()}"), "the environment"
            continue
        if name in file_values:
            values[name], sources[name] = file_values[name], f"config file {file_path}"
    _warn_unknown_variables()
    retry_on = values.get("retry_on")
    if isinstance(retry_on, type):
        values["retry_on"] = (retry_on,)
    elif isinstance(retry_on, (str, bytes)):  # tuple() would make ('V', 'a', 'l', ...) of it
        example = retry_on if isinstance(retry_on, str) and retry_on.isidentifier() else "ValueError"
        raise ConfigError(
            f"retry_on={retry_on!r} (from {sources['retry_on']}) is a string; pass exception classes, "
            f"e.g. retry_on=({example},)"
        )
    elif "retry_on" in values:
        try:
            values["retry_on"] = tuple(retry_on)
        except TypeError:
            raise ConfigError(
                f"retry_on={retry_on!r} (from {sources['retry_on']}) is not an exception class or a tuple "
                "of them; e.g. retry_on=(ConnectionError, TimeoutError)"
            ) from None
    if isinstance(values.get("memory"), list):  # a list as a tuple: the Config stays hashable
        values["memory"] = tuple(values["memory"])
    gpu = values.get("gpu")
    if "backend" not in values and isinstance(gpu, int) and not isinstance(gpu, bool) and gpu > 0:
        # GPU calls run as container jobs unless a backend is named (issue 6).
        values["backend"], sources["backend"] = "batch", f"{_GPU_SOURCE}{gpu}: GPU calls run as container jobs"
    return Config(sources=sources, **values)


#: FNMAP_* variables read outside :class:`Config` (storage, the runtime, the emulator).
OTHER_VARIABLES = ("FNMAP_S3_ENDPOINT_URL", "FNMAP_RUNTIME", "FNMAP_HTTP_PARSER", "FNMAP_BATCH_CONCURRENCY")
_warned_variables: set[str] = set()


def _warn_unknown_variables() -> None:
    """Warn once per variable about an ``FNMAP_*`` variable fnmap does not read (a typo such as
    ``FNMAP_CHUNK_SIZE`` would otherwise be ignored silently), naming the closest known one."""
    known = [f"FNMAP_{name.upper()}" for name in OPTIONS if name not in _ENV_SKIP] + list(OTHER_VARIABLES)
    for name in os.environ:
        if not name.startswith("FNMAP_") or name in known or name in _warned_variables:
            continue
        _warned_variables.add(name)
        import difflib
        import warnings

        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        warnings.warn(f"{name} is not a setting fnmap reads, so it is ignored; {hint}"
                      "the settings are listed in fnmap.config.Config", UserWarning, stacklevel=3)


def _read_config_file() -> tuple[dict, str | None]:
    candidates = [os.path.join(os.getcwd(), "fnmap.toml")]
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    candidates.append(os.path.join(xdg, "fnmap", "config.toml"))
    for path in candidates:
        if os.path.isfile(path):
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib
            try:
                with open(path, "rb") as f:
                    data = tomllib.load(f)
            except (tomllib.TOMLDecodeError, OSError) as e:
                raise ConfigError(f"config file {path} cannot be read: {e}") from e
            data = data.get("fnmap", data)
            unknown = sorted(set(data) - set(OPTIONS))
            if unknown:
                raise ConfigError(
                    f"config file {path} has unknown option(s) {', '.join(map(repr, unknown))}; "
                    f"valid options: {', '.join(OPTIONS)}"
                )
            return data, path
    return {}, None


#: Values of the ``output`` option.
OUTPUT_MODES = ("after", "live", "none")
_INTS = {"chunksize", "retries", "memory", "gpu", "workers", "inline_limit",
         "lambda_sync_limit", "lambda_async_limit", "lambda_fanout"}
_FLOATS = {"timeout"}
_BOOLS = {"progress", "speculation"}


def _parse(name: str, raw: str, label: str) -> Any:
    try:
        if name == "memory" and "," in raw:
            return tuple(int(part) for part in raw.split(","))
        if name == "chunksize" and raw.strip().lower() == "auto":
            return "auto"
        if name in _INTS:
            return int(raw)
        if name in _FLOATS:
            return float(raw)
        if name in _BOOLS:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
    except ValueError:
        kind = {**dict.fromkeys(_INTS, "an integer"), **dict.fromkeys(_FLOATS, "a number"),
                **dict.fromkeys(_BOOLS, "true or false")}[name]
        raise ConfigError(f"{label}={raw!r} (from the environment) is not {kind}") from None
    return raw


def _validate(c: Config) -> None:
    from .backends import BACKENDS
    from .errors import UnknownBackend

    if c.backend not in BACKENDS:
        raise UnknownBackend(
            f"{c.describe('backend')} is not a backend; choose one of: {', '.join(BACKENDS)}"
        )
    if c.chunksize == "auto":  # the keyword or FNMAP_CHUNKSIZE=auto: the default, said explicitly
        object.__setattr__(c, "chunksize", None)
    if c.chunksize is not None:
        _check_int(c, "chunksize", 1, "items per invocation; use chunksize=1 or more, or 'auto'")
    _check_int(c, "retries", 0, "use retries=0 to never re-run a call")
    _check_int(c, "gpu", 0, "use gpu=0 for CPU work or gpu=1 for one GPU per call")
    if c.lambda_fanout is not None and not (type(c.lambda_fanout) is int and c.lambda_fanout == 0):
        _check_int(c, "lambda_fanout", 2, "calls in a job from which all go through spawners; 0 for no spawners")
    _check_int(c, "inline_limit", 0, "a size in bytes")
    if c.workers is not None:
        _check_int(c, "workers", 1, "at least one worker")
    if c.memory is not None:
        _check_memory(c)
    if c.timeout is not None:
        if isinstance(c.timeout, bool) or not isinstance(c.timeout, (int, float)) or not c.timeout > 0:
            raise ConfigError(f"{c.describe('timeout')} must be a positive number of seconds, or None")
    for name in _BOOLS:
        value = getattr(c, name)
        if not isinstance(value, bool) and not (name == "progress" and value is None):
            choices = "True, False or None (automatic)" if name == "progress" else "True or False"
            raise ConfigError(f"{c.describe(name)} must be {choices}, not {type(value).__name__}")
    for exc in c.retry_on:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ConfigError(
                f"retry_on={c.retry_on!r}: {exc!r} is not an exception class; "
                "pass exception types, e.g. retry_on=(ConnectionError,)"
            )
    if c.output not in OUTPUT_MODES:
        raise ConfigError(f"{c.describe('output')} is not an output mode; use one of: {', '.join(OUTPUT_MODES)}")
    if c.initializer is not None and not callable(c.initializer):
        raise ConfigError(f"{c.describe('initializer')} is not callable; pass a function, e.g. "
                          "initializer=load_model, initargs=('model.pt',)")
    if not isinstance(c.initargs, (tuple, list)):
        raise ConfigError(f"{c.describe('initargs')} must be a tuple of the initializer's arguments, "
                          f"e.g. initargs=({c.initargs!r},)")
    if c.initargs and c.initializer is None:
        raise ConfigError(f"{c.describe('initargs')} is given without initializer=; pass the function "
                          "that takes them, e.g. initializer=load_model")
    if not isinstance(c.extra_env, dict):
        raise ConfigError(f"{c.describe('extra_env')} must be a dict of environment variables")
    if c.storage is not None and (not isinstance(c.storage, str) or "://" not in c.storage):
        raise ConfigError(
            f"{c.describe('storage')} is not a storage URL; use file:///absolute/path or s3://bucket/prefix"
        )
    if c.emulator_options:
        _check_emulator_options(c)
    if c.emulator_url is not None and not str(c.emulator_url).startswith(("http://", "https://")):
        raise ConfigError(
            f"{c.describe('emulator_url')} is not an http(s) URL; e.g. http://127.0.0.1:8765"
        )


def _check_emulator_options(c: Config) -> None:
    if not isinstance(c.emulator_options, str):
        raise ConfigError(f"{c.describe('emulator_options')} must be a string of `fnmap emulator` options, "
                          "e.g. emulator_options='--fail-rate 0.1 --seed 1'")
    from .cli.emulator import check_options

    try:
        check_options(c.emulator_options)
    except ValueError as e:
        raise ConfigError(f"{c.describe('emulator_options')}: {e}") from None


def _check_memory(c: Config) -> None:
    """``memory``: MB per call, at least 128, or a rising tuple of them (the steps a call climbs)."""
    steps = c.memory_steps
    fix = ("memory per call in MB, at least 128, or a rising list of them that a call killed for "
           "memory climbs on its retries, e.g. memory=[1024, 4096, 10240]")
    if not steps or any(isinstance(m, bool) or not isinstance(m, int) or m < 128 for m in steps):
        raise ConfigError(f"{c.describe('memory')} must be an integer >= 128 ({fix})")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ConfigError(f"{c.describe('memory')} must rise from step to step ({fix})")


def _check_int(c: Config, name: str, minimum: int, fix: str) -> None:
    value = getattr(c, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{c.describe(name)} must be an integer >= {minimum} ({fix})")
