"""Old import path of the policy factory; it lives in :mod:`kv_offload.policies.factory`
(kept for modules not yet moved to the new layout)."""

from __future__ import annotations

from .policies.factory import POLICY_ENTRY_POINT_GROUP, CachePolicyFactory

__all__ = ["CachePolicyFactory", "POLICY_ENTRY_POINT_GROUP"]
