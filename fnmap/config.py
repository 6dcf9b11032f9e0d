"""Configuration, resolved once into a frozen dataclass.

Precedence: keyword argument > environment (``FNMAP_<NAME>``) > config file
(``fnmap.toml`` in the working folder, else ``~/.config/fnmap/config.toml``;
keys at the top level or under ``[fnmap]``) > default.  Every value is
validated on construction and an error names the value, where it came from,
and the fix.

Each option is declared once (:class:`fnmap.options.Option`): the options of every job in
:data:`JOB_OPTIONS` below, each backend's own in :mod:`fnmap.backend_table`.  :class:`Config` is
assembled from them, as are the environment variables, the parsing, the checks and
:meth:`Config.deployment_key`.  This module imports nothing of fnmap above it (no backends, no
command line; tests/test_layout.py checks).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .backend_table import BACKEND_ALIASES, BACKEND_OPTIONS, BACKENDS
from .errors import ConfigError, UnknownBackend, user_stacklevel
from .options import Option, check_bool, check_int, did_you_mean, parse_age, parse_bool


class UnknownOption(ConfigError, TypeError):
    """A keyword option fnmap does not know."""


#: Values of the ``output`` option.
OUTPUT_MODES = ("after", "live", "none")


def _parse_chunksize(raw: str) -> Any:
    return "auto" if raw.strip().lower() == "auto" else int(raw)


def _parse_memory(raw: str) -> Any:
    return tuple(int(part) for part in raw.split(",")) if "," in raw else int(raw)


def _check_chunksize(c: Config, option: Option) -> None:
    if c.chunksize == "auto":  # the keyword or FNMAP_CHUNKSIZE=auto: the default, said explicitly
        object.__setattr__(c, "chunksize", None)
    check_int(c, option)


def _check_timeout(c: Config, option: Option) -> None:
    if c.timeout is not None:
        if isinstance(c.timeout, bool) or not isinstance(c.timeout, (int, float)) or not c.timeout > 0:
            raise ConfigError(f"{c.describe('timeout')} must be a positive number of seconds, or None")


def _check_retry_on(c: Config, option: Option) -> None:
    for exc in c.retry_on:
        if not (isinstance(exc, type) and issubclass(exc, BaseException)):
            raise ConfigError(
                f"retry_on={c.retry_on!r}: {exc!r} is not an exception class; "
                "pass exception types, e.g. retry_on=(ConnectionError,)"
            )


def _check_memory(c: Config, option: Option) -> None:
    """``memory``: MB per call, at least 128, or a rising tuple of them (the steps a call climbs)."""
    if c.memory is None:
        return
    steps = c.memory_steps
    fix = ("memory per call in MB, at least 128, or a rising list of them that a call killed for "
           "memory climbs on its retries, e.g. memory=[1024, 4096, 10240]")
    if not steps or any(isinstance(m, bool) or not isinstance(m, int) or m < 128 for m in steps):
        raise ConfigError(f"{c.describe('memory')} must be an integer >= 128 ({fix})")
    if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ConfigError(f"{c.describe('memory')} must rise from step to step ({fix})")


def _check_output(c: Config, option: Option) -> None:
    if c.output not in OUTPUT_MODES:
        raise ConfigError(f"{c.describe('output')} is not an output mode; use one of: {', '.join(OUTPUT_MODES)}")


def _check_initializer(c: Config, option: Option) -> None:
    if c.initializer is not None and not callable(c.initializer):
        raise ConfigError(f"{c.describe('initializer')} is not callable; pass a function, e.g. "
                          "initializer=load_model, initargs=('model.pt',)")


def _check_initargs(c: Config, option: Option) -> None:
    if not isinstance(c.initargs, (tuple, list)):
        raise ConfigError(f"{c.describe('initargs')} must be a tuple of the initializer's arguments, "
                          f"e.g. initargs=({c.initargs!r},)")
    if c.initargs and c.initializer is None:
        raise ConfigError(f"{c.describe('initargs')} is given without initializer=; pass the function "
                          "that takes them, e.g. initializer=load_model")


def _check_extra_env(c: Config, option: Option) -> None:
    if not isinstance(c.extra_env, dict):
        raise ConfigError(f"{c.describe('extra_env')} must be a dict of environment variables")


def _check_lease(c: Config, option: Option) -> None:
    if isinstance(c.lease, bool) or not isinstance(c.lease, (int, float)) or not c.lease > 0:
        raise ConfigError(f"{c.describe('lease')} must be a positive number of seconds, e.g. lease=60")


def _check_max_cost(c: Config, option: Option) -> None:
    """``max_cost``: a positive number of US dollars, or None (no cap)."""
    value = c.max_cost
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value \
            or value == float("inf"):
        raise ConfigError(f"{c.describe('max_cost')} must be a positive number of US dollars, e.g. "
                          "max_cost=5 (the map stops with fnmap.CostCapReached before it spends more), "
                          "or None for no cap")


def _check_storage(c: Config, option: Option) -> None:
    if c.storage is not None and (not isinstance(c.storage, str) or "://" not in c.storage):
        raise ConfigError(
            f"{c.describe('storage')} is not a storage URL; use file:///absolute/path or s3://bucket/prefix"
        )


@dataclasses.dataclass(frozen=True)
class Cache:
    """The result cache's knobs, for ``cache=fnmap.Cache(...)`` (``cache=True`` is ``Cache()``).

    - ``expire``: an entry older than this is not used (seconds, a ``timedelta``, or an age such as
      ``"12h"`` or ``"7d"``); its call runs again and replaces it.  None: entries never expire.
    - ``refresh``: run every call again and replace its entry (the answer to a change the key
      cannot see: a file read by path, a remote service).
    - ``key``: ``key(*args, **kwargs)`` returns what identifies a call, in place of its arguments
      (for arguments fnmap cannot encode, or to key on less than all of them).
    - ``ignore``: names of arguments, or of globals and closure variables the function reads,
      left out of the key (a logger, a verbosity flag, a client object).

    What the key covers and what it cannot see: docs/cache.md."""

    expire: Any = None
    refresh: bool = False
    key: Any = None
    ignore: tuple = ()

    def __post_init__(self):
        expire = self.expire
        if isinstance(expire, str):
            try:
                expire = parse_age(expire)
            except ValueError as e:
                raise ConfigError(f"fnmap.Cache(expire={self.expire!r}): {e}") from None
        elif hasattr(expire, "total_seconds"):
            expire = expire.total_seconds()
        if expire is not None and (isinstance(expire, bool) or not isinstance(expire, (int, float)) or expire < 0):
            raise ConfigError(f"fnmap.Cache(expire={self.expire!r}) is not a duration: pass seconds, a timedelta "
                              "or an age such as '12h' or '7d', or None (never expires)")
        object.__setattr__(self, "expire", None if expire is None else float(expire))
        if not isinstance(self.refresh, bool):
            raise ConfigError(f"fnmap.Cache(refresh={self.refresh!r}) must be True or False")
        if self.key is not None and not callable(self.key):
            raise ConfigError(f"fnmap.Cache(key={self.key!r}) is not callable; pass a function of the call's "
                              "arguments, e.g. key=lambda path: (path, os.path.getmtime(path))")
        ignore = (self.ignore,) if isinstance(self.ignore, str) else tuple(self.ignore)
        if not all(isinstance(name, str) and name.isidentifier() for name in ignore):
            raise ConfigError(f"fnmap.Cache(ignore={self.ignore!r}) must list argument names, e.g. ignore=['log']")
        object.__setattr__(self, "ignore", ignore)


def _parse_cache(raw: str) -> Any:
    return parse_bool(raw)


def _check_cache(c: Config, option: Option) -> None:
    """``cache``: False/None (off), True (``Cache()``), a :class:`Cache`, or a config file's table."""
    value = c.cache
    if isinstance(value, dict):  # [fnmap.cache] in a config file
        try:
            value = Cache(**value)
        except TypeError as e:
            raise ConfigError(f"{c.describe('cache')}: {e}; the keys are expire, refresh, key and ignore") from None
    if value is True:
        value = Cache()
    if value is False:
        value = None
    if value is not None and not isinstance(value, Cache):
        raise ConfigError(f"{c.describe('cache')} must be True, False or fnmap.Cache(expire=..., refresh=..., "
                          f"key=..., ignore=...), not {type(value).__name__}")
    object.__setattr__(c, "cache", value)


