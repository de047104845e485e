"""What the tier stores, and where: the value format, the Redis keys, the namespace marker.

Nothing here talks to a server or holds state: these are the rules every engine sharing a
namespace must agree on, used by the I/O side (:mod:`.io`) to build and check what it sends.

The value: a small header, then the block's bytes exactly as in the CPU buffer row. Two
formats, both little-endian:

* version 1 (checked): magic ``KVOB``, format version (u16), key length (u16), reserved
  (u32, zero), payload length (u64), XXH3-64 of the payload (u64), then the offload key.
* version 2 (authenticated, with ``auth_key_env``): magic ``KVOB``, format version (u16),
  key length (u16), reserved (u32, zero), payload length (u64), the 40-byte record of
  :class:`kv_offload.block_auth.BlockAuth` (algorithm, key id, a MAC keyed by the tenant's
  secret over the namespace, key, block size, format version and payload), then the key. The
  MAC replaces the checksum: it detects every accidental change the checksum would, and the
  deliberate ones a checksum in a public format cannot.

A value is accepted only if all of it matches what the reader expects: a truncated value, a
value written for another block size, another key's value, a foreign one, or (with
authentication) an unsigned or badly signed one is rejected and never copied into the CPU
buffer. A stack without ``auth_key_env`` refuses version-2 values too (it cannot check them)
and leaves them alone.

The header is a separate buffer from the payload: the writer sends ``header`` and the CPU row
as two pieces of one bulk string (see :mod:`.wire`), so the row is never copied to build a
value.

The keys: a block lives at ``<namespace>:<key in hex>``. The namespace marker
``<namespace>:__format__`` names the block size and format every engine of the namespace
writes; in a Cluster it has a copy on every master (:func:`marker_copies`), each with the hash
tag that puts the ACL probe (:func:`probe_key`) in the same slot. How the marker is claimed is
the I/O side's (:class:`.io.NamespaceClaim`); the errors a claim can end in are stated here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash
from kv_offload.block_auth import RECORD_SIZE, BlockAuth
from kv_offload.errors import ConfigError
from redis.crc import key_slot

from .settings import RedisTierSettings

__all__ = [
    "AUTH_FORMAT_VERSION",
    "FORMAT_VERSION",
    "HEADER",
    "AuthFailed",
    "BadValue",
    "MarkerCopy",
    "check",
    "format_version",
    "header",
    "marker",
    "marker_copies",
    "probe_key",
]

FORMAT_VERSION = 1
AUTH_FORMAT_VERSION = 2
MAGIC = b"KVOB"
HEADER = struct.Struct("<4sHHIQQ")
#: The authenticated header: the checksum's place holds the length, then the auth record.
AUTH_HEADER = struct.Struct(f"<4sHHIQ{RECORD_SIZE}s")


class BadValue(Exception):
    """A stored value failed the integrity check; the message says which part.

    ``delete``: whether the tier should delete it (a damaged or forged value is worthless; a
    value this reader merely cannot check may be good for others)."""

    delete = True


class AuthFailed(BadValue):
    """A value failed authentication; ``kind`` is one of
    :data:`kv_offload.block_auth.AUTH_KINDS`."""

    def __init__(self, kind: str, message: str, *, delete: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.delete = delete


def format_version(auth: BlockAuth | None) -> int:
    """The format a stack with ``auth`` writes (and claims its namespace with)."""
    return FORMAT_VERSION if auth is None else AUTH_FORMAT_VERSION


def header(key: bytes, payload: Any, auth: BlockAuth | None = None) -> bytes:
    """The header of ``payload`` (a buffer: a CPU buffer row) stored under ``key``; signed
    when ``auth`` is given."""
    view = memoryview(payload)
    if auth is None:
        digest = xxhash.xxh3_64_intdigest(view)
        return HEADER.pack(MAGIC, FORMAT_VERSION, len(key), 0, view.nbytes, digest) + key
    record = auth.sign(key, view.nbytes, AUTH_FORMAT_VERSION, view)
    return AUTH_HEADER.pack(MAGIC, AUTH_FORMAT_VERSION, len(key), 0, view.nbytes, record) + key


def check(value: bytes, key: bytes, block_size: int, auth: BlockAuth | None = None) -> memoryview:
    """The payload of ``value`` (a view, no copy) if it is ``key``'s block of ``block_size``
    bytes in this stack's format; :class:`BadValue` (:class:`AuthFailed` for authentication)
    otherwise."""
    view = memoryview(value)
    if view.nbytes < HEADER.size:
        raise BadValue(f"truncated: {view.nbytes} bytes, shorter than the header ({HEADER.size})")
    magic, version, key_len, reserved, length = HEADER.unpack_from(view)[:5]
    if magic != MAGIC:
        raise BadValue("not a kv-offload block (bad magic)")
    if version == AUTH_FORMAT_VERSION and auth is None:
        error = BadValue("a signed block, and this stack has no auth_key_env to check it")
        error.delete = False
        raise error
    if version == FORMAT_VERSION and auth is not None:
        raise AuthFailed("unsigned", "an unsigned block in an authenticated namespace")
    if version != format_version(auth):
        raise BadValue(f"format version {version}, this reader has {format_version(auth)}")
    layout = HEADER if auth is None else AUTH_HEADER
    if view.nbytes < layout.size:
        raise BadValue(f"truncated: {view.nbytes} bytes, shorter than the header ({layout.size})")
    start = layout.size + key_len
    named = view[layout.size : start]  # shorter than key_len if the value was cut there
    if key_len != len(key) or named != key[: named.nbytes]:
        raise BadValue("the value names another key")
    if named.nbytes < key_len:
        raise BadValue(
            f"truncated: {view.nbytes} bytes, shorter than the header and the key it "
            f"names ({start})"
        )
    if length != block_size:
        raise BadValue(f"a block of {length} bytes, this stack's blocks have {block_size}")
    if reserved:
        raise BadValue("damaged header (reserved field set)")
    payload = view[start:]
    if payload.nbytes != length:
        raise BadValue(f"truncated: {payload.nbytes} of {length} payload bytes")
    if auth is None:
        if xxhash.xxh3_64_intdigest(payload) != HEADER.unpack_from(view)[5]:
            raise BadValue("checksum mismatch")
        return payload
    record = view[HEADER.size - 8 : layout.size]
    failure = auth.verify(record, key, block_size, AUTH_FORMAT_VERSION, payload)
    if failure is not None:
        # A key id this reader does not hold may be the next secret of a rolling rotation.
        raise AuthFailed(failure.kind, failure.message, delete=failure.kind != "unknown_key")
    return payload


# -- the keys and the namespace marker ----------------------------------------------------

#: How many hash tags ``{0}``, ``{1}``, ... are tried to find a slot of every master.
_TAG_SEARCH = 1 << 16


def key_prefix(namespace: str) -> bytes:
    """What every Redis key of a block starts with: ``<namespace>:``, then the key in hex."""
    return f"{namespace}:".encode()


def marker(auth: BlockAuth | None, block_size: int) -> str:
    """The namespace marker this stack writes: its format and block size."""
    return f"kv-offload-redis-tier format={format_version(auth)} block_size={block_size}"


@dataclass(frozen=True)
class MarkerCopy:
    """One copy of the namespace marker: its key, and the hash tag that puts the ACL probe
    in the same slot (so the same server answers both)."""

    key: bytes
    tag: bytes


def home_copy(namespace: str) -> MarkerCopy:
    """``<namespace>:__format__``: the only copy on a standalone server, and the one older
    versions read."""
    return MarkerCopy(f"{namespace}:__format__".encode(), b"")


def marker_copies(namespace: str, masters: Mapping[int, str] | None) -> list[MarkerCopy]:
    """Where the marker lives, given the master of each covered Cluster slot (``None``: a
    standalone server): the home copy, and in a Cluster a copy ``<namespace>:__format__{N}``
    on every other master, ``N`` the first number whose slot that master owns. A namespace
    with a hash tag of its own has all its keys in one slot, hence one copy. An empty slot
    map has no copy (the caller reports the Cluster unreachable)."""
    home = home_copy(namespace)
    if masters is None or key_slot(home.key + b"{0}") == key_slot(home.key + b"{1}"):
        return [home]
    wanted = set(masters.values())
    chosen: dict[str, MarkerCopy] = {}
    owner = masters.get(key_slot(home.key))
    if owner is not None:
        chosen[owner] = home
    for number in range(_TAG_SEARCH):
        if len(chosen) == len(wanted):
            break
        tag = str(number).encode()
        key = home.key + b"{" + tag + b"}"
        owner = masters.get(key_slot(key))
        if owner is not None and owner not in chosen:
            chosen[owner] = MarkerCopy(key, tag)
    return list(chosen.values())


def probe_key(namespace: str, copy: MarkerCopy) -> bytes:
    """The key the ACL probe runs every command on: in the namespace, in ``copy``'s slot."""
    tag = copy.tag or copy.key
    return f"{namespace}:__acl_probe__{{".encode() + tag + b"}"


