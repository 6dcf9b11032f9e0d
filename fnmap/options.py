"""What an option is: one declaration says its name, type, default, variable, help and checks.

:mod:`fnmap.config` declares the options every job has; :mod:`fnmap.backend_table` the ones each
backend reads.  ``config`` assembles :class:`fnmap.config.Config` from both, so an option is
written once: the keyword, the ``FNMAP_<NAME>`` variable, the config-file key, the parsing of the
variable, the check of the value and whether it identifies a deployment all come from here.

A leaf module: it imports nothing of fnmap but the errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: How an option's variable is parsed, and what the error says it should have been.
_KINDS = {"int": (int, "an integer"), "float": (float, "a number")}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    """One option: a keyword of ``fnmap.map`` and friends, a field of ``Config``."""

    name: str
    default: Any = None
    #: The text shown in ``Config``'s documentation.
    help: str = ""
    #: "str", "int", "float", "bool" or "object" (never read from the environment).
    kind: str = "str"
    #: Whether the value identifies a deployment (two jobs that differ in it need another client);
    #: a string names the attribute that does (``storage`` -> ``storage_url``, default resolved).
    identifies: bool | str = False
    #: ``check(config, option)`` raises ConfigError naming the value and the fix.
    check: Callable[[Any, Option], None] | None = None
    #: Parses the environment variable's text, for kinds with special spellings (``auto``, lists).
    parse: Callable[[str], Any] | None = None
    #: ``int`` options checked by :func:`check_int`: the least value and how to fix a bad one.
    minimum: int = 0
    fix: str = ""
    #: A fresh default per Config (``dict`` for ``extra_env``).
    factory: Callable[[], Any] | None = None

    def __post_init__(self):
        #: The environment variable that sets it, or None for options only a keyword can set.
        object.__setattr__(self, "variable", None if self.kind == "object" else f"FNMAP_{self.name.upper()}")

    def from_environment(self, raw: str) -> Any:
        """The value ``raw`` (the variable's text) stands for; ConfigError naming it when it is bad."""
        try:
            if self.parse is not None:
                return self.parse(raw)
            if self.kind in _KINDS:
                return _KINDS[self.kind][0](raw)
            if self.kind == "bool":
                return parse_bool(raw)
        except ValueError:
            expected = "true or false" if self.kind == "bool" else _KINDS[self.kind][1]
            raise ConfigError(f"{self.variable}={raw!r} (from the environment) is not {expected}") from None
        return raw


def did_you_mean(name: object, choices, aliases: dict[str, str] | None = None) -> str:
    """The hint for a misspelt name: ``"did you mean 'chunksize'? "``, or ``""`` when none is close.

    ``aliases`` maps other names people use for a choice to it (``"lambda"`` -> ``"aws"``): a word
    no spelling distance finds.  Case and ``-``/``_`` are ignored, as users mix them."""
    import difflib

    if not isinstance(name, str):
        return ""
    folded = name.strip().lower().replace("-", "_")
    by_folded = {c.lower().replace("-", "_"): c for c in choices}
    for alias, choice in (aliases or {}).items():
        by_folded.setdefault(alias.lower().replace("-", "_"), choice)
    close = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=0.6)
    return f"did you mean {by_folded[close[0]]!r}? " if close else ""


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in an age like ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    text = text.strip().lower()
    unit = _AGE_UNITS.get(text[-1:]) if text else None
    try:
        value = float(text[:-1]) if unit else None
    except ValueError:
        value = None
    if unit is None or value is None or value < 0:
        raise ValueError(f"{text!r} is not an age: use a number and a unit s, m, h, d or w, e.g. 12h or 7d")
    return value * unit


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(raw)


def check_int(config: Any, option: Option) -> None:
    """An integer of at least ``option.minimum``; None passes where the default is None (automatic)."""
    value = getattr(config, option.name)
    if value is None and option.default is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < option.minimum:
        raise ConfigError(f"{config.describe(option.name)} must be an integer >= {option.minimum} ({option.fix})")


def check_bool(config: Any, option: Option) -> None:
    """True or False; None too where None is the default (automatic)."""
    value = getattr(config, option.name)
    if isinstance(value, bool) or (value is None and option.default is None):
        return
    choices = "True, False or None (automatic)" if option.default is None else "True or False"
    raise ConfigError(f"{config.describe(option.name)} must be {choices}, not {type(value).__name__}")


def check_url(config: Any, option: Option) -> None:
    """An http(s) URL, or unset."""
    value = getattr(config, option.name)
    if value is not None and not str(value).startswith(("http://", "https://")):
        raise ConfigError(f"{config.describe(option.name)} is not an http(s) URL; e.g. http://127.0.0.1:8765")