#: The options of every job, whatever the backend (each backend's own: fnmap.backend_table).
JOB_OPTIONS = (
    Option("backend", "emulator", "Where calls run: " + ", ".join(BACKENDS) + ".", identifies=True),
    Option("storage", None, "Storage URL (file:///path or s3://bucket/prefix); default: a per-user cache folder.",
           identifies="storage_url", check=_check_storage),
    Option("secret", None, "Shared secret that signs requests; unset means generated for an auto-started emulator.",
           identifies=True),
    Option("chunksize", None, 'Items per invocation; None ("auto"): sized as the job runs to the backend\'s call '
           "duration.", kind="int", parse=_parse_chunksize, check=_check_chunksize, minimum=1,
           fix="items per invocation; use chunksize=1 or more, or 'auto'"),
    Option("timeout", None, "Seconds per call before it is stopped and reported as fnmap.TimeoutError.",
           kind="float", check=_check_timeout),
    Option("retries", 2, "How often a call is re-run after a platform fault.", kind="int", check=check_int,
           fix="use retries=0 to never re-run a call"),
    Option("retry_on", (), "User exception types that are retried too.", kind="object", check=_check_retry_on),
    Option("speculation", True, "Launch a speculative copy of straggling calls once most of a job is done.",
           kind="bool", check=check_bool),
    Option("memory", None, "Memory per call in MB, or a rising list of them (``[1024, 4096]``, "
           "``FNMAP_MEMORY=1024,4096``): a call killed for memory is retried at the next (see memory_steps).",
           kind="int", parse=_parse_memory, check=_check_memory),
    Option("gpu", 0, "GPUs per call (container jobs).", kind="int", check=check_int,
           fix="use gpu=0 for CPU work or gpu=1 for one GPU per call"),
    Option("progress", None, "Show a progress bar (None: in a terminal or notebook, for long jobs).",
           kind="bool", check=check_bool),
    Option("output", "after", 'Where remote print() output is shown: "after" the job (each call\'s, in call '
           'order, as far as it came back with the answers), "live" (as it happens, on this process\'s '
           'stderr) or "none".', check=_check_output),
    Option("initializer", None, "Called as ``initializer(*initargs)`` once per warm worker process before its "
           "first call (``multiprocessing.Pool``'s names); it travels with the function.", kind="object",
           check=_check_initializer),
    Option("initargs", (), "The initializer's arguments.", kind="object", check=_check_initargs),
    Option("extra_env", None, "Environment variables set around each call on the worker.", kind="object",
           factory=dict, check=_check_extra_env),
    Option("workers", None, "Worker processes of an auto-started emulator / concurrent calls of the client.",
           kind="int", identifies=True, check=check_int, minimum=1, fix="at least one worker"),
    Option("inline_limit", 256 << 10, "Arguments and results larger than this (bytes) travel through storage, "
           "not in request bodies.", kind="int", check=check_int, fix="a size in bytes"),
    Option("max_cost", None, "The most this job may cost, in US dollars at list prices (see "
           ":mod:`fnmap.cost.prices`): no call is sent once what ran plus what is still out would "
           "pass it, and the map raises fnmap.CostCapReached; None: no cap.", kind="float",
           check=_check_max_cost),
    Option("blocking_warning", True, "Warn (fnmap.blocking.BlockingCallWarning, at your line) when a blocking "
           "form such as fnmap.map is called from a coroutine on a running event loop, naming its ``.aio`` "
           "twin.", kind="bool", check=check_bool),
    Option("lease", 60.0, "Seconds a running job's lease lasts (renewed every sixth of it): a job whose client "
           "stopped renewing it for this long is ``abandoned`` wherever it is read (:mod:`fnmap.lease`).",
           kind="float", check=_check_lease),
    Option("cache", None, "Keep each call's result in the storage and use it instead of running the call "
           "again: True, or fnmap.Cache(expire=..., refresh=True, key=..., ignore=[...]) (docs/cache.md); "
           "``FNMAP_CACHE=1``.", kind="bool", parse=_parse_cache, check=_check_cache),
)


