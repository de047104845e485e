"""The stored object: a small header, then the block's bytes exactly as in the CPU buffer row.

Two formats, both little-endian:

* version 1 (checked): magic ``KVOS``, format version (u16), key length (u16), reserved
  (u32, zero), payload length (u64), XXH3-64 of the payload (u64), then the offload key;
* version 2 (authenticated, with ``auth_key_env``): the same, with the 40-byte record of
  :class:`kv_offload.block_auth.BlockAuth` (a MAC keyed by the tenant's secret over the bucket
  and prefix, the key, the block size, the format version and the payload) in place of the
  checksum.

An object is served only if all of it matches what the reader expects: a truncated object,
one written for another block size, another key's object (a swapped or copied one), a
foreign one, or (with authentication) an unsigned or badly signed one is refused before a
byte reaches the CPU buffer. A stack without ``auth_key_env`` refuses version-2 objects too
(it cannot check them) and leaves them alone, as it leaves alone an object signed with a
key id it does not hold (the next secret of a rolling rotation).
"""

from __future__ import annotations

import struct
from typing import Any

import xxhash
from kv_offload.block_auth import RECORD_SIZE, BlockAuth

__all__ = ["AuthFailed", "BadObject", "check", "format_version", "header", "header_size"]

FORMAT_VERSION = 1
AUTH_FORMAT_VERSION = 2
MAGIC = b"KVOS"
HEADER = struct.Struct("<4sHHIQQ")
#: The authenticated header: the checksum's place holds the auth record.
AUTH_HEADER = struct.Struct(f"<4sHHIQ{RECORD_SIZE}s")


class BadObject(Exception):
    """An object failed its check; ``delete``: whether it is worthless to every reader."""

    delete = True


class AuthFailed(BadObject):
    """An object failed authentication; ``kind`` is one of
    :data:`kv_offload.block_auth.AUTH_KINDS`."""

    def __init__(self, kind: str, message: str, *, delete: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.delete = delete


def format_version(auth: BlockAuth | None) -> int:
    return FORMAT_VERSION if auth is None else AUTH_FORMAT_VERSION


def header_size(key_bytes: int, auth: BlockAuth | None) -> int:
    """The header's size for a key of ``key_bytes`` bytes."""
    return (HEADER if auth is None else AUTH_HEADER).size + key_bytes


def header(key: bytes, payload: Any, auth: BlockAuth | None) -> bytes:
    """The header of ``payload`` (a CPU buffer row) stored under ``key``; signed with
    ``auth``."""
    view = memoryview(payload)
    if auth is None:
        digest = xxhash.xxh3_64_intdigest(view)
        return HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, view.nbytes, digest) + key
    record = auth.sign(key, view.nbytes, AUTH_FORMAT_VERSION, view)
    return AUTH_HEADER.pack(MAGIC, AUTH_FORMAT_VERSION, len(key), 0, view.nbytes, record) + key


def check(
    value: bytes | memoryview, key: bytes, block_size: int, auth: BlockAuth | None
) -> memoryview:
    """The payload of ``value`` (a view) if it is ``key``'s block of ``block_size`` bytes in
    this stack's format; :class:`BadObject` (:class:`AuthFailed`) otherwise."""
    view = memoryview(value)
    if view.nbytes < HEADER.size:
        raise BadObject(f"truncated: {view.nbytes} bytes, shorter than the header")
    magic, version, key_len, reserved, length = HEADER.unpack_from(view)[:5]
    if magic != MAGIC:
        raise BadObject("not a kv-offload block (bad magic)")
    if version == AUTH_FORMAT_VERSION and auth is None:
        error = BadObject("a signed block, and this stack has no auth_key_env to check it")
        error.delete = False
        raise error
    if version == FORMAT_VERSION and auth is not None:
        raise AuthFailed("unsigned", "an unsigned block under an authenticated prefix")
    if version != format_version(auth):
        raise BadObject(f"format version {version}, this reader has {format_version(auth)}")
    layout = HEADER if auth is None else AUTH_HEADER
    start = layout.size + key_len
    if view.nbytes < start:
        raise BadObject(f"truncated: {view.nbytes} bytes, shorter than the header and key")
    if key_len != len(key) or view[layout.size : start] != key:
        raise BadObject("the object names another key (swapped or copied)")
    if length != block_size:
        raise BadObject(f"a block of {length} bytes, this stack's blocks have {block_size}")
    if reserved:
        raise BadObject("damaged header (reserved field set)")
    payload = view[start:]
    if payload.nbytes != length:
        raise BadObject(f"truncated: {payload.nbytes} of {length} payload bytes")
    if auth is None:
        if xxhash.xxh3_64_intdigest(payload) != HEADER.unpack_from(view)[5]:
            raise BadObject("checksum mismatch")
        return payload
    record = view[HEADER.size - 8 : layout.size]
    failure = auth.verify(record, key, block_size, AUTH_FORMAT_VERSION, payload)
    if failure is not None:
        raise AuthFailed(failure.kind, failure.message, delete=failure.kind != "unknown_key")
    return payload
