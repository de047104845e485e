"""Secondary tiers: the tier plugin interface (``base``), name resolution (``factory``), the
tiered manager (``manager``), its jobs in flight (``jobs``) and counters (``stats``)."""

from __future__ import annotations

from .base import JobDirection, JobMetadata, JobResult, OffloadingConfig, SecondaryTierManager
from .factory import TIER_ENTRY_POINT_GROUP, SecondaryTierFactory, check_tier_arguments
from .manager import TieringOffloadingManager
from .stats import TieringStats, TierStats

__all__ = [
    "JobDirection",
    "JobMetadata",
    "JobResult",
    "OffloadingConfig",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TIER_ENTRY_POINT_GROUP",
    "TieringOffloadingManager",
    "TieringStats",
    "TierStats",
    "check_tier_arguments",
]
