"""The answer of a single-block lookup."""

from __future__ import annotations

from enum import Enum

__all__ = ["LookupResult"]


class LookupResult(Enum):
    """``HIT``: loadable now. ``MISS``: absent. ``PENDING``: present, but a store or promotion
    is still in flight; ask again after the engine's next step."""

    MISS = "miss"
    HIT = "hit"
    PENDING = "pending"
