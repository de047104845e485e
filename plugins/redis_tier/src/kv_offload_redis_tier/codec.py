"""The stored value: a small header, then the block's bytes exactly as in the CPU buffer row.

Header (little-endian): magic ``KVOB``, format version (u16), key length (u16), reserved
(u32, zero), payload length (u64), XXH3-64 of the payload (u64), then the offload key itself.
A value is accepted only if all of it matches what the reader expects: a truncated value, a
value written for another block size, another key's value or a foreign one is rejected and
never copied into the CPU buffer.

The header is a separate buffer from the payload: the writer sends ``header`` and the CPU row
as two pieces of one bulk string (see :mod:`.wire`), so the row is never copied to build a
value.
"""

from __future__ import annotations

import struct
from typing import Any

import xxhash

__all__ = ["FORMAT_VERSION", "HEADER", "BadValue", "check", "header"]

FORMAT_VERSION = 1
MAGIC = b"KVOB"
HEADER = struct.Struct("<4sHHIQQ")


class BadValue(Exception):
    """A stored value failed the integrity check; the message says which part."""


def header(key: bytes, payload: Any) -> bytes:
    """The header of ``payload`` (a buffer: a CPU buffer row) stored under ``key``."""
    view = memoryview(payload)
    return (
        HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, view.nbytes, xxhash.xxh3_64_intdigest(view))
        + key
    )


def check(value: bytes, key: bytes, block_size: int) -> memoryview:
    """The payload of ``value`` (a view, no copy) if it is ``key``'s block of ``block_size``
    bytes in this format; :class:`BadValue` otherwise."""
    view = memoryview(value)
    if view.nbytes < HEADER.size:
        raise BadValue(f"{view.nbytes} bytes, shorter than the header")
    magic, version, key_len, _, length, digest = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise BadValue("not a kv-offload block (bad magic)")
    if version != FORMAT_VERSION:
        raise BadValue(f"format version {version}, this reader has {FORMAT_VERSION}")
    start = HEADER.size + key_len
    if view[HEADER.size : start] != key:
        raise BadValue("the value names another key")
    if length != block_size:
        raise BadValue(f"a block of {length} bytes, this stack's blocks have {block_size}")
    payload = view[start:]
    if payload.nbytes != length:
        raise BadValue(f"truncated: {payload.nbytes} of {length} payload bytes")
    if xxhash.xxh3_64_intdigest(payload) != digest:
        raise BadValue("checksum mismatch")
    return payload