def _assemble(job_options: tuple, backend_options: dict) -> tuple[Option, ...]:
    """The job's options, then each backend's (an option two backends share, once)."""
    options: dict[str, Option] = {}
    for option in (*job_options, *(o for group in backend_options.values() for o in group)):
        if options.setdefault(option.name, option) is not option:
            raise AssertionError(f"option {option.name!r} is declared twice")
    return tuple(options.values())


#: Every option, declared once.
DECLARED = _assemble(JOB_OPTIONS, BACKEND_OPTIONS)
OPTIONS = tuple(o.name for o in DECLARED)
_BY_NAME = {o.name: o for o in DECLARED}
_IDENTIFYING = tuple(o.identifies if isinstance(o.identifies, str) else o.name for o in DECLARED if o.identifies)

#: How the ``backend`` source starts when ``gpu=`` chose it.
_GPU_SOURCE = "gpu="


class _ConfigMethods:
    """What :class:`Config` does besides holding the options."""

    __slots__ = ()

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
        label = _BY_NAME[name].variable if src == "the environment" else name
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
        """The options that identify a client (those declared ``identifies``: backend, storage and
        where/how calls are sent), the AWS settings of the environment and whether gpu= chose the backend."""
        return (*(getattr(self, name) for name in _IDENTIFYING), endpoint_environment(), self.gpu_chose_backend)

    def replace(self, **changes: Any) -> Config:
        sources = dict(self.sources)
        sources.update({k: "keyword" for k in changes})
        return dataclasses.replace(self, sources=sources, **changes)


