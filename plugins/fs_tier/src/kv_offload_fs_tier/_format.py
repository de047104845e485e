"""The on-disk format: one file per block, a header in front of the block's bytes.

A block file is a header page of :data:`HEADER_SPACE` bytes (``HEADER``, 32 bytes little
endian, then the key, then zeros) followed by the block's bytes::

    magic         8s   b"KVOFSBLK"
    version       u16  FORMAT_VERSION
    key_len       u16  length of the key that follows the header
    flags         u32  0, or FLAG_AUTHENTICATED
    payload_len   u64  block size in bytes
    checksum      u64  xxh3-64 of the block's bytes (0 when authenticated)

With ``auth_key_env`` the tier sets ``FLAG_AUTHENTICATED`` and writes, right after the key,
the 40-byte record of :class:`kv_offload.block_auth.BlockAuth`: algorithm, key id and a MAC
keyed by the tenant's secret over the key, block size, format version and the block's bytes.
The MAC replaces the checksum (it catches every change the checksum would, and forgeries).
A tier with authentication refuses unsigned files and files signed with a secret it does not
hold; one without refuses signed files (it cannot check them). Like every block that fails
its check, they are deleted: the root has one owner process, no other reader could use them.

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
from collections.abc import Iterable
from typing import Any

import xxhash
from kv_offload.block_auth import RECORD_SIZE, BlockAuth

__all__ = [
    "AUTH_CONTEXT",
    "CHECKSUM_NAME",
    "FLAG_AUTHENTICATED",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_SPACE",
    "MAGIC",
    "MARKER_NAME",
    "MAX_KEY_BYTES",
    "bad_key",
    "checksum",
    "file_size",
    "marker_bytes",
    "pack_header",
    "pack_signed_header",
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
FLAG_AUTHENTICATED = 1
#: What the MAC binds a block to besides its key (a block of another tier never verifies).
AUTH_CONTEXT = b"kv-offload-fs-tier"


def bad_key(keys: Iterable[object]) -> str | None:
    """Why a job's keys cannot name block files (the first that cannot), or ``None``."""
    for key in keys:
        if not isinstance(key, bytes) or not key or len(key) > MAX_KEY_BYTES:
            return (
                f"key {key!r} is not 1..{MAX_KEY_BYTES} bytes (build keys with "
                "kv_offload.make_offload_key)"
            )
    return None


def checksum(data: memoryview) -> int:
    """xxh3-64 of ``data``, hashed in place (no copy)."""
    return xxhash.xxh3_64_intdigest(data)


def file_size(block_size: int) -> int:
    return HEADER_SPACE + block_size


def pack_header(key: bytes, block_size: int, digest: int) -> list[memoryview]:
    """The header page as buffers for ``pwritev`` (the zero padding is not copied)."""
    head = HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, block_size, digest) + key
    return [memoryview(head), memoryview(_ZEROS)[len(head) :]]


def pack_signed_header(
    key: bytes, block_size: int, row: memoryview, auth: BlockAuth
) -> list[memoryview]:
    """The header page of an authenticated block: flagged, the record after the key."""
    record = auth.sign(key, block_size, FORMAT_VERSION, row)
    head = (
        HEADER.pack(MAGIC, FORMAT_VERSION, len(key), FLAG_AUTHENTICATED, block_size, 0)
        + key
        + record
    )
    return [memoryview(head), memoryview(_ZEROS)[len(head) :]]


def verify(
    head: bytearray,
    key: bytes,
    block_size: int,
    nread: int,
    row: memoryview,
    auth: BlockAuth | None = None,
) -> tuple[str, str] | None:
    """Why the file read into ``head`` + ``row`` (``nread`` bytes in all) is not ``key``'s
    block, as ``(kind, message)``, or ``None`` when it is. With ``auth`` the block must be
    signed by a secret it holds (kinds of :data:`kv_offload.block_auth.AUTH_KINDS`)."""
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
    if flags & ~FLAG_AUTHENTICATED:  # a set bit is damage (or a newer writer), never ignored
        return "header", f"unknown header flags {flags:#x}"
    signed = bool(flags & FLAG_AUTHENTICATED)
    if signed and auth is None:
        return "signed", "a signed block, and this tier has no auth_key_env to check it"
    if auth is not None and not signed:
        return "unsigned", "an unsigned block in an authenticated tier"
    if payload_len != block_size:
        return "block_size", f"a block of {payload_len} bytes, this tier stores {block_size}"
    end = HEADER.size + len(key)
    if key_len != len(key) or head[HEADER.size : end] != key:
        return "wrong_key", "the file holds another key's block"
    stop = end + RECORD_SIZE if signed else end
    if head.count(0, stop) != HEADER_SPACE - stop:
        return "header", "damaged header padding"
    if auth is not None:
        failure = auth.verify(memoryview(head)[end:stop], key, block_size, FORMAT_VERSION, row)
        return None if failure is None else (failure.kind, failure.message)
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
