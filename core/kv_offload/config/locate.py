"""Where a config key is written: ``file:line`` for errors, from the key's path, not a message.

A key's path is the tuple of table names, array indices and key names that leads to it:
``("num_blocks",)``, ``("hooks", "enable")``, ``("tiers", 0, "capacity_blocks")``. Errors
carry it (:attr:`kv_offload.ConfigError.key` holds its dotted form), and :class:`Locator`
turns it into the line of the TOML file that sets it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .rules import Invalid
from .schema import Field

__all__ = ["KeyPath", "Locator", "Validator", "did_you_mean", "dotted", "read_config_text"]

KeyPath = tuple[str | int, ...]

#: One part of a TOML key: bare, "double-quoted" or 'single-quoted'.
_KEY_PART = r"[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'"


def dotted(path: KeyPath) -> str:
    """The key as messages name it: ``hooks.enable``, ``tiers[0].type``."""
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")


class Locator:
    """Finds the line of a key in TOML text, so errors can say ``file:line``.

    Understands what configs use: ``[table]`` and ``[[tiers]]`` headers (comments after them
    included), ``key = value`` and dotted ``table.key = value`` lines.
    """

    _HEADER = re.compile(r"^(\[\[?)([^\]]+)\]\]?\s*(?:#.*)?$")
    _KEY = re.compile(rf"^((?:{_KEY_PART})(?:\s*\.\s*(?:{_KEY_PART}))*)\s*=")
    _PART = re.compile(_KEY_PART)

    def __init__(self, source: str, text: str | None) -> None:
        self.source = source
        self.lines = text.splitlines() if text is not None else None

    def where(self, path: KeyPath) -> str:
        """``source:line`` of ``path``, or ``source`` alone when no line sets it."""
        line = self.line(path)
        return f"{self.source}:{line}" if line else self.source

    @classmethod
    def _parts(cls, text: str) -> tuple[str, ...]:
        return tuple(part.strip("\"'") for part in cls._PART.findall(text))

    def line(self, path: KeyPath) -> int | None:
        """The line that sets ``path`` (a table's header for a table), else the first line
        setting a key of the same name, else ``None``."""
        if not self.lines or not path:
            return None
        table: KeyPath = ()
        array_index: dict[tuple[str, ...], int] = {}
        first_match = None
        for number, raw in enumerate(self.lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            header = self._HEADER.match(line) if line.startswith("[") else None
            if header:
                name = self._parts(header.group(2))
                if header.group(1) == "[[":
                    array_index[name] = array_index.get(name, -1) + 1
                    table = (*name, array_index[name])
                else:
                    table = name
                if table == path:
                    return number
                continue
            match = self._KEY.match(line)
            if match is None:
                continue
            full = (*table, *self._parts(match.group(1)))
            if full == path:
                return number
            if first_match is None and full[-1] == path[-1]:
                first_match = number
        return first_match


def read_config_text(source: str) -> str | None:
    """The text of the config file ``source`` names, or ``None`` (a dict, an unreadable file)."""
    path = Path(source)
    if source.startswith("<") or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def closest(word: str, known: set[str]) -> str | None:
    """The name in ``known`` closest to a misspelt ``word``, if one is close enough: the one
    rule behind every "did you mean" of the project (config keys, plugin names)."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return close[0] if close else None


def did_you_mean(key: str, known: set[str]) -> str:
    """``"; did you mean 'x'?"`` for :func:`closest`'s answer, else ``""``."""
    close = closest(key, known)
    return f"; did you mean {close!r}?" if close else ""


class Validator:
    """Builds the errors of one config source: ``file:line: key: message``, ``key`` set."""

    def __init__(self, locator: Locator) -> None:
        self.loc = locator

    @classmethod
    def for_source(cls, source: str) -> Validator:
        """For a config already parsed: re-reads its file (if it is one) to locate keys."""
        return cls(Locator(source, read_config_text(source)))

    def fail(self, path: KeyPath, message: str, at: KeyPath | None = None) -> ConfigError:
        """An error naming the key ``path``, located at ``path`` (or at ``at``: for a key that
        is missing from the file, the line that needs it)."""
        key = dotted(path)
        return ConfigError(f"{self.loc.where(at or path)}: {key}: {message}", key=key)

    def unknown(self, data: Mapping[str, Any], known: set[str], prefix: KeyPath) -> None:
        for key in data:
            if key not in known:
                raise self.fail(
                    (*prefix, key),
                    f"unknown key{did_you_mean(key, known)} (known: {', '.join(sorted(known))})",
                )

    def fields(
        self, data: Mapping[str, Any], fields: tuple[Field, ...], prefix: KeyPath = ()
    ) -> dict[str, Any]:
        """Each field's checked value as written; absent fields are left out."""
        values = {}
        for f in fields:
            if f.name not in data:
                continue
            try:
                values[f.name] = f.check(data[f.name])
            except Invalid as exc:
                raise self.fail((*prefix, f.name), str(exc)) from None
        return values

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, Mapping):
            raise self.fail((key,), f"must be a table, got {value!r}")
        return value