def _field(option: Option) -> tuple:
    if option.factory is not None:
        return option.name, Any, dataclasses.field(default_factory=option.factory)
    return option.name, Any, dataclasses.field(default=option.default)


Config = dataclasses.make_dataclass(
    "Config",
    [*map(_field, DECLARED),
     # Where each value came from, for error messages (not an option).
     ("sources", dict, dataclasses.field(default_factory=dict, compare=False, repr=False))],
    bases=(_ConfigMethods,), frozen=True,
)
Config.__module__ = __name__
Config.__doc__ = "Every option of a job and of the deployment it runs on.\n\n" + "\n".join(
    f"- ``{o.name}`` (default {'{}' if o.factory else repr(o.default)}"
    f"{', ' + o.variable if o.variable else ''}): {o.help}" for o in DECLARED)


def endpoint_environment() -> tuple:
    """The AWS endpoint and credential settings of the environment.

    Workers of an auto-started emulator inherit the environment when it starts,
    so a change here (say ``AWS_ENDPOINT_URL_S3`` set after the first job) must
    lead to a new client and emulator rather than to workers that see old values.
    """
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith(("AWS_", "FNMAP_S3_"))))


def resolve(**kwargs: Any) -> Config:
    """Build a :class:`Config` from keywords, the environment, the config file and defaults."""
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        raise UnknownOption(f"{_unknown_options(unknown)}valid options: {', '.join(OPTIONS)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_values, file_path = _read_config_file()
    for option in DECLARED:
        name = option.name
        if name in kwargs and kwargs[name] is not None:
            values[name], sources[name] = kwargs[name], "keyword"
            continue
        env = os.environ.get(option.variable) if option.variable else None
        if env not in (None, ""):
            values[name], sources[name] = option.from_environment(env), "the environment"
            continue
        if name in file_values:
            values[name], sources[name] = file_values[name], f"config file {file_path}"
    _warn_unknown_variables()
    _normalize(values, sources)
    return Config(sources=sources, **values)


def _normalize(values: dict, sources: dict) -> None:
    """Spellings made canonical before the checks: one exception class, lists as tuples, gpu= choosing batch."""
    if "retry_on" in values:
        values["retry_on"] = _retry_on_tuple(values["retry_on"], sources["retry_on"])
    if isinstance(values.get("memory"), list):  # a list as a tuple: the Config stays hashable
        values["memory"] = tuple(values["memory"])
    gpu = values.get("gpu")
    if "backend" not in values and isinstance(gpu, int) and not isinstance(gpu, bool) and gpu > 0:
        # GPU calls run as container jobs unless a backend is named.
        values["backend"], sources["backend"] = "batch", f"{_GPU_SOURCE}{gpu}: GPU calls run as container jobs"


def _retry_on_tuple(retry_on: Any, source: str) -> tuple:
    if isinstance(retry_on, type):
        return (retry_on,)
    if isinstance(retry_on, (str, bytes)):  # tuple() would make ('V', 'a', 'l', ...) of it
        example = retry_on if isinstance(retry_on, str) and retry_on.isidentifier() else "ValueError"
        raise ConfigError(
            f"retry_on={retry_on!r} (from {source}) is a string; pass exception classes, "
            f"e.g. retry_on=({example},)"
        )
    try:
        return tuple(retry_on)
    except TypeError:
        raise ConfigError(
            f"retry_on={retry_on!r} (from {source}) is not an exception class or a tuple "
            "of them; e.g. retry_on=(ConnectionError, TimeoutError)"
        ) from None


#: FNMAP_* variables read outside :class:`Config` (storage, the runtime, the emulator).
OTHER_VARIABLES = ("FNMAP_S3_ENDPOINT_URL", "FNMAP_RUNTIME", "FNMAP_HTTP_PARSER", "FNMAP_BATCH_CONCURRENCY",
                   "FNMAP_SIGNATURE_WINDOW", "FNMAP_EMULATOR_ACCESS_KEY_ID", "FNMAP_EMULATOR_SECRET_ACCESS_KEY")
_warned_variables: set[str] = set()
_KNOWN_VARIABLES = frozenset([*(o.variable for o in DECLARED if o.variable), *OTHER_VARIABLES])


def _warn_unknown_variables() -> None:
    """Warn once per variable about an ``FNMAP_*`` variable fnmap does not read (a typo such as
    ``FNMAP_CHUNK_SIZE`` would otherwise be ignored silently), naming the closest known one."""
    for name in os.environ:
        if not name.startswith("FNMAP_") or name in _KNOWN_VARIABLES or name in _warned_variables:
            continue
        _warned_variables.add(name)
        import warnings

        hint = did_you_mean(name, sorted(_KNOWN_VARIABLES)).replace("'", "")
        warnings.warn(f"{name} is not a setting fnmap reads, so it is ignored; {hint}"
                      "the settings are listed in fnmap.config.Config", UserWarning, stacklevel=user_stacklevel())


def _read_config_file() -> tuple[dict, str | None]:
    candidates = [os.path.join(os.getcwd(), "fnmap.toml")]
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    candidates.append(os.path.join(xdg, "fnmap", "config.toml"))
    for path in candidates:
        if os.path.isfile(path):
            return _read_toml(path), path
    return {}, None


def _read_toml(path: str) -> dict:
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
        raise ConfigError(f"config file {path} has {_unknown_options(unknown)}valid options: {', '.join(OPTIONS)}")
    return data


#: Keywords of the front-ends that are not options (``fnmap.map``'s and ``map_reduce``'s own):
#: a misspelling of one reaches :func:`resolve` as an unknown option, and is hinted at too.
FRONT_END_KEYWORDS = ("return_exceptions", "return_job", "job_name", "obj_chunk_size", "obj_chunk_number",
                      "reduce_fanin", "reduce_by_key")
#: The front ends that take each of them: a keyword given to a call that does not take it is named so.
_TAKEN_BY = {"return_exceptions": "map, starmap, imap and imap_unordered",
             "return_job": "map, starmap and map_reduce", "job_name": "map and starmap",
             "obj_chunk_size": "map and map_reduce", "obj_chunk_number": "map and map_reduce",
             "reduce_fanin": "map_reduce", "reduce_by_key": "map_reduce"}


def _unknown_options(names: list[str]) -> str:
    """``unknown option 'chunk_size' (did you mean 'chunksize'?); `` for each name fnmap does not know."""
    parts = []
    for name in names:
        if name in _TAKEN_BY:  # right, but for another front end (job_name= of an imap)
            parts.append(f"{name!r} (a keyword of fnmap's {_TAKEN_BY[name]} only, not of this call)")
            continue
        hint = did_you_mean(name, (*OPTIONS, *FRONT_END_KEYWORDS)).strip()
        parts.append(f"{name!r}" + (f" ({hint})" if hint else ""))
    return f"unknown option{'s' if len(names) > 1 else ''} {', '.join(parts)}; "


def _validate(c: Config) -> None:
    if c.backend not in BACKENDS:
        hint = did_you_mean(c.backend, BACKENDS, BACKEND_ALIASES)
        raise UnknownBackend(f"{c.describe('backend')} is not a backend; {hint}choose one of: {', '.join(BACKENDS)}")
    for option in DECLARED:
        if option.check is not None:
            option.check(c, option)
