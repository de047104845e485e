"""Offload keys: what identifies a KV block across tiers.

A key is the prefix block hash the engine already computed, as ``bytes``: hashable, cheap to
compare and free of per-object GC overhead (a tuple key would be tracked by the collector).
The manager accepts any hashable object at run time, but tiers that persist keys (files, Redis)
need bytes, so build keys with :func:`make_offload_key`.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["OffloadKey", "make_offload_key", "get_offload_block_hash", "get_offload_group_idx"]

OffloadKey = NewType("OffloadKey", bytes)

_GROUP_BYTES = 4


def make_offload_key(block_hash: bytes | int, group_idx: int = 0) -> OffloadKey:
    """Pack a block hash (bytes, or an integer id as in the Mooncake traces) and a KV group."""
    if isinstance(block_hash, int):
        block_hash = block_hash.to_bytes(8, "big", signed=block_hash < 0)
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(_GROUP_BYTES, "big"))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block-hash part of a key built by :func:`make_offload_key`."""
    return key[:-_GROUP_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-group part of a key built by :func:`make_offload_key`."""
    return int.from_bytes(key[-_GROUP_BYTES:], "big")