#: The commands the ACL probe runs, in order, as an error message names them.
PROBE_COMMANDS = ("SET ... PX", "GET", "EXISTS", "DEL")


# -- what a refused claim says ------------------------------------------------------------


def mismatch_error(s: RedisTierSettings, ours: str, theirs: str, block_size: int) -> ConfigError:
    """The namespace holds another stack's marker."""
    hint = "give this model or block size its own namespace"
    if f"block_size={block_size}" in theirs.split():
        hint = (
            "every engine of a namespace must set auth_key_env (format=2) or none "
            "(format=1); set it here too, or give this stack its own namespace"
        )
    return ConfigError(
        f"tier {s.tier!r}: namespace {s.namespace!r} on {s.safe_url} holds "
        f"{theirs!r}, this stack writes {ours!r}; {hint}"
    )


def denied_error(s: RedisTierSettings, command: str, exc: Exception) -> ConfigError:
    """The server's ACL refused ``command`` on the namespace's keys."""
    user = s.username or "default"
    return ConfigError(
        f"tier {s.tier!r}: the Redis user {user!r} on {s.safe_url} may not run {command} "
        f"on keys of namespace {s.namespace!r} ({exc}); grant it, e.g. "
        f"`ACL SETUSER {user} ~{s.namespace}:* +get +set +exists +del`, or use the "
        f"namespace its ACL allows (see the tier's README, 'Access control')",
        key="namespace",
    )


def cluster_node_error(s: RedisTierSettings) -> ConfigError:
    """``cluster = false`` against a Cluster node."""
    return ConfigError(
        f"tier {s.tier!r}: cluster = false, but {s.safe_url} is a Redis Cluster node "
        f"(it answers only for its own slots); set cluster = true (and startup_nodes "
        f"to more of its nodes), or point url at a standalone server",
        key="cluster",
    )
