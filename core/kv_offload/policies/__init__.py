"""Eviction policies: the plugin interface (``base``) and name resolution (``factory``)."""

from __future__ import annotations

from .base import CachePolicy
from .factory import POLICY_ENTRY_POINT_GROUP, CachePolicyFactory

__all__ = ["CachePolicy", "CachePolicyFactory", "POLICY_ENTRY_POINT_GROUP"]
