"""The on-disk format: one file per block, a header in front of the block's bytes.

A block file is a header page of :data:`HEADER_SPACE` bytes (``HEADER``, 32 bytes little
endian, then the key, then zeros) followed by the block's bytes::

    magic         8s   b"KVOFSBLK"
    version       u16  FORMAT_VERSION
    key_len       u16  length of the key that follows the header
    flags         u32  0 (reserved)
    payload_len   u64  block size in bytes
    checksum      u64  xxh3-64 of the block's bytes

The header takes a whole page so that the block's bytes, and the file's end, are page aligned:
overwriting a recycled file whose last page is partial and no longer cached makes the kernel
read that page first, ~4x the cost of the write (measured on ext4, see
``benchmarks/fs_tier.py``).

On load every field is compared with what the reader expects (this format, this key, this
block size) and the checksum of the bytes read is recomputed, so a truncated, bit-flipped,
swapped or foreign file is refused instead of served. The root directory carries a marker
(:data:`MARKER_NAME`) naming the format version and block size, so a directory written with
another block size or format is refused at construction instead of misread block by block.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import xxhash

__all__ = [
    "CHECKSUM_NAME",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_SPACE",
    "MAGIC",
    "MARKER_NAME",
    "MAX_KEY_BYTES",
    "checksum",
    "file_size",
    "marker_bytes",
    "pack_header",
    "parse_marker",
    "verify",
]

FORMAT_VERSION = 1
MAGIC = b"KVOFSBLK"
HEADER = struct.Struct("<8sHHIQQ")
HEADER_SPACE = 4096
_ZEROS = bytes(HEADER_SPACE)
CHECKSUM_NAME = "xxh3_64"
MARKER_NAME = "kv-offload-fs.json"
#: A key becomes a file name as hex: 2 characters a byte, under the usual 255-byte limit.
MAX_KEY_BYTES = 120


def checksum(data: memoryview) -> int:
    """xxh3-64 of ``data``, hashed in place (no copy)."""
    return xxhash.xxh3_64_intdigest(data)


def file_size(block_size: int) -> int:
    return HEADER_SPACE + block_size


def pack_header(key: bytes, block_size: int, digest: int) -> list[memoryview]:
    """The header page as buffers for ``pwritev`` (the zero padding is not copied)."""
    head = HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, block_size, digest) + key
    return [memoryview(head), memoryview(_ZEROS)[len(head) :]]


def verify(
    head: bytearray, key: bytes, block_size: int, nread: int, row: memoryview
) -> tuple[str, str] | None:
    """Why the file read into ``head`` + ``row`` (``nread`` bytes in all) is not ``key``'s
    block, as ``(kind, message)``, or ``None`` when it is."""
    expected = HEADER_SPACE + block_size
    if nread < expected:
        return "truncated", f"truncated ({nread} of {expected} bytes)"
    if nread > expected:
        return "too_long", f"longer than a block file ({expected} bytes)"
    magic, version, key_len, flags, payload_len, digest = HEADER.unpack_from(head)
    if magic != MAGIC:
        return "foreign", "not a kv-offload block file (bad magic)"
    if version != FORMAT_VERSION:
        return "version", f"format version {version}, this tier reads {FORMAT_VERSION}"
    if flags != 0:  # none are defined: a set bit is damage (or a newer writer), never ignored
        return "header", f"unknown header flags {flags:#x}"
    if payload_len != block_size:
        return "block_size", f"a block of {payload_len} bytes, this tier stores {block_size}"
    end = HEADER.size + len(key)
    if key_len != len(key) or head[HEADER.size : end] != key:
        return "wrong_key", "the file holds another key's block"
    if head.count(0, end) != HEADER_SPACE - end:
        return "header", "damaged header padding"
    if checksum(row) != digest:
        return "checksum", "checksum mismatch"
    return None


def marker_bytes(block_size: int) -> bytes:
    marker = {
        "format": "kv-offload-fs",
        "format_version": FORMAT_VERSION,
        "block_size_bytes": block_size,
        "checksum": CHECKSUM_NAME,
    }
    return (json.dumps(marker, indent=2) + "\n").encode()


def parse_marker(data: bytes) -> dict[str, Any] | None:
    """The marker's fields, or ``None`` if ``data`` is not a marker this tier wrote."""
    try:
        marker = json.loads(data)
    except ValueError:
        return None
    if not isinstance(marker, dict) or marker.get("format") != "kv-offload-fs":
        return None
    return marker
