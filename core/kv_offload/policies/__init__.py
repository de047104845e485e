"""Eviction policies: the plugin interface (``base``) and name resolution (``factory``)."""

from __future__ import annotations

from ..block_status import BlockStatus, bind_block_status
from .base import CachePolicy, split_pairs
from .factory import POLICY_ENTRY_POINT_GROUP, CachePolicyFactory
from .key_queue import KeyQueue
from .request_access import RequestAccessLog

__all__ = [
    "BlockStatus",
    "CachePolicy",
    "CachePolicyFactory",
    "KeyQueue",
    "POLICY_ENTRY_POINT_GROUP",
    "RequestAccessLog",
    "bind_block_status",
    "split_pairs",
]
