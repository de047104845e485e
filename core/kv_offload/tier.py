"""The secondary-tier plugin interface, at the import path tier plugins have always used.

The definitions live in :mod:`kv_offload.tiering.base`; every name is also exported by
``kv_offload`` itself.
"""

from __future__ import annotations

from .tiering.base import (
    JobDirection,
    JobMetadata,
    JobResult,
    OffloadingConfig,
    SecondaryTierManager,
)

__all__ = [
    "JobDirection",
    "JobMetadata",
    "JobResult",
    "OffloadingConfig",
    "SecondaryTierManager",
]
