"""Parsing of Kafka-style dotted config dicts (string values as a broker passes them, or native values).

Each package declares its keys once as ConfigKey tuples; unknown or invalid keys fail at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlmm.errors import ConfigError

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    return int(str(value).strip())


def parse_str(value: Any) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return str(value)


@dataclass(frozen=True)
class ConfigKey:
    name: str
    parse: Callable[[Any], Any]
    default: Any = None
    required: bool = False
    check: Callable[[Any], bool] | None = None
    requirement: str = ""
    secret: bool = False


def parse_config(
    raw: Mapping[str, Any], keys: Iterable[ConfigKey], owner: str, ignore_prefixes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Parse `raw` against `keys`; return every declared key (defaults filled in)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{owner} config must be a mapping of key -> value, got {type(raw).__name__}")
    declared = {key.name: key for key in keys}
    unknown = sorted(k for k in raw if k not in declared and not k.startswith(ignore_prefixes))
    if unknown:
        raise ConfigError(
            f"{owner}: unknown config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(declared))}"
        )
    parsed: dict[str, Any] = {}
    for name, key in declared.items():
        if name not in raw or raw[name] is None:
            if key.required:
                raise ConfigError(f"{owner}: config key {name} is required")
            parsed[name] = key.default
            continue
        shown = "<redacted>" if key.secret else repr(raw[name])
        try:
            value = key.parse(raw[name])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{owner}: config key {name} has invalid value {shown}: {exc}") from None
        if key.check is not None and not key.check(value):
            raise ConfigError(f"{owner}: config key {name} must be {key.requirement}, got {shown}")
        parsed[name] = value
    return parsed
