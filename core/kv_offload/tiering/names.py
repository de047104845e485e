"""How the secondary tiers of one stack are named (the optional ``name`` of a ``[[tiers]]``
entry).

A tier's name is what stats, events, hooks and ``kv-offload replay`` call it. An entry with a
``name`` keeps it. An entry without one is called by its type, unless another unnamed entry
has the same type: then every such entry is called ``<position>:<type>``, its 1-based position
in the list (``1:fs``, ``2:fs``; position 0 is the CPU tier), as vLLM names repeated tiers.
The resulting names must be distinct, and none may be ``"CPU"`` (the CPU tier's medium).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..errors import ConfigError

__all__ = ["RESERVED_NAMES", "TierNameError", "tier_names"]

#: Media a secondary tier cannot be called: events and hooks use them for the CPU tier.
RESERVED_NAMES = frozenset({"CPU"})


class TierNameError(ConfigError):
    """Two ``[[tiers]]`` entries resolve to one name, or a name is reserved; ``index`` is the
    entry at fault (the later one of a pair), ``other`` the earlier one or ``None``."""

    def __init__(self, message: str, *, index: int, other: int | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.other = other


def tier_names(entries: Sequence[tuple[str, str | None]]) -> list[str]:
    """The name of every ``(type, name or None)`` entry, in order (see the module docstring)."""
    unnamed = Counter(tier_type for tier_type, name in entries if name is None)
    names: list[str] = []
    seen: dict[str, int] = {}
    for index, (tier_type, name) in enumerate(entries):
        if name is None:
            name = tier_type if unnamed[tier_type] == 1 else f"{index + 1}:{tier_type}"
            given = f"tiers[{index}] (type {tier_type!r}, unnamed) is called {name!r}"
        else:
            given = f"tiers[{index}] is named {name!r}"
        if name in RESERVED_NAMES:
            raise TierNameError(
                f"{given}, which is reserved for the CPU tier; pick another name", index=index
            )
        if name in seen:
            other = seen[name]
            raise TierNameError(
                f"{given}, like tiers[{other}] (type {entries[other][0]!r}); give each "
                f"[[tiers]] entry a distinct name",
                index=index,
                other=other,
            )
        seen[name] = index
        names.append(name)
    return names
