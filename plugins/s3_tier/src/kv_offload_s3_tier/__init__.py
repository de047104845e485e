"""kv-offload's S3 tier: blocks in any S3-compatible object store (AWS S3, MinIO, Ceph RGW).

``[[tiers]] type = "s3"`` with ``bucket``, ``endpoint_url`` (absent: AWS), ``prefix`` and
``capacity_blocks`` or ``capacity_bytes``; see the README for every key.
"""

from .tier import S3Tier, S3TierStats

__all__ = ["S3Tier", "S3TierStats"]
