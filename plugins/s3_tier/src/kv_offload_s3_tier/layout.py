"""Where a block lives in the bucket: ``{prefix}/{shard}/{key hex}.kvb``.

``shard`` is two hex digits of the XXH3 hash of the key (256 shards), so the objects spread
over an object store's index partitions however the keys look (S3 partitions by key prefix;
a store that throttles per prefix throttles per shard). The format marker lives at
``{prefix}/__format__``; nothing else of the tier's is under the prefix, so listing it finds
every block (restart recovery).
"""

from __future__ import annotations

import xxhash
from kv_offload import OffloadKey

__all__ = ["SUFFIX", "Layout"]

SUFFIX = ".kvb"


class Layout:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.blocks = f"{prefix}/"
        self.marker = f"{prefix}/__format__"

    def name(self, key: bytes) -> str:
        shard = xxhash.xxh3_64_intdigest(key) & 0xFF
        return f"{self.blocks}{shard:02x}/{key.hex()}{SUFFIX}"

    def key_of(self, name: str) -> OffloadKey | None:
        """The block key of object ``name``, or ``None`` for a name that is not a block's."""
        if not name.startswith(self.blocks) or not name.endswith(SUFFIX):
            return None
        shard, _, tail = name[len(self.blocks) : -len(SUFFIX)].partition("/")
        try:
            key = bytes.fromhex(tail)
        except ValueError:
            return None
        if len(shard) != 2 or not key or self.name(key) != name:
            return None
        return OffloadKey(key)
