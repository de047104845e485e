"""Offload keys: what identifies a KV block across tiers.

A key is the prefix block hash the engine already computed, as ``bytes``: hashable, cheap to
compare and free of per-object GC overhead (a tuple key would be tracked by the collector).
The manager accepts any hashable object at run time, but tiers that persist keys (files, Redis)
need bytes, so build keys with :func:`make_offload_key`.
"""

from __future__ import annotations

from typing import Any, NewType

from .errors import InvalidKeyError

__all__ = ["OffloadKey", "make_offload_key", "get_offload_block_hash", "get_offload_group_idx"]

OffloadKey = NewType("OffloadKey", bytes)

_GROUP_BYTES = 4
_HASH_MIN = -(1 << 63)
_HASH_LIMIT = 1 << 64
_GROUP_LIMIT = 1 << (8 * _GROUP_BYTES)


def make_offload_key(block_hash: bytes | int, group_idx: int = 0) -> OffloadKey:
    """Pack a block hash (bytes, or an integer id as in the Mooncake traces) and a KV group.

    An integer hash must fit in 64 bits (``-2**63 <= h < 2**64``: signed or unsigned, as
    engines and traces write them; a negative hash is its two's-complement bit pattern, so
    ``-1`` and ``2**64 - 1`` are the same key) and ``group_idx`` in 32 unsigned bits.
    Anything else raises :class:`~kv_offload.errors.InvalidKeyError` naming the value, since a
    silently truncated or wrapped hash would alias another block.
    """
    if isinstance(block_hash, bool) or not isinstance(
        block_hash, (int, bytes, bytearray, memoryview)
    ):
        hint = " (encode a str first, e.g. text.encode())" if isinstance(block_hash, str) else ""
        raise InvalidKeyError(
            f"make_offload_key: block_hash must be bytes or an int, got "
            f"{type(block_hash).__name__} {block_hash!r}{hint}"
        )
    if isinstance(group_idx, bool) or not isinstance(group_idx, int):
        raise InvalidKeyError(
            f"make_offload_key: group_idx must be an int, got {type(group_idx).__name__} "
            f"{group_idx!r}"
        )
    if not 0 <= group_idx < _GROUP_LIMIT:
        raise InvalidKeyError(f"make_offload_key: group_idx {group_idx} is out of range [0, 2**32)")
    if isinstance(block_hash, int):
        if not _HASH_MIN <= block_hash < _HASH_LIMIT:
            raise InvalidKeyError(
                f"make_offload_key: block_hash {block_hash} does not fit in 64 bits "
                f"(-2**63 <= hash < 2**64)"
            )
        block_hash = block_hash.to_bytes(8, "big", signed=block_hash < 0)
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(_GROUP_BYTES, "big"))


def is_offload_key(value: object) -> bool:
    """The one rule of what the manager accepts as a key: ``bytes`` (a subclass too). Tiers
    persist keys as bytes; a str, an int, ``None`` or a tuple would answer ``MISS`` forever,
    or fail a tier job and the valid keys in it."""
    return isinstance(value, bytes)


_JOIN = b"".join  # refuses (TypeError) what is not bytes-like, at C speed


def all_offload_keys(values: list[Any]) -> bool:
    """Whether every item is bytes-like, in one C-level pass (``b"".join``, the cheapest
    there is): what the hot paths ask before keys enter the cache or a tier. ``False`` names
    no culprit: the caller then applies :func:`is_offload_key` to each. A read-only
    ``memoryview`` passes (it hashes and compares as the bytes it views, so it is the same
    key); a ``bytearray`` passes too, and is refused as unhashable by the cache lookup that
    precedes every use."""
    try:
        _JOIN(values)
    except TypeError:
        return False
    return True


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block-hash part of a key built by :func:`make_offload_key`."""
    return key[:-_GROUP_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-group part of a key built by :func:`make_offload_key`."""
    return int.from_bytes(key[-_GROUP_BYTES:], "big")
