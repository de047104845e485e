"""Secondary tiers: the tier plugin interface (``base``), name resolution (``factory``), the
tiered manager (``manager``), its jobs in flight (``jobs``) and counters (``stats``).

Each tier's settings in the stack (name, locality, cascade gate, write policy, admission)
are the manager's record of it (``record``), never attributes of the plugin.

``__all__`` is the tier author's API (docs/plugin-guide.md, "Plugin-author API"): what a
tier plugin imports, and the tiered manager and its statistics."""

from __future__ import annotations

from ..async_lookup import AsyncLookup, AsyncLookupStats
from ..tier_types import Locality, Medium, TierMatcher
from ..types import TieringStats, TierStats
from .base import JobDirection, JobMetadata, JobResult, OffloadingConfig, SecondaryTierManager
from .breaker import CircuitBreaker
from .factory import TIER_ENTRY_POINT_GROUP, SecondaryTierFactory
from .manager import TieringOffloadingManager
from .record import TierEntry

__all__ = [
    "AsyncLookup",
    "AsyncLookupStats",
    "Locality",
    "Medium",
    "TierMatcher",
    "CircuitBreaker",
    "JobDirection",
    "JobMetadata",
    "JobResult",
    "OffloadingConfig",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TIER_ENTRY_POINT_GROUP",
    "TierEntry",
    "TieringOffloadingManager",
    "TieringStats",
    "TierStats",
]
