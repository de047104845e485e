"""Deprecated: the tier plugin interface is :mod:`kv_offload.tiering` (``from
kv_offload.tiering import SecondaryTierManager, JobResult, ...``). This module re-exports it,
with a ``DeprecationWarning`` on import, for tier plugins written before."""

from __future__ import annotations

import warnings

from .tiering.base import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

__all__ = ["JobDirection", "JobMetadata", "JobResult", "OffloadingConfig", "SecondaryTierManager"]

warnings.warn(
    "kv_offload.tier is deprecated: import the tier interface from kv_offload.tiering",
    DeprecationWarning,
    stacklevel=2,
)
