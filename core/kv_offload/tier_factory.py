"""Old import path of the tier factory; it lives in :mod:`kv_offload.tiering.factory`
(kept for modules not yet moved to the new layout)."""

from __future__ import annotations

from .tiering.factory import TIER_ENTRY_POINT_GROUP, SecondaryTierFactory, check_tier_arguments

__all__ = ["SecondaryTierFactory", "TIER_ENTRY_POINT_GROUP", "check_tier_arguments"]
