"""Where a config key is written: ``file:line`` for errors, from the key's path, not a message.

A key's path is the tuple of table names, array indices and key names that leads to it:
``("num_blocks",)``, ``("hooks", "enable")``, ``("tiers", 0, "capacity_blocks")``. Errors
carry it (:attr:`kv_offload.ConfigError.key` holds its dotted form), and :class:`Locator`
turns it into the line of the TOML file that sets it.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["KeyPath", "Locator", "dotted", "read_config_text"]

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
