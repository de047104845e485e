"""The rules config values obey, one per kind of value: a check that returns the value to
keep or raises :class:`Invalid` saying how the value broke it (``must be > 0, got 0``), and the
type text ``docs/configuration.md`` shows for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ANY",
    "BOOLEAN",
    "NAME",
    "NAMES",
    "NON_NEGATIVE_INT",
    "POSITIVE_INT",
    "POSITIVE_SECONDS",
    "REQUIRED",
    "TABLE",
    "Invalid",
    "Rule",
]


class Invalid(ValueError):
    """A value broke its key's rule; the message says how (``must be > 0, got 0``)."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a key that must be set.
REQUIRED: Final = _Required()


@dataclass(frozen=True)
class Rule:
    """A value check: ``check(value)`` returns the value to keep or raises :class:`Invalid`."""

    type_text: str
    check: Callable[[Any], Any]


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be an integer, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise Invalid(f"must be > 0, got {value}")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"must be an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise Invalid(f"must be >= 0, got {value}")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"must be a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {value!r}")
    return value


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Invalid(f"must be a list of plugin names, got {value!r}")
    return tuple(value)


def _positive_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"must be a number of seconds, got {type(value).__name__} {value!r}")
    if not 0 < value < float("inf"):
        raise Invalid(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(f"must be a table, got {type(value).__name__} {value!r}")
    return dict(value)


POSITIVE_INT = Rule("int > 0", _positive_int)
NON_NEGATIVE_INT = Rule("int >= 0", _non_negative_int)
POSITIVE_SECONDS = Rule("float > 0", _positive_seconds)
NAME = Rule("str", _name)
BOOLEAN = Rule("bool", _boolean)
NAMES = Rule("list[str]", _names)
TABLE = Rule("table", _table)
ANY = Rule("any", lambda value: value)
